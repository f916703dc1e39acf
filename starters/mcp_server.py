"""`perdure mcp`: perdure served to MCP clients (an agent, an IDE) as tools and resources,
over stdio or streamable HTTP, with the official `mcp` SDK.

Tools: `start_goal`; the steering verbs `steer`, `queue`, `answer`, `approve`, `park`,
`resume`, `signal`, `narrow`, `rewind`, `abort`; and the reads `goal_status`, `goal_inbox`,
`goal_report`. Resources: `perdure://goals/{goal_id}/progress` (JSON) and
`perdure://goals/{goal_id}/report` (markdown). Each does what the CLI and the web UI do,
through the same client (starters/client/), so a message sent here gets the same request
id rules and receipts.

A mutating call takes an optional `request_id`; without one the server makes one, and the
result names it (`request_id_made`): calling again with that id is a retry, deduplicated by
the goal like any client's. A start with the same request id names the same goal.

Every failure a caller can cause or meet (bad arguments, an unknown goal, no worker, Temporal
unreachable) is a tool error (`isError`) saying what was wrong; the server keeps serving.
It connects to Temporal at its first call, so it starts, and lists its tools, while Temporal
is down. A client only: it never reads the workers' environment or model keys.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError, UnexpectedToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field, ValidationError
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from perdure.runtime import settings
from perdure.runtime.connect import ServerUnavailable, connect
from perdure.starters.client import PerdureClient
from perdure.starters.client.client_errors import (
    EndedWithoutResult,
    GoalNotFound,
    ResultUnreadable,
    StillRunning,
)
from perdure.starters.client.goal_reads import ClosedReport
from perdure.starters.client.goal_specs import GOAL_ID_PATTERN, StartRequest, start_spec
from perdure.starters.client.message_delivery import InboxResult
from perdure.workflows.goal.contracts.goal_contracts import ProgressSnapshot
from perdure.workflows.goal.contracts.messages import (
    REQUEST_ID,
    Abort,
    Answer,
    Approve,
    Narrow,
    Park,
    Queue,
    Resume,
    Rewind,
    Signal,
    Steer,
)
from perdure.workflows.goal.contracts.plan import describe_validation_error

INSTRUCTIONS = (
    "perdure runs long goals durably on Temporal. Start one with start_goal, follow it with goal_status "
    "(or the perdure://goals/{goal_id}/progress resource), answer its questions with answer or approve, "
    "and read its report with goal_report once it ends. Pass your own request_id on a call you may retry."
)
QUERY_TIMEOUT_S = 5.0
_NO_WORKER = "is a worker running (`perdure worker`) on the goal's task queue?"

MUTATES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
ENDS = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)


def _like(model: type[BaseModel], name: str, description: str | None = None) -> Any:
    """A tool parameter typed and limited as `model`'s field `name`: the schema a client
    sees carries the message's own limits, and the message stays the one judge of them."""
    field = model.model_fields[name]
    return Annotated[field.annotation, field, Field(description=description or field.description)]


GoalId = Annotated[str, Field(pattern=GOAL_ID_PATTERN.pattern, description="The goal's id, as start_goal returned it.")]
RequestId = Annotated[
    str | None,
    Field(
        pattern=REQUEST_ID,
        description="Your id for this message. Sending again with the same id and content is a retry (one "
        "message); other content under a used id is refused. Made by the server when absent (the result names it).",
    ),
]
Text = _like(Steer, "text", "What the goal should take into account, in words the model reads.")
Work = _like(Queue, "text", "The follow-up work, in words the model reads.")
QuestionId = _like(Answer, "question_id", "The question's id (e.g. q1), from goal_status's questions.")
Choice = _like(Answer, "choice", "One of the question's option ids.")
Note = _like(Answer, "text", "A note that goes with the answer.")
Steps = Annotated[
    list[str] | None,
    Field(description="approve_some / refuse_some on an approvals-ahead card: the step names it picks (its `ahead`)."),
]
Approved = _like(Approve, "approved", "True to approve, false to refuse what the question proposes.")
Reason = _like(Park, "reason", "What the goal waits for.")
Until = _like(Park, "until", "Wake at this time (ISO 8601, UTC unless it has an offset); else wait for resume.")
ExpiryHours = _like(Park, "expiry_hours", "Ask a person again after this many hours parked.")
UntilFile = _like(Park, "until_file", "Resume by itself once this path (relative to the goal's workspace) exists.")
UntilCommand = _like(Park, "until_command", "Resume by itself once this command, sandboxed in the workspace, exits 0.")
UntilSignal = _like(Park, "until_signal", "Resume by itself once the `signal` tool sends this name.")
PollFirst = _like(Park, "poll_first_s", "Seconds before the first check of a file or command; the wait doubles.")
PollMax = _like(Park, "poll_max_s", "The longest wait between checks, in seconds.")
SignalName = _like(Signal, "name", "The name a park waits for (park's until_signal).")
Premises = _like(Narrow, "premises", 'Premise key -> new value, e.g. {"scope": "module_a"}.')
Why = _like(Narrow, "why", "Why the requirement changed.")
Node = _like(Rewind, "node", "The step to void (with what depends on it), by its name in goal_status.")
Wrong = _like(Rewind, "why", "What was wrong with it; the model is shown this.")
AbortReason = _like(Abort, "reason", "Why the goal stops.")
Rollback = _like(Abort, "rollback", "Run the registered compensations (refunds, reverts), newest first.")


