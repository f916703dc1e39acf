"""The watchdog's I/O: what the server knows about open goals, messages to them,
and the watchdog's memory and rule book (activities/watchdog/watchdog_files.py).

`scan` lists the open goals of one task queue through visibility, then asks
each, concurrently, for its progress snapshot (a query, answered by a worker)
and the server for its pending activities (`describe`, answered by the server
alone, so a goal no worker answers for still shows its failing activity).
`intervene` signals goals with user messages carrying the watchdog's request
ids; a signal needs no worker, and the goal's inbox dedupes a repeated id.
Nothing here decides: classification is `perdure.workflows.watchdog.watchdog_rules`.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio import activity
from temporalio.api.enums.v1 import PendingActivityState, WorkflowExecutionStatus
from temporalio.client import Client, WorkflowExecutionDescription
from temporalio.service import RPCError, RPCStatusCode

from perdure.activities.artifacts import ArtifactStore
from perdure.activities.watchdog.watchdog_files import WatchdogFiles
from perdure.activities.watchdog.watchdog_memory import load_memory, load_rules, save_memory
from perdure.workflows.goal.contracts.goal_contracts import GOAL_WORKFLOW, ProgressSnapshot
from perdure.workflows.goal.contracts.messages import Escalate, Steer
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.rules.stall import fingerprint, normalise_output, novelty
from perdure.workflows.watchdog.watchdog_contracts import (
    GoalObservation,
    InterveneInput,
    InterveneResult,
    InterventionOutcome,
    PendingActivityView,
    RecallInput,
    RecallResult,
    RememberInput,
    RememberResult,
    ScanInput,
    ScanResult,
    WatchdogActivities,
)

# Queries wait on a worker and describes on the server; neither costs CPU here,
# so many run at once. Bounded so a namespace with thousands of goals does not
# open thousands of RPCs together.
SCAN_CONCURRENCY = 32
FAILURE_CHARS = 300
FAILED_STEPS_SHOWN = 5
JUDGE_TEXT_CHARS = 400
PLAN_SHOWN = 30
CONCLUSIONS_SHOWN = 5
INFORMATIVE = 0.2  # a finished step adding at least this share of new words moves the goal on
_STATES = {
    PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED: "scheduled",
    PendingActivityState.PENDING_ACTIVITY_STATE_STARTED: "started",
    PendingActivityState.PENDING_ACTIVITY_STATE_CANCEL_REQUESTED: "cancel_requested",
    PendingActivityState.PENDING_ACTIVITY_STATE_PAUSED: "paused",
    PendingActivityState.PENDING_ACTIVITY_STATE_PAUSE_REQUESTED: "pause_requested",
}


def open_goals_query(task_queue: str) -> str:
    quoted = task_queue.replace("\\", "\\\\").replace("'", "\\'")
    return f"WorkflowType = '{GOAL_WORKFLOW}' AND ExecutionStatus = 'Running' AND TaskQueue = '{quoted}'"


class VisibilityActivities:
    def __init__(
        self, client: Client, home: Path, store: ArtifactStore | None = None, concurrency: int = SCAN_CONCURRENCY
    ) -> None:
        """The memory and rule book beside `store` when it is an object store, else under `home`."""
        self._client = client
        self._files = WatchdogFiles(store, home)
        self._concurrency = concurrency

    def activities(self) -> list:
        return [self.recall, self.scan, self.intervene, self.remember]

    @activity.defn(name=WatchdogActivities.RECALL)
    async def recall(self, input: RecallInput) -> RecallResult:
        # In a thread: the files may be objects in a store a network round trip away.
        memory, note = await asyncio.to_thread(load_memory, self._files.memory(input.scope))
        book, rules_note = await asyncio.to_thread(load_rules, self._files.rules(input.scope))
        return RecallResult(memory=memory, note=note, rules=book, rules_note=rules_note)

    @activity.defn(name=WatchdogActivities.REMEMBER)
    async def remember(self, input: RememberInput) -> RememberResult:
        kept = self._files.memory(input.scope)
        await asyncio.to_thread(save_memory, kept, input.memory)
        return RememberResult(path=kept.where)

    @activity.defn(name=WatchdogActivities.SCAN)
    async def scan(self, input: ScanInput) -> ScanResult:
        started = time.monotonic()
        executions = [
            wf async for wf in self._client.list_workflows(open_goals_query(input.task_queue), limit=input.max_goals)
        ]
        gate = asyncio.Semaphore(self._concurrency)
        observed = 0

        async def observe(goal_id: str, run_id: str | None, start: datetime) -> GoalObservation | None:
            nonlocal observed
            async with gate:
                row = await self._observe(goal_id, run_id, start, input.query_timeout_s)
            observed += 1
            activity.heartbeat(f"{observed}/{len(executions)} goals")
            return row

        rows = await asyncio.gather(*(observe(wf.id, wf.run_id, wf.start_time) for wf in executions))
        goals = [row for row in rows if row is not None]
        return ScanResult(goals=goals, seconds=round(time.monotonic() - started, 3))

    async def _observe(
        self, goal_id: str, run_id: str | None, start: datetime, timeout_s: float
    ) -> GoalObservation | None:
        """One goal's row, or None when it closed since it was listed."""
        handle = self._client.get_workflow_handle(goal_id, run_id=run_id)
        rpc_timeout = timedelta(seconds=timeout_s)
        snapshot, desc = await asyncio.gather(
            handle.query(GoalWorkflow.progress, rpc_timeout=rpc_timeout),
            handle.describe(rpc_timeout=rpc_timeout),
            return_exceptions=True,
        )
        for outcome in (snapshot, desc):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
        if isinstance(desc, RPCError) and desc.status == RPCStatusCode.NOT_FOUND:
            return None
        if isinstance(desc, WorkflowExecutionDescription):
            if desc.status != WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING:
                return None
            pending = [pending_view(p) for p in desc.raw_description.pending_activities]
        else:
            pending = []
        known = isinstance(desc, WorkflowExecutionDescription)
        if not isinstance(snapshot, ProgressSnapshot):
            return GoalObservation(
                goal_id=goal_id,
                started_at=start,
                query_error=query_problem(snapshot, timeout_s),
                pending=pending,
                pending_known=known,
            )
        failed, failed_count = failed_steps(snapshot)
        return GoalObservation(
            goal_id=goal_id,
            started_at=snapshot.started_at or start,
            phase=snapshot.phase,
            parked=snapshot.parked,
            percent_done=snapshot.percent_done,
            running=snapshot.running,
            last_progress_at=snapshot.last_progress_at,
            stall_after_s=snapshot.stall_after_s,
            looping_nodes={n: r for n, r in snapshot.stall_rungs.items() if n in snapshot.running},
            park_expires_at=snapshot.park_expires_at,
            open_questions=[f"{q.id}: {q.title}" for q in snapshot.questions],
            oldest_question_at=snapshot.oldest_question_at,
            waiting_for_devices=snapshot.waiting_for_devices,
            waiting_on_timers=[n.name for n in snapshot.nodes if n.kind == "wait" and n.status == "parked"],
            waiting_for_quota=[n.name for n in snapshot.nodes if (n.quota or "").startswith("waiting for quota")],
            budget=snapshot.budget,
            failed_steps=failed,
            failed_count=failed_count,
            pending=pending,
            pending_known=known,
            goal_text=snapshot.goal[:JUDGE_TEXT_CHARS],
            plan=[f"{n.name} ({n.kind}): {n.status}" for n in snapshot.nodes][:PLAN_SHOWN],
            conclusions=[c[:JUDGE_TEXT_CHARS] for c in snapshot.conclusions[-CONCLUSIONS_SHOWN:]],
            new_information=(shares := new_information(snapshot)),
            informative_steps=sum(1 for share in shares if share >= INFORMATIVE),
            plan_version=snapshot.plan_version,
        )

    @activity.defn(name=WatchdogActivities.INTERVENE)
    async def intervene(self, input: InterveneInput) -> InterveneResult:
        outcomes = []
        for item in input.interventions:
            if item.action == "nudge":
                message = Steer(request_id=item.request_id, text=item.text, by="watchdog")
            else:
                message = Escalate(request_id=item.request_id, finding=item.finding, detail=item.text, by="watchdog")
            handle = self._client.get_workflow_handle(item.goal_id)
            try:
                # A signal is stored by the server even when no worker runs; the
                # goal applies it at its next safe point, once per request id.
                await handle.signal(GoalWorkflow.message_signal, message.model_dump(mode="json"))
            except RPCError as err:
                # Not sent, so not remembered: the next run tries again with the same id.
                why = "the goal has ended" if err.status == RPCStatusCode.NOT_FOUND else err.message
                activity.logger.warning("intervention not sent", extra={"request_id": item.request_id, "why": why})
                outcomes.append(InterventionOutcome(request_id=item.request_id, sent=False, error=why))
                continue
            outcomes.append(InterventionOutcome(request_id=item.request_id, sent=True))
        return InterveneResult(outcomes=outcomes)


