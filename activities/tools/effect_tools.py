"""Remote-write tools (HTTP, mail, git, webhook, payments) and the runner that makes each effect happen once.

Owns the side-effect protocol on the worker. For every call of a tool whose
replay policy is not `safe`, `run_effect`:
1. derives the effect key from the resolved arguments (`perdure.workflows.shared.effects`), so
   every attempt of the same logical effect carries the same key;
2. refuses an `irreversible` tool unless the workflow says a human confirmed it;
3. decides from the attempt number, the previous attempt's last heartbeat and
   the replay policy whether to reuse a receipt, look the effect up, send it
   (again, under the same key) or answer `uncertain`;
4. heartbeats the phase around the external call: `intent` with the key before,
   `done` with the receipt after.
It must not guess: when an effect may or may not have happened and nothing can
tell, the result is `uncertain` and nothing is sent again.

Service addresses and credentials come from the worker's environment at call
time (PERDURE_MAIL_URL, PERDURE_MAIL_KEY, PERDURE_MAIL_FROM,
PERDURE_PAYMENTS_URL, PERDURE_PAYMENTS_KEY), never from workflow input. Fault
points (`perdure.activities.faults`) mark where crash tests may kill the worker; they do
nothing unless PERDURE_FAULT is set.
"""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from perdure.activities.artifacts import ArtifactStore, preview
from perdure.activities.client_pool import http_client
from perdure.activities.faults import fault_point
from perdure.activities.heartbeat import Heartbeat
from perdure.activities.tools import credentials
from perdure.activities.tools.tool_errors import NotSent, OutcomeUnknown, ToolError
from perdure.activities.tools.workspace import WorkspaceEscape, resolve_in_workspace, workspace_root
from perdure.workflows.shared.contracts import Compensation, ToolInput, ToolResult
from perdure.workflows.shared.effects import (
    compensation_for,
    decide_retry,
    done_details,
    effect_key,
    effect_of,
    intent_details,
    last_heartbeat,
)
from perdure.workflows.shared.tool_specs import (
    GitCommitArgs,
    GitRevertArgs,
    HttpRequestArgs,
    MakePaymentArgs,
    NotifyWebhookArgs,
    RefundPaymentArgs,
    SendEmailArgs,
    ToolArgs,
    ToolSpec,
)

HTTP_TIMEOUT_S = 30.0
GIT_TIMEOUT_S = 45.0
"""Below the 60 s start-to-close recommended for git tools, so a hung hook fails the call, not the attempt."""
BODY_EXCERPT_CHARS = 300
EFFECT_TRAILER = "Effect-Key"
REVERTS_TRAILER = "Reverts-Effect-Key"
DEFAULT_MAIL_FROM = "perdure <perdure@localhost>"
IDEMPOTENCY_MISMATCH = "invalid_idempotent_request"
"""Resend's error name for a key reused with another payload (it answers 409; the IETF draft says 422)."""


@dataclass(frozen=True)
class EffectCall:
    """What one tool implementation needs to know about the call besides its arguments."""

    goal_id: str
    tool: str
    workspace: Path
    key: str
    store: ArtifactStore


class EffectTool(ABC):
    """One remote-write tool. `send` makes the effect and returns a small receipt."""

    needs_workspace = False

    @abstractmethod
    async def send(self, call: EffectCall, args: Any) -> dict: ...

    async def lookup(self, call: EffectCall, args: Any) -> dict | None:
        """For `check` tools: the receipt of the effect if it already happened."""
        raise TypeError(f"{call.tool} is not a `check` tool and has no lookup")

    @abstractmethod
    def describe(self, call: EffectCall, args: Any, receipt: dict) -> str: ...

    @abstractmethod
    def target(self, args: Any) -> str:
        """Where the effect lands, for messages."""


# --- the runner ---------------------------------------------------------------------


