"""A small async client of the paid generation API: submit a job under an idempotency key,
poll it by its id, fetch its result, find it again by its key, and refund it.

Where the API is and the key that pays for it come from the worker's environment
(PAIDGEN_API_URL, PAIDGEN_API_KEY), read when a call is made: the key goes into the
`Authorization` header and nowhere else (never into an argument, a result, an error or
a log line). The client does no retries of its own: a tool's retries are perdure's, which
re-sends a submission under the same key (tools.py).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal, Self

import httpx
from pydantic import BaseModel, ConfigDict

API_URL_ENV = "PAIDGEN_API_URL"
API_KEY_ENV = "PAIDGEN_API_KEY"
FINISHED = ("succeeded", "failed", "canceled")


class Price(BaseModel):
    model_config = ConfigDict(extra="ignore")

    amount: Decimal
    currency: str


class Output(BaseModel):
    model_config = ConfigDict(extra="ignore")

    url: str
    content_type: str = "application/octet-stream"


class Generation(BaseModel):
    """A job as the API shows it."""

    model_config = ConfigDict(extra="ignore")

    id: str
    status: Literal["queued", "running", "succeeded", "failed", "canceled"]
    progress: float = 0.0
    price: Price
    output: Output | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


class Refund(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    generation: str
    amount: Price


class NotConfigured(RuntimeError):
    """The worker's environment does not say where the API is or what key pays for it."""


class APIError(Exception):
    """The API answered with an error: its HTTP status and its own `type`, `code` and message."""

    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error") if isinstance(body, dict) else None
        error = error if isinstance(error, dict) else {}
        self.status = status
        self.type = str(error.get("type") or "unknown")
        self.code = str(error.get("code") or "")
        super().__init__(f"HTTP {status} {self.type}: {str(error.get('message') or body)[:300]}")

    @property
    def refused(self) -> bool:
        """The request was refused as it stands and nothing was done: sending it again would not help."""
        return 400 <= self.status < 500 and self.status not in (408, 409, 429)


class GenerationAPI:
    """`async with GenerationAPI.from_env() as api: ...`"""

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 10.0) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout_s
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> GenerationAPI:
        url, key = environ.get(API_URL_ENV, "").strip(), environ.get(API_KEY_ENV, "").strip()
        if not url or not key:
            missing = " and ".join(name for name, value in ((API_URL_ENV, url), (API_KEY_ENV, key)) if not value)
            raise NotConfigured(f"{missing} must be set in the worker's environment")
        return cls(url, key)

    def __repr__(self) -> str:
        return f"GenerationAPI({self._http.base_url})"  # without the key

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def submit(self, prompt: str, *, seed: int, idempotency_key: str) -> Generation:
        """Submit a job (billed when accepted); the same key again answers the same job, billed nothing."""
        body = {"prompt": prompt, "seed": seed}
        reply = await self._http.post("/v1/generations", json=body, headers={"Idempotency-Key": idempotency_key})
        return Generation.model_validate(self._json(reply))

    async def get(self, job_id: str) -> Generation:
        return Generation.model_validate(self._json(await self._http.get(f"/v1/generations/{job_id}")))

    async def find(self, idempotency_key: str) -> Generation | None:
        """The job submitted under this key, if one was."""
        reply = await self._http.get("/v1/generations", params={"idempotency_key": idempotency_key})
        found = self._json(reply)["data"]
        return Generation.model_validate(found[0]) if found else None

    async def content(self, job_id: str) -> bytes:
        """The finished job's result."""
        reply = await self._http.get(f"/v1/generations/{job_id}/content")
        return base64.b64decode(self._json(reply)["b64_json"])

    async def refund(self, job_id: str, *, idempotency_key: str) -> Refund | None:
        """Stop the job if it runs and refund its price; None when it was refunded already."""
        reply = await self._http.post(f"/v1/generations/{job_id}/refund", headers={"Idempotency-Key": idempotency_key})
        try:
            return Refund.model_validate(self._json(reply))
        except APIError as err:
            if err.code == "already_refunded":
                return None
            raise

    @staticmethod
    def _json(reply: httpx.Response) -> Any:
        try:
            body = reply.json()
        except ValueError:
            body = reply.text
        if reply.status_code >= 400:
            raise APIError(reply.status_code, body)
        return body
