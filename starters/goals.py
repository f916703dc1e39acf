"""Client-side goal operations: build a spec, start, read progress and results.

Used by the CLI and the demo; talks to Temporal only through the client and
reads the local artifact store for full reports. Holds no goal state.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import get_args

import yaml
from pydantic import BaseModel, Field, ValidationError
from temporalio.api.common.v1 import Payload, WorkflowExecution
from temporalio.api.enums.v1 import EventType, WorkflowExecutionStatus, WorkflowTaskFailedCause
from temporalio.api.failure.v1 import Failure
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistoryEventFilterType,
)
from temporalio.client import WorkflowExecution as WorkflowExecution_
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError, CancelledError, TerminatedError
from temporalio.exceptions import TimeoutError as TimeoutError_
from temporalio.service import RPCError, RPCStatusCode

from perdure.activities.artifacts import ArtifactMissing, default_store
from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.runtime import settings
from perdure.workflows.goal.contracts.plan import (
    AgentStep,
    Plan,
    SubgoalStep,
    ToolStep,
    describe_validation_error,
    parse_plan,
)
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared import search_attributes as sa
from perdure.workflows.shared.contracts import (
    DEFAULT_MAX_TOKENS,
    GOAL_MEMO,
    GOAL_WORKFLOW,
    Budget,
    GoalResult,
    GoalSpec,
    ProgressSnapshot,
    goal_memo,
)
from perdure.workflows.shared.mcp_tools import is_mcp_tool
from perdure.workflows.shared.statuses import Phase


class GoalNotFound(LookupError):
    pass


class BadPlanFile(ValueError):
    pass


class EndedWithoutResult(Exception):
    """The goal closed with no GoalResult: terminated, timed out, cancelled, or failed outside
    the goal's own ending (which always carries its report)."""


SPEC_FIELDS_IN_PLAN = ("device_wait_s", "device_approval", "stall_after_s", "recovery_mode", "verify_after_s")
"""Goal settings a plan file may carry beside its steps (GoalSpec fields, validated there)."""


