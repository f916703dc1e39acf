"""How soon a step waiting for an offline device starts once the device is back
(`device_resume_s`).

A perdure worker and the device daemon's own code (`perdure.workers.device.run_device`, the
same announce, lease and activities `perdure device` runs) in this process. Each
repeat: the device announces itself and stops, so the registry knows it offline; a
goal's read step on it waits as `offline`; then the daemon starts again. The figure is

    the device activity's start (its ActivityTaskStarted event) − the moment the
    daemon was registered again (its announce answered)

which covers the registry telling the goal, the goal's workflow task, the call's
resolution and its pick-up by the device. The daemon's own start-up (a Python process,
the connection) is not in it: it is the same for any worker. The median is the
headline; the worst repeat is printed.

    .venv/bin/python -m bench.device_resume [--repeats 5]
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from bench.common import (
    Section,
    event_seconds,
    goal_spec,
    median,
    new_id,
    parse_options,
    perdure_worker,
    run_standalone,
)
from bench.common import start_goal as start_bench_goal
from perdure.workers.device import run_device
from perdure.workflows.devices.device_contracts import DeviceActivities, DeviceListing, RegistryQueries, registry_id
from perdure.workflows.goal.contracts.goal_contracts import ProgressSnapshot
from perdure.workflows.goal.goal_workflow import GoalWorkflow

KEY = "device_resume_s"
KEYS = (KEY,)
NAME = "bench-laptop"


async def _until(handle: WorkflowHandle, check, what: str, timeout_s: float = 60) -> ProgressSnapshot:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snapshot = await handle.query(GoalWorkflow.progress)
        if check(snapshot):
            return snapshot
        await asyncio.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


async def _offline(client: Client, task_queue: str, timeout_s: float = 60) -> None:
    registry = client.get_workflow_handle(registry_id(task_queue))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listing = await registry.query(RegistryQueries.DEVICES, result_type=DeviceListing)
        if all(not r.presence.online for r in listing.devices):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the device never went offline")


class _Daemon:
    """`run_device` in a task; `online_at` is when its announce was answered."""

    def __init__(self, client: Client, root: Path, task_queue: str, scratch: Path) -> None:
        self.online_at: float | None = None
        self._online = asyncio.Event()

        def online(_config, _session) -> None:
            self.online_at = time.time()
            self._online.set()

        self._task = asyncio.create_task(
            run_device(
                client,
                name=NAME,
                root=root,
                approval={"*": "never"},
                lease_s=3,
                scratch=scratch,
                task_queue=task_queue,
                on_online=online,
            )
        )

    async def online(self) -> None:
        await asyncio.wait_for(self._online.wait(), 60)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def _device_call_started(handle: WorkflowHandle) -> float:
    scheduled: set[int] = set()
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == DeviceActivities.RUN_TOOL:
                scheduled.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            if event.activity_task_started_event_attributes.scheduled_event_id in scheduled:
                return event_seconds(event)
    raise RuntimeError("the device call never started")


async def measure(client: Client, workdir: Path, repeats: int = 5) -> Section:
    task_queue = new_id("bench-device")
    home = workdir / "device-resume"
    root = home / "laptop"
    root.mkdir(parents=True, exist_ok=True)
    (root / "notes.md").write_text("notes on the laptop\n")
    read = {"name": "read", "kind": "tool", "tool": "read_file", "device": NAME, "args": {"path": "notes.md"}}
    waits: list[float] = []
    async with perdure_worker(client, task_queue, home):
        first = _Daemon(client, root, task_queue, home / "scratch")
        await first.online()
        await first.stop()
        await _offline(client, task_queue)
        for i in range(repeats):
            spec = goal_spec(root.parent, [read], allowed_tools=["read_file"], label=f"device resume {i}")
            handle = await start_bench_goal(client, task_queue, spec, "device-resume")
            await _until(handle, lambda s: s.waiting_for_devices == {"read": NAME}, "the step to wait")
            daemon = _Daemon(client, root, task_queue, home / "scratch")
            await daemon.online()
            result = await handle.result()
            if result.outcome != "succeeded":
                raise RuntimeError(f"the goal did not succeed: {result.excerpt}")
            assert daemon.online_at is not None
            waits.append(await _device_call_started(handle) - daemon.online_at)
            await daemon.stop()
            await _offline(client, task_queue)
    notes = [
        f"device back online -> its waiting step started: median {median(waits):.3f} s, worst {max(waits):.3f} s "
        f"over {repeats} repeats ({', '.join(f'{w:.3f}' for w in waits)})"
    ]
    return Section(figures={KEY: round(median(waits), 3)}, notes=notes)


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, repeats=5))


if __name__ == "__main__":
    main()
