"""What every tool is, whatever it does: the generic types of a tool's declaration.

A tool declares a risk class (what its effect reaches) and a replay policy (what a
retry after an interrupted attempt may do):
- `safe`: re-run freely (reads, overwrites inside the workspace);
- `keyed`: re-send with the same effect key to a service that deduplicates it;
- `check`: look the effect up by its key before writing, write only if absent;
- `once`: never re-run; a retry after an interrupted attempt is `uncertain`.

`ToolSpec` holds a tool's facts as data (name, risk, replay, description, argument
model, timeouts, where it may run); `Tool` is a declaration: its spec and the two pure
rules of its effect, `effect` (what the call reaches, does and sends: the effect key is
made from it) and `undo` (the compensation, known before the effect is attempted). The
built-in tools are declared one module each in `perdure.activities.tools.catalogue`,
which gathers them; tools from MCP servers are declared by the goal's catalogue
(workflows/shared/mcp_tools.py). No tool's own facts live here, and nothing here does
I/O: the workflow reads all of it.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from perdure.workflows.shared.retries import HEARTBEAT_TIMEOUT, ONCE_HEARTBEAT

RiskClass = Literal["read", "local-write", "remote-write", "irreversible"]
# The risk classes whose calls reach outside the workspace: prepared, keyed and recorded first.
WRITE_RISKS: tuple[RiskClass, ...] = ("remote-write", "irreversible")
ReplayPolicy = Literal["safe", "keyed", "check", "once"]
ExpiryOutcome = Literal["deny", "park", "abort", "happened", "not_happened"]
"""What a question decides when nobody answers it by its deadline (workflows/goal/rules/question_deadline_rules.py)."""
ExpiryAssumption = Literal["happened", "not_happened"]
"""The outcomes that assume what became of an uncertain call: only for a tool that declares them safe."""

HTTP_URL = r"^https?://"
EFFECT_KEY = r"^fx-[0-9a-f]{32}$"
"""An effect key as `perdure.workflows.shared.effects.effect_key` makes it (an argument naming an effect)."""
FAILED_COST = "failed_cost_usd"
"""In a tool activity's failure details and heartbeat: what its failed attempts so far reported
they cost (a user's paid read; activities/tools/user/user_tool_runs.py). The goal charges it."""


class ToolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


def preview_value(value: object, limit: int = 40) -> str:
    """A short repr for an error message: a model may send a megabyte where a digest goes."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ToolSpec(BaseModel):
    name: str
    risk: RiskClass
    replay: ReplayPolicy
    description: str
    args_model: type[BaseModel] = Field(
        description="The arguments' pydantic model (a built-in tool's is a ToolArgs; a user's own may be any)."
    )
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
    needs_workspace: bool = Field(
        default=False, description="Runs on the goal's workspace: only where it exists, under the node's fence."
    )
    on_devices: bool = Field(default=False, description="A device (`perdure device`) may offer it.")
    versioned_write: bool = Field(
        default=False,
        description="Writes a file based on a version of it: the goal sends what the node saw (ToolInput.based_on).",
    )
    runs_commands: bool = Field(
        default=False,
        description="Runs a shell command in the sandbox: the goal's or step's network permission reaches it, "
        "and an interrupted run is re-run only when the command is replay-safe.",
    )
    refused_when_superseded: bool = Field(
        default=False,
        description="A superseded call is not started: its node's newer work must not be overwritten. Other "
        "workspace calls still present their token (a newer run's read fences the older run's writes).",
    )
    low_value: bool = Field(
        default=False,
        description="Dropped first when a goal runs degraded (past its soft budget gate): it widens the search "
        "rather than finish the work.",
    )
    max_cost_usd: float | None = Field(
        default=None,
        ge=0,
        description="A paid tool's most costly call: reserved from the cost budget before a step calls it "
        "(workflows/goal/spend.py); what each call cost is charged as the tool reports it.",
    )

    safe_on_expiry: tuple[ExpiryAssumption, ...] = Field(
        default=(),
        description="What may be assumed of an uncertain call of this tool when the question asking whether it "
        "happened expires unanswered: `happened` (it is not sent again), `not_happened` (it is sent once more). "
        "A step, plan or tool asking for an assumption the tool does not declare is refused.",
    )
    on_expiry: ExpiryOutcome | None = Field(
        default=None,
        description="The outcome the questions about its calls take on expiry when their step, plan and goal "
        "name none (an assumption only if declared in safe_on_expiry).",
    )

    def expiry_problem(self, outcome: str | None) -> str | None:
        """Why `outcome` may not decide this tool's uncertain calls on expiry, or None."""
        if outcome not in ("happened", "not_happened") or outcome in self.safe_on_expiry:
            return None
        declared = ", ".join(self.safe_on_expiry) or "nothing"
        return (
            f"on_expiry {outcome} assumes what became of a {self.name} call, and {self.name} does not declare "
            f"that safe (it declares: {declared}); use deny, park or abort"
        )

    def json_schema(self) -> dict:
        """The arguments' JSON schema, as a model is shown it. Shared: do not change it."""
        return self.input_schema if self.input_schema is not None else args_schema(self.args_model)


@functools.cache
def args_schema(model: type[BaseModel]) -> dict:
    """A built-in tool's argument schema, built once: pydantic builds it anew on every call
    (0.3 ms for a tool, on every agent turn and planner prompt)."""
    return model.model_json_schema()


class Effect(NamedTuple):
    """What a write reaches (`target`), does (`action`) and sends (`payload`): its effect key's material."""

    target: str
    action: str
    payload: Any


class Compensation(BaseModel):
    """The tool call that undoes one effect; itself keyed, so running it twice undoes once."""

    tool: str
    args: dict
    reason: str


class Tool:
    """One tool's declaration: its facts (`spec`), a valid call's arguments (`example`, what
    the catalogue check builds its effect and compensation from) and the pure rules of its
    effect. Worker code adds how it runs (activities/tools/catalogue/tool_base.py).

    `effect` and `undo` run in the workflow (a write prepared there) and in the activity
    alike, and must answer the same on both: pure functions of the validated arguments.
    """

    spec: ToolSpec
    example: ClassVar[dict[str, Any]] = {}

    def effect(self, args: Any, workspace: str) -> Effect | None:
        """What a remote-write call reaches, does and sends; None for a tool with no remote effect.

        The payload is everything that goes into the request, so a changed body is a new
        effect; output formatting options (max_bytes) and the undo recipe are not."""
        del args, workspace
        return None

    def undo(self, key: str, args: Any) -> Compensation | None:
        """The call that undoes the effect made under `key`, known before it is attempted."""
        del key, args
        return None


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

DEVICE_NAME = r"^[a-z0-9][a-z0-9-]{0,47}$"
"""A device's name (`perdure device --name`): its task queue is perdure-device-NAME."""

ApprovalRule = Literal["always", "never", "risk>=local-write"]
"""When a device call needs a person's approval: every call, no call, or calls whose risk
is local-write or more (a read-only command counts as a read)."""
