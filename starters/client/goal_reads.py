"""Reading goals: describe one, query its progress, say why it is stuck and what its
running activities are doing, wait for its result and read its report, and list goals
with their outcomes and texts.

Talks to Temporal only through the client and reads the local artifact store for full
reports. Holds no goal state.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import get_args

from pydantic import BaseModel, Field
from temporalio.api.common.v1 import Payload, WorkflowExecution
from temporalio.api.enums.v1 import EventType, WorkflowExecutionStatus, WorkflowTaskFailedCause
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import History
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
    WorkflowHistoryEventFilterType,
    WorkflowQueryFailedError,
)
from temporalio.client import WorkflowExecution as WorkflowExecution_
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError, CancelledError, TerminatedError
from temporalio.exceptions import TimeoutError as TimeoutError_
from temporalio.service import RPCError, RPCStatusCode

from perdure.activities.artifacts import ArtifactCorrupt, ArtifactMissing, ObjectStoreUnavailable, artifact_store
from perdure.runtime.converter import store_failure_in
from perdure.starters.client.client_errors import EndedWithoutResult, GoalNotFound, ResultUnreadable, StillRunning
from perdure.workflows.goal.contracts.goal_contracts import GOAL_MEMO, GOAL_WORKFLOW, GoalResult, ProgressSnapshot
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared import search_attributes as sa
from perdure.workflows.shared.statuses import Phase


async def finished_text(client: Client, desc: WorkflowExecution_) -> str:
    return f"goal {desc.id} has finished (outcome {await outcome(client, desc)}); see `perdure result {desc.id}`"


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
            raise not_found(goal_id) from None
        raise


def not_found(goal_id: str) -> GoalNotFound:
    return GoalNotFound(f"no goal with id '{goal_id}' (list goals with `perdure ls`)")


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
    """Query the goal. GoalNotFound when there is none; RPCError when no worker answers in time."""
    handle = client.get_workflow_handle(goal_id)
    try:
        return await handle.query(GoalWorkflow.progress, rpc_timeout=timedelta(seconds=timeout_s))
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise not_found(goal_id) from None
        raise


def unanswered_text(
    desc: WorkflowExecutionDescription, err: RPCError | WorkflowQueryFailedError, instead: str | None = None
) -> str:
    """Why `status` (or `questions`) has no snapshot: the progress query needs a worker, which may
    be replaying a goal that is not in its cache (its whole history: seconds for a long goal) or
    not run at all. `instead`: what the command does without it (status shows server facts)."""
    where = instead or f"showing {'what the goal published' if not is_open(desc) else 'server facts'}"
    if isinstance(err, WorkflowQueryFailedError):  # a worker ran the query and it failed
        return f"the goal's worker could not answer the progress query ({err}); {where}"
    if err.status != RPCStatusCode.DEADLINE_EXCEEDED:  # the server knows no worker polls
        return f"no worker answered the progress query ({err.message}); {where}"
    events = desc.raw_description.workflow_execution_info.history_length
    return (
        f"no worker answered the progress query in time: a worker may be replaying this goal's {events} events "
        f"(ask again in a moment), or none runs; {where}"
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
    except (RPCError, LookupError, ValueError, RuntimeError) as err:
        # A RuntimeError is the result's own business only when the payload store failed under it.
        unreachable = store_failure_in(err)
        if isinstance(err, RuntimeError) and unreachable is None:
            raise
        raise ResultUnreadable(f"the goal's result cannot be read here: {unreachable or err}") from None
    try:
        # Off the loop: the store may be a network call away, and `perdure ui` serves streams meanwhile.
        report = await asyncio.to_thread(read_report, ended)
    except (ObjectStoreUnavailable, ArtifactCorrupt, ValueError) as err:
        raise ResultUnreadable(f"the goal's report cannot be read here: {err}") from None
    return ClosedReport(
        goal_id=goal_id,
        outcome=ended.outcome,
        failure=ended.failure,
        unfinished=ended.unfinished,
        report=report,
    )


def read_report(goal_result: GoalResult) -> str:
    """The full report from the artifact store (PERDURE_ARTIFACT_STORE), or the excerpt the
    goal carries. ObjectStoreUnavailable, ArtifactCorrupt or a ValueError (the setting, a
    key) when the store holds it but cannot give it."""
    store = artifact_store()
    try:
        return store.get_text(goal_result.report)
    except ArtifactMissing:
        return goal_result.excerpt + f"\n\n(full report not in the artifact store at {store.where})"


# What `perdure ls --status` and `--phase` take; a value goes into a visibility query, so
# only these words are let through (a quote would end the string and add a clause).
CONTINUED_AS_NEW = "ContinuedAsNew"
EXECUTION_STATUSES = ("Running", "Completed", "Failed", "Canceled", "Terminated", CONTINUED_AS_NEW, "TimedOut")
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
    """Goal id -> outcome for the closed goals listed (the close event only, read concurrently).
    A run that continued as new did not end its goal: its result would wait for the goal's end."""
    open_ = (
        WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING,
        WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW,
    )
    closed = [wf for wf in executions if wf.status not in open_]

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
    """Goals, newest first: each goal's latest run, unless `query` asks for runs by their
    ExecutionStatus (`--status ContinuedAsNew` lists the runs a goal left behind)."""
    latest = "" if query and "ExecutionStatus" in query else f" AND ExecutionStatus != '{CONTINUED_AS_NEW}'"
    full = f"WorkflowType = '{GOAL_WORKFLOW}'{latest}" + (f" AND ({query})" if query else "")
    goals = []
    async for wf in client.list_workflows(full, limit=limit):
        goals.append(wf)
    return goals


async def history(client: Client, goal_id: str, *, encoded: bool = False) -> WorkflowHistory:
    """The goal's event history (its latest run), its payloads decrypted with the client's
    codec unless `encoded` (as the server holds them: encrypted, if keys are on)."""
    found = await client.get_workflow_handle(goal_id).fetch_history()
    codec = client.data_converter.payload_codec
    if codec is None or encoded:
        return found
    from perdure.runtime.codec import decode_history

    plain = await decode_history(History(events=found.events), codec)
    return WorkflowHistory(found.workflow_id, list(plain.events))
