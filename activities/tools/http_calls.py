"""HTTP on the worker, for the tools that speak it (activities/tools/catalogue/): one write
request with its transport errors sorted into "never sent" and "may have been sent", what
a status code means for an effect, the answer's excerpt with the worker's keys taken out,
where a service is and its key (the worker's environment, read at call time, never
workflow input), and http_get's capped GET.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from perdure.activities.artifacts import preview
from perdure.activities.client_pool import http_client
from perdure.activities.tools import credentials
from perdure.activities.tools.catalogue.http_tools import HttpGetArgs
from perdure.activities.tools.catalogue.tool_base import decoded
from perdure.activities.tools.catalogue.tool_errors import NotSent, OutcomeUnknown, ToolError

HTTP_TIMEOUT_S = 30.0
BODY_EXCERPT_CHARS = 300
IDEMPOTENCY_MISMATCH = "invalid_idempotent_request"
"""Resend's error name for a key reused with another payload (it answers 409; the IETF draft says 422)."""


async def http_call(method: str, url: str, *, body: Any = None, headers: dict[str, str]) -> httpx.Response:
    """One request, with transport errors sorted into 'never sent' and 'may have been sent'."""
    kwargs: dict[str, Any] = {"headers": headers}
    if body is not None:
        kwargs["json"] = body
    try:
        # Redirects are not followed: re-sending a write to another URL is a new effect.
        client = http_client(HTTP_TIMEOUT_S, follow_redirects=False)
        return await client.request(method, url, **kwargs)
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as err:
        raise ToolError(f"{method} {url}: {err}") from None
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as err:
        raise NotSent(f"cannot connect to {url} ({type(err).__name__}: {err or 'no detail'})") from None
    except httpx.HTTPError as err:
        detail = f"{type(err).__name__}: {err or 'no detail'}"
        raise OutcomeUnknown(f"no answer from {url} after the request went out ({detail})") from None


def check_status(response: httpx.Response, what: str) -> None:
    """Return on 2xx; otherwise raise what the status means for an effect."""
    status = response.status_code
    if 200 <= status < 300:
        return
    shown = excerpt(response)
    retry = retry_after(response)
    if status == 422 or (status == 409 and IDEMPOTENCY_MISMATCH in response.text):
        if "idempoten" in response.text.lower():
            raise ToolError(
                f"{what} refused the Idempotency-Key: it was used before with a different request "
                f"(HTTP {status}: {shown})"
            )
    if status in (409, 425, 429):
        raise NotSent(f"{what} answered HTTP {status} (busy or rate-limited): {shown}", retry_after_s=retry)
    if status == 408 or status >= 500:
        raise OutcomeUnknown(f"{what} answered HTTP {status}: {shown}", retry_after_s=retry)
    raise ToolError(f"{what} answered HTTP {status}: {shown}")


# The services' keys the worker holds: a service that echoes its request must not put
# them into an error, a result or the history.
SERVICE_KEYS = ("PERDURE_MAIL_KEY", "PERDURE_PAYMENTS_KEY")


def excerpt(response: httpx.Response, chars: int = BODY_EXCERPT_CHARS) -> str:
    """A short piece of the answer for an error message, with the worker's keys taken out."""
    keys = [os.environ.get(name, "").strip() for name in SERVICE_KEYS]
    return credentials.redact(preview(response.text, chars), keys) or "(empty body)"


def retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    try:
        return min(max(float(value), 0.0), 300.0) if value else None
    except ValueError:
        return None  # an HTTP date; the retry policy's own backoff applies


def json_reply(response: httpx.Response, what: str) -> Any:
    try:
        return response.json()
    except ValueError:
        raise OutcomeUnknown(f"{what} answered HTTP {response.status_code} with a body that is not JSON") from None


def service_url(tool: str, url_env: str, what: str) -> str:
    url = os.environ.get(url_env, "").strip().rstrip("/")
    if not url:
        raise ToolError(f"{tool} is not configured on this worker: set {url_env} to the {what} API's base URL")
    return url


def bearer(key_env: str) -> dict[str, str]:
    key = os.environ.get(key_env, "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


def replayed(response: httpx.Response) -> dict:
    """Services that deduplicate say so (Stripe's `Idempotent-Replayed: true`); worth telling the user."""
    return {"replayed": True} if response.headers.get("Idempotent-Replayed", "").lower() == "true" else {}


async def http_get(root: Path, args: HttpGetArgs) -> str:
    """The start of a URL's body as text (the http_get tool; also a finished step's re-check)."""
    del root  # http_get does not touch the workspace
    body = bytearray()
    truncated = False
    try:
        client = http_client(HTTP_TIMEOUT_S, follow_redirects=True)
        async with client.stream("GET", args.url) as response:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > args.max_bytes:
                    truncated = True
                    del body[args.max_bytes :]
                    break
            status = response.status_code
            encoding = response.encoding or "utf-8"
            final_url = str(response.url)
    except httpx.HTTPError as err:
        raise ToolError(f"GET {args.url} failed: {type(err).__name__}: {err or 'no detail'}") from None

    text = decoded(bytes(body), encoding, capped=truncated)
    if not 200 <= status < 300:
        raise ToolError(f"GET {args.url} returned HTTP {status}; body starts: {preview(text, 300) or '(empty)'}")
    if b"\x00" in body[:8192]:
        raise ToolError(f"GET {args.url} returned binary content; http_get returns text only")
    if truncated:
        text += f"\n[truncated: showing the first {args.max_bytes} bytes of {final_url}]"
    return text


def setting(name: str) -> str:
    """A setting of the worker's environment, read at call time ("" when unset)."""
    return os.environ.get(name, "").strip()
