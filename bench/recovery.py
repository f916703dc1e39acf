"""How long a goal's step waits after the worker running it is SIGKILLed (`recovery_s`).

Two `perdure worker` subprocesses poll the same task queue (testing/crash.py's
CrashRig, as the crash tests use it). A goal runs until a step is in flight; the
benchmark finds which worker runs it, SIGKILLs that one, and times how long until the
step runs again on the standby, as the server records it: the next attempt's activity
start, or the standby's first workflow task when the step is a local activity (then
the whole read segment re-runs there). One step of each kind:

- a remote write (`recovery_write_s`): `http_request` POST to the fake ledger service,
  which takes several seconds to answer (the kill lands while the request is open);
- a read segment (`recovery_read_s`): `read_file` steps in a chain, one of which reads a
  FIFO whose writer is late (a slow read; the kill lands while the worker waits in it);
- a model call (`recovery_model_s`): an llm step whose scripted model holds the first
  request open;
- a replay-safe command (`recovery_command_s`, bench/recovery_command.py): until the
  step is recorded, less the command's own run, so it also counts the workflow task
  that records the result (which must not wait for the dead worker's sticky queue).

The worst of them is `recovery_s`. Each is also cross-checked from outside: the ledger
sees the retried request, the FIFO sees the standby open it, the model server sees the
second request.

    .venv/bin/python -m bench.recovery [--wait-s 150] [--command-repeats 3]
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle

from bench import recovery_command
from bench.common import Section, event_seconds, goal_spec, make_workspace, parse_options, run_standalone, start_goal
from perdure.activities.models.scripted import ScriptedServer
from perdure.testing.crash import CrashRig, open_writer, serve_fifo
from perdure.testing.fakes import LedgerAPI

# Each kind's figure, in the order they are measured; `recovery_s` is the worst.
KINDS = ("recovery_write_s", "recovery_read_s", "recovery_model_s", recovery_command.KEY)
KEYS = ("recovery_s", *KINDS)


@dataclass
class Recovery:
    step: str
    seconds: float | None  # None: not resumed within the wait
    how: str
    outside_s: float | None
    outside_how: str

    def describe(self, wait_s: float) -> str:
        if self.seconds is None:
            return f"{self.step}: NOT resumed on the standby within {wait_s:.0f} s of the kill"
        outside = f"; {self.outside_how} {self.outside_s:.2f} s after the kill" if self.outside_s is not None else ""
        return f"{self.step}: resumed {self.seconds:.2f} s after the kill ({self.how}){outside}"


async def resumed_at(handle: WorkflowHandle, standby: str, killed_at: float) -> tuple[float, str] | None:
    """When the server first recorded work for this goal on the standby after the kill."""
    found: list[tuple[float, str]] = []
    description = await handle.describe()
    for pending in description.raw_description.pending_activities:
        if (
            pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            and pending.last_worker_identity == standby
            and pending.last_started_time.ToDatetime().timestamp() > killed_at
        ):
            found.append((pending.last_started_time.ToDatetime().timestamp(), f"activity attempt {pending.attempt}"))
    async for event in handle.fetch_history_events():
        if event_seconds(event) <= killed_at:
            continue
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            if event.workflow_task_started_event_attributes.identity == standby:
                found.append((event_seconds(event), "workflow task on the standby"))
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            if attrs.identity == standby:
                found.append((event_seconds(event), f"activity attempt {attrs.attempt}"))
    return min(found) if found else None


async def wait_resumed(
    handle: WorkflowHandle, standby: str, killed_at: float, wait_s: float
) -> tuple[float | None, str]:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        found = await resumed_at(handle, standby, killed_at)
        if found is not None:
            return found[0] - killed_at, found[1]
        await asyncio.sleep(0.05)
    return None, "not resumed"


async def activity_killed(
    rig: CrashRig, handle: WorkflowHandle, in_flight: Callable[[], object], again: Callable[[], object], wait_s: float
) -> tuple[float | None, str, float | None]:
    """SIGKILL the worker running the goal's activity once `in_flight()`; (seconds until
    the standby's next attempt started, how, seconds until `again()` from outside)."""
    victim = await rig.running_activity_worker(handle, "the step never got in flight", 60, ready=in_flight)
    standby = next(w for w in rig.workers if w is not victim)
    victim.kill()
    killed_at = time.time()
    seconds, how = await wait_resumed(handle, standby.identity, killed_at, wait_s)
    outside = None
    deadline = time.monotonic() + 5
    while not again() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    if again():
        outside = time.time() - killed_at
    return seconds, how, outside


async def succeeded(rig: CrashRig, handle: WorkflowHandle, what: str) -> None:
    result = await rig.result(handle, timeout_s=120)
    if result.outcome != "succeeded":
        raise RuntimeError(f"the {what} goal ended {result.outcome}: {result.unfinished}")