class StartResult(BaseModel):
    goal_id: str
    started: bool = Field(description="False: this start was already done (a retry); nothing new started.")
    text: str
    request_id: str | None = Field(description="The request id the start was made under (none when an id was given).")
    request_id_made: bool = Field(description="True when the server made the request id: pass it to retry safely.")
    warnings: list[str] = Field(default_factory=list, description="What could not be checked, e.g. no worker ran.")


class SendResult(BaseModel):
    goal_id: str
    request_id: str
    request_id_made: bool = Field(description="True when the server made the request id: pass it to retry safely.")
    kind: str
    status: Literal["pending", "applied"] = Field(
        description="applied: the goal took it; pending: admitted, and judged in the order it was sent."
    )
    via: Literal["update", "signal"] = Field(
        description="update: a worker judged it at once; signal: the server stored it while no worker answered."
    )
    note: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class _Temporal:
    """The server's one client, connected at the first call that needs it and again after
    a failed try, so the server outlives a Temporal that is down."""

    def __init__(self, connect_to: Callable[[], Awaitable[Client]]) -> None:
        self._connect_to = connect_to
        self._client: PerdureClient | None = None
        self._lock = asyncio.Lock()

    async def client(self) -> PerdureClient:
        async with self._lock:
            if self._client is None:
                self._client = PerdureClient(await self._connect_to())
            return self._client


@contextmanager
def _plainly(error: type[Exception] = ToolError, missing: type[Exception] = ToolError) -> Iterator[None]:
    """What went wrong, as `error` (a tool error, or a resource error) in words a caller acts on."""
    try:
        yield
    except GoalNotFound as err:
        raise missing(str(err)) from None
    except (ServerUnavailable, settings.TemporalConfigError, ValueError) as err:
        # ValueError: a refusal perdure worded (a bad plan, a start that clashes, a rejected message).
        raise error(str(err)) from None
    except WorkflowQueryFailedError as err:
        raise error(f"the goal did not answer: {err}") from None
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise missing(f"no such goal: {err.message}") from None
        if err.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
            # The SDK ends a call at its rpc_timeout with either, "Timeout expired".
            raise error(f"no worker answered within {QUERY_TIMEOUT_S:g} s: {_NO_WORKER}") from None
        if err.status == RPCStatusCode.UNAVAILABLE:
            raise error(f"Temporal is unreachable: {err.message}") from None
        raise error(f"Temporal: {err.message}") from None


