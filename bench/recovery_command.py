"""How long a `replay: safe` shell command's step is held up when the worker running it is
SIGKILLed (`recovery_command_s`).

Two `perdure worker` subprocesses poll the same task queue (testing/crash.py's
CrashRig). A goal's one step is `run_command` with `replay: safe`: it appends a line
to a file in the workspace, then sleeps COMMAND_S. Once the line is there, the
worker whose activity runs the command is SIGKILLed; the standby runs it again after
the server notices the lost heartbeat. The figure, read from the goal's history:

    (step finished − kill) − the command's own duration

where the step finished when the workflow task that recorded its result completed,
and the command's own duration is the successful attempt's run (activity started to
completed). That leaves detection, the retry's start and the step's bookkeeping.
Each repeat is cross-checked from outside: the file shows the second line. The worst
repeat is the headline (the heartbeat's phase at the kill moves it by a few seconds).

    .venv/bin/python -m bench.recovery_command [--repeats 3] [--command-s 2]
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from bench.common import Section, event_seconds, goal_spec, make_workspace, parse_options, run_standalone, start_goal
from perdure.testing.crash import CrashRig, WorkerProcess
from perdure.workflows.goal.contracts.goal_contracts import Activities

KEY = "recovery_command_s"
KEYS = (KEY,)


@dataclass
class CommandRecovery:
    seconds: float
    restarted_s: float  # kill -> the standby's attempt started
    own_s: float
    rerun_seen_s: float  # kill -> the second line in the file, seen from outside
    attempt: int

    def describe(self) -> str:
        return (
            f"{self.seconds:.2f} s (attempt {self.attempt} started {self.restarted_s:.2f} s after the kill; "
            f"command's own run {self.own_s:.2f} s; second line seen {self.rerun_seen_s:.2f} s after the kill)"
        )


def _lines(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


async def _wait_lines(log: Path, count: int, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while _lines(log) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{log} never reached {count} lines in {timeout_s:g} s")
        await asyncio.sleep(0.01)
    return time.time()


async def _runner_of(rig: CrashRig, handle: WorkflowHandle) -> WorkerProcess:
    return await rig.running_activity_worker(handle, "no worker holds the command's activity", 30)


async def _step_timing(handle: WorkflowHandle) -> tuple[float, float, float, int, str]:
    """(attempt started, attempt completed, step recorded, attempt, worker identity) of the command."""
    tools: set[int] = set()
    started: dict[int, tuple[float, int, str]] = {}
    completed_at = recorded_at = None
    began, attempt, who = 0.0, 0, ""
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == Activities.RUN_TOOL:
                tools.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            if attrs.scheduled_event_id in tools:
                started[event.event_id] = (event_seconds(event), attrs.attempt, attrs.identity)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED and completed_at is None:
            attrs = event.activity_task_completed_event_attributes
            if attrs.started_event_id not in started:
                continue
            began, attempt, who = started[attrs.started_event_id]
            completed_at = event_seconds(event)
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and completed_at and not recorded_at:
            recorded_at = event_seconds(event)
    if completed_at is None or recorded_at is None:
        raise RuntimeError("the command's activity never completed")
    return began, completed_at, recorded_at, attempt, who


async def once(client: Client, root: Path, command_s: float) -> CommandRecovery:
    rig = CrashRig(client=client, root=root)
    try:
        await rig.start_standby_pair()
        workspace = make_workspace(root / "ws", {})
        log = workspace / "runs.log"
        step = {
            "name": "build",
            "kind": "tool",
            "tool": "run_command",
            "replay": "safe",
            "args": {"command": f"echo ran >> runs.log; sleep {command_s:g}", "timeout_s": 300},
        }
        spec = goal_spec(workspace, [step], allowed_tools=["run_command"])
        handle = await start_goal(client, rig.task_queue, spec, "bench-recovery-command")
        await _wait_lines(log, 1, timeout_s=60)
        victim = await _runner_of(rig, handle)
        standby = next(w for w in rig.workers if w is not victim)
        victim.kill()
        killed_at = time.time()
        seen = await _wait_lines(log, 2, timeout_s=120)
        result = await rig.result(handle, timeout_s=120)
        if result.outcome != "succeeded":
            raise RuntimeError(f"the command goal ended {result.outcome}: {result.unfinished}")
        began, completed, recorded, attempt, who = await _step_timing(handle)
        if who != standby.identity or attempt < 2:
            raise RuntimeError(f"the command completed on {who} at attempt {attempt}, not on the standby's retry")
        own = completed - began
        return CommandRecovery(
            seconds=recorded - killed_at - own,
            restarted_s=began - killed_at,
            own_s=own,
            rerun_seen_s=seen - killed_at,
            attempt=attempt,
        )
    finally:
        rig.close()


async def measure(client: Client, workdir: Path, repeats: int = 3, command_s: float = 2.0) -> Section:
    root = workdir / "recovery-command"
    runs = [await once(client, root / f"run{i}", command_s) for i in range(repeats)]
    worst = max(r.seconds for r in runs)
    notes = [
        f"two `perdure worker` processes; the one running a `replay: safe` run_command ({Activities.RUN_TOOL}, "
        f"command ~{command_s:g} s) is SIGKILLed; step finished − kill − the command's own run:"
    ]
    notes += [f"  run {i + 1}: {r.describe()}" for i, r in enumerate(runs)]
    return Section(figures={KEY: round(worst, 2)}, notes=notes)


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, repeats=3, command_s=2.0))


if __name__ == "__main__":
    main()
