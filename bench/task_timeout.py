"""Why a worker restarted in place takes a goal back no sooner than it does: the workflow task
timeout a dead worker's task must run out, what a shorter one costs a busy worker, and how long
`perdure worker` takes to start (`worker_start_s`, `task_timeouts_at_1s_pct`, ...).

A worker SIGKILLed inside a workflow task (a read segment's local activities) is noticed by
the server only when that task's timeout runs out: 2 s after the task started, or after the
SDK's last heartbeat of it, which it sends at 80 % of the timeout while local activities run.
Temporal offers nothing sooner for a task in flight: a sticky queue's schedule-to-start
timeout and the worker's graceful shutdown (ShutdownWorker) concern tasks not yet started,
and the server's worker heartbeats (RecordWorkerHeartbeat, server 1.29 on) feed the worker
list, not task timeouts. So the lever is the task timeout itself, and its price is a live
worker judged dead: a task whose heartbeat is late (a loaded machine) times out, and its
reads run again on the next attempt.

This benchmark measures both sides on the bench's server:

- busy workers: one worker (in this process) runs `--workflows` workflows at once, each one
  local activity of `--hold-s` (bench/raw.py's RawHold), next to `--burners` CPU-bound
  processes, once per task timeout in `--timeouts`; reported: the tasks timed out (their
  worker alive) over all the tasks, from the histories, as `task_timeouts_at_<t>s_pct`;
- worker start: `perdure worker` started as a user does (testing/crash.py), from the spawn
  until it logs that it polls, `--starts` times, the burners gone: `worker_start_s` (median). A worker
  restarted in place takes a goal back after the later of the two: its start and the dead
  worker's task timeout.

    .venv/bin/python -m bench.task_timeout [--timeouts 1,1.5,2] [--workflows 60] [--hold-s 8] [--burners 3]
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from bench.common import Section, kill_child, median, parse_options, run_standalone
from bench.raw import HOLD_ACTIVITY, RawHoldWorkflow
from perdure.testing.crash import CrashRig

KEYS = ("worker_start_s",)
# A process that keeps one core busy until it is killed.
BURNER = [sys.executable, "-c", "while True: pass"]


def timeouts_key(timeout_s: float) -> str:
    return f"task_timeouts_at_{timeout_s:g}s_pct".replace(".", "_")


@activity.defn(name=HOLD_ACTIVITY)
async def hold(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass
class Busy:
    timeout_s: float
    timed_out: int  # workflow tasks timed out, their worker alive
    tasks: int  # workflow tasks in all
    unfinished: int  # workflows not done within the wait: their tasks kept timing out

    def describe(self) -> str:
        stuck = f"; {self.unfinished} workflow(s) NOT done after the wait" if self.unfinished else ""
        return f"  task timeout {self.timeout_s:g} s: {self.timed_out} of {self.tasks} workflow tasks timed out{stuck}"


async def busy_tasks(client: Client, timeout_s: float, workflows: int, hold_s: float) -> Busy:
    """`workflows` held open at once on one worker, waited for up to three holds and a minute."""
    task_queue = f"bench-hold-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=task_queue, workflows=[RawHoldWorkflow], activities=[hold]):
        handles = await asyncio.gather(
            *(
                client.start_workflow(
                    RawHoldWorkflow.run,
                    hold_s,
                    id=f"{task_queue}-{i}",
                    task_queue=task_queue,
                    task_timeout=timedelta(seconds=timeout_s),
                )
                for i in range(workflows)
            )
        )
        results = [asyncio.ensure_future(h.result()) for h in handles]
        await asyncio.wait(results, timeout=3 * hold_s + 60)
        unfinished = [h for h, r in zip(handles, results, strict=True) if not r.done()]
        for result in results:
            result.cancel()
        await asyncio.gather(*(h.terminate("benchmark over") for h in unfinished))
    busy = Busy(timeout_s, 0, 0, len(unfinished))
    for handle in handles:
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                busy.tasks += 1
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                busy.timed_out += 1
    return busy


async def worker_start(client: Client, root: Path) -> float:
    """Seconds from spawning `perdure worker` until it logs that it polls."""
    rig = CrashRig(client=client, root=root)
    try:
        started = time.monotonic()
        worker = rig.start_worker()
        await worker.wait_polling(timeout_s=120)
        return time.monotonic() - started
    finally:
        rig.close()


async def measure(
    client: Client,
    workdir: Path,
    timeouts: str = "1,1.5,2",
    workflows: int = 60,
    hold_s: float = 8.0,
    burners: int = 3,
    starts: int = 3,
) -> Section:
    figures: dict[str, float] = {}
    notes = [
        f"busy workers: {workflows} workflows at once on one worker, each a local activity of {hold_s:g} s, "
        f"beside {burners} CPU-bound processes; tasks timed out with their worker alive:"
    ]
    procs = [subprocess.Popen(BURNER, stdin=subprocess.DEVNULL) for _ in range(burners)]
    try:
        for timeout_s in sorted(float(t) for t in timeouts.split(",")):
            busy = await busy_tasks(client, timeout_s, workflows, hold_s)
            figures[timeouts_key(timeout_s)] = round(100 * busy.timed_out / busy.tasks, 1)
            notes.append(busy.describe())
            print(busy.describe(), flush=True)
    finally:
        for proc in procs:
            kill_child(proc)
    seconds = [await worker_start(client, workdir / f"start-{i}") for i in range(starts)]
    figures["worker_start_s"] = round(median(seconds), 2)
    notes.append(
        f"`perdure worker` from its spawn until it polls (no burner): median {median(seconds):.2f} s "
        f"of {', '.join(f'{s:.2f}' for s in seconds)}"
    )
    return Section(figures=figures, notes=notes)


def main(argv: list[str] | None = None) -> dict:
    options = parse_options(__doc__, argv, timeouts="1,1.5,2", workflows=60, hold_s=8.0, burners=3, starts=3)
    return run_standalone(measure, options)


if __name__ == "__main__":
    main()