async def remote_write(client: Client, root: Path, wait_s: float) -> Recovery:
    with LedgerAPI(respond_delay_s=8.0) as ledger:
        rig = CrashRig(client=client, root=root)
        try:
            await rig.start_standby_pair()
            workspace = make_workspace(root / "ws", {"a.txt": "alpha\n", "b.txt": "beta\n"})
            steps = [
                {"name": "before", "kind": "tool", "tool": "read_file", "args": {"path": "a.txt"}},
                {
                    "name": "write",
                    "kind": "tool",
                    "tool": "http_request",
                    "needs": ["before"],
                    # With an undo, so it keeps its activity (a fully known keyed write with
                    # nothing to undo is a local activity since issue 39: docs/guide/side-effects.md)
                    # and its recovery is a dead worker's activity noticed by its heartbeat.
                    "args": {
                        "method": "POST",
                        "url": f"{ledger.base_url}/entries",
                        "body": {"bench": "recovery"},
                        "undo": {"method": "DELETE", "url": f"{ledger.base_url}/entries/1"},
                    },
                },
                {"name": "after", "kind": "tool", "tool": "read_file", "needs": ["write"], "args": {"path": "b.txt"}},
            ]
            spec = goal_spec(workspace, steps, allowed_tools=["read_file", "http_request"])
            handle = await start_goal(client, rig.task_queue, spec, "bench-recovery-write")
            seconds, how, outside = await activity_killed(
                rig, handle, lambda: ledger.requests == 1, lambda: ledger.requests > 1, wait_s
            )
            await succeeded(rig, handle, "write")
            return Recovery("remote write (http_request, slow service)", seconds, how, outside, "ledger got the retry")
        finally:
            rig.close()


async def model_call(client: Client, root: Path, wait_s: float) -> Recovery:
    script = {
        "replies": [
            # The first request is held open long enough for its worker to die while it waits.
            {"when": "RECOVERY", "times": 1, "content": "never delivered", "delay_s": 60},
            {"when": "RECOVERY", "content": "The notice is written."},
        ]
    }
    with ScriptedServer(script) as model:
        rig = CrashRig(client=client, root=root, model=model)
        try:
            await rig.start_standby_pair()
            workspace = make_workspace(root / "ws", {})
            steps = [{"name": "notice", "kind": "llm", "prompt": "RECOVERY: write the notice."}]
            spec = goal_spec(workspace, steps, model_profile="test")
            handle = await start_goal(client, rig.task_queue, spec, "bench-recovery-model")

            def requests() -> int:
                return sum("RECOVERY" in r["last_message"] for r in model.requests())

            seconds, how, outside = await activity_killed(
                rig, handle, lambda: requests() == 1, lambda: requests() > 1, wait_s
            )
            await succeeded(rig, handle, "model")
            return Recovery("model call (llm step, reply held open)", seconds, how, outside, "model got the retry")
        finally:
            rig.close()


async def read_segment(client: Client, root: Path, wait_s: float) -> Recovery:
    rig = CrashRig(client=client, root=root)
    gate = root / "ws" / "gate.fifo"
    try:
        await rig.start_standby_pair()
        workspace = make_workspace(root / "ws", {"a.txt": "alpha\n", "b.txt": "beta\n"})
        os.mkfifo(gate)
        paths = ["a.txt", "b.txt", "gate.fifo", "a.txt", "b.txt"]
        steps = []
        for i, path in enumerate(paths):
            step = {"name": f"r{i}", "kind": "tool", "tool": "read_file", "args": {"path": path}}
            if i:
                step["needs"] = [f"r{i - 1}"]
            steps.append(step)
        spec = goal_spec(workspace, steps, allowed_tools=["read_file"])
        handle = await start_goal(client, rig.task_queue, spec, "bench-recovery-read")
        # Open the writer end without writing: the reader then waits inside its read.
        held = await open_writer(gate, timeout_s=60)
        victim = await rig.reader_of(gate)
        standby = next(w for w in rig.workers if w is not victim)
        victim.kill()
        killed_at = time.time()
        os.close(held)
        first: asyncio.Future = asyncio.get_running_loop().create_future()
        served = asyncio.create_task(serve_fifo(gate, first))
        try:
            seconds, how = await wait_resumed(handle, standby.identity, killed_at, wait_s)
            try:
                # The standby reads the FIFO shortly after it resumed (or never, if it did not).
                reopened = await asyncio.wait_for(asyncio.shield(first), timeout=30 if seconds is not None else 1)
            except TimeoutError:
                reopened = None
            await succeeded(rig, handle, "read")
        finally:
            served.cancel()
        outside = reopened - killed_at if reopened else None
        return Recovery("read segment (read_file chain, slow read)", seconds, how, outside, "standby opened the FIFO")
    finally:
        rig.close()


async def measure(client: Client, workdir: Path, wait_s: float = 150, command_repeats: int = 3) -> Section:
    root = workdir / "recovery"
    kinds = {
        "recovery_write_s": await remote_write(client, root / "write", wait_s),
        "recovery_read_s": await read_segment(client, root / "read", wait_s),
        "recovery_model_s": await model_call(client, root / "model", wait_s),
    }
    figures = {key: round(r.seconds if r.seconds is not None else wait_s, 2) for key, r in kinds.items()}
    notes = ["two `perdure worker` processes on one task queue; the one running the step is SIGKILLed:"]
    notes += ["  " + r.describe(wait_s) for r in kinds.values()]
    if any(r.seconds is None for r in kinds.values()):
        notes.append(f"  a step that never resumed is recorded as the wait ({wait_s:.0f} s)")
    command = await recovery_command.measure(client, workdir, repeats=command_repeats)
    figures.update(command.figures)
    notes += command.notes
    figures["recovery_s"] = max(figures[key] for key in KINDS)
    return Section(figures=figures, notes=notes)


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, wait_s=150.0, command_repeats=3))


if __name__ == "__main__":
    main()