async def run_effect(
    impl: EffectTool, spec: ToolSpec, input: ToolInput, args: ToolArgs, store: ArtifactStore, beat: Heartbeat
) -> ToolResult:
    effect = effect_of(input.tool, args, input.workspace)
    assert effect is not None, f"{input.tool} has no effect description"
    key = effect_key(input.goal_id, *effect)
    # On the tool call's span (activities/spans.py), when tracing is on.
    trace.get_current_span().set_attribute("perdure.effect_key", key)
    call = EffectCall(goal_id=input.goal_id, tool=input.tool, workspace=Path(input.workspace), key=key, store=store)
    outcome = _Outcome(spec, input, key, impl.target(args), compensation_for(input.tool, key, args))

    if spec.risk == "irreversible" and not input.confirmed:
        return outcome.failed(
            f"{input.tool} is irreversible and needs a human confirmation before it runs; "
            "nothing was sent (the workflow must ask and set confirmed)"
        )

    if input.resolution == "happened":
        # A person checked the receiving side after an uncertain attempt: record, do not send.
        receipt = {"confirmed_by": "a person, after an uncertain attempt"}
        text = impl.describe(call, args, receipt)
        return outcome.result(ok=True, output=store.put_text(text), preview=preview(text), receipt=receipt)

    info = activity.info()
    previous = last_heartbeat(info.heartbeat_details, key)
    decision = decide_retry(spec.replay, info.attempt, previous)
    activity.logger.info(
        "effect decided", extra={"tool": input.tool, "attempt": info.attempt, "effect_key": key, "decision": decision}
    )

    if decision == "uncertain":
        return outcome.uncertain(
            f"an earlier attempt of {input.tool} was interrupted and may have sent the request "
            f"(effect key {key}); whether {outcome.target} received it is unknown, and {input.tool} is never "
            "sent twice on its own: a human must check and decide"
        )

    receipt: dict | None = None
    if decision == "reuse":
        assert previous is not None
        receipt = {**previous["receipt"], "confirmed_by": "an earlier attempt's receipt"}
    elif decision == "lookup":
        try:
            receipt = await impl.lookup(call, args)
        except ToolError as err:
            return outcome.failed(err.message)

    if receipt is None:
        beat.set(intent_details(key))
        fault_point("before_effect", input.tool, effect_key=key)
        try:
            receipt = await impl.send(call, args)
        except ToolError as err:
            activity.logger.info("effect refused", extra={"tool": input.tool, "effect_key": key, "error": err.message})
            return outcome.failed(err.message)
        except (NotSent, OutcomeUnknown) as err:
            return outcome.unconfirmed(err, info)
        fault_point("after_effect", input.tool, effect_key=key)
        beat.set(done_details(key, receipt))
        fault_point("after_receipt", input.tool, effect_key=key)

    text = impl.describe(call, args, receipt)
    return outcome.result(ok=True, output=store.put_text(text), preview=preview(text), receipt=receipt)


@dataclass(frozen=True)
class _Outcome:
    """Builds the ToolResult of one effect call; the compensation travels whenever the effect may exist."""

    spec: ToolSpec
    input: ToolInput
    key: str
    target: str
    compensation: Compensation | None

    def result(self, **fields: Any) -> ToolResult:
        if fields.get("ok") or fields.get("uncertain"):
            fields["compensation"] = self.compensation
        return ToolResult(
            call_id=self.input.call_id, tool=self.input.tool, risk=self.spec.risk, effect_key=self.key, **fields
        )

    def failed(self, message: str) -> ToolResult:
        return self.result(ok=False, error=message)

    def uncertain(self, message: str) -> ToolResult:
        activity.logger.warning(
            "effect uncertain", extra={"tool": self.input.tool, "effect_key": self.key, "error": message}
        )
        return self.result(ok=False, uncertain=True, error=message)

    def unconfirmed(self, err: NotSent | OutcomeUnknown, info: activity.Info) -> ToolResult:
        """The call failed without a definite answer: retry, report, or say it is uncertain."""
        tool, target = self.input.tool, self.target
        if self.spec.replay == "once":
            if isinstance(err, NotSent):
                return self.failed(f"{tool} was not delivered to {target}: {err}")
            return self.uncertain(
                f"{tool} may have reached {target} but no answer says so ({err}); "
                f"it is never sent twice on its own (effect key {self.key}): a human must check and decide"
            )
        maximum = info.retry_policy.maximum_attempts if info.retry_policy else 0
        if maximum == 0 or info.attempt < maximum:
            # Safe to retry: the next attempt sends the same key (keyed) or looks first (check).
            raise ApplicationError(
                f"{tool} to {target} not confirmed yet: {err}",
                {"effect_key": self.key},
                type="EffectNotConfirmed",
                next_retry_delay=_delay(err.retry_after_s),
            )
        if info.attempt == 1 and isinstance(err, NotSent):
            return self.failed(f"{tool} to {target} was not sent: {err}")
        return self.uncertain(
            f"{tool} to {target} was not confirmed in {info.attempt} attempts (last: {err}); an earlier attempt "
            f"may have got through. Running it again is safe: it carries the same effect key {self.key}"
        )


