"""The tool catalogue: names, risk classes, replay policies and argument contracts.

Pure data shared by the planner prompt, plan validation in the workflow and the
tool activities. Implementations live in `activities/tools/run_tool.py` and
`activities/tools/effect_tools.py`; this module must never import them.

Every tool declares a risk class (what its effect reaches) and a replay policy
(what a retry after an interrupted attempt may do):
- `safe`: re-run freely (reads, overwrites inside the workspace);
- `keyed`: re-send with the same effect key to a service that deduplicates it;
- `check`: look the effect up by its key before writing, write only if absent;
- `once`: never re-run; a retry after an interrupted attempt is `uncertain`.

`run_command` is `once` by default (a shell command can append, POST or push), with
three ways out, each making a re-run after an interruption free: the plan step's
`replay: safe`, the call's own `replay: "safe"` argument, or a command on the short
read-only allowlist (`perdure.workflows.shared.effects.read_only_command`).

A command tool (COMMAND_TOOLS) runs its command in a sandbox (activities/tools/sandbox.py):
the workspace and read-only system directories, nothing of the worker's, and no
network unless the goal allows it (`allow_network`) or its plan step says
`network: true`; the workflow passes that as `ToolInput.network`, never as an
argument a model could set.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from perdure.workflows.shared.retries import HEARTBEAT_TIMEOUT, ONCE_HEARTBEAT

RiskClass = Literal["read", "local-write", "remote-write", "irreversible"]
# The risk classes whose calls reach outside the workspace: prepared, keyed and recorded first.
WRITE_RISKS: tuple[RiskClass, ...] = ("remote-write", "irreversible")
ReplayPolicy = Literal["safe", "keyed", "check", "once"]

HTTP_URL = r"^https?://"
EMAIL = r"^[^@\s<>,;]+@[^@\s<>,;]+$"


class ToolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReadFileArgs(ToolArgs):
    path: str = Field(description="Path relative to the workspace root.")
    max_bytes: int = Field(default=65_536, ge=1, le=1_048_576)


class ListDirArgs(ToolArgs):
    path: str = Field(default=".", description="Directory relative to the workspace root.")


BASE_VERSION = r"^sha256:[0-9a-f]{64}$"


class WriteFileArgs(ToolArgs):
    path: str = Field(description="Path relative to the workspace root; the file is overwritten.")
    content: str
    base_version: str | None = Field(
        default=None,
        description="The version of the file your content is based on (a sha256:... digest). Leave it out to "
        "use the version this step last read or wrote; a file it never saw must not exist yet. "
        '"any" replaces whatever the file holds (only when told to discard what is there).',
    )

    @field_validator("base_version", mode="before")
    @classmethod
    def _a_version_or_any(cls, value: object) -> object:
        if value is None or value == "any":
            return value
        expected = 'base_version must be "any" or a file version: "sha256:" and 64 lower-case hex digits'
        if not isinstance(value, str):
            raise ValueError(f"{expected}; got {type(value).__name__} {_preview_value(value)}")
        if len(value) > 100:
            raise ValueError(f"{expected}; got a string of {len(value)} characters")
        if not re.fullmatch(BASE_VERSION, value):
            raise ValueError(f"{expected}; got {value!r}")
        return value


def _preview_value(value: object, limit: int = 40) -> str:
    """A short repr for an error message: a model may send a megabyte where a digest goes."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class RunCommandArgs(ToolArgs):
    command: str = Field(
        description="Shell command, run with /bin/sh in the workspace root, inside a sandbox: only the workspace "
        "(writable, also $HOME) and the system directories (read-only) exist, /tmp is private and emptied "
        "afterwards, background processes end with the command, and there is no network unless the goal "
        "allows it."
    )
    timeout_s: float = Field(default=60, gt=0, le=600)
    replay: Literal["safe"] | None = Field(
        default=None,
        description='"safe" when running the command twice does no harm (tests, builds, linters, reads): if '
        "its run is interrupted (a lost worker), it runs again on its own. Leave it out when the command "
        "appends, sends, pushes, deletes or otherwise changes something: an interrupted run then becomes a "
        "question for a person (did it happen?) and is never repeated on its own.",
    )

    @field_validator("replay", mode="before")
    @classmethod
    def _replay_is_safe_or_absent(cls, value: object) -> object:
        if value is not None and value != "safe":
            raise ValueError(
                f'replay must be "safe" (the command may run again after an interruption) or left out; got {value!r}'
            )
        return value


class ReadArtifactArgs(ToolArgs):
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$", description="Digest of an output named in the conversation.")
    max_bytes: int = Field(default=65_536, ge=1, le=1_048_576)


class HttpGetArgs(ToolArgs):
    url: str = Field(pattern=r"^https?://", description="http or https URL.")
    max_bytes: int = Field(default=65_536, ge=1, le=1_048_576)


# --- remote effects -------------------------------------------------------------


# Headers that carry credentials: never literal in a plan or a model's call.
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "x-auth-token"})
CREDENTIAL_NAME = r"^[A-Z][A-Z0-9_]{0,63}$"
AUTH_DESCRIPTION = (
    "Name of a credential declared on the worker (config file, [credentials]), e.g. GITHUB_TOKEN: the worker "
    "adds it to the request; never the secret itself."
)


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


