"""The activities a device daemon runs (workers/device.py): one tool call, and the lease.

Owns the device's side of the contracts in workflows/devices/device_contracts.py. A call runs
the worker's own tool implementation (activities/tools/run_tool.py `ToolActivities.run_tool`,
with its sandbox, confinement, replay policies and effect keys), inside the device's
root only, for the tools the device was started with only, with the network only when
both the device and the call allow it; its output comes back inline (capped), never as
a reference, because a device shares no disk with the workers. What the worker's
implementation writes to an artifact store goes to a scratch directory, one directory
per call, deleted when the call ends: the device keeps nothing between calls.

The lease activity is the device's presence: it heartbeats for as long as the daemon
lives, its details the calls running now, so the registry learns of a dead daemon from
the heartbeat timeout and `perdure devices` reads what runs where from the pending
activity. Generations fence both: a call or a lease for a newer session than this one
means this daemon was replaced, and it stops taking work. This module must not decide
whether a call needs a person (the goal asks before it dispatches) nor hold goal state.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.tools.run_tool import ToolActivities
from perdure.workflows.devices.device_contracts import (
    LEASE_S,
    MAX_DEVICE_PAYLOAD,
    DeviceActivities,
    DeviceToolInput,
    DeviceToolResult,
    LeaseInput,
    LeaseResult,
    RunningCall,
)
from perdure.workflows.shared.contracts import ToolInput, ToolResult
from perdure.workflows.shared.tool_specs import Tool

CALL_DIR_PREFIX = "call-"
"""A call's directory in the scratch; only these are removed when a daemon starts."""

STOP_POLL_S = 0.1
"""How often a stopping daemon's lease looks whether its last call has finished."""


@dataclass
class DeviceSessionState:
    """What one daemon process knows of itself, shared by its activities and its main loop."""

    name: str
    session: str = field(default_factory=lambda: uuid.uuid4().hex)
    generation: int = 0
    """0 until the registry answered the announce."""
    superseded: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a call or a lease names a newer session of this device."""
    announcing: bool = False
    """Announcing itself again: work for a newer generation may be this session's own."""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the daemon shuts down: the lease ends once the running calls have."""
    running: dict[str, RunningCall] = field(default_factory=dict)
    """workflow id/activity id -> the call, for the lease's heartbeats."""
    leases: int = 0
    """Leases of this session held now (0 or 1, but for a moment when one is renewed)."""
    lease_seen: float = field(default_factory=time.monotonic)
    """When a lease of this session last beat (or when the session began)."""

    def running_details(self) -> list[dict]:
        return [call.model_dump(mode="json") for call in self.running.values()]


class DeviceSuperseded(ApplicationError):
    """This daemon was replaced by a newer session of the same device."""


class _CallScratch(DiskArtifactStore):
    """One call's blobs in its own directory, so concurrent calls never share (and delete)
    one blob. `root` (`local_dir`) stays the whole scratch: it is what the sandbox hides from commands
    (activities/tools/run_tool.py passes `sandbox.hidden_paths(store.local_dir)`)."""

    def __init__(self, scratch: Path, call_dir: Path) -> None:
        super().__init__(scratch, keyring=None)
        self.call_dir = call_dir

    def _path(self, digest: str) -> Path:
        algo, _, hexdigest = digest.partition(":")
        return self.call_dir / algo / hexdigest


def clear_scratch(scratch: Path) -> None:
    """Remove the call directories a killed daemon left behind (nothing else in the directory)."""
    scratch.mkdir(parents=True, exist_ok=True)
    for leftover in scratch.glob(CALL_DIR_PREFIX + "*"):
        shutil.rmtree(leftover, ignore_errors=True)