def load_plan_file(path: Path, allowed_tools: list[str] | None = None) -> tuple[Plan, dict]:
    """Read a YAML/JSON plan file: `steps:` plus optional `goal:`, `constraints:`, `premises:`,
    the device settings `device_wait_s:` and `device_approval:`, and `stall_after_s:`.
    Without `allowed_tools`, any known tool may appear (see `plan_tools`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise BadPlanFile(f"cannot read plan file {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise BadPlanFile(
            f"{path} is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}): "
            "save it as UTF-8 (a plan is YAML or JSON)"
        ) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise BadPlanFile(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {err}") from None
    return plan_from_mapping(data, allowed_tools, str(path))


def plan_from_mapping(data: object, allowed_tools: list[str] | None = None, where: str = "plan") -> tuple[Plan, dict]:
    """A plan file's content, already parsed (a file, or the JSON `perdure ui` is sent):
    the plan and its extras (`goal`, `constraints`, `premises`, the spec settings).
    BadPlanFile says what is wrong, prefixed by `where`."""
    if not isinstance(data, dict):
        raise BadPlanFile(f"{where}: expected a mapping with a 'steps' list at the top level")
    data = dict(data)
    extras = {k: data.pop(k) for k in ("goal", "constraints", "premises", *SPEC_FIELDS_IN_PLAN) if k in data}
    premises = extras.get("premises")
    if premises is not None and (
        not isinstance(premises, dict) or not all(isinstance(v, str) for v in premises.values())
    ):
        raise BadPlanFile(f"{where}: 'premises' must map each key to a string value, e.g. scope: all_modules")
    constraints = extras.get("constraints")
    if constraints is not None and (
        not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints)
    ):
        # A single string would be taken letter by letter as constraints.
        raise BadPlanFile(f"{where}: 'constraints' must be a list of strings, e.g. [\"touch only docs/\"]")
    # Without a list, a plan allows what it names: any built-in tool, and MCP tools, which
    # only a worker can list (the goal checks them against its servers' catalogue).
    plan, problem = parse_plan(data, allowed_tools or [*TOOL_SPECS, *mcp_tools_named(data)])
    if plan is None:
        raise BadPlanFile(f"{where}: {problem}")
    return plan, extras


def mcp_tools_named(data: dict) -> list[str]:
    """The MCP tools a raw plan's steps name (before it is validated), subgoals' plans included."""
    steps = data.get("steps")
    named = []
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict):
            continue
        tools = step.get("tools")
        for tool in [step.get("tool"), *(tools if isinstance(tools, list) else [])]:
            if isinstance(tool, str) and is_mcp_tool(tool):
                named.append(tool)
        if isinstance(step.get("plan"), dict):
            named += mcp_tools_named(step["plan"])
    return named


def plan_tools(plan: Plan) -> list[str]:
    """Every tool a plan names, in its subgoals' plans and `tools` too: writing it into a
    plan file is the user allowing it (a child may use only what its parent may)."""
    named: set[str] = set()
    for step in plan.steps:
        if isinstance(step, ToolStep):
            named.add(step.tool)
        elif isinstance(step, AgentStep):
            named.update(step.tools)
        elif isinstance(step, SubgoalStep):
            named.update(step.tools or [])
            named.update(plan_tools(step.plan) if step.plan is not None else [])
    return sorted(named)


def build_spec(**fields) -> GoalSpec:
    try:
        return GoalSpec(**fields)
    except ValidationError as err:
        raise ValueError(describe_validation_error(err)) from None


# Goal ids go into URLs (the UI link, the codec and HTTP APIs) and shell commands we print.
GOAL_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
# Memo key of the digest of the spec a goal started with: a retried start compares it.
SPEC_DIGEST_MEMO = "perdure_spec_digest"


class StartRefused(ValueError):
    """A start that would clash with the goal already holding the id; the text says why."""


def check_goal_id(goal_id: str) -> None:
    if not GOAL_ID_PATTERN.match(goal_id):
        raise StartRefused(
            f"goal id {goal_id!r} is not allowed: use 1-200 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it goes into links and commands)"
        )


# Spec fields added after goals were already being started: left out of the digest while
# at their defaults, so a start retried across an upgrade still matches the goal it started.
LATER_SPEC_FIELDS = (
    *("forked_from", "reuse_outputs", "recovery_mode", "verify_after_s", "parent"),
    *("evidence_window", "min_new_information", "evidence_spacing_s", "continue_as_new_after_nodes"),
)


# Plan step fields added since, with their defaults: left out of a plan's steps at those.
LATER_STEP_FIELDS = {"verify": None, "writes": None, "defer": True}
# A step's `verify` fields added after `verify` itself, likewise left out of it at their defaults.
LATER_VERIFY_FIELDS = {"question": None}


def spec_digest(spec: GoalSpec) -> str:
    fields = GoalSpec.model_fields
    unset = {n for n in LATER_SPEC_FIELDS if getattr(spec, n) == fields[n].get_default(call_default_factory=True)}
    text = spec.model_dump_json(exclude=unset)
    if spec.plan is not None:
        data = json.loads(text)
        _drop_later_step_fields(data["plan"])
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _drop_later_step_fields(plan: dict) -> None:
    for step in plan.get("steps", []):
        for name, default in LATER_STEP_FIELDS.items():
            if name in step and step[name] == default:
                del step[name]
        if isinstance(step.get("verify"), dict):
            for name, default in LATER_VERIFY_FIELDS.items():
                if name in step["verify"] and step["verify"][name] == default:
                    del step["verify"][name]
        if isinstance(step.get("plan"), dict):
            _drop_later_step_fields(step["plan"])  # a subgoal's own plan


def static_details(spec: GoalSpec) -> str:
    """What the Temporal UI shows in the goal's header and list: the goal and its limits (markdown)."""
    plan = f"plan file ({len(spec.plan.steps)} steps)" if spec.plan is not None else "the planner"
    lines = [
        "**Goal:** " + _md_line(spec.goal),
        "**Constraints:** " + ("; ".join(_md_line(c) for c in spec.constraints) or "none"),
        "**Budget:** " + budget_text(spec.budget),
        f"**Plan:** {plan} · profile `{spec.model_profile}` · tools: {', '.join(spec.allowed_tools) or 'none'}",
    ]
    return "\n\n".join(lines)[:20_000]


def budget_text(budget: Budget) -> str:
    """A budget's limits in a line: '2,000,000 tokens, $2.5, 3600 s active', or 'none'."""
    limits = [
        f"{budget.max_tokens:,} tokens" if budget.max_tokens else "",
        f"${budget.max_cost_usd:g}" if budget.max_cost_usd else "",
        f"{budget.max_wall_seconds} s active" if budget.max_wall_seconds else "",
        f"deadline {budget.deadline.isoformat()}" if budget.deadline else "",
    ]
    return ", ".join(x for x in limits if x) or "none"


