"""Recovery with the timeouts perdure chooses (docs/guide/recovery.md): real
`perdure worker` processes, one SIGKILLed in the middle of a step, a standby taking over;
and a worker that is busy, not dead, never judged dead. Figures belong to the benchmarks
(bench/recovery.py): bounds here are generous, and what is asserted is what happened.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from perdure.testing.crash import open_writer, serve_fifo
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.shared.retries import HEARTBEAT_TIMEOUT
from tests.builders import spec

pytestmark = pytest.mark.process


async def lines_in(path: Path, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or len(path.read_text().splitlines()) < count:
        assert time.monotonic() < deadline, f"{path} never had {count} lines"
        await asyncio.sleep(0.02)


def tool_attempts(history: WorkflowHistory) -> list[tuple[int, str, timedelta, float]]:
    """(attempt, worker identity, heartbeat timeout, seconds it ran) of each completed tool activity."""
    scheduled: dict[int, timedelta] = {}
    started = {}
    done = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == Activities.RUN_TOOL:
                scheduled[event.event_id] = attrs.heartbeat_timeout.ToTimedelta()
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started[event.event_id] = event
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = event.activity_task_completed_event_attributes
            if attrs.scheduled_event_id in scheduled:
                begun = started[attrs.started_event_id]
                run_s = event.event_time.ToDatetime().timestamp() - begun.event_time.ToDatetime().timestamp()
                info = begun.activity_task_started_event_attributes
                done.append((info.attempt, info.identity, scheduled[attrs.scheduled_event_id], run_s))
    return done


def task_timeouts_after(history: WorkflowHistory, moment: float) -> list[str]:
    return [
        f"workflow task timed out ({e.workflow_task_timed_out_event_attributes.timeout_type})"
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
        and e.event_time.ToDatetime().timestamp() > moment
    ]


async def test_a_command_killed_with_its_worker_is_recorded_by_the_standby_without_the_dead_workers_sticky_wait(
    crash_rig, tmp_path
):
    """The goal and its command ran on the killed worker. The standby retries the command
    after the heartbeat timeout; the workflow task that records its result must not wait
    out the dead worker's sticky queue (a WorkflowTaskTimedOut, schedule-to-start, 3 s):
    the retried attempt released the goal from it (workers/lost_worker.py)."""
    rig = crash_rig()
    await rig.start_standby_pair()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    step = {
        "name": "build",
        "kind": "tool",
        "tool": "run_command",
        "replay": "safe",
        "args": {"command": "echo ran >> runs.log; sleep 1", "timeout_s": 60},
    }
    goal = spec(workspace, plan={"steps": [step]}, allowed_tools=["run_command"], drift_every=0)
    handle = await rig.start_goal(goal)
    await lines_in(workspace / "runs.log", 1)
    victim = await rig.running_activity_worker(handle, "no worker holds the command", 30)
    standby = next(w for w in rig.workers if w is not victim)
    victim.kill()
    killed_at = time.time()

    result = await rig.result(handle)
    settled_s = time.time() - killed_at
    assert result.outcome == "succeeded", result.excerpt
    assert len((workspace / "runs.log").read_text().splitlines()) == 2  # run again, once
    history = await handle.fetch_history()
    [(attempt, who, heartbeat, _)] = tool_attempts(history)
    assert attempt == 2 and who == standby.identity
    assert heartbeat == HEARTBEAT_TIMEOUT
    assert task_timeouts_after(history, killed_at) == []
    assert settled_s < 20, settled_s  # generous: bench/recovery_command.py measures it


async def test_a_cpu_bound_command_keeps_its_heartbeat_while_it_keeps_both_cores_busy(crash_rig, tmp_path):
    """A command spinning on both cores for three heartbeat timeouts: the worker's heartbeats
    come from its event loop, not the command, so the server never judges it dead and the
    command runs once."""
    rig = crash_rig()
    worker = rig.start_worker()
    await worker.wait_polling()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    busy_s = 3 * HEARTBEAT_TIMEOUT.total_seconds()
    spin = f"python3 -c 'import time\nend = time.time() + {busy_s:g}\nwhile time.time() < end: pass'"
    step = {
        "name": "crunch",
        "kind": "tool",
        "tool": "run_command",
        "replay": "safe",
        "args": {"command": f"echo ran >> runs.log; {spin} & {spin} & {spin}; wait", "timeout_s": 120},
    }
    goal = spec(workspace, plan={"steps": [step]}, allowed_tools=["run_command"], drift_every=0)
    handle = await rig.start_goal(goal)

    result = await rig.result(handle)
    assert result.outcome == "succeeded", result.excerpt
    assert (workspace / "runs.log").read_text().splitlines() == ["ran"]
    [(attempt, _, heartbeat, ran_s)] = tool_attempts(await handle.fetch_history())
    assert (attempt, heartbeat) == (1, HEARTBEAT_TIMEOUT)
    assert ran_s >= busy_s  # it did outlast several heartbeat timeouts


async def test_a_read_segment_killed_with_its_worker_is_taken_over_by_the_standby(crash_rig, tmp_path):
    """The kill lands inside a read (a FIFO whose writer is late) in a read segment: the
    standby takes the goal over when the workflow task times out, reads again, and the
    goal ends with every step once."""
    rig = crash_rig()
    await rig.start_standby_pair()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    for name in ("a.txt", "b.txt"):
        (workspace / name).write_text(f"{name}\n")
    gate = workspace / "gate.fifo"
    os.mkfifo(gate)
    steps = []
    for i, path in enumerate(["a.txt", "gate.fifo", "b.txt"]):
        steps.append({"name": f"r{i}", "kind": "tool", "tool": "read_file", "args": {"path": path}})
        if i:
            steps[-1]["needs"] = [f"r{i - 1}"]
    goal = spec(workspace, plan={"steps": steps}, allowed_tools=["read_file"], drift_every=0)
    handle = await rig.start_goal(goal)
    held = await open_writer(gate, timeout_s=60)
    victim = await rig.reader_of(gate)
    victim.kill()
    killed_at = time.time()
    os.close(held)
    reopened: asyncio.Future = asyncio.get_running_loop().create_future()
    served = asyncio.create_task(serve_fifo(gate, reopened))
    try:
        result = await rig.result(handle)
    finally:
        served.cancel()

    assert result.outcome == "succeeded", result.excerpt
    assert sorted(result.outputs) == ["r0", "r1", "r2"]
    started = (await handle.fetch_history()).events[0].workflow_execution_started_event_attributes
    assert started.workflow_task_timeout.ToTimedelta() == goal.task_timeout() == timedelta(seconds=2)
    assert reopened.result() - killed_at < 15  # generous: bench/recovery.py measures it


async def test_a_worker_killed_while_writing_the_report_is_taken_over_in_seconds(crash_rig, tmp_path):
    """The report is every goal's last step. Its activity used to have no heartbeat timeout:
    a worker killed while writing it was noticed at its 60 s start-to-close timeout. The
    next worker is started after the kill, so the one killed is surely the one writing."""
    rig = crash_rig()
    victim = rig.start_worker(fault="report:1")
    await victim.wait_polling()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("alpha\n")
    step = {"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "a.txt"}}
    handle = await rig.start_goal(spec(workspace, plan={"steps": [step]}, allowed_tools=["read_file"], drift_every=0))
    await rig.wait_killed(victim)
    killed_at = time.time()
    await rig.after_kill(handle)
    rig.start_worker()

    result = await rig.result(handle)
    assert result.outcome == "succeeded", result.excerpt
    assert rig.store.get_text(result.report).startswith("# Goal report")
    assert time.time() - killed_at < 20  # generous next to the 2 s heartbeat timeout; it was 60 s