class SendEmailArgs(ToolArgs):
    to: str = Field(pattern=EMAIL, max_length=320, description="One recipient address.")
    subject: str = Field(min_length=1, max_length=998)
    body: str = Field(description="Plain-text body.")


class GitCommitArgs(ToolArgs):
    message: str = Field(min_length=1, description="Commit message; perdure appends an Effect-Key trailer.")
    paths: list[str] | None = Field(
        default=None, description="Paths relative to the workspace to commit; default: every change in the workspace."
    )


class GitRevertArgs(ToolArgs):
    effect_key: str = Field(pattern=r"^fx-[0-9a-f]{32}$", description="Effect-Key trailer of the commit to revert.")


class NotifyWebhookArgs(ToolArgs):
    url: str = Field(pattern=HTTP_URL)
    payload: dict[str, Any] = Field(description="JSON object POSTed to the webhook.")


class MakePaymentArgs(ToolArgs):
    amount_cents: int = Field(gt=0, le=100_000_000)
    currency: str = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code, upper case.")
    recipient: str = Field(min_length=1, max_length=200)
    memo: str = Field(default="", max_length=500)


class RefundPaymentArgs(ToolArgs):
    payment_key: str | None = Field(
        default=None, pattern=r"^fx-[0-9a-f]{32}$", description="Effect key the payment was made with."
    )
    payment_id: str | None = Field(default=None, min_length=1, description="Payment id from the payments API.")
    reason: str = Field(default="compensation", max_length=500)

    @model_validator(mode="after")
    def _names_a_payment(self) -> RefundPaymentArgs:
        if not self.payment_key and not self.payment_id:
            raise ValueError("give payment_key or payment_id")
        return self


class ToolSpec(BaseModel):
    name: str
    risk: RiskClass
    replay: ReplayPolicy
    description: str
    args_model: type[ToolArgs]
    compensation: str | None = Field(default=None, description="The tool that undoes this one's effect.")
    start_to_close_s: float = Field(default=120, gt=0, description="Recommended start-to-close timeout.")
    heartbeat_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Recommended heartbeat timeout: how fast a killed worker is noticed. The activity "
        "heartbeats in the background whenever one is set.",
    )
    expected_s: float | None = Field(
        default=None,
        gt=0,
        description="Typical duration when it is known in advance (local disk work); None when it depends "
        "on something outside the worker (a network, a command). Decides where the call runs: "
        "workflows/goal/rules/segments.py.",
    )
    input_schema: dict | None = Field(
        default=None,
        description="A tool from an MCP server (workflows/shared/mcp_tools.py): the JSON schema its server gives for "
        "its arguments, which are checked against it; args_model then takes any object.",
    )

    def json_schema(self) -> dict:
        """The arguments' JSON schema, as a model is shown it. Shared: do not change it."""
        return self.input_schema if self.input_schema is not None else args_schema(self.args_model)


@functools.cache
def args_schema(model: type[ToolArgs]) -> dict:
    """A built-in tool's argument schema, built once: pydantic builds it anew on every call
    (0.3 ms for a tool, on every agent turn and planner prompt)."""
    return model.model_json_schema()


REMOTE_TIMEOUTS: dict[str, Any] = {"start_to_close_s": 60, "heartbeat_timeout_s": HEARTBEAT_TIMEOUT.total_seconds()}
"""An HTTP call is bounded at 30 s; heartbeats let a dead worker be noticed within 2 s. A live
worker's heartbeats reach the server about every second (workflows/shared/retries.py), so one that
is more than a second late is judged dead by mistake: harmless for keyed and checked
effects, whose retry sends the same key."""
ONCE_TIMEOUTS: dict[str, Any] = {"start_to_close_s": 60, "heartbeat_timeout_s": ONCE_HEARTBEAT.total_seconds()}
"""A `once` tool's retry is a question for a person, so a busy worker gets more slack."""
LONG_CALL_TIMEOUTS: dict[str, Any] = {"heartbeat_timeout_s": HEARTBEAT_TIMEOUT.total_seconds()}
"""A command or a download may run for minutes (run_command's start-to-close is its own
limit plus 30 s): heartbeats let a killed worker be noticed in seconds, as for a model call.
A command that is not replay-safe is scheduled with ONCE_HEARTBEAT instead
(workflows/goal/tool_runner.py): its retry asks a person."""