def _delay(seconds: float | None) -> timedelta | None:
    return timedelta(seconds=seconds) if seconds else None


# --- HTTP ---------------------------------------------------------------------------


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
    excerpt = _excerpt(response)
    retry_after = _retry_after(response)
    if status == 422 or (status == 409 and IDEMPOTENCY_MISMATCH in response.text):
        if "idempoten" in response.text.lower():
            raise ToolError(
                f"{what} refused the Idempotency-Key: it was used before with a different request "
                f"(HTTP {status}: {excerpt})"
            )
    if status in (409, 425, 429):
        raise NotSent(f"{what} answered HTTP {status} (busy or rate-limited): {excerpt}", retry_after_s=retry_after)
    if status == 408 or status >= 500:
        raise OutcomeUnknown(f"{what} answered HTTP {status}: {excerpt}", retry_after_s=retry_after)
    raise ToolError(f"{what} answered HTTP {status}: {excerpt}")


# The services' keys the worker holds: a service that echoes its request must not put
# them into an error, a result or the history.
SERVICE_KEYS = ("PERDURE_MAIL_KEY", "PERDURE_PAYMENTS_KEY")


def _excerpt(response: httpx.Response, chars: int = BODY_EXCERPT_CHARS) -> str:
    """A short piece of the answer for an error message, with the worker's keys taken out."""
    keys = [os.environ.get(name, "").strip() for name in SERVICE_KEYS]
    return credentials.redact(preview(response.text, chars), keys) or "(empty body)"


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    try:
        return min(max(float(value), 0.0), 300.0) if value else None
    except ValueError:
        return None  # an HTTP date; the retry policy's own backoff applies


def _json(response: httpx.Response, what: str) -> Any:
    try:
        return response.json()
    except ValueError:
        raise OutcomeUnknown(f"{what} answered HTTP {response.status_code} with a body that is not JSON") from None


def _service(tool: str, url_env: str, what: str) -> str:
    url = os.environ.get(url_env, "").strip().rstrip("/")
    if not url:
        raise ToolError(f"{tool} is not configured on this worker: set {url_env} to the {what} API's base URL")
    return url


