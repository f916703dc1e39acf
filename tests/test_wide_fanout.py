"""A plan with many steps ready at once: the goal starts them in passes of at most
STARTS_PER_TASK per workflow task (workflows/goal/scheduler.py), so a task's completion
stays far below Temporal's 4 MB limit on a gRPC message and its work far below the SDK's
2 s deadlock limit. Found by sizing a wide fan-out: 5,000 independent writes put 5,000
ScheduleActivityTask commands (about 1 KB each) in one completion, and the goal made no
progress for the 300 s the test waited (it took 150 s with passes; too long to keep here,
so the test holds 1,200 writes, which passes would split in three)."""

from __future__ import annotations

import pytest
from temporalio.api.enums.v1 import EventType

from perdure.testing.fakes import LedgerAPI
from perdure.workflows.goal.contracts.messages import Abort
from perdure.workflows.goal.scheduler import STARTS_PER_TASK
from tests.helpers import goal_result, run_ids, running_worker, start, submit, wait_until, workflow_task_failures

WRITES = 1_200

# Their workflow tasks take up to 0.7 s on an idle 2-core machine; beside four other tests
# the SDK's 2 s deadlock check failed them on every retry (two clean-clone runs of four).
pytestmark = pytest.mark.cpu_heavy


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
    assert [workflow_task_failures(history, burst=True) for history in runs] == [[]] * len(runs)
    assert sorted(entry["body"]["n"] for entry in ledger.ledger()) == list(range(WRITES))  # each write once
    scheduled_per_task = []
    for history in runs:  # the commands of each task: the events after its completion, up to the next task's
        count = 0
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                count += 1
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                scheduled_per_task.append(count)
                count = 0
        scheduled_per_task.append(count)
    assert max(scheduled_per_task) <= STARTS_PER_TASK, max(scheduled_per_task)


@pytest.mark.slow
async def test_six_hundred_reads_ready_at_once_start_in_two_workflow_tasks_and_the_goal_finishes(
    env, task_queue, store, workspace
):
    """Reads settle within the task that starts them (local activities): the loop must wait
    for the next task, not spin on ready steps it may not start (the first version of the
    bound did, and its workflow task failed the SDK's 2 s deadlock check)."""
    (workspace / "notes.md").write_text("a note\n")
    steps = [
        {"name": f"r{i:03d}", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md", "max_bytes": 100 + i}}
        for i in range(600)
    ]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["read_file"], drift_every=0)
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.outcome == "succeeded", result.excerpt
    assert workflow_task_failures(history) == []
    timers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    assert len(timers) == 1  # one full task, then the rest


@pytest.mark.slow
async def test_an_abort_during_a_wide_fanout_of_slow_writes_ends_the_goal_and_sends_none_twice(
    env, task_queue, store, workspace, fake_service
):
    """700 writes ready at once, started over two workflow tasks, each answered a second
    after it is recorded: the abort comes while they are in flight. Those settle (a write
    is never cut off; how many had started depends on the machine), the goal ends aborted
    with no failed workflow task, and no write reaches the ledger twice."""
    ledger = fake_service(LedgerAPI, respond_delay_s=1.0)
    steps = [
        {
            "name": f"w{i:04d}",
            "kind": "tool",
            "tool": "http_request",
            "args": {"method": "POST", "url": f"{ledger.base_url}/entries", "body": {"n": i}},
        }
        for i in range(700)
    ]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["http_request"], drift_every=0)
        await wait_until(handle, lambda s: s.counts.get("running", 0) >= 100, timeout_s=60)
        await submit(handle, Abort(request_id="stop-1", reason="enough"))
        result = await goal_result(handle)
        history = await handle.fetch_history()
    assert result.outcome == "aborted", result.excerpt
    assert workflow_task_failures(history, burst=True) == []
    numbers = [entry["body"]["n"] for entry in ledger.ledger()]
    assert numbers and len(numbers) == len(set(numbers))  # none twice
