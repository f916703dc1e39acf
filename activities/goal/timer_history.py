"""A wait step's output, with how late it acted and why (workflows/goal/rules/timing.py).

The local activity a wait step with the `timer-late-cause` patch runs when its time
comes, in place of the device store's: when the step acts late (and was not parked) it
reads the goal's current run's history for the step's timer (found by its summary):
when the server fired it (TimerFired) and when a worker next took a workflow task
(WorkflowTaskStarted), which say whether the server or the worker was missing. Then it
judges the timer and keeps the step's output. One activity per step, as before, so wait
steps that act together keep their order. The goal records the answer: its replay reads
the same. Needs the worker's client for the history; without one the cause stays unknown.
"""

from __future__ import annotations

import json
from datetime import UTC

from temporalio import activity
from temporalio.api.enums.v1 import EventType

from perdure.activities.artifacts import ArtifactStore
from perdure.activities.tools.run_tool import preview
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.wait_contracts import WaitOutput, WaitOutputInput
from perdure.workflows.goal.rules import timing
from perdure.workflows.goal.rules.timing import TimerEvents
from perdure.workflows.shared.contracts import ToolResult


class TimingActivities:
    def __init__(self, store: ArtifactStore) -> None:
        self._store = store

    def activities(self) -> list:
        return [self.wait_output]

    @activity.defn(name=Activities.WAIT_OUTPUT)
    async def wait_output(self, input: WaitOutputInput) -> WaitOutput:
        cause = None
        if not input.parked and input.acted - input.planned >= timing.EXACT_WITHIN:
            cause = timing.late_cause(input.planned, await timer_events(input.summary))
        record = timing.judge(
            f"wait step {input.name}", input.planned, input.acted, node=input.name, parked=input.parked, cause=cause
        )
        text = f"wait step '{input.name}': {record.text()}"
        stored = ToolResult(
            call_id="", tool="wait", ok=True, output=await self._store.aput_text(text), preview=preview(text)
        )
        return WaitOutput(record=record, stored=stored)


async def timer_events(summary: str) -> TimerEvents:
    """The last timer started with `summary` in the calling goal's current run: when it fired,
    and when a worker took the next workflow task."""
    info = activity.info()
    try:
        client = activity.client()
    except RuntimeError:
        return TimerEvents()
    handle = client.get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
    started_id, events = None, TimerEvents()
    async for event in handle.fetch_history_events():
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_TIMER_STARTED and _summary(event) == summary:
            started_id, events = event.event_id, TimerEvents()
        elif kind == EventType.EVENT_TYPE_TIMER_FIRED and started_id is not None:
            if event.timer_fired_event_attributes.started_event_id == started_id:
                events.fired_at = event.event_time.ToDatetime(tzinfo=UTC)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and events.fired_at is not None:
            if events.taken_at is None:
                events.taken_at = event.event_time.ToDatetime(tzinfo=UTC)
    return events


def _summary(event) -> str | None:  # noqa: ANN001 - a history event (protobuf)
    if not event.HasField("user_metadata") or not event.user_metadata.HasField("summary"):
        return None
    try:
        return json.loads(event.user_metadata.summary.data)
    except ValueError:
        return None