def _tool_taking(model: type[BaseModel]) -> Callable[[Callable[[Any], Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """A tool whose parameters are `model`'s fields (names, types, limits, descriptions), so
    the schema a client lists is the model's own; the function is given the model."""

    def wrap(fn: Callable[[Any], Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def tool(**fields: Any) -> Any:
            try:
                body = model.model_validate(fields)
            except ValidationError as err:
                raise ToolError(describe_validation_error(err)) from None
            return await fn(body)

        tool.__name__, tool.__doc__ = fn.__name__, fn.__doc__
        parameters = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[field.annotation, field])
            for name, field in model.model_fields.items()
        ]
        returns = inspect.signature(fn, eval_str=True).return_annotation
        tool.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
        return tool

    return wrap


class PerdureMCP(MCPServer):
    """The SDK's server, with arguments that fail their schema refused in one line per
    problem (`field: what is wrong`) instead of pydantic's report with its links, and
    arguments a tool does not take refused rather than dropped: `approve` with
    `"approve": false` for `"approved": false` would otherwise approve."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        tool = next((t for t in await self.list_tools() if t.name == name), None)
        takes = tool.input_schema.get("properties", {}) if tool is not None else {}
        unknown = sorted(set(arguments) - set(takes))
        if tool is not None and unknown:
            raise ToolError(
                f"{name}: unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                f"it takes: {', '.join(takes)}"
            )
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as err:
            cause = err.__cause__
            if isinstance(cause, ValidationError) and not isinstance(err, UnexpectedToolError):
                raise ToolError(f"{name}: wrong arguments: {describe_validation_error(cause)}") from cause
            raise


def build_server(connect_to: Callable[[], Awaitable[Client]] = connect) -> PerdureMCP:
    """The MCP server over the goals on the configured Temporal (perdure.runtime.connect)."""
    temporal = _Temporal(connect_to)
    server = PerdureMCP("perdure", instructions=INSTRUCTIONS, log_level="WARNING")

    async def send(goal_id: str, kind: type[BaseModel], request_id: str | None, **fields: Any) -> SendResult:
        rid = request_id or PerdureClient.new_request_id("mcp")
        try:
            message = kind(request_id=rid, **fields)
        except ValidationError as err:
            raise ToolError(describe_validation_error(err)) from None
        with _plainly():
            delivery = await (await temporal.client()).send(goal_id, message)
        said = SendResult(
            goal_id=goal_id, request_id=rid, request_id_made=request_id is None, kind=message.kind, status="pending",
            via="signal",
        )  # fmt: skip
        if delivery.stuck is not None:
            said.note = (
                f"the goal is stuck: its workflow task fails ({delivery.stuck}). The server stored the message; it "
                "is applied once a worker can run the goal again."
            )
            return said
        receipt = delivery.receipt
        if receipt is None:
            said.note = (
                "no worker answered, so the server stored the message; the goal judges it in the order it was "
                "sent once a worker runs (`perdure worker`). Read its receipt with goal_inbox."
            )
            return said
        if receipt.status == "rejected":
            # Admitted, then judged in its turn: it could not apply.
            raise ToolError(f"rejected: {receipt.note or 'no reason given'} (request id {rid})")
        return said.model_copy(
            update={"status": receipt.status, "via": "update", "note": receipt.note, "detail": receipt.detail}
        )

    @server.tool(annotations=MUTATES)
    @_tool_taking(StartRequest)
    async def start_goal(body: StartRequest) -> StartResult:
        """Start a goal from text (`goal`) or a plan (`plan`: a plan file's content), with `perdure start`'s
        options. A start repeated with the same request_id (or the same id and spec) names the same goal and
        starts nothing new. The workspace is a directory on the workers' machine."""
        made = body.id is None and body.request_id is None
        if made:
            body = body.model_copy(update={"request_id": PerdureClient.new_request_id("mcp")})
        with _plainly():
            spec, goal_id = start_spec(body)
            answer = await (await temporal.client()).start_spec(spec, goal_id, replace=body.replace)
        return StartResult(
            goal_id=answer.goal_id, started=answer.started, text=answer.text, request_id=body.request_id,
            request_id_made=made, warnings=list(answer.warnings),
        )  # fmt: skip

    @server.tool(annotations=MUTATES)
    async def steer(goal_id: GoalId, text: Text, request_id: RequestId = None) -> SendResult:
        """Guide the goal: applied at its next model turn and kept from then on."""
        return await send(goal_id, Steer, request_id, text=text)

    @server.tool(annotations=MUTATES)
    async def queue(goal_id: GoalId, text: Work, request_id: RequestId = None) -> SendResult:
        """Queue follow-up work, planned when the goal's current work is done."""
        return await send(goal_id, Queue, request_id, text=text)

    @server.tool(annotations=MUTATES)
    async def answer(
        goal_id: GoalId, question_id: QuestionId, choice: Choice, text: Note = None, steps: Steps = None,
        request_id: RequestId = None,
    ) -> SendResult:  # fmt: skip
        """Answer a question the goal asked (goal_status lists them with their options); on an
        approvals-ahead card, approve_some / refuse_some name the steps they pick."""
        picked = {"steps": steps} if steps else {}
        return await send(goal_id, Answer, request_id, question_id=question_id, choice=choice, text=text, **picked)

    @server.tool(annotations=MUTATES)
    async def approve(
        goal_id: GoalId, question_id: QuestionId, approved: Approved = True, text: Note = None,
        request_id: RequestId = None,
    ) -> SendResult:  # fmt: skip
        """Approve (or, with approved=false, refuse) what a confirmation question proposes, e.g. an
        irreversible tool call."""
        return await send(goal_id, Approve, request_id, question_id=question_id, approved=approved, text=text)

    @server.tool(annotations=MUTATES)
    async def park(
        goal_id: GoalId, reason: Reason, until: Until = None, expiry_hours: ExpiryHours = 48,
        until_file: UntilFile = None, until_command: UntilCommand = None, until_signal: UntilSignal = None,
        poll_first_s: PollFirst = 2, poll_max_s: PollMax = 300, request_id: RequestId = None,
    ) -> SendResult:  # fmt: skip
        """Pause the goal's dispatching until resume, `until` a time, or one condition (a workspace
        file exists, a command exits 0, a named signal arrives); no stall checks while parked."""
        wake = until.replace(tzinfo=UTC) if isinstance(until, datetime) and until.tzinfo is None else until
        condition = {"until_file": until_file, "until_command": until_command, "until_signal": until_signal}
        return await send(
            goal_id, Park, request_id, reason=reason, until=wake, expiry_hours=expiry_hours,
            poll_first_s=poll_first_s, poll_max_s=poll_max_s, **condition,
        )  # fmt: skip

    @server.tool(annotations=MUTATES)
    async def signal(goal_id: GoalId, name: SignalName, request_id: RequestId = None) -> SendResult:
        """Send a named signal: it ends a park that waits for it (park's until_signal)."""
        return await send(goal_id, Signal, request_id, name=name)

    @server.tool(annotations=MUTATES)
    async def resume(goal_id: GoalId, request_id: RequestId = None) -> SendResult:
        """Resume a parked goal."""
        return await send(goal_id, Resume, request_id)

    @server.tool(annotations=MUTATES)
    async def narrow(goal_id: GoalId, premises: Premises, why: Why = None, request_id: RequestId = None) -> SendResult:
        """Change the goal's premises: the work they invalidate is voided, the rest kept."""
        return await send(goal_id, Narrow, request_id, premises=premises, why=why)

    @server.tool(annotations=MUTATES)
    async def rewind(goal_id: GoalId, node: Node, why: Wrong, request_id: RequestId = None) -> SendResult:
        """Void a step and what depends on it, and record why it was wrong."""
        return await send(goal_id, Rewind, request_id, node=node, why=why)

    @server.tool(annotations=ENDS)
    async def abort(
        goal_id: GoalId, reason: AbortReason = "aborted by the user", rollback: Rollback = False,
        request_id: RequestId = None,
    ) -> SendResult:  # fmt: skip
        """Stop the goal: it dispatches nothing more and finishes with its report and the unfinished list."""
        return await send(goal_id, Abort, request_id, reason=reason, rollback=rollback)

    async def progress(goal_id: str, missing: type[Exception] = ToolError, error: type[Exception] = ToolError):
        with _plainly(error, missing):
            client = await temporal.client()
            if not await client.worker_polls(goal_id):
                raise error(f"no worker runs the goal, so it cannot answer: {_NO_WORKER}")
            return await client.progress(goal_id, timeout_s=QUERY_TIMEOUT_S)

    async def report(goal_id: str, missing: type[Exception] = ToolError, error: type[Exception] = ToolError):
        with _plainly(error, missing):
            try:
                return await (await temporal.client()).report(goal_id)
            except (StillRunning, ResultUnreadable) as err:
                raise error(str(err)) from None
            except EndedWithoutResult as ended:
                raise error(f"the goal ended without a report: {ended}") from None

    @server.tool(annotations=READS)
    async def goal_status(goal_id: GoalId) -> ProgressSnapshot:
        """The goal's progress: phase, steps and their status, open questions, budget used, conclusions, ETA."""
        return await progress(goal_id)

    @server.tool(annotations=READS)
    async def goal_inbox(goal_id: GoalId) -> InboxResult:
        """Every message sent to the goal with its receipt (pending, applied, rejected and why); with no
        worker running, what the server admitted."""
        with _plainly():
            return await (await temporal.client()).messages(goal_id, timeout_s=QUERY_TIMEOUT_S)

    @server.tool(annotations=READS)
    async def goal_report(goal_id: GoalId) -> ClosedReport:
        """A goal's report (markdown) and how it ended, once it has ended."""
        return await report(goal_id)

    @server.resource(
        "perdure://goals/{goal_id}/progress", name="progress", mime_type="application/json",
        description="A goal's progress snapshot (what goal_status returns), read from the goal.",
    )  # fmt: skip
    async def progress_resource(goal_id: str) -> str:
        snapshot = await progress(goal_id, missing=ResourceNotFoundError, error=ResourceError)
        return snapshot.model_dump_json(indent=1)

    @server.resource(
        "perdure://goals/{goal_id}/report", name="report", mime_type="text/markdown",
        description="A closed goal's report, as `perdure result` shows it.",
    )  # fmt: skip
    async def report_resource(goal_id: str) -> str:
        return (await report(goal_id, missing=ResourceNotFoundError, error=ResourceError)).report

    return server
