"""A goal's commands do not depend on how Temporal groups a workflow task's events into
activations.

The same history can reach the workflow as one activation or as several: a worker that
had not cached a goal answers a query by replaying it, applying the events that arrived
since the last workflow task, and the task that follows brings the rest as a second
activation; a replay elsewhere later sees them as one. A goal whose timed wait was set
again at every wake-up made a timer in the first grouping that the second never made, and
its replay failed with `[TMPRL1100] Timer fired event did not have expected timer id`
(seen in test_hosts when a host that ran the goal was killed and `perdure status` asked
about it). These tests record a real goal whose workflow task carries two events at once (two
messages; a device call's timeout and a message), then replay its history both grouped and
split one job per activation, the earlier ones at the earlier time where that matters.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.api.enums.v1 import EventType

from perdure.workflows.goal.contracts.messages import Abort, Answer, Park, Steer
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests import goldens
from tests.device_rig import InProcessDevice, device_call_running, freezing_on_first, question_of, write_on
from tests.helpers import goal_result, running_worker, start, submit, wait_until

WAIT_AN_HOUR = {"name": "later", "kind": "wait", "after": "1h"}
# Long enough for a worker to stop, two messages to be sent and another worker to start.
WAKE_AFTER_S = 6


def signals_in_one_task(history) -> int:
    """The most signals received between two workflow tasks' starts."""
    most = count = 0
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            count += 1
            most = max(most, count)
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            count = 0
    return most


async def until_a_task_completed_after_the_signals(handle, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = (await handle.fetch_history()).events
        signalled = [e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
        done = [e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
        if signalled and done and done[-1] > signalled[-1]:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no workflow task completed after the signals in {timeout_s} s")


@pytest.mark.slow
async def test_a_parked_goal_woken_twice_in_one_task_replays_however_the_task_is_split(
    env, task_queue, store, workspace
):
    # A park that wakes by itself: the goal's loop waits on a timer while messages wake it,
    # and the timer fires after them (a fired timer is where a replay compares timer ids).
    async with running_worker(env, task_queue, store, max_cached_workflows=0):
        handle = await start(env, task_queue, workspace, [WAIT_AN_HOUR])
        wake = datetime.now(UTC) + timedelta(seconds=WAKE_AFTER_S)
        await submit(handle, Park(request_id="p1", reason="lunch", until=wake))
        await wait_until(handle, lambda s: s.phase == "parked")
    # No worker: both messages wait for the next workflow task, which carries them together.
    for n in (1, 2):
        await handle.signal(GoalWorkflow.message_signal, Steer(request_id=f"s{n}", text=f"hint {n}").model_dump())
    async with running_worker(env, task_queue, store):
        await until_a_task_completed_after_the_signals(handle)
        assert datetime.now(UTC) < wake, "the messages came after the wake time: raise WAKE_AFTER_S"
        await wait_until(handle, lambda s: s.phase != "parked", timeout_s=WAKE_AFTER_S + 30)
        await handle.signal(GoalWorkflow.message_signal, Abort(request_id="a1").model_dump())
        result = await goal_result(handle)
    assert result.outcome == "aborted", result.excerpt
    history = await handle.fetch_history()
    assert signals_in_one_task(history) >= 2  # the grouping under test happened
    await goldens.replayer().replay_workflow(history)  # as recorded: one activation
    with goldens.activations_split() as split:
        replayed = await goldens.replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert split, "no activation of several jobs was split: the test would prove nothing"
    assert replayed.replay_failure is None, replayed.replay_failure


async def history_has(handle, event_type, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(e.event_type == event_type for e in (await handle.fetch_history()).events):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {EventType.Name(event_type)} in {timeout_s} s")


@pytest.mark.slow
async def test_a_device_wait_begun_in_one_activation_and_past_its_limit_in_the_next_replays_however_split(
    env, task_queue, store, workspace, tmp_path
):
    # The step's device call times out while no worker runs the goal, and a message comes
    # too: the next task carries both. Split, the timeout is seen at the time of the task
    # before (as by a query's replay on a worker that had not cached the goal), the message
    # at the task's own time, by when the device wait's 1 s limit has passed. The wait's
    # timer was once set as "now + 1 s" at each of them: a timer the grouped run never made
    # (the failure seen in test_hosts, [TMPRL1100] Timer fired event did not have expected timer id).
    root = tmp_path / "machine"
    root.mkdir()
    frozen = freezing_on_first("write_file")
    laptop = InProcessDevice(env, task_queue, "laptop", root, activities=frozen, lease_s=2.0, approval={"*": "never"})
    async with running_worker(env, task_queue, store):
        await laptop.start()
        try:
            steps = [write_on("laptop", device_wait_s=1)]
            handle = await start(env, task_queue, workspace, steps, allowed_tools=["write_file"])
            await device_call_running(handle)
        except BaseException:
            await laptop.stop()
            raise
    try:
        await handle.signal(GoalWorkflow.message_signal, Steer(request_id="s1", text="hint").model_dump())
        await history_has(handle, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT)  # the heartbeat's 3 s
    finally:
        await laptop.stop()  # the device is gone for good
    async with running_worker(env, task_queue, store):
        card = await question_of(handle, "device_offline")
        await submit(handle, Answer(request_id="skip-1", question_id=card.id, choice="skip"))
        result = await goal_result(handle)
    assert result.outcome != "succeeded", result.excerpt  # the write was skipped
    history = await handle.fetch_history()
    await goldens.replayer().replay_workflow(history)  # as recorded: one activation
    with goldens.activations_split(stale_now=True) as split:
        replayed = await goldens.replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert split, "no activation of several jobs was split: the test would prove nothing"
    assert replayed.replay_failure is None, replayed.replay_failure
