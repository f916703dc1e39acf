"""A chain of runs records its behaviour changes (`workflow.patched` markers) once: a run
continued from one that had them takes them from its carried state, so its events go to its
work. Before, every run of a long goal began with one marker per patch (about twenty of its
first events), and a goal that continues as new every 50 events did a third of the work per run.
And the first run records one marker for them all, the baseline (workflows/goal/patches.py),
and one for each change made after it: before, it recorded a marker and a TemporalChangeVersion
upsert per patch, about fifty events."""

from __future__ import annotations

import json

import pytest
from temporalio.api.enums.v1 import EventType

from perdure.workflows.goal.patches import (
    BASELINE_PATCH,
    PARKS_HOLD_VERDICTS_PATCH,
    UNSUCCESSFUL_GOALS_FAIL_PATCH,
    WORKER_LOSS_PATCH,
)
from tests.helpers import run_ids, running_worker, start


def change_version_upserts(history) -> int:
    return sum(
        1
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
        and "TemporalChangeVersion"
        in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    )


def patch_markers(history) -> list[str]:
    """The ids of the patch markers the run recorded."""
    return [
        json.loads(e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data)["id"]
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]


@pytest.mark.slow
async def test_the_first_run_records_one_patch_marker_and_the_runs_after_it_none(env, task_queue, store, workspace):
    (workspace / "notes.md").write_text("a note\n")
    steps = [
        {"name": f"r{i:02d}", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md", "max_bytes": 100 + i}}
        | ({"needs": [f"r{i - 1:02d}"]} if i else {})
        for i in range(40)
    ]
    async with running_worker(env, task_queue, store):
        handle = await start(
            env,
            task_queue,
            workspace,
            steps,
            allowed_tools=["read_file"],
            continue_as_new_after_events=60,
            local_activities_up_to_s=0,
            drift_every=0,
        )
        result = await handle.result()
        runs = await run_ids(handle)
        histories = [await env.client.get_workflow_handle(handle.id, run_id=r).fetch_history() for r in runs]
    assert result.outcome == "succeeded"
    markers = [patch_markers(h) for h in histories]
    # The baseline and each change made after it, then nothing: carried.
    first = [BASELINE_PATCH, PARKS_HOLD_VERDICTS_PATCH, UNSUCCESSFUL_GOALS_FAIL_PATCH, WORKER_LOSS_PATCH]
    assert len(runs) >= 3 and markers == [first] + [[]] * (len(runs) - 1), markers
    assert [change_version_upserts(h) for h in histories] == [len(first)] + [0] * (len(runs) - 1)
