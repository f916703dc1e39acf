"""How long a goal's step waits after the worker running it is SIGKILLed (`recovery_s`).

Two `perdure worker` subprocesses poll the same task queue (testing/crash.py's
CrashRig, as the crash tests use it). A goal runs until a step is in flight;
the benchmark finds which worker runs it, SIGKILLs that one, and times how long
until the step runs again on the standby, as the server records it: the next
attempt's activity start, or the standby's first workflow task when the step is
a local activity (then the whole read segment re-runs there). Two steps:

- a remote write: `http_request` POST to the fake ledger service, which takes
  several seconds to answer (the kill lands while the request is open);
- a read segment: `read_file` steps in a chain, one of which reads a FIFO whose
  writer is late (a slow read; the kill lands while the worker waits in it).

The worse of the two is `recovery_s`. Each is also cross-checked from outside:
the ledger sees the retried request, the FIFO sees the standby open it.

    .venv/bin/python -m bench.recovery [--wait-s 150]
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle

from bench.common import Section, event_seconds, goal_spec, make_workspace, parse_options, run_standalone, start_goal
from testing.crash import CrashRig, WorkerProcess
from testing.fakes import LedgerAPI

KEYS = ("recovery_s",)
HOST = socket.gethostname()


def identity(worker: WorkerProcess) -> str:
    """The SDK's default worker identity, which `perdure worker` keeps."""
    return f"{worker.pid}@{HOST}"


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


async def wait_polling(rig: CrashRig, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    for worker in rig.workers:
        while "worker polling" not in worker.log.read_text(errors="replace"):
            if not worker.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"worker {worker.pid} did not start; log:\n{worker.log_tail()}")
            await asyncio.sleep(0.1)


def by_identity(rig: CrashRig, ident: str) -> WorkerProcess | None:
    return next((w for w in rig.workers if w.alive() and identity(w) == ident), None)


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


async def remote_write(client: Client, root: Path, wait_s: float) -> Recovery:
    with LedgerAPI(respond_delay_s=8.0) as ledger:
        rig = CrashRig(client=client, root=root)
        try:
            rig.start_worker()
            rig.start_worker()
            await wait_polling(rig)
            workspace = make_workspace(root / "ws", {"a.txt": "alpha\n", "b.txt": "beta\n"})
            steps = [
                {"name": "before", "kind": "tool", "tool": "read_file", "args": {"path": "a.txt"}},
                {
                    "name": "write",
                    "kind": "tool",
                    "tool": "http_request",
                    "needs": ["before"],
                    "args": {"method": "POST", "url": f"{ledger.base_url}/entries", "body": {"bench": "recovery"}},
                },
                {"name": "after", "kind": "tool", "tool": "read_file", "needs": ["write"], "args": {"path": "b.txt"}},
            ]
            spec = goal_spec(workspace, steps, allowed_tools=["read_file", "http_request"])
            handle = await start_goal(client, rig.task_queue, spec, "bench-recovery-write")
            victim = await _write_in_flight(rig, handle, ledger)
            standby = next(w for w in rig.workers if w is not victim)
            requests_before = ledger.requests
            victim.kill()
            killed_at = time.time()
            seconds, how = await wait_resumed(handle, identity(standby), killed_at, wait_s)
            outside = None
            deadline = time.monotonic() + 5
            while ledger.requests == requests_before and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if ledger.requests > requests_before:
                outside = time.time() - killed_at
            result = await rig.result(handle, timeout_s=120)
            if result.outcome != "succeeded":
                raise RuntimeError(f"the write goal ended {result.outcome}: {result.unfinished}")
            return Recovery("remote write (http_request, slow service)", seconds, how, outside, "ledger got the retry")
        finally:
            rig.close()


async def _write_in_flight(rig: CrashRig, handle: WorkflowHandle, ledger: LedgerAPI) -> WorkerProcess:
    """Wait until the ledger holds the request open; return the worker whose activity sent it."""
    return await running_activity_worker(
        rig, handle, "the write never got in flight", 60, ready=lambda: ledger.requests
    )


