"""The most open goals one worker holds with its workflow tasks under 1 s (`max_goals_one_worker`).

One `perdure worker` subprocess, started as a user does (bench/rss.py), and goals
added in levels (250, 1000, 2000, 3000 by default) that stay open: each is a chain of
cycles, a `wait` step of `--period-s` seconds then a `read_file` step, so every open
goal has a workflow task once a period (its timer fires, the read runs as a local
activity inside that task, the next timer starts). First waits are spread over one
period, so the load is even: N goals make N / period tasks a second.

At each level the benchmark starts the new goals, waits until the last of them has
finished its first workflow task (starting is heavier than a cycle), lets one period
pass, and then reads, from the server's histories of a sample of the open goals,
every workflow task scheduled in that period: schedule-to-completed, i.e. the time
the task waited for the worker plus the worker's processing, the read included. A
level passes when the p95 is under 1 s and no task timed out or failed; the figure
is the largest level that passed, with the worker's RSS at that level
(`max_goals_worker_rss_mb`). Levels stop at the first one that misses, or when the
time budget cannot fit the next one. Goals are terminated at the end.

The worker keeps the SDK's workflow cache (1,000 runs), raised to the largest level
(PERDURE_WORKFLOW_CACHE) when that is more, so every level is served from cache: a goal
evicted would replay its run on its next task, which measures the cache, not the worker.
The figure measures the worker and the dev server together, on one machine: it moves
with the machine's load more than any other figure here.

    .venv/bin/python -m bench.max_goals [--levels 250,1000,2000,3000] [--period-s 30] [--budget-s 900]
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory

from bench.common import (
    Section,
    event_seconds,
    goal_spec,
    kill_child,
    make_workspace,
    new_id,
    p95,
    parse_options,
    run_standalone,
    start_goal,
)
from bench.rss import proc_status_kb, start_worker, wait_polling
from perdure.runtime.settings import DEFAULT_WORKFLOW_CACHE, WORKFLOW_CACHE_ENV

KEYS = ("max_goals_one_worker", "max_goals_worker_rss_mb")
TASK_LIMIT_S = 1.0
LEVELS = "250,1000,2000,3000"
# Goals started, histories read and goals terminated this many at a time.
CONCURRENT_CALLS = 50


def worker_env(sizes: list[int]) -> dict[str, str]:
    """The worker's cache raised to hold every goal of the largest level, when the default does not."""
    largest = max(sizes)
    return {WORKFLOW_CACHE_ENV: str(largest)} if largest > DEFAULT_WORKFLOW_CACHE else {}


def ramp_limit_s(new_goals: int) -> float:
    """How long new goals' first tasks may take before the level counts as missed: starting
    is heavier than a cycle (1,000 new goals took 100-250 s on a loaded 2-core machine)."""
    return max(300.0, 0.5 * new_goals)


def cycle_steps(first_wait_s: int, period_s: int, cycles: int) -> list[dict]:
    """`cycles` times: wait, then read a small file; each step needs the one before."""
    steps: list[dict] = []
    for c in range(cycles):
        wait = {"name": f"wait-{c:03d}", "kind": "wait", "after": f"{first_wait_s if c == 0 else period_s}s"}
        if steps:
            wait["needs"] = [steps[-1]["name"]]
        read = {"name": f"read-{c:03d}", "kind": "tool", "tool": "read_file", "args": {"path": "note.txt"}}
        read["needs"] = [wait["name"]]
        steps += [wait, read]
    return steps


@dataclass
class Level:
    goals: int
    tasks: int  # workflow tasks of the sample scheduled in the window
    p95_s: float
    max_s: float
    failed: int  # tasks that timed out or failed
    rss_mb: float
    ramp_s: float

    @property
    def passed(self) -> bool:
        return self.tasks > 0 and self.failed == 0 and self.p95_s < TASK_LIMIT_S

    def describe(self) -> str:
        verdict = "under" if self.passed else "NOT under"
        return (
            f"{self.goals} open goals: workflow task schedule-to-completed p95 {self.p95_s:.3f} s, "
            f"max {self.max_s:.3f} s over {self.tasks} tasks of the sample ({self.failed} timed out or failed): "
            f"{verdict} {TASK_LIMIT_S:g} s; worker RSS {self.rss_mb:.0f} MB; "
            f"the new goals' first tasks took {self.ramp_s:.1f} s"
        )


async def bounded(calls, limit: int = CONCURRENT_CALLS) -> list:
    gate = asyncio.Semaphore(limit)

    async def one(call):
        async with gate:
            return await call

    return await asyncio.gather(*(one(c) for c in calls))


async def first_task_done(handle: WorkflowHandle, deadline: float) -> None:
    """Until the goal's history has its first timer: its first workflow task completed."""
    while time.monotonic() < deadline:
        history = await handle.fetch_history()
        if any(e.event_type == EventType.EVENT_TYPE_TIMER_STARTED for e in history.events):
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{handle.id} did not finish its first workflow task in time")


async def task_latencies(handles: list[WorkflowHandle], since: float, until: float) -> tuple[list[float], int]:
    """`task_times` over these goals' histories."""
    latencies: list[float] = []
    failed = 0
    for history in await bounded(h.fetch_history() for h in handles):
        seconds, failures = task_times(history, since, until)
        latencies += seconds
        failed += failures
    return latencies, failed