def with_default_budget(limits: dict, no_budget: bool = False) -> dict:
    """The budget fields a start asks for (`max_tokens`, `max_cost_usd`, `max_wall_seconds`,
    `deadline`), with the default token limit (contracts.DEFAULT_MAX_TOKENS) when it names
    neither a token nor a cost limit, unless `no_budget`, which asks for no limit at all
    (ValueError when a limit is given beside it)."""
    if no_budget:
        if any(value is not None for value in limits.values()):
            raise ValueError("no budget means no limit at all: give no token, cost, time or deadline limit with it")
        return limits
    if limits.get("max_tokens") is None and limits.get("max_cost_usd") is None:
        return {**limits, "max_tokens": DEFAULT_MAX_TOKENS}
    return limits


def budget_line(budget: Budget, defaulted: bool) -> str:
    """What `perdure start` says of the goal's budget."""
    if defaulted:
        return f"budget: {budget_text(budget)} (the default; --max-tokens or --max-cost set your own, --no-budget none)"
    return f"budget: {budget_text(budget)}"


def _md_line(text: str) -> str:
    return " ".join(text.split())


async def start_goal(client: Client, spec: GoalSpec, goal_id: str, replace: bool = False) -> WorkflowHandle:
    """Start the goal under `goal_id`. The server refuses an id another run holds (conflict
    FAIL) and, unless `replace`, an id a finished run had (reuse REJECT_DUPLICATE), so two
    starts racing cannot both win; `start` in the CLI decides before it gets here."""
    check_goal_id(goal_id)
    return await client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=spec),
        id=goal_id,
        task_queue=settings.task_queue(),
        static_summary=spec.goal[:200],
        static_details=static_details(spec),
        memo={SPEC_DIGEST_MEMO: spec_digest(spec), **goal_memo(spec.goal)},
        search_attributes=TypedSearchAttributes([SearchAttributePair(sa.OWNER, settings.user())]),
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE if replace else WorkflowIDReusePolicy.REJECT_DUPLICATE,
        task_timeout=spec.task_timeout(),
    )


@dataclass(frozen=True)
class StartAnswer:
    """What a start did: `started` a new goal, or found this very start already done."""

    goal_id: str
    started: bool
    text: str


async def start_or_existing(client: Client, spec: GoalSpec, goal_id: str, replace: bool = False) -> StartAnswer:
    """Start the goal, or answer with the one already under `goal_id` when this start is a
    retry of it (same spec); StartRefused for a different spec under a live id, and for a
    finished goal's id without `replace`. The decision `perdure start` prints and the web
    UI's POST /api/goals returns."""
    from temporalio.exceptions import WorkflowAlreadyStartedError

    existing = await existing_goal(client, goal_id)
    if existing is not None:
        same = await started_digest(existing) == spec_digest(spec)
        if is_open(existing):
            if not same:
                raise StartRefused(
                    f"goal {goal_id} is already running with a different spec; nothing started. Pick another "
                    f"--id, or end that goal first (`perdure abort {goal_id}`)"
                )
            started = f"{existing.start_time:%Y-%m-%d %H:%M:%S}" if existing.start_time else "earlier"
            text = f"goal {goal_id} already running with this spec (started {started}); nothing new started"
            return StartAnswer(goal_id, False, text)
        if same and not replace:
            text = f"{await finished_text(client, existing)} (same spec; nothing new started)"
            return StartAnswer(goal_id, False, text)
        if not replace:
            raise StartRefused(
                f"{await finished_text(client, existing)}. To start a new goal under this id, add --replace: "
                "the old run stays in the server's history until its retention ends, but perdure shows only "
                "the new one from then on"
            )
    try:
        await start_goal(client, spec, goal_id, replace=replace)
    except WorkflowAlreadyStartedError:
        # Another start won the race between our look and this one.
        raise StartRefused(
            f"goal {goal_id} was started meanwhile by someone else; see `perdure status {goal_id}`"
        ) from None
    replaced = " (replacing the finished goal of that id)" if existing is not None else ""
    return StartAnswer(goal_id, True, f"goal {goal_id} started{replaced}")