def capped_output(text: str, limit: int = MAX_DEVICE_PAYLOAD) -> str:
    """`text` within `limit` UTF-8 bytes, a note included when it was cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    note = f"\n[truncated: the device returns at most {limit} bytes of a call's output; it was {len(data)} bytes]"
    kept = data[: limit - len(note.encode("utf-8"))]
    # A cut mid-character drops that character rather than showing a replacement.
    return kept.decode("utf-8", errors="ignore") + note


class DeviceToolActivities:
    """Register `run_tool` and `lease` with the device's worker."""

    def __init__(
        self,
        root: Path,
        tools: frozenset[str],
        network: bool,
        state: DeviceSessionState,
        scratch: Path,
        user_tools: Mapping[str, Tool] | None = None,
        workspaces: Mapping[str, Path] | None = None,
    ) -> None:
        self.root = root
        # A host's workspaces (name -> path): a call may work in any of them; a device has its root.
        self.workspaces = dict(workspaces or {})
        self.roots = {str(path) for path in self.workspaces.values()} or {str(root)}
        self.tools = tools
        # The user's own tools the daemon loaded (`perdure device --tools mypkg.tools`).
        self.user_tools = dict(user_tools or {})
        self.network = network
        self.state = state
        self.scratch = scratch

    def _superseded(self, what: str, generation: int) -> DeviceSuperseded:
        self.state.superseded.set()
        return DeviceSuperseded(
            f"device {self.state.name}: {what} is for session {generation}, and this daemon is session "
            f"{self.state.generation}: a newer daemon of this device took over, this one stops",
            type="DeviceSuperseded",
            non_retryable=True,
            # Expected when a daemon is replaced: the SDK logs it at debug, and the daemon says
            # in one line that it stops (workers/device.py).
            category=ApplicationErrorCategory.BENIGN,
        )

    @activity.defn(name=DeviceActivities.RUN_TOOL)
    async def run_tool(self, input: DeviceToolInput) -> DeviceToolResult:
        state = self.state
        if input.generation > state.generation:
            if state.announcing:
                # Probably this daemon's own new session, its answer still on the way: not
                # run now, and the goal sends it again ("not started").
                raise DeviceSuperseded(
                    f"device {state.name} is announcing itself again; the call was not run",
                    type="DeviceNotReady",
                    non_retryable=True,
                )
            raise self._superseded(f"a {input.tool} call of goal {input.goal_id}", input.generation)

        def refused(error: str) -> DeviceToolResult:
            return DeviceToolResult(tool=input.tool, ok=False, generation=state.generation, error=error)

        if input.root not in self.roots:
            if self.workspaces:
                holds = ", ".join(f"{name} ({path})" for name, path in sorted(self.workspaces.items()))
                return refused(f"host {state.name} holds no workspace {input.root} ({holds}); nothing was run")
            return refused(
                f"device {state.name} now works in {self.root}, not in {input.root} (it was restarted with "
                "another --root); nothing was run"
            )
        if input.tool not in self.tools:
            offers = ", ".join(sorted(self.tools))
            return refused(f"device {state.name} does not offer {input.tool} (offers: {offers}); nothing was run")

        info = activity.info()
        # Activity ids are unique within a workflow only: two goals may both send "7".
        running_key = f"{info.workflow_id}/{info.activity_id}"
        state.running[running_key] = RunningCall(
            goal_id=input.goal_id, node_key=input.node_key, tool=input.tool, started_at=datetime.now(UTC)
        )
        call_dir = self.scratch / f"{CALL_DIR_PREFIX}{uuid.uuid4().hex}"
        scratch = _CallScratch(self.scratch, call_dir)
        try:
            result = await ToolActivities(scratch, user_tools=self.user_tools).run_tool(self._tool_input(input))
            output = await scratch.aget_text(result.output) if result.output is not None else None
        finally:
            state.running.pop(running_key, None)
            await asyncio.to_thread(shutil.rmtree, call_dir, True)
        return self._device_result(result, output)

    def _tool_input(self, input: DeviceToolInput) -> ToolInput:
        return ToolInput(
            goal_id=input.goal_id,
            node_key=input.node_key,
            tool=input.tool,
            workspace=input.root,  # one of self.roots, checked above
            args=input.args,
            # Templates were filled in on the worker: `{{steps.x}}` left in them is literal text.
            resolved=True,
            call_id=input.call_id,
            confirmed=input.confirmed,
            resolution=input.resolution,
            # The device's own setting wins: a plan cannot give a command a network the owner did not.
            network=input.network and self.network,
            # A host's versioned, fenced writes (its scratch keeps the fences and locks); None on a device.
            fence=input.fence if self.workspaces else None,
            based_on=input.based_on if self.workspaces else None,
        )

    def _device_result(self, result: ToolResult, output: str | None) -> DeviceToolResult:
        return DeviceToolResult(
            tool=result.tool,
            ok=result.ok,
            generation=self.state.generation,
            output=capped_output(output) if output is not None else None,
            error=result.error,
            uncertain=result.uncertain,
            effect_key=result.effect_key,
            receipt=result.receipt,
            compensation=result.compensation,
            cost_usd=result.cost_usd,
            # A host's goal bases its later writes on them; a device's files are its owner's business.
            fingerprints=result.fingerprints if self.workspaces else [],
        )

    @activity.defn(name=DeviceActivities.LEASE)
    async def lease(self, input: LeaseInput) -> LeaseResult:
        """Hold the lease for its term, heartbeating the running calls. A cancellation (the
        registry renewed or replaced the session) propagates as it is: it is not a
        replacement of this daemon."""
        state = self.state
        if input.generation < state.generation:
            return LeaseResult(ended="stale")
        if input.generation > state.generation and input.session == state.session:
            # This session's own lease, ahead of the announce's answer: the registry gave us that generation.
            state.generation = input.generation
        if input.generation > state.generation:
            raise self._superseded("a lease", input.generation)
        timeout = activity.info().heartbeat_timeout
        every_s = (timeout.total_seconds() if timeout else LEASE_S) / 3
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + input.term_s
        next_beat = loop.time()
        state.leases += 1
        try:
            while True:
                now = loop.time()
                state.lease_seen = time.monotonic()
                if now >= next_beat:
                    # Also how a cancellation reaches this activity: the SDK delivers it through heartbeats.
                    activity.heartbeat(state.running_details())
                    next_beat = now + every_s
                stopping = state.stopping.is_set()
                if stopping and not state.running:
                    return LeaseResult(ended="stopped")
                if now >= ends_at:
                    return LeaseResult(ended="term")
                wake_in = min(ends_at, next_beat) - now
                if stopping:
                    # The device stays online while its last calls finish, then the lease ends.
                    await asyncio.sleep(min(STOP_POLL_S, wake_in))
                    continue
                try:
                    await asyncio.wait_for(state.stopping.wait(), timeout=wake_in)
                except TimeoutError:
                    pass
        finally:
            state.leases -= 1
            state.lease_seen = time.monotonic()
