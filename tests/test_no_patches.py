"""The 1.0 baseline: a goal's runs record no `workflow.patched` marker and no upsert of the
TemporalChangeVersion search attribute (the policy: workflows/goal/__init__.py), so a fresh
goal's first workflow task goes to its work. Before 1.0 the first run of every goal recorded
a baseline marker and one per later change (four), each with a TemporalChangeVersion upsert."""

from __future__ import annotations

import pytest
from temporalio.api.enums.v1 import EventType

from tests.builders import spec
from tests.helpers import run_goal, run_ids, running_worker

CHANGE_VERSION = "TemporalChangeVersion"


def patch_markers(history) -> int:
    return sum(
        1
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    )


def change_version_upserts(history) -> int:
    return sum(
        1
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
        and CHANGE_VERSION in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    )


def first_task_events(history) -> int:
    """The events up to the end of what the run's first workflow task recorded: its start,
    its first task, and the commands that task completed with."""
    completed = next(e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    following = (
        e.event_id
        for e in history.events
        if e.event_id > completed
        and e.event_type in (EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)
    )
    return next(following, history.events[-1].event_id + 1) - 1


@pytest.mark.slow
async def test_a_goal_records_no_patch_markers_in_any_run(env, task_queue, store, workspace):
    (workspace / "notes.md").write_text("a note\n")
    steps = [
        {"name": f"r{i:02d}", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md", "max_bytes": 100 + i}}
        | ({"needs": [f"r{i - 1:02d}"]} if i else {})
        for i in range(40)
    ]
    # A chain long enough to continue as new twice: a continued run records nothing either.
    chain = spec(workspace, plan={"steps": steps}, allowed_tools=["read_file"], drift_every=0)
    chain.continue_as_new_after_events, chain.local_activities_up_to_s = 60, 0
    async with running_worker(env, task_queue, store):
        handle, result = await run_goal(env, task_queue, chain)
        runs = await run_ids(handle)
        histories = [await env.client.get_workflow_handle(handle.id, run_id=r).fetch_history() for r in runs]
    assert result.outcome == "succeeded" and len(runs) >= 3, (result.outcome, runs)
    assert [patch_markers(h) for h in histories] == [0] * len(runs)
    assert [change_version_upserts(h) for h in histories] == [0] * len(runs)
    # The first task: the start, its task (scheduled, started, completed), the one upsert of
    # perdure's own search attributes, and the first step's activity (14 events before 1.0).
    first = [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in histories[0].events]
    assert first[: first_task_events(histories[0])] == [
        "WORKFLOW_EXECUTION_STARTED",
        "WORKFLOW_TASK_SCHEDULED",
        "WORKFLOW_TASK_STARTED",
        "WORKFLOW_TASK_COMPLETED",
        "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES",
        "ACTIVITY_TASK_SCHEDULED",
    ]
