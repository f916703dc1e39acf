"""Reading a goal's decision log (`perdure log`, the page, `perdure.Client.decisions`): the
entries the goal's state holds joined, in order, with the chunks it stored in the artifact
store (workflows/goal/contracts/decision_contracts.py).

Where the log is read from, as `perdure status` reads progress: a running goal answers the
`decisions` query (a worker answers); with no worker polling, one that does not answer in
time, or a goal that is stuck, the log the goal carried into its current run (its start
input, which the server holds), and the read says the latest entries need a worker; a
closed goal's result carries its log as it ended (no worker needed). Never waits longer
than the query's timeout. Holds no goal state.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowQueryFailedError, WorkflowQueryRejectedError
from temporalio.service import RPCError

from perdure.activities.artifacts import ArtifactCorrupt, ArtifactMissing, ObjectStoreUnavailable, artifact_store
from perdure.starters.client import goal_reads
from perdure.starters.client.client_errors import EndedWithoutResult
from perdure.starters.client.start_checks import has_pollers
from perdure.workflows.goal.contracts.decision_contracts import (
    DECISIONS_QUERY,
    Decision,
    DecisionChunk,
    DecisionLog,
    gaps,
)
from perdure.workflows.goal.contracts.state import GoalInput

QUERY_TIMEOUT_S = 5.0


class DecisionRead(BaseModel):
    """A goal's decision log as read here: every entry that could be read, in order."""

    goal_id: str
    count: int = Field(description="Decisions the log holds in all (some may not be readable here: see notes).")
    entries: list[Decision]
    source: str = Field(description="Where the log was read: the goal, its result, or the start of its current run.")
    notes: list[str] = Field(default_factory=list, description="What could not be read, and why.")

    def of_kinds(self, kinds: list[str]) -> list[Decision]:
        return [e for e in self.entries if e.kind in kinds] if kinds else list(self.entries)


async def read(client: Client, goal_id: str, timeout_s: float = QUERY_TIMEOUT_S) -> DecisionRead:
    """The goal's whole decision log; GoalNotFound when there is no goal. A log that cannot be
    read at all (no worker, and nothing carried yet) is an empty read with a note saying why."""
    desc = await goal_reads.describe(client, goal_id)
    if goal_reads.is_open(desc):
        log, source, notes = await _from_running(client, desc, timeout_s)
    else:
        log, source, notes = await _from_closed(client, desc)
    entries, unread = await asyncio.to_thread(_join, log) if log is not None else ([], [])
    count = log.count if log is not None else 0
    notes += unread
    missing = gaps(entries, count)
    if missing and not unread:
        ranges = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in missing)
        notes.append(f"entries {ranges} are missing from what was read")
    return DecisionRead(goal_id=goal_id, count=count, entries=entries, source=source, notes=notes)


async def _from_running(
    client: Client, desc: WorkflowExecutionDescription, timeout_s: float
) -> tuple[DecisionLog | None, str, list[str]]:
    goal_id = desc.id
    failure = await goal_reads.workflow_task_failure(client, desc)
    if failure is not None:
        why = f"goal {goal_id} is stuck (its workflow task fails: {failure}; see `perdure status {goal_id}`)"
    elif not await has_pollers(client, desc.task_queue):
        why = f"no worker polls task queue '{desc.task_queue}' (start one: `perdure worker`)"
    else:
        try:
            log = await client.get_workflow_handle(goal_id).query(
                DECISIONS_QUERY, result_type=DecisionLog, rpc_timeout=timedelta(seconds=timeout_s)
            )
            return log, "the goal", []
        except RPCError as err:
            why = f"no worker answered the decisions query in {timeout_s:g} s ({err.message})"
        except (WorkflowQueryFailedError, WorkflowQueryRejectedError) as err:
            why = f"the worker running goal {goal_id} cannot answer the decisions query ({err})"
    log, run, problem = await _carried_into_run(client, desc)
    if log is None:
        return None, "nothing", [f"{why}; {problem}"]
    note = f"{why}: showing the log as it was carried into run {run}; the decisions since need a worker"
    return log, f"the start of run {run}", [note]


async def _from_closed(client: Client, desc: WorkflowExecutionDescription) -> tuple[DecisionLog | None, str, list[str]]:
    ended = await goal_reads.published_ending(client, desc)
    if ended is not None and not isinstance(ended, EndedWithoutResult) and ended.decisions is not None:
        return ended.decisions, "its result", []
    why = "the goal ended without a result" if isinstance(ended, EndedWithoutResult) else "its result has no log here"
    log, run, problem = await _carried_into_run(client, desc)
    if log is None:
        return None, "nothing", [f"{why}; {problem}"]
    return log, f"the start of run {run}", [f"{why}: showing the log as it was carried into its last run ({run})"]


async def _carried_into_run(client: Client, desc: WorkflowExecutionDescription) -> tuple[DecisionLog | None, int, str]:
    """The log the goal's state carried into its current run (its start input): (log, run, why none)."""
    handle = client.get_workflow_handle(desc.id, run_id=desc.run_id)
    try:
        async for event in handle.fetch_history_events(page_size=1):
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                break
            payloads = list(event.workflow_execution_started_event_attributes.input.payloads)
            [goal_input] = await client.data_converter.decode(payloads, [GoalInput])
            return _carried(goal_input)
    except (RPCError, ValueError, LookupError, RuntimeError) as err:
        return None, 0, f"the start of its current run cannot be read here ({err})"
    return None, 0, "its current run's start is not in its history"


def _carried(goal_input: Any) -> tuple[DecisionLog | None, int, str]:
    if not isinstance(goal_input, GoalInput):
        return None, 0, "its input cannot be read here (encrypted with keys this machine lacks)"
    if goal_input.state is None:
        return None, 1, "nothing is carried into a goal's first run: the log is read from the goal"
    try:
        state = json.loads(goal_input.state)
        log = DecisionLog.model_validate(state.get("decisions") or {})
    except (ValueError, ValidationError, AttributeError) as err:
        return None, 0, f"the state carried into its current run cannot be read here ({str(err)[:200]})"
    return log, int(state.get("runs") or 0), ""


def _join(log: DecisionLog) -> tuple[list[Decision], list[str]]:
    """Every entry, in order: each stored chunk's, then the recent ones; what cannot be read
    from the store is a note naming the entries it holds."""
    entries: list[Decision] = []
    notes: list[str] = []
    store = None
    for chunk in log.chunks:
        try:
            store = store or artifact_store()
            entries += [Decision.model_validate(e) for e in store.get_json(chunk.ref)]
        except (ArtifactMissing, ArtifactCorrupt, ObjectStoreUnavailable, ValueError, ValidationError) as err:
            notes.append(_unreadable(chunk, store, err))
    return entries + log.recent, notes


def _unreadable(chunk: DecisionChunk, store: Any, err: Exception) -> str:
    where = f" at {store.where}" if store is not None else ""
    return f"entries {chunk.first}-{chunk.last} are stored in the artifact store{where} and cannot be read here: {err}"