def pending_view(pending) -> PendingActivityView:
    options = pending.activity_options if pending.HasField("activity_options") else None
    return PendingActivityView(
        activity_type=pending.activity_type.name,
        state=_STATES.get(pending.state, "unknown"),
        attempt=pending.attempt,
        task_queue=(options.task_queue.name or None) if options is not None else None,
        scheduled_at=pending.scheduled_time.ToDatetime(tzinfo=UTC) if pending.HasField("scheduled_time") else None,
        last_failure=pending.last_failure.message[:FAILURE_CHARS] if pending.HasField("last_failure") else None,
    )


def new_information(snapshot: ProgressSnapshot) -> list[float]:
    """Each finished step's share of new information (word 3-grams of its preview not in
    the earlier finished steps' previews), in plan order, rounded to 2 places."""
    seen: list[str] = []
    shares = []
    for node in snapshot.nodes:
        if node.status != "succeeded":
            continue
        sketch = fingerprint([normalise_output(node.preview)])
        shares.append(round(novelty(seen, sketch), 2))
        seen.append(sketch)
    return shares


def failed_steps(snapshot: ProgressSnapshot) -> tuple[list[str], int]:
    """'step: error' of the first few failed steps, earlier plan versions' included, and
    how many failed in all: a scan row stays small however many steps failed."""
    failed = [(n.name, n) for n in snapshot.nodes if n.status == "failed"]
    failed += [(f"{n.name} (plan v{n.plan_version})", n) for n in snapshot.earlier if n.status == "failed"]
    shown = [f"{name}: {n.error or 'failed'}"[:FAILURE_CHARS] for name, n in failed[:FAILED_STEPS_SHOWN]]
    return shown, len(failed)


def query_problem(error: BaseException, timeout_s: float) -> str:
    if isinstance(error, RPCError) and error.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
        return f"no worker answered within {timeout_s:g} s"
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    return f"{type(error).__name__}: {message}"[:FAILURE_CHARS]
