"""A plan with many steps ready at once: the goal starts them in passes of at most
DISPATCH_PER_PASS per workflow task (workflows/goal/scheduler.py), so a task's completion
stays far below Temporal's 4 MB limit on a gRPC message and its work far below the SDK's
2 s deadlock limit. Found by sizing a wide fan-out: 5,000 independent writes put 5,000
ScheduleActivityTask commands (about 1 KB each) in one completion, and the goal made no
progress for the 300 s the test waited (it took 150 s with passes; too long to keep here,
so the test holds 1,200 writes, which passes would split in three)."""

from __future__ import annotations

import pytest
from temporalio.api.enums.v1 import EventType

from testing.fakes import LedgerAPI
from tests.helpers import run_ids, running_worker, start, workflow_task_failures
from workflows.goal.scheduler import DISPATCH_PER_PASS

WRITES = 1_200


@pytest.mark.slow
async def test_twelve_hundred_independent_writes_start_in_passes_of_bounded_size_and_each_is_sent_once(
    env, task_queue, store, workspace, fake_service
):
    ledger = fake_service(LedgerAPI)
    steps = [
        {
            "name": f"w{i:05d}",
            "kind": "tool",
            "tool": "http_request",
            "args": {"method": "POST", "url": f"{ledger.base_url}/entries", "body": {"n": i}},
        }
        for i in range(WRITES)
    ]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["http_request"], drift_every=0)
        result = await handle.result()
        runs = [
            await env.client.get_workflow_handle(handle.id, run_id=r).fetch_history() for r in await run_ids(handle)
        ]
    assert result.outcome == "succeeded", (result.unfinished[:5], result.failure)
    assert [workflow_task_failures(history) for history in runs] == [[]] * len(runs)
    assert sorted(entry["body"]["n"] for entry in ledger.ledger()) == list(range(WRITES))  # each write once
    scheduled_per_task, count = [], 0
    for event in (e for history in runs for e in history.events):
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            count += 1
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            scheduled_per_task.append(count)
            count = 0
    assert max(scheduled_per_task) <= DISPATCH_PER_PASS, max(scheduled_per_task)
