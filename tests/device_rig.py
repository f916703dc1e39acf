"""An in-process device for tests and recordings: the real device activities on their own
task queue, announced to the real registry, without the daemon's process (no SIGKILL).
Not a test module."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from temporalio import activity
from temporalio.client import WithStartWorkflowOperation, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from perdure.activities.devices.device_tools import DeviceSessionState, DeviceToolActivities
from perdure.activities.tools.user.toolbox import Toolbox
from perdure.workflows.devices.device_contracts import (
    DEVICE_REGISTRY_WORKFLOW,
    DEVICE_TOOLS,
    DeviceActivities,
    DeviceAnnouncement,
    DeviceListing,
    DeviceRegistryInput,
    DeviceSession,
    DeviceToolInput,
    DeviceToolResult,
    RegistryQueries,
    RegistryUpdates,
    device_queue,
    registry_id,
)
from tests.helpers import wait_until


def freezing_on_first(tool: str) -> type[DeviceToolActivities]:
    """Device activities whose first call of `tool` hangs without a heartbeat: the machine
    froze mid-call (the goal's heartbeat timeout ends the call)."""

    class FreezesOnFirstCall(DeviceToolActivities):
        frozen = 0

        @activity.defn(name=DeviceActivities.RUN_TOOL)
        async def run_tool(self, input: DeviceToolInput) -> DeviceToolResult:
            if input.tool == tool and not FreezesOnFirstCall.frozen:
                FreezesOnFirstCall.frozen += 1
                await asyncio.sleep(3600)
            return await super().run_tool(input)

    return FreezesOnFirstCall


async def device_call_running(handle: WorkflowHandle, timeout_s: float = 30) -> None:
    """Until a worker has picked up the goal's device call (activity started events reach the
    history only when the call ends: this reads the pending activities)."""
    for _ in range(int(timeout_s * 10)):
        pending = (await handle.describe()).raw_description.pending_activities
        if any(p.activity_type.name == DeviceActivities.RUN_TOOL and p.HasField("last_started_time") for p in pending):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the device call did not start in {timeout_s} s")


class InProcessDevice:
    """A device daemon's activities and announce, without its process (no SIGKILL here)."""

    def __init__(
        self,
        env,
        task_queue: str,
        name: str,
        root: Path,
        user_tools: Toolbox | None = None,
        activities: type[DeviceToolActivities] = DeviceToolActivities,
        **announced,
    ) -> None:
        self.env, self.task_queue, self.name, self.root = env, task_queue, name, root
        self.activities = activities  # e.g. freezing_on_first("git_commit")
        # The user's own tools it runs (announce their names in `tools` too).
        self.user_tools = user_tools or Toolbox()
        # A 1 s lease lapsed on a loaded 2-core machine (the lease activity not picked up or
        # heartbeated within it): the device went offline and the goal waited for it for good
        # (test_ui_page's question never appeared). Nothing here dies without stopping, so a
        # longer lease costs no test any time.
        self.announced = {"tools": list(DEVICE_TOOLS), "lease_s": 5.0, **announced}
        self.state = DeviceSessionState(name=name)
        self.worker: Worker | None = None
        self._run: asyncio.Task | None = None

    async def start(self) -> DeviceSession:
        announcement = DeviceAnnouncement(
            name=self.name, session=self.state.session, root=str(self.root), **self.announced
        )
        session = await self.env.client.execute_update_with_start_workflow(
            RegistryUpdates.ANNOUNCE,
            announcement,
            start_workflow_operation=WithStartWorkflowOperation(
                DEVICE_REGISTRY_WORKFLOW,
                DeviceRegistryInput(),
                id=registry_id(self.task_queue),
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            ),
            result_type=DeviceSession,
        )
        self.state.generation = session.generation
        scratch = self.root.parent / f"scratch-{self.name}-{session.generation}"
        acts = self.activities(
            self.root,
            frozenset(self.announced["tools"]),
            self.announced.get("network", False),
            self.state,
            scratch,
            self.user_tools.implementations(),
            # A host (announced with `workspaces`) works in those, as workers/host.py's does.
            workspaces={name: Path(path) for name, path in self.announced.get("workspaces", {}).items()},
        )
        self.worker = Worker(
            self.env.client, task_queue=device_queue(self.name, self.task_queue), activities=[acts.run_tool, acts.lease]
        )
        self._run = asyncio.create_task(self.worker.run())
        return session

    async def stop(self) -> None:
        if self.worker is not None and self._run is not None:
            self.state.stopping.set()
            await self.worker.shutdown()
            with contextlib.suppress(asyncio.CancelledError):
                await self._run
            self.worker = self._run = None


async def registry_says(env, task_queue: str, name: str, online: bool, timeout_s: float = 30) -> None:
    handle = env.client.get_workflow_handle(registry_id(task_queue))
    for _ in range(int(timeout_s * 10)):
        listing = await handle.query(RegistryQueries.DEVICES, result_type=DeviceListing)
        if any(r.presence.name == name and r.presence.online is online for r in listing.devices):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the registry never said device {name} is {'online' if online else 'offline'}")


def write_on(device: str, path: str = "out.txt", content: str = "hello\n", **extra) -> dict:
    args = {"path": path, "content": content}
    return {"name": "save", "kind": "tool", "tool": "write_file", "device": device, "args": args, **extra}


async def question_of(handle: WorkflowHandle, topic: str):
    snap = await wait_until(handle, lambda s: any(q.topic == topic for q in s.questions))
    return next(q for q in snap.questions if q.topic == topic)