TOOL_SPECS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in [
        ToolSpec(
            name="read_file",
            replay="safe",
            expected_s=0.1,
            risk="read",
            description="Read a text file inside the workspace.",
            args_model=ReadFileArgs,
        ),
        ToolSpec(
            name="list_dir",
            replay="safe",
            expected_s=0.1,
            risk="read",
            description="List the entries of a directory inside the workspace.",
            args_model=ListDirArgs,
        ),
        ToolSpec(
            name="read_artifact",
            replay="safe",
            expected_s=0.1,
            risk="read",
            description="Read an earlier output in full by its artifact digest (a compacted conversation "
            "names the digest of each output it shortened).",
            args_model=ReadArtifactArgs,
        ),
        ToolSpec(
            name="write_file",
            replay="safe",
            expected_s=0.1,
            risk="local-write",
            description="Create or overwrite a text file inside the workspace. Writes are versioned: a file "
            "that changed since this step last read or wrote it (a person edited it, another step wrote it) is "
            "not overwritten; the call fails with what changed, and you read the file again and re-apply your "
            "change. Read an existing file before replacing it.",
            args_model=WriteFileArgs,
        ),
        ToolSpec(
            name="run_command",
            # Not re-run after an interruption unless declared or read-only (module
            # docstring): a shell command can reach further than the workspace.
            replay="once",
            risk="local-write",
            description="Run a shell command in the workspace root, in a sandbox (only the workspace and "
            "system directories, no network unless the goal allows it; timeout, output capped). Set "
            '"replay": "safe" for commands that may run twice (tests, builds).',
            args_model=RunCommandArgs,
            **LONG_CALL_TIMEOUTS,
        ),
        ToolSpec(
            name="http_get",
            replay="safe",
            risk="read",
            description="Fetch a URL with HTTP GET and return the start of the body.",
            args_model=HttpGetArgs,
            **LONG_CALL_TIMEOUTS,
        ),
        ToolSpec(
            name="http_request",
            risk="remote-write",
            replay="keyed",
            description="Send a POST, PUT, PATCH or DELETE with a JSON body. The effect key goes out as the "
            "Idempotency-Key header, so a retry is deduplicated by services that support it.",
            args_model=HttpRequestArgs,
            compensation="http_request",
            **REMOTE_TIMEOUTS,
        ),
        ToolSpec(
            name="send_email",
            risk="remote-write",
            replay="keyed",
            description="Send one plain-text email through the mail API configured on the worker.",
            args_model=SendEmailArgs,
            **REMOTE_TIMEOUTS,
        ),
        ToolSpec(
            name="git_commit",
            risk="remote-write",
            replay="check",
            description="Commit changes in the workspace's git repository (all changes, or the given paths).",
            args_model=GitCommitArgs,
            compensation="git_revert",
            **REMOTE_TIMEOUTS,
        ),
        ToolSpec(
            name="git_revert",
            risk="remote-write",
            replay="check",
            description="Revert the commit perdure made under an effect key (a compensation).",
            args_model=GitRevertArgs,
            **REMOTE_TIMEOUTS,
        ),
        ToolSpec(
            name="notify_webhook",
            risk="remote-write",
            replay="once",
            description="POST a JSON payload to a webhook that cannot deduplicate; never sent twice.",
            args_model=NotifyWebhookArgs,
            **ONCE_TIMEOUTS,
        ),
        ToolSpec(
            name="make_payment",
            risk="irreversible",
            replay="keyed",
            description="Pay a recipient through the payments API configured on the worker. "
            "Needs a human confirmation; a refund is registered as its compensation before it is sent.",
            args_model=MakePaymentArgs,
            compensation="refund_payment",
            **REMOTE_TIMEOUTS,
        ),
        ToolSpec(
            name="refund_payment",
            risk="remote-write",
            replay="keyed",
            description="Refund a payment in full (a compensation for make_payment).",
            args_model=RefundPaymentArgs,
            **REMOTE_TIMEOUTS,
        ),
    ]
}

DEVICE_NAME = r"^[a-z0-9][a-z0-9-]{0,47}$"
"""A device's name (`perdure device --name`): its task queue is perdure-device-NAME."""
DEVICE_TOOLS: tuple[str, ...] = ("read_file", "list_dir", "write_file", "run_command", "git_commit", "git_revert")
"""What a device can run: the workspace tools and git commits (git reads are `run_command`
with `git status/diff/log/show`, which are replay-safe). HTTP and payment tools stay on
the workers, which hold their credentials."""

ApprovalRule = Literal["always", "never", "risk>=local-write"]
"""When a device call needs a person's approval: every call, no call, or calls whose risk
is local-write or more (a read-only command counts as a read)."""

VERSIONED_WRITES: frozenset[str] = frozenset({"write_file"})
"""Workspace writes based on a version of their file: the goal sends what the node saw (ToolInput.based_on)."""

COMMAND_TOOLS: frozenset[str] = frozenset({"run_command"})
"""Tools that run a shell command in the sandbox; the goal's or step's network permission reaches them."""

# Offered to an agent by the runtime, not by the plan: on a turn whose prompt was
# compacted, so the model can read in full an output it sees as one line.
COMPACTION_TOOL = "read_artifact"

DEFAULT_TOOLS: list[str] = [
    name for name, spec in TOOL_SPECS.items() if spec.risk in ("read", "local-write") and name != COMPACTION_TOOL
]
"""Tools a goal may use unless it names its own: nothing that reaches outside the workspace."""

# Dropped first when a goal runs degraded (past its soft budget gate): they
# widen the search rather than finish the work.
LOW_VALUE_TOOLS: frozenset[str] = frozenset({"list_dir", "http_get"})