async def running_activity_worker(
    rig: CrashRig, handle: WorkflowHandle, never: str, timeout_s: float, ready=lambda: True
) -> WorkerProcess:
    """The rig's worker that runs one of the goal's started activities, once `ready()`;
    raises RuntimeError(`never`) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            description = await handle.describe()
            for pending in description.raw_description.pending_activities:
                if pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
                    worker = by_identity(rig, pending.last_worker_identity)
                    if worker is not None:
                        return worker
        await asyncio.sleep(0.05)
    raise RuntimeError(never)


async def read_segment(client: Client, root: Path, wait_s: float) -> Recovery:
    rig = CrashRig(client=client, root=root)
    gate = root / "ws" / "gate.fifo"
    try:
        rig.start_worker()
        rig.start_worker()
        await wait_polling(rig)
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
        victim = await reader_of(rig, gate)
        standby = next(w for w in rig.workers if w is not victim)
        victim.kill()
        killed_at = time.time()
        os.close(held)
        first: asyncio.Future = asyncio.get_running_loop().create_future()
        served = asyncio.create_task(serve_fifo(gate, first))
        try:
            seconds, how = await wait_resumed(handle, identity(standby), killed_at, wait_s)
            try:
                # The standby reads the FIFO shortly after it resumed (or never, if it did not).
                reopened = await asyncio.wait_for(asyncio.shield(first), timeout=30 if seconds is not None else 1)
            except TimeoutError:
                reopened = None
            result = await rig.result(handle, timeout_s=120)
        finally:
            served.cancel()
        if result.outcome != "succeeded":
            raise RuntimeError(f"the read goal ended {result.outcome}: {result.unfinished}")
        outside = reopened - killed_at if reopened else None
        return Recovery("read segment (read_file chain, slow read)", seconds, how, outside, "standby opened the FIFO")
    finally:
        rig.close()


async def open_writer(fifo: Path, timeout_s: float) -> int:
    """Open the FIFO for writing once a reader has it open (ENXIO until then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            if err.errno != errno.ENXIO:
                raise
        await asyncio.sleep(0.01)
    raise RuntimeError(f"nobody opened {fifo} for reading in {timeout_s:g} s")


async def serve_fifo(fifo: Path, first: asyncio.Future) -> None:
    """Give every later reader its content; `first` gets the time the first one opened it."""
    while True:
        fd = await open_writer(fifo, timeout_s=3600)
        if not first.done():
            first.set_result(time.time())
        os.write(fd, b"gate open\n")
        os.close(fd)
        await asyncio.sleep(0.05)


async def reader_of(rig: CrashRig, fifo: Path, timeout_s: float = 5) -> WorkerProcess:
    # The reader's open() returns as the writer opens, so its descriptor may show a moment later.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reader = next((w for w in rig.workers if w.alive() and _holds(w.pid, fifo)), None)
        if reader is not None:
            return reader
        await asyncio.sleep(0.01)
    raise RuntimeError(f"no worker has {fifo} open")


def _holds(pid: int, path: Path) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


async def measure(client: Client, workdir: Path, wait_s: float = 150) -> Section:
    root = workdir / "recovery"
    write = await remote_write(client, root / "write", wait_s)
    read = await read_segment(client, root / "read", wait_s)
    worst = [r.seconds if r.seconds is not None else wait_s for r in (write, read)]
    notes = ["two `perdure worker` processes on one task queue; the one running the step is SIGKILLed:"]
    notes += ["  " + r.describe(wait_s) for r in (write, read)]
    if any(r.seconds is None for r in (write, read)):
        notes.append(f"  recovery_s records the wait ({wait_s:.0f} s) for a step that never resumed")
    return Section(
        figures={"recovery_s": round(max(worst), 2)},
        notes=notes,
        extra={"recovery_write_s": round(worst[0], 2), "recovery_read_s": round(worst[1], 2)},
    )


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, wait_s=150.0))


if __name__ == "__main__":
    main()