async def finished_text(client: Client, desc: WorkflowExecution_) -> str:
    return f"goal {desc.id} has finished (outcome {await outcome(client, desc)}); see `perdure result {desc.id}`"


async def started_digest(desc: WorkflowExecutionDescription) -> str | None:
    """The digest of the spec the goal started with (None for a goal started without one)."""
    try:
        return (await desc.memo()).get(SPEC_DIGEST_MEMO)
    except Exception:  # a memo this client cannot decode (other keys): treat as unknown
        return None


async def existing_goal(client: Client, goal_id: str) -> WorkflowExecutionDescription | None:
    try:
        return await describe(client, goal_id)
    except GoalNotFound:
        return None


async def outcome(client: Client, desc: WorkflowExecution_) -> str:
    """How a closed goal ended, in the goal's words: succeeded, partial, failed, aborted; or
    terminated, timed out, cancelled when it ended without a result."""
    try:
        return (await result(client, desc.id, desc.run_id)).outcome
    except EndedWithoutResult as ended:
        return str(ended).partition(" ")[0].rstrip(":")


async def describe(client: Client, goal_id: str) -> WorkflowExecutionDescription:
    try:
        return await client.get_workflow_handle(goal_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise GoalNotFound(f"no goal with id '{goal_id}' (list goals with `perdure ls`)") from None
        raise


def is_open(desc: WorkflowExecutionDescription) -> bool:
    return desc.status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING


# How far back from a goal's last event to look for the failure of its workflow task:
# after a failure the server records nothing of the retries, only signals and updates.
STUCK_LOOKBACK_EVENTS = 200
# How far back `status` looks for the scheduled events of the activities still running.
PENDING_LOOKBACK_EVENTS = 1000


async def workflow_task_failure(client: Client, desc: WorkflowExecutionDescription) -> str | None:
    """Why a goal is stuck, when it is: its workflow task is being retried after a failure
    (the server records the first failure only, then retries, so the goal decides nothing,
    answers no query and takes no update meanwhile). The failure message of the last
    WorkflowTaskFailed event since the last completed task; None when the goal is not stuck."""
    raw = desc.raw_description
    if not is_open(desc) or not raw.HasField("pending_workflow_task") or raw.pending_workflow_task.attempt < 2:
        return None
    request = GetWorkflowExecutionHistoryReverseRequest(
        namespace=client.namespace,
        execution=WorkflowExecution(workflow_id=desc.id, run_id=desc.run_id),
        maximum_page_size=STUCK_LOOKBACK_EVENTS,
    )
    events = (await client.workflow_service.get_workflow_execution_history_reverse(request)).history.events
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            return None
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            attributes = event.workflow_task_failed_event_attributes
            return await failure_message(client.data_converter, attributes.failure) or WorkflowTaskFailedCause.Name(
                attributes.cause
            )
    return None


async def pending_activities(client: Client, desc: WorkflowExecutionDescription) -> list[PendingActivity]:
    """The goal's running activities as a person reads them: what each is for (the summary
    it was scheduled with, which the server's pending record does not carry) and what it
    last reported, both decoded with the client's converter (encrypted when keys are set)."""
    pending = list(desc.raw_description.pending_activities)
    if not pending:
        return []
    wanted = {p.activity_id for p in pending}
    summaries: dict[str, str] = {}
    request = GetWorkflowExecutionHistoryReverseRequest(
        namespace=client.namespace,
        execution=WorkflowExecution(workflow_id=desc.id, run_id=desc.run_id),
        maximum_page_size=PENDING_LOOKBACK_EVENTS,
    )
    events = (await client.workflow_service.get_workflow_execution_history_reverse(request)).history.events
    converter = client.data_converter
    for event in events:
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        activity_id = event.activity_task_scheduled_event_attributes.activity_id
        if activity_id in wanted and event.user_metadata.HasField("summary"):
            summaries[activity_id] = await _decoded_text(converter, event.user_metadata.summary)
    views = []
    for p in pending:
        details = ""
        if p.HasField("heartbeat_details") and p.heartbeat_details.payloads:
            details = await _decoded_text(converter, p.heartbeat_details.payloads[0])
        views.append(
            PendingActivity(
                summary=summaries.get(p.activity_id) or p.activity_type.name,
                attempt=p.attempt,
                heartbeat=details,
                failure=p.last_failure.message if p.HasField("last_failure") else "",
            )
        )
    return views


@dataclass(frozen=True)
class PendingActivity:
    summary: str
    attempt: int
    heartbeat: str
    failure: str


async def _decoded_text(converter: DataConverter, payload: Payload) -> str:
    """A payload as text: decoded (and decrypted) when this client can, else its raw bytes."""
    try:
        [value] = await converter.decode([payload])
    except Exception:
        return payload.data.decode(errors="replace")
    return value if isinstance(value, str) else json.dumps(value, default=str)


async def failure_message(converter: DataConverter, failure: Failure) -> str:
    """A failure's message as its sender wrote it: with payload encryption on, history holds
    "Encoded failure" and the real message in the encrypted attributes."""
    if not failure.HasField("encoded_attributes"):
        return failure.message
    decoded = Failure()
    decoded.CopyFrom(failure)  # decoding works in place; the event stays as history has it
    try:
        return str(await converter.decode_failure(decoded)) or failure.message
    except Exception:  # no keys here, or not the right ones: say what history says
        return failure.message


async def progress(client: Client, goal_id: str, timeout_s: float = 5) -> ProgressSnapshot:
    """Query the goal. Raises RPCError when no worker answers in time."""
    handle = client.get_workflow_handle(goal_id)
    return await handle.query(GoalWorkflow.progress, rpc_timeout=timedelta(seconds=timeout_s))


def unanswered_text(desc: WorkflowExecutionDescription, err: RPCError) -> str:
    """Why `status` has no snapshot: the progress query needs a worker, which may be replaying a
    goal that is not in its cache (its whole history: seconds for a long goal) or not run at all."""
    where = "what the goal published" if not is_open(desc) else "server facts"
    if err.status != RPCStatusCode.DEADLINE_EXCEEDED:  # the server knows no worker polls
        return f"no worker answered the progress query ({err.message}); showing {where}"
    events = desc.raw_description.workflow_execution_info.history_length
    return (
        f"no worker answered the progress query in time: a worker may be replaying this goal's {events} events "
        f"(ask again in a moment), or none runs; showing {where}"
    )


async def published_ending(
    client: Client, desc: WorkflowExecutionDescription
) -> GoalResult | EndedWithoutResult | None:
    """How a closed goal ended, from its close event (no worker needed); None when this
    machine cannot read it (a payload store or key it lacks)."""
    try:
        return await result(client, desc.id, desc.run_id)
    except EndedWithoutResult as ended:
        return ended
    except (RPCError, LookupError, ValueError):
        return None


async def result(client: Client, goal_id: str, run_id: str | None = None) -> GoalResult:
    """Wait for the goal to end. A goal that failed still carries its report; one that ended
    any other way raises EndedWithoutResult, saying how."""
    return await ended(client.get_workflow_handle(goal_id, run_id=run_id, result_type=GoalResult))


async def ended(handle: WorkflowHandle) -> GoalResult:
    """The result of the goal behind `handle`, however it ended: a goal that failed or was
    aborted fails its workflow with the result in the failure's details (GoalFailed)."""
    try:
        return await handle.result()
    except WorkflowFailureError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type == "GoalFailed" and cause.details:
            return GoalResult.model_validate(cause.details[0])
        if isinstance(cause, TerminatedError):
            raise EndedWithoutResult(f"terminated ({await _termination_reason(handle)})") from None
        raise EndedWithoutResult(_ending(cause)) from None


async def _termination_reason(handle: WorkflowHandle) -> str:
    """The reason the terminating client gave: the close event holds it, the error does not."""
    async for event in handle.fetch_history_events(event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
            return event.workflow_execution_terminated_event_attributes.reason or "no reason given"
    return "no reason given"


def _ending(cause: BaseException | None) -> str:
    if isinstance(cause, TimeoutError_):
        return "timed out (the workflow's execution or run timeout passed)"
    if isinstance(cause, CancelledError):
        return "cancelled"
    return f"failed: {cause}" if cause is not None else "failed"


class StillRunning(Exception):
    """The goal has not ended: its report is written when it does."""


class ResultUnreadable(Exception):
    """The goal's result is in a payload store this machine does not see, or encrypted with a key it lacks."""


class ClosedReport(BaseModel):
    """A closed goal's report (markdown) and how it ended: what `perdure result` shows."""

    goal_id: str
    outcome: str
    failure: str | None = None
    unfinished: list[str] = Field(default_factory=list)
    report: str


async def closed_report(client: Client, goal_id: str) -> ClosedReport:
    """The report of a goal that has ended; GoalNotFound, StillRunning, EndedWithoutResult
    (terminated, timed out: no report) or ResultUnreadable says why there is none."""
    desc = await describe(client, goal_id)
    if is_open(desc):
        raise StillRunning("the goal is still running; its report is written when it ends")
    try:
        ended = await result(client, goal_id, desc.run_id)
    except (RPCError, LookupError, ValueError) as err:
        raise ResultUnreadable(f"the goal's result cannot be read here: {err}") from None
    return ClosedReport(
        goal_id=goal_id,
        outcome=ended.outcome,
        failure=ended.failure,
        unfinished=ended.unfinished,
        report=read_report(ended),
    )


def read_report(goal_result: GoalResult) -> str:
    """The full report from the local artifact store, or the excerpt the goal carries."""
    try:
        return default_store().get_text(goal_result.report)
    except ArtifactMissing:
        return goal_result.excerpt + "\n\n(full report not in this machine's artifact store)"


# What `perdure ls --status` and `--phase` take; a value goes into a visibility query, so
# only these words are let through (a quote would end the string and add a clause).
EXECUTION_STATUSES = ("Running", "Completed", "Failed", "Canceled", "Terminated", "ContinuedAsNew", "TimedOut")
PHASES = get_args(Phase)


def list_filters(
    status: str | None = None, phase: str | None = None, needs_human: bool = False, parked: bool = False
) -> list[str]:
    """Visibility-query clauses for `perdure ls`; ValueError names the allowed values."""
    filters = []
    if status:
        known = {s.lower(): s for s in EXECUTION_STATUSES}
        if status.lower() not in known:
            raise ValueError(f"unknown --status {status!r}; one of: {', '.join(EXECUTION_STATUSES)}")
        filters.append(f"ExecutionStatus = '{known[status.lower()]}'")
    if phase:
        if phase not in PHASES:
            raise ValueError(f"unknown --phase {phase!r}; one of: {', '.join(PHASES)}")
        filters.append(f"{sa.GOAL_STATUS.name} = '{phase}'")
    if needs_human:
        filters.append(f"{sa.NEEDS_HUMAN.name} = true")
    if parked:
        filters.append(f"{sa.PARKED.name} = true")
    return filters


async def outcomes(client: Client, executions: list) -> dict[str, str]:
    """Goal id -> outcome for the closed goals listed (the close event only, read concurrently)."""
    closed = [wf for wf in executions if wf.status != WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING]

    async def one(wf) -> str:
        try:
            return await outcome(client, wf)
        except (RPCError, LookupError, ValueError):
            # A result that cannot be read here (its payload in a store this machine does not
            # see, or encrypted with a key it lacks) must not break the whole listing.
            return "?"

    found = await asyncio.gather(*(one(wf) for wf in closed))
    return {wf.id: o for wf, o in zip(closed, found, strict=True)}


async def goal_texts(client: Client, executions: list) -> dict[str, str]:
    """Goal id -> the goal's text, for a list of goals: from the memo it started with, which
    the listing carries (no call per goal); for a goal started without one (before the memo,
    or by code that sets none), from its static summary, one describe each."""
    texts: dict[str, str] = {}
    unnamed = []
    for wf in executions:
        try:
            text = (await wf.memo()).get(GOAL_MEMO)
        except Exception:  # noqa: BLE001 - a memo this client cannot decode: named by its summary
            text = None
        if isinstance(text, str) and text:
            texts[wf.id] = text
        else:
            unnamed.append(wf)

    async def summary(wf) -> str | None:
        try:
            desc = await client.get_workflow_handle(wf.id, run_id=wf.run_id).describe()
            return await desc.static_summary()
        except (RPCError, ValueError):
            return None  # the row still shows its id

    found = await asyncio.gather(*(summary(wf) for wf in unnamed))
    texts.update({wf.id: text for wf, text in zip(unnamed, found, strict=True) if text})
    return texts


async def list_goals(client: Client, query: str | None = None, limit: int = 50) -> list:
    full = f"WorkflowType = '{GOAL_WORKFLOW}'" + (f" AND ({query})" if query else "")
    goals = []
    async for wf in client.list_workflows(full, limit=limit):
        goals.append(wf)
    return goals