def _auth(key_env: str) -> dict[str, str]:
    key = os.environ.get(key_env, "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


def _replayed(response: httpx.Response) -> dict:
    """Services that deduplicate say so (Stripe's `Idempotent-Replayed: true`); worth telling the user."""
    return {"replayed": True} if response.headers.get("Idempotent-Replayed", "").lower() == "true" else {}


def _how(receipt: dict) -> str:
    if receipt.get("confirmed_by"):
        return f"; confirmed by {receipt['confirmed_by']}, not sent again"
    if receipt.get("found_by"):
        return f"; found by {receipt['found_by']}, not done again"
    if receipt.get("replayed"):
        return "; the service recognised the effect key and did not repeat it"
    return ""


class HttpRequestTool(EffectTool):
    def target(self, args: HttpRequestArgs) -> str:
        return args.url

    async def send(self, call: EffectCall, args: HttpRequestArgs) -> dict:
        headers = {k: v for k, v in args.headers.items() if k.lower() != "idempotency-key"}
        headers["Idempotency-Key"] = call.key
        secrets: list[str] = []
        if args.auth:
            # Named, resolved here on the worker, sent only to the hosts it is declared for.
            header, secret = credentials.header_for(args.auth, args.url)
            headers.update(header)
            secrets.append(secret)
        what = f"{args.method} {args.url}"
        try:
            response = await http_call(args.method, args.url, body=args.body, headers=headers)
            check_status(response, what)
        except (ToolError, NotSent, OutcomeUnknown) as err:
            if secrets:  # a service may echo what it was sent
                raise _redacted(err, secrets) from None
            raise
        body = response.content[: args.max_bytes].decode(response.encoding or "utf-8", errors="replace")
        body = credentials.redact(body, secrets)
        parsed = None
        try:
            parsed = response.json()
        except ValueError:
            pass
        receipt: dict = {"status": response.status_code, "body": call.store.put_text(body).digest}
        if isinstance(parsed, dict) and isinstance(parsed.get("id"), (str, int)):
            receipt["id"] = parsed["id"]
        return {**receipt, **_replayed(response)}

    def describe(self, call: EffectCall, args: HttpRequestArgs, receipt: dict) -> str:
        head = f"{args.method} {args.url} -> HTTP {receipt.get('status')}"
        if "id" in receipt:
            head += f" (id {receipt['id']})"
        head += _how(receipt)
        digest = receipt.get("body")
        body = call.store.get_text(digest) if isinstance(digest, str) and call.store.has(digest) else ""
        return f"{head}\n{body}" if body else head


def _redacted(err: ToolError | NotSent | OutcomeUnknown, secrets: list[str]) -> Exception:
    """The same error with the secrets taken out of its message."""
    message = credentials.redact(str(err.args[0]) if err.args else "", secrets)
    if isinstance(err, ToolError):
        return ToolError(message, output=err.output)
    return type(err)(message, retry_after_s=err.retry_after_s)


class SendEmailTool(EffectTool):
    def target(self, args: SendEmailArgs) -> str:
        return args.to

    async def send(self, call: EffectCall, args: SendEmailArgs) -> dict:
        base = _service(call.tool, "PERDURE_MAIL_URL", "mail")
        sender = os.environ.get("PERDURE_MAIL_FROM", "").strip() or DEFAULT_MAIL_FROM
        domain = sender.rstrip(">").rpartition("@")[2] or "perdure.invalid"
        message = {
            "from": sender,
            "to": [args.to],
            "subject": args.subject,
            "text": args.body,
            # The key as Message-ID too: a mail server or client that sees it twice knows it is one message.
            "headers": {"Message-ID": f"<{call.key}@{domain}>"},
        }
        headers = {"Idempotency-Key": call.key, **_auth("PERDURE_MAIL_KEY")}
        response = await http_call("POST", f"{base}/emails", body=message, headers=headers)
        check_status(response, "the mail API")
        reply = _json(response, "the mail API")
        if not isinstance(reply, dict) or not reply.get("id"):
            raise OutcomeUnknown(f"the mail API accepted the message but returned no id: {_excerpt(response)}")
        return {"message_id": str(reply["id"]), "to": args.to, **_replayed(response)}

    def describe(self, call: EffectCall, args: SendEmailArgs, receipt: dict) -> str:
        return f"sent '{args.subject}' to {args.to} (message id {receipt.get('message_id')}{_how(receipt)})"


class NotifyWebhookTool(EffectTool):
    def target(self, args: NotifyWebhookArgs) -> str:
        return args.url

    async def send(self, call: EffectCall, args: NotifyWebhookArgs) -> dict:
        # The key travels for the receiver's logs; this receiver is assumed not to deduplicate.
        response = await http_call("POST", args.url, body=args.payload, headers={"X-Perdure-Effect-Key": call.key})
        status = response.status_code
        if 200 <= status < 300:
            return {"status": status}
        excerpt = _excerpt(response)
        if status == 429:
            raise NotSent(f"the webhook answered HTTP 429 (rate-limited): {excerpt}")
        if status == 408 or status >= 500:
            raise OutcomeUnknown(f"the webhook answered HTTP {status}: {excerpt}")
        raise ToolError(f"the webhook refused the payload with HTTP {status}: {excerpt}")

    def describe(self, call: EffectCall, args: NotifyWebhookArgs, receipt: dict) -> str:
        return f"delivered to {args.url} (HTTP {receipt.get('status')}{_how(receipt)})"


class MakePaymentTool(EffectTool):
    def target(self, args: MakePaymentArgs) -> str:
        return f"the payments API (payee {args.recipient})"

    async def send(self, call: EffectCall, args: MakePaymentArgs) -> dict:
        base = _service(call.tool, "PERDURE_PAYMENTS_URL", "payments")
        headers = {"Idempotency-Key": call.key, **_auth("PERDURE_PAYMENTS_KEY")}
        response = await http_call("POST", f"{base}/payments", body=args.model_dump(mode="json"), headers=headers)
        check_status(response, "the payments API")
        reply = _json(response, "the payments API")
        if not isinstance(reply, dict) or not reply.get("id"):
            raise OutcomeUnknown(f"the payments API answered without a payment id: {_excerpt(response)}")
        return {"payment_id": str(reply["id"]), "status": str(reply.get("status", "")), **_replayed(response)}

    def describe(self, call: EffectCall, args: MakePaymentArgs, receipt: dict) -> str:
        amount = f"{args.amount_cents / 100:.2f} {args.currency}"
        return f"paid {amount} to {args.recipient} (payment {receipt.get('payment_id')}{_how(receipt)})"


class RefundPaymentTool(EffectTool):
    def target(self, args: RefundPaymentArgs) -> str:
        return f"the payments API (refund of {args.payment_id or args.payment_key})"

    async def send(self, call: EffectCall, args: RefundPaymentArgs) -> dict:
        base = _service(call.tool, "PERDURE_PAYMENTS_URL", "payments")
        auth = _auth("PERDURE_PAYMENTS_KEY")
        payment_id = args.payment_id
        if payment_id is None:
            # A compensation is registered before its payment is sent, so it may name
            # the payment only by its key; a payment that never happened needs no refund.
            response = await http_call("GET", f"{base}/payments?idempotency_key={args.payment_key}", headers=auth)
            check_status(response, "the payments API")
            found = (_json(response, "the payments API") or {}).get("data") or []
            if not found:
                return {"refund_id": None, "payment_id": None}
            payment_id = str(found[0]["id"])
        headers = {"Idempotency-Key": call.key, **auth}
        body = {"payment_id": payment_id, "reason": args.reason}
        response = await http_call("POST", f"{base}/refunds", body=body, headers=headers)
        if response.status_code == 400 and "already_refunded" in response.text:
            existing = (_json(response, "the payments API").get("error") or {}).get("refund_id")
            return {"refund_id": existing, "payment_id": payment_id, "already": True}
        check_status(response, "the payments API")
        reply = _json(response, "the payments API")
        return {"refund_id": str(reply.get("id")), "payment_id": payment_id, **_replayed(response)}

    def describe(self, call: EffectCall, args: RefundPaymentArgs, receipt: dict) -> str:
        if receipt.get("payment_id") is None:
            return f"nothing to refund: no payment was made under key {args.payment_key}"
        if receipt.get("already"):
            return f"payment {receipt['payment_id']} was already refunded (refund {receipt.get('refund_id')})"
        return f"refunded payment {receipt['payment_id']} (refund {receipt.get('refund_id')}{_how(receipt)})"


# --- git ------------------------------------------------------------------------------


def git_env() -> dict[str, str]:
    """Enough for git and the user's own git config; no worker secrets, no inherited GIT_DIR."""
    env = {
        "PATH": os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "GIT_TERMINAL_PROMPT": "0",
    }
    if os.environ.get("HOME"):
        env["HOME"] = os.environ["HOME"]
    return env


# The workspace is the model's to write (run_command), .git included: none of the
# programs a repository's own hooks or config could make git run on the worker, outside
# the command sandbox, may run. Hooks, the filesystem monitor and signing are switched
# off for every call; a repository whose local config names other programs is refused.
GIT_OVERRIDES = (
    "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
    "-c", "commit.gpgSign=false", "-c", "tag.gpgSign=false",
)  # fmt: skip
LOCAL_PROGRAM_KEYS = (
    r"^(filter\..*|diff\..*\.(command|textconv)|merge\..*\.driver"
    r"|core\.(sshcommand|pager|editor|askpass|gitproxy)|gpg\..*)$"
)


async def refuse_repository_programs(root: Path) -> None:
    """Refuse a repository whose own config names a program git would run (a filter, a
    diff or merge driver, a pager, an ssh or gpg program)."""
    code, out = await git(root, "config", "--local", "--get-regexp", LOCAL_PROGRAM_KEYS, check=False)
    if code == 0 and out.strip():
        keys = sorted({line.split()[0] for line in out.splitlines() if line.strip()})
        raise ToolError(
            f"the repository's own config names programs git would run on the worker ({', '.join(keys)}); "
            "remove them from .git/config (a person's global git config is not affected)"
        )


async def git(cwd: Path, *args: str, check: bool = True) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "git",
        *GIT_OVERRIDES,
        *args,
        cwd=cwd,
        env=git_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=GIT_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ToolError(f"git {args[0]} did not finish in {GIT_TIMEOUT_S:g}s") from None
    text = out.decode("utf-8", errors="replace").strip()
    if check and proc.returncode != 0:
        raise ToolError(f"git {' '.join(args[:2])} failed (exit {proc.returncode}): {preview(text, 600)}")
    return proc.returncode or 0, text


_repo_locks: dict[Path, asyncio.Lock] = {}


def repo_lock(root: Path) -> asyncio.Lock:
    """One git write at a time per repository in this worker: parallel steps would race for index.lock."""
    return _repo_locks.setdefault(root, asyncio.Lock())


async def _repo(workspace: Path) -> Path:
    root = workspace_root(workspace)
    code, _ = await git(root, "rev-parse", "--show-toplevel", check=False)
    if code != 0:
        raise ToolError(f"the workspace {workspace} is not inside a git repository")
    await refuse_repository_programs(root)
    return root


async def find_commit(root: Path, trailer: str, value: str) -> str | None:
    """The newest commit in HEAD's history whose `trailer:` equals value."""
    code, _ = await git(root, "rev-parse", "--verify", "-q", "HEAD", check=False)
    if code != 0:
        return None  # no commits yet
    _, out = await git(
        root,
        "log",
        "-F",
        f"--grep={trailer}: {value}",
        f"--format=%H%x09%(trailers:key={trailer},valueonly,separator=%x2C)",
        "HEAD",
    )
    for line in out.splitlines():
        sha, _, values = line.partition("\t")
        if value in [v.strip() for v in values.split(",")]:
            return sha
    return None


async def _identity(root: Path) -> list[str]:
    """Use the repository's identity; fall back to perdure's own only when none is configured."""
    _, email = await git(root, "config", "user.email", check=False)
    return [] if email else ["-c", "user.name=perdure", "-c", "user.email=perdure@localhost"]


def _pathspecs(root: Path, paths: list[str] | None) -> list[str]:
    if not paths:
        return ["."]
    specs = []
    real_root = workspace_root(root)
    for path in paths:
        try:
            resolved = resolve_in_workspace(root, path)
        except WorkspaceEscape as err:
            raise ToolError(str(err)) from None
        rel = resolved.relative_to(real_root).as_posix() or "."
        specs.append(f":(literal){rel}")
    return specs


async def _commit_keyed(root: Path, key: str, message: str, *options: str) -> str:
    """Commit what is staged with the effect key as a trailer, so `lookup` can find it; the new commit's sha."""
    await git(
        root, *await _identity(root), "commit", "-q", "-m", message, "--trailer", f"{EFFECT_TRAILER}: {key}", *options
    )
    _, sha = await git(root, "rev-parse", "HEAD")
    return sha


class GitEffectTool(EffectTool):
    """A commit in the workspace's repository: found again by its effect-key trailer, written one at a time."""

    needs_workspace = True

    def target(self, args: Any) -> str:
        return "the workspace's git repository"

    async def lookup(self, call: EffectCall, args: Any) -> dict | None:
        root = await _repo(call.workspace)
        sha = await find_commit(root, EFFECT_TRAILER, call.key)
        return {"commit": sha, "found_by": f"its {EFFECT_TRAILER} trailer"} if sha else None

    async def send(self, call: EffectCall, args: Any) -> dict:
        root = await _repo(call.workspace)
        async with repo_lock(root):
            return await self.write(root, call, args)

    @abstractmethod
    async def write(self, root: Path, call: EffectCall, args: Any) -> dict:
        """The commit itself, under the repository's lock."""


class GitCommitTool(GitEffectTool):
    async def write(self, root: Path, call: EffectCall, args: GitCommitArgs) -> dict:
        specs = _pathspecs(call.workspace, args.paths)
        await git(root, "add", "-A", "--", *specs)
        code, _ = await git(root, "diff", "--cached", "--quiet", "--", *specs, check=False)
        if code == 0:
            raise ToolError(f"nothing to commit in {', '.join(args.paths or ['the workspace'])}")
        return {"commit": await _commit_keyed(root, call.key, args.message, "--", *specs)}

    def describe(self, call: EffectCall, args: GitCommitArgs, receipt: dict) -> str:
        subject = args.message.strip().splitlines()[0] if args.message.strip() else ""
        return f"committed {receipt.get('commit')} '{subject}' ({EFFECT_TRAILER}: {call.key}{_how(receipt)})"


class GitRevertTool(GitEffectTool):
    async def write(self, root: Path, call: EffectCall, args: GitRevertArgs) -> dict:
        original = await find_commit(root, EFFECT_TRAILER, args.effect_key)
        if original is None:
            # The commit this compensates never happened (or is not in HEAD's history).
            return {"commit": None, "reverted": None}
        code, out = await git(root, *await _identity(root), "revert", "--no-commit", original, check=False)
        if code != 0:
            await git(root, "revert", "--abort", check=False)
            raise ToolError(f"cannot revert {original} cleanly: {preview(out, 600)}")
        staged, _ = await git(root, "diff", "--cached", "--quiet", check=False)
        if staged == 0:
            await git(root, "revert", "--quit", check=False)
            return {"commit": None, "reverted": original, "already": True}
        _, subject = await git(root, "log", "-1", "--format=%s", original)
        message = f'Revert "{subject}"\n\nThis reverts commit {original}.'
        sha = await _commit_keyed(root, call.key, message, "--trailer", f"{REVERTS_TRAILER}: {args.effect_key}")
        return {"commit": sha, "reverted": original}

    def describe(self, call: EffectCall, args: GitRevertArgs, receipt: dict) -> str:
        if receipt.get("reverted") is None and receipt.get("commit") is None:
            return f"nothing to revert: no commit in HEAD's history carries {EFFECT_TRAILER}: {args.effect_key}"
        if receipt.get("already"):
            return f"commit {receipt['reverted']} is already undone in the working tree; no revert commit needed"
        return f"reverted {receipt.get('reverted') or 'the commit'} with {receipt.get('commit')}{_how(receipt)}"


EFFECT_TOOLS: dict[str, EffectTool] = {
    "http_request": HttpRequestTool(),
    "send_email": SendEmailTool(),
    "git_commit": GitCommitTool(),
    "git_revert": GitRevertTool(),
    "notify_webhook": NotifyWebhookTool(),
    "make_payment": MakePaymentTool(),
    "refund_payment": RefundPaymentTool(),
}
