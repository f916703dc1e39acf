"""http_get and http_request: read a URL, and write to an HTTP API under an effect key.

http_get is a read (`safe`), capped, drawing on its host's declared quota.
http_request is a `keyed` remote write: its effect key goes out as the Idempotency-Key
header, so a retry is deduplicated by services that support it; a request that names
how to undo it (`undo`) registers that request as its compensation before it is sent.
Credentials are named (`auth`), never written into the arguments: the worker resolves
the name and sends it only to the hosts it is declared for. The HTTP plumbing is in
activities/tools/http_calls.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from perdure.activities.tools.catalogue.tool_base import (
    EffectCall,
    EffectTool,
    LocalCall,
    LocalTool,
    how_confirmed,
)
from perdure.activities.tools.catalogue.tool_errors import NotSent, OutcomeUnknown, ToolError
from perdure.workflows.shared.tool_specs import (
    HTTP_URL,
    LONG_CALL_TIMEOUTS,
    REMOTE_TIMEOUTS,
    Compensation,
    Effect,
    ToolArgs,
    ToolSpec,
)

# Headers that carry credentials: never literal in a plan or a model's call.
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "x-auth-token"})
CREDENTIAL_NAME = r"^[A-Z][A-Z0-9_]{0,63}$"
AUTH_DESCRIPTION = (
    "Name of a credential declared on the worker (config file, [credentials]), e.g. GITHUB_TOKEN: the worker "
    "adds it to the request; never the secret itself."
)


class HttpGetArgs(ToolArgs):
    url: str = Field(pattern=r"^https?://", description="http or https URL.")
    max_bytes: int = Field(default=65_536, ge=1, le=1_048_576)


class HttpUndo(ToolArgs):
    """The request that undoes an http_request (e.g. DELETE of the resource it creates)."""

    method: Literal["POST", "PUT", "PATCH", "DELETE"]
    url: str = Field(pattern=HTTP_URL)
    body: Any = Field(default=None, description="JSON body of the undo request.")
    auth: str | None = Field(default=None, pattern=CREDENTIAL_NAME, description=AUTH_DESCRIPTION)


class HttpRequestArgs(ToolArgs):
    method: Literal["POST", "PUT", "PATCH", "DELETE"]
    url: str = Field(pattern=HTTP_URL, description="http or https URL.")
    body: Any = Field(default=None, description="JSON body (any JSON value); omitted when null.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra request headers; credentials go in `auth`, never here."
    )
    auth: str | None = Field(default=None, pattern=CREDENTIAL_NAME, description=AUTH_DESCRIPTION)
    undo: HttpUndo | None = Field(default=None, description="How to undo this request, registered before it is sent.")
    max_bytes: int = Field(default=65_536, ge=1, le=1_048_576)

    @field_validator("headers")
    @classmethod
    def _no_literal_credentials(cls, headers: dict[str, str]) -> dict[str, str]:
        secret = sorted(name for name in headers if name.lower() in SECRET_HEADERS)
        if secret:
            raise ValueError(
                f"a credential may not be written into the arguments (header {', '.join(secret)}): name one "
                "declared on the worker instead, e.g. `auth: GITHUB_TOKEN` (README, Credentials)"
            )
        return headers


class HttpGet(LocalTool):
    spec = ToolSpec(
        name="http_get",
        replay="safe",
        risk="read",
        description="Fetch a URL with HTTP GET and return the start of the body.",
        args_model=HttpGetArgs,
        low_value=True,
        **LONG_CALL_TIMEOUTS,
    )
    example = {"url": "https://example.com/status"}

    async def run(self, call: LocalCall, args: HttpGetArgs) -> str:
        from perdure.activities.quota.quota_admission import QuotaTooFar, host_admitted
        from perdure.activities.tools.http_calls import http_get

        try:
            async with host_admitted(call.quotas(), args.url):
                return await http_get(call.root, args)
        except QuotaTooFar as err:
            raise ToolError(str(err)) from None


class HttpRequest(EffectTool):
    spec = ToolSpec(
        name="http_request",
        risk="remote-write",
        replay="keyed",
        description="Send a POST, PUT, PATCH or DELETE with a JSON body. The effect key goes out as the "
        "Idempotency-Key header, so a retry is deduplicated by services that support it.",
        args_model=HttpRequestArgs,
        compensation="http_request",
        **REMOTE_TIMEOUTS,
    )
    example = {
        "method": "POST",
        "url": "https://ledger.example/entries",
        "body": {"amount": 3},
        "undo": {"method": "DELETE", "url": "https://ledger.example/entries/7"},
    }

    def effect(self, args: HttpRequestArgs, workspace: str) -> Effect:
        named = {"auth": args.auth} if args.auth else {}  # another credential is another effect
        return Effect(args.url, args.method, {"body": args.body, "headers": args.headers, **named})

    def undo(self, key: str, args: HttpRequestArgs) -> Compensation | None:
        if args.undo is None:
            return None
        # The undo names its own credential, else the request's (sent only to its declared hosts).
        undo = args.undo.model_copy(update={"auth": args.undo.auth or args.auth})
        return Compensation(
            tool="http_request",
            args=undo.model_dump(mode="json", exclude_none=True),
            reason=f"undo {args.method} {args.url} with {args.undo.method} {args.undo.url}",
        )

    def target(self, args: HttpRequestArgs) -> str:
        return args.url

    async def send(self, call: EffectCall, args: HttpRequestArgs) -> dict:
        from perdure.activities.tools import credentials
        from perdure.activities.tools import http_calls as http

        headers = {k: v for k, v in args.headers.items() if k.lower() != "idempotency-key"}
        headers["Idempotency-Key"] = call.key
        sent_secrets: list[str] = []
        if args.auth:
            # Named, resolved here on the worker, sent only to the hosts it is declared for.
            header, secret = credentials.header_for(args.auth, args.url)
            headers.update(header)
            sent_secrets.append(secret)
        what = f"{args.method} {args.url}"
        try:
            response = await http.http_call(args.method, args.url, body=args.body, headers=headers)
            http.check_status(response, what)
        except (ToolError, NotSent, OutcomeUnknown) as err:
            if sent_secrets:  # a service may echo what it was sent
                raise credentials.redacted(err, sent_secrets) from None
            raise
        body = response.content[: args.max_bytes].decode(response.encoding or "utf-8", errors="replace")
        body = credentials.redact(body, sent_secrets)
        parsed = None
        try:
            parsed = response.json()
        except ValueError:
            pass
        receipt: dict = {"status": response.status_code, "body": (await call.store.aput_text(body)).digest}
        if isinstance(parsed, dict) and isinstance(parsed.get("id"), (str, int)):
            receipt["id"] = parsed["id"]
        return {**receipt, **http.replayed(response)}

    def describe(self, call: EffectCall, args: HttpRequestArgs, receipt: dict) -> str:
        head = f"{args.method} {args.url} -> HTTP {receipt.get('status')}"
        if "id" in receipt:
            head += f" (id {receipt['id']})"
        head += how_confirmed(receipt)
        digest = receipt.get("body")
        body = call.store.get_text(digest) if isinstance(digest, str) and call.store.has(digest) else ""
        return f"{head}\n{body}" if body else head


DECLARED = (HttpGet(), HttpRequest())