def task_times(history: WorkflowHistory, since: float, until: float) -> tuple[list[float], int]:
    """Schedule-to-completed seconds of every workflow task scheduled in [since, until), and
    how many tasks scheduled then timed out or failed instead."""
    scheduled: dict[int, float] = {}
    latencies: list[float] = []
    failed = 0
    for event in history.events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled[event.event_id] = event_seconds(event)
            continue
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            at = scheduled.get(event.workflow_task_completed_event_attributes.scheduled_event_id)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            at = scheduled.get(event.workflow_task_timed_out_event_attributes.scheduled_event_id)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            at = scheduled.get(event.workflow_task_failed_event_attributes.scheduled_event_id)
        else:
            continue
        if at is None or not since <= at < until:
            continue
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            latencies.append(event_seconds(event) - at)
        else:
            failed += 1
    return latencies, failed


def sample(handles: list[WorkflowHandle], size: int) -> list[WorkflowHandle]:
    """`size` goals spread evenly over all open ones (every level's goals are in it)."""
    if len(handles) <= size:
        return list(handles)
    step = len(handles) / size
    return [handles[int(i * step)] for i in range(size)]


async def measure(
    client: Client,
    workdir: Path,
    levels: str = LEVELS,
    period_s: int = 30,
    budget_s: float = 900,
    sample_goals: int = 100,
) -> Section:
    sizes = sorted(int(n) for n in levels.split(","))
    home = workdir / "max-goals"
    workspace = make_workspace(home / "ws", {"note.txt": "a small note\n"})
    task_queue = new_id("bench-max-goals")
    log = home / "worker.log"
    home.mkdir(parents=True, exist_ok=True)
    proc = start_worker(client, home, task_queue, log, env=worker_env(sizes))
    started = time.monotonic()
    cycles = math.ceil(budget_s / period_s) + 3  # no goal reaches its last step during the run
    handles: list[WorkflowHandle] = []
    done: list[Level] = []
    notes: list[str] = []
    try:
        await wait_polling(proc, log)
        idle_mb = proc_status_kb(proc.pid, "VmRSS") / 1024
        for size in sizes:
            elapsed = time.monotonic() - started
            if done:
                # The next level: its ramp grows with the goals it adds, then one period and the reading.
                added = size - done[-1].goals
                estimate = done[-1].ramp_s * added / max(done[-1].goals - (done[-2].goals if len(done) > 1 else 0), 1)
                if elapsed + estimate + period_s + 10 > budget_s:
                    notes.append(f"  level {size} skipped: {elapsed:.0f} s of the {budget_s:.0f} s budget spent")
                    break
            ramp_started = time.monotonic()
            new = size - len(handles)
            specs = (
                goal_spec(
                    workspace,
                    cycle_steps(1 + (len(handles) + i) * 7919 % period_s, period_s, cycles),
                    label=f"stay open ({len(handles) + i})",
                    allowed_tools=["read_file"],
                )
                for i in range(new)
            )
            handles += await bounded(start_goal(client, task_queue, spec, "bench-open") for spec in specs)
            deadline = time.monotonic() + ramp_limit_s(new)
            try:
                await asyncio.gather(*(first_task_done(h, deadline) for h in handles[-5:]))
            except RuntimeError as err:
                rss_mb = proc_status_kb(proc.pid, "VmRSS") / 1024
                notes.append(f"  {size} open goals: NOT started in time ({err}); worker RSS {rss_mb:.0f} MB")
                break
            ramp_s = time.monotonic() - ramp_started
            since = time.time()
            await asyncio.sleep(period_s)
            until = time.time()
            rss_mb = proc_status_kb(proc.pid, "VmRSS") / 1024
            latencies, failed = await task_latencies(sample(handles, sample_goals), since, until)
            level = Level(
                goals=size,
                tasks=len(latencies),
                p95_s=p95(latencies) if latencies else math.inf,
                max_s=max(latencies, default=math.inf),
                failed=failed,
                rss_mb=rss_mb,
                ramp_s=ramp_s,
            )
            done.append(level)
            notes.append("  " + level.describe())
            if not level.passed:
                break
        peak_mb = proc_status_kb(proc.pid, "VmHWM") / 1024
    finally:
        await bounded(h.terminate("benchmark over") for h in handles)
        kill_child(proc)
    passed = [level for level in done if level.passed]
    head = (
        f"one `perdure worker`, goals that each run a workflow task every {period_s} s (a timer, then a read step "
        f"as a local activity); RSS idle {idle_mb:.0f} MB, peak {peak_mb:.0f} MB; "
        f"{time.monotonic() - started:.0f} s"
    )
    if done and done[-1].passed:
        notes.append(f"  every level passed: {done[-1].goals} is where this run stopped, not the worker's limit")
    figures = {}
    if passed:
        figures = {"max_goals_one_worker": passed[-1].goals, "max_goals_worker_rss_mb": round(passed[-1].rss_mb, 1)}
    else:
        notes.append(f"  no level passed: not even {sizes[0]} goals kept their workflow tasks under {TASK_LIMIT_S:g} s")
    return Section(figures=figures, notes=[head, *notes])


def main(argv: list[str] | None = None) -> dict:
    options = parse_options(__doc__, argv, levels=LEVELS, period_s=30, budget_s=900.0, sample_goals=100)
    return run_standalone(measure, options)


if __name__ == "__main__":
    main()
