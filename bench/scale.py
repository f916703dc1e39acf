"""Goals of 1,000 to 100,000 nodes: wall time, their continue-as-new chains, events per
run, the state carried into each run, and the longest workflow task.

Shape: W independent chains of D `read_file` steps (W x D nodes; each step needs
the one before it in its chain, chains share nothing), W = 100 by default. The
width stays fixed while the depth grows, so every size has the same parallelism
and only the number of nodes changes: growth in time per node is the cost of
the goal's bookkeeping, not of the shape.

Sizes run smallest first, within one time budget for all of them. From the
last two, a quadratic fit predicts the time of each next size; a size predicted
to exceed what is left of the budget is skipped (and said so), so the figure
`nodes_10k_wall_s` is recorded only when 10,000 nodes actually ran (and
`nodes_100k_wall_s` only when 100,000 did). Each goal's run chain is walked
through `continued_as_new` events to count runs, the largest number of events in
any one run (`max_events_per_run`), the longest workflow task
(`max_workflow_task_ms`: what the SDK's 2 s deadlock check and the task timeout
see) and the state each run after the first started with (`carried_state_bytes`,
at the largest size: what grows with the past unless settled steps leave it).
At 100,000 nodes `perdure status GOAL` is timed as a person runs it (the CLI in a process of
its own, wall time) while the goal runs and once it has finished: `status_100k_s`, the slower
of the two (the issue's bound: under 2 s). Then `--concurrent` goals of 10,000 nodes run at once on the one worker
(`concurrent_10k_max_task_ms`). One run of a few hundred events is then replayed
under cProfile to show where workflow time goes.

Plans of thousands of steps are stored in the artifact store first and started
by reference, as `perdure start` does (starters/client/plan_upload.py).

    .venv/bin/python -m bench.scale [--sizes 1000,10000,30000,100000] [--width 100] [--budget-s 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.worker import Replayer

from bench.common import (
    Section,
    bench_store,
    event_seconds,
    goal_spec,
    make_workspace,
    max_payload_bytes,
    new_id,
    perdure_worker,
    run_chain,
    start_goal,
)
from perdure.runtime.converter import STORE_ENV, data_converter
from perdure.runtime.plugin import PerdurePlugin
from perdure.starters.client.plan_upload import with_stored_plan
from perdure.workflows.goal.contracts.migrations import load_state
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.watchdog.watchdog_workflow import WatchdogWorkflow

KEYS = (
    "nodes_10k_wall_s",
    "max_events_per_run",
    "workflow_task_ms_per_node",
    "nodes_100k_wall_s",
    "carried_state_bytes",
    "max_workflow_task_ms",
    "ms_per_node_100k_over_1k",
    "concurrent_10k_max_task_ms",
    "status_100k_s",
)
TARGET_NODES = 10_000
LARGEST_NODES = 100_000
PROFILE_MAX_EVENTS = 700
# Seconds after a 100,000-node goal started at which `perdure status` is timed while it runs.
STATUS_WHILE_RUNNING_AFTER_S = 60


def chains(width: int, depth: int) -> list[dict]:
    """W chains of D steps; the first step of each chain reads its own file, so no two
    nodes share a key (later steps differ by the step they need)."""
    steps = []
    for c in range(width):
        for d in range(depth):
            step = {"name": f"c{c:03d}-{d:05d}", "kind": "tool", "tool": "read_file", "args": {"path": f"c{c:03d}.txt"}}
            if d:
                step["needs"] = [f"c{c:03d}-{d - 1:05d}"]
            steps.append(step)
    return steps


@dataclass
class SizeRun:
    nodes: int
    seconds: float
    outcome: str
    runs: list[WorkflowHistory]
    largest_offloaded: int
    largest_offloaded_path: Path | None = None
    carried: list[int] = field(default_factory=list)  # state bytes each run after the first started with
    carried_input: int = 0  # the largest whole input of such a run (spec, state and event stream)
    status_s: dict[str, float] = field(default_factory=dict)  # `perdure status` wall time: "running", "finished"

    def longest_task_ms(self) -> float:
        return max((most for _, most in self.workflow_task_ms()), default=0.0)

    @property
    def events(self) -> list[int]:
        return [len(h.events) for h in self.runs]

    def workflow_task_ms(self) -> list[tuple[float, float]]:
        """Mean and longest workflow-task time (started -> completed, server clock) per run:
        the workflow's own processing, including the local activities it ran in that task.
        The longest is what the SDK's 2 s deadlock detector and the task timeout see."""
        means = []
        for history in self.runs:
            started: dict[int, float] = {}
            spans = []
            for e in history.events:
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                    started[e.event_id] = event_seconds(e)
                elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                    begun = started.get(e.workflow_task_completed_event_attributes.started_event_id)
                    if begun is not None:
                        spans.append(event_seconds(e) - begun)
            means.append((sum(spans) / len(spans) * 1000 if spans else 0.0, max(spans, default=0.0) * 1000))
        return means

    def workflow_task_ms_per_node(self) -> float:
        """All its workflow tasks' time (every run) per node settled: the goal's bookkeeping
        plus the reads its tasks ran as local activities (a node's share of both)."""
        total = sum(mean * count for (mean, _), count in zip(self.workflow_task_ms(), self._task_counts(), strict=True))
        return total / self.nodes

    def _task_counts(self) -> list[int]:
        kind = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        return [sum(1 for e in history.events if e.event_type == kind) for history in self.runs]

    def workflow_task_failures(self) -> int:
        """Workflow tasks that timed out or failed (each one is retried from the last
        completed task, re-running every local activity since)."""
        bad = (EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
        return sum(1 for h in self.runs for e in h.events if e.event_type in bad)

    def describe(self) -> str:
        tasks = [f"{mean:.0f}/{most:.0f}" for mean, most in self.workflow_task_ms()]
        carried = "none (one run)"
        if self.carried:
            carried = f"{max(self.carried):,} B (whole input {self.carried_input:,} B)"
        return (
            f"{self.nodes:>6} nodes: {self.seconds:7.1f} s ({self.seconds / self.nodes * 1000:.2f} ms/node), "
            f"{self.outcome}, {len(self.runs)} run(s), events per run {self.events}, "
            f"largest state carried into a run {carried}, longest workflow task {self.longest_task_ms():.0f} ms, "
            f"largest payload in history {max(max_payload_bytes(h) for h in self.runs)} B, "
            f"largest payload offloaded to the store {self.largest_offloaded} B, "
            f"workflow task mean/longest per run {tasks} ms, "
            f"workflow tasks timed out or failed: {self.workflow_task_failures()}"
        )


async def run_size(
    client: Client,
    task_queue: str,
    workspace: Path,
    payloads: Path,
    width: int,
    nodes: int,
    timeout_s: float,
    home: Path,
    label: str = "",
) -> SizeRun:
    depth = max(1, nodes // width)
    spec = goal_spec(workspace, chains(width, depth), allowed_tools=["read_file"], label=f"{width}x{depth} chains")
    spec = await with_stored_plan(spec, bench_store(home))  # as `perdure start` starts it
    before = _offloaded(payloads)
    started = time.perf_counter()
    handle: WorkflowHandle = await start_goal(client, task_queue, spec, f"bench-scale-{nodes}{label}")
    timed: dict[str, float] = {}
    while_running = None
    if nodes >= LARGEST_NODES:
        while_running = asyncio.ensure_future(_status_later(client, handle.id, timed))
    try:
        result = await asyncio.wait_for(handle.result(), timeout_s)
        outcome = result.outcome
        if while_running is not None:
            if "running" in timed:
                await while_running
            else:
                while_running.cancel()  # it finished before it was timed while running
            timed["finished"] = await status_seconds(client, handle.id)
    except TimeoutError:
        outcome = f"NOT FINISHED after {timeout_s:.0f} s (terminated)"
        await handle.terminate("bench: over its time budget")
    except Exception as err:  # a failed goal is a finding to report, not a crash of the benchmark
        outcome = f"FAILED: {type(err).__name__}: {getattr(err, 'cause', None) or err}"
    seconds = time.perf_counter() - started
    if while_running is not None and not while_running.done():
        while_running.cancel()  # the goal failed or ran out of time
    runs = await run_chain(client, handle)
    new = {name: size for name, size in _offloaded(payloads).items() if name not in before}
    path = max(new, key=new.__getitem__, default=None)
    run = SizeRun(width * depth, seconds, outcome, runs, new.get(path, 0) if path else 0, Path(path) if path else None)
    inputs = await carried_inputs(client, runs)
    run.carried = [len((carried.state or "").encode()) for carried in inputs]
    run.carried_input = max((len(carried.model_dump_json().encode()) for carried in inputs), default=0)
    run.status_s = timed
    return run


async def _status_later(client: Client, goal_id: str, timed: dict[str, float]) -> None:
    await asyncio.sleep(STATUS_WHILE_RUNNING_AFTER_S)
    timed["running"] = float("nan")  # begun: waited for, not cancelled, once the goal ends
    timed["running"] = await status_seconds(client, goal_id)


async def status_seconds(client: Client, goal_id: str) -> float:
    """Wall seconds of `perdure status GOAL`, the command in a process of its own (its start-up
    included, as a person waits for it)."""
    perdure = Path(sys.executable).parent / "perdure"
    variables = {**os.environ, "PERDURE_TEMPORAL": client.service_client.config.target_host, "COLUMNS": "200"}
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        str(perdure), "status", goal_id, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=variables
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    took = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"perdure status {goal_id} exited {process.returncode}: {(out + err).decode()[-400:]}")
    return took


async def carried_inputs(client: Client, runs: list[WorkflowHistory]) -> list[GoalInput]:
    """What each run after the first started with, decoded as a worker decodes it (through
    the payload store): its state is what `carried_state_bytes` measures."""
    inputs = []
    for history in runs[1:]:
        payloads = history.events[0].workflow_execution_started_event_attributes.input.payloads
        [carried] = await client.data_converter.decode(payloads, [GoalInput])
        inputs.append(carried)
    return inputs


def _offloaded(payloads: Path) -> dict[str, int]:
    """Payloads the converter's external storage wrote (path -> bytes)."""
    if not payloads.exists():
        return {}
    return {str(p): p.stat().st_size for p in payloads.rglob("*") if p.is_file()}


def state_load_seconds(path: Path) -> float | None:
    """What a continued run does first with its carried state, outside the sandbox:
    decode the workflow input from the stored payload and load the state (best of 3).
    None when the largest offloaded payload is not a goal's input with a state."""
    payload = Payload.FromString(path.read_bytes())
    converter = data_converter().payload_converter
    best = None
    for _ in range(3):
        started = time.perf_counter()
        try:
            carried = converter.from_payload(payload, GoalInput)
        except Exception:
            return None
        if carried.state is None:
            return None
        load_state(carried.state)
        took = time.perf_counter() - started
        best = took if best is None else min(best, took)
    return best


def predict(points: list[tuple[int, float]], nodes: int) -> float:
    """Seconds for `nodes` from a fit t = a*n + b*n^2 through the two largest points
    (no constant: the fixed cost of a goal is small next to these sizes)."""
    (n1, t1), (n2, t2) = points[-2], points[-1]
    det = n1 * n2 * n2 - n2 * n1 * n1
    if det == 0:
        return t2 * nodes / n2
    a = (t1 * n2 * n2 - t2 * n1 * n1) / det
    b = (n1 * t2 - n2 * t1) / det
    return max(a * nodes + b * nodes * nodes, t2 * nodes / n2)


async def profile_replay(history: WorkflowHistory, top: int = 14) -> list[str]:
    """Replay one run under cProfile (in the replayer's own workflow thread) and list
    the functions with the most cumulative time."""
    profiler = cProfile.Profile()
    executor = ThreadPoolExecutor(max_workers=1)
    executor.submit(profiler.enable).result()
    replayer = Replayer(
        workflows=[GoalWorkflow, WatchdogWorkflow], plugins=[PerdurePlugin()], workflow_task_executor=executor
    )
    started = time.perf_counter()
    await replayer.replay_workflow(history, raise_on_replay_failure=False)
    seconds = time.perf_counter() - started
    executor.submit(profiler.disable).result()
    executor.shutdown()
    lines = [f"replay of the largest run ({len(history.events)} events) took {seconds:.1f} s under cProfile"]
    root = str(Path(__file__).resolve().parent.parent) + "/"
    for order, restrict, label in (
        ("cumulative", r"workflows/", "perdure workflow code, by cumulative time"),
        ("tottime", "", "everything, by own time"),
    ):
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).sort_stats(order)
        stats.print_stats(restrict, top) if restrict else stats.print_stats(top)
        lines.append(f"  {label}:")
        for line in out.getvalue().splitlines():
            if "ncalls" in line or ("(" in line and ":" in line and line[:1] == " "):
                lines.append("    " + line.replace(root, "").replace(".venv/lib/python3.11/site-packages/", "")[:170])
    return lines


async def measure(
    client: Client,
    workdir: Path,
    sizes: tuple[int, ...] = (1_000, TARGET_NODES, 30_000, LARGEST_NODES),
    width: int = 100,
    budget_s: float = 1500,
    profile: bool = True,
    concurrent: int = 3,
) -> Section:
    home = workdir / "scale"
    workspace = make_workspace(home / "ws", {f"c{c:03d}.txt": "x\n" for c in range(width)})
    payloads = Path(os.environ.get(STORE_ENV, "").removeprefix("disk:") or workdir / "no-payload-store")
    task_queue = new_id("bench-scale")
    notes = [f"shape: {width} independent chains of read_file steps (depth = nodes / {width})"]
    done: list[SizeRun] = []
    deadline = time.monotonic() + budget_s
    async with perdure_worker(client, task_queue, home):
        for nodes in sizes:
            left = deadline - time.monotonic()
            if len(done) >= 2:
                expected = predict([(r.nodes, r.seconds) for r in done], nodes)
                if expected > left:
                    notes.append(
                        f"{nodes:>6} nodes: skipped, predicted {expected:.0f} s from the growth so far "
                        f"({left:.0f} s of the {budget_s:.0f} s budget left)"
                    )
                    continue
            run = await run_size(client, task_queue, workspace, payloads, width, nodes, max(left, 30), home)
            done.append(run)
            notes.append(run.describe())
            if run.outcome != "succeeded":
                break
        together = await run_together(client, task_queue, workspace, payloads, width, concurrent, deadline, home)
    if profile and done:
        # A run of a few hundred events is enough to see what grows; larger ones profile slowly.
        runs = sorted((h for r in done for h in r.runs), key=lambda h: len(h.events))
        small = [h for h in runs if len(h.events) <= PROFILE_MAX_EVENTS]
        notes += await profile_replay((small or runs)[-1])
    if len(done) >= 2:
        (n1, t1), (n2, t2) = (done[0].nodes, done[0].seconds), (done[-1].nodes, done[-1].seconds)
        notes.append(
            f"growth: {n2 / n1:.1f}x the nodes took {t2 / t1:.1f}x the time "
            f"(linear would be {n2 / n1:.1f}x; per node {t1 / n1 * 1000:.1f} -> {t2 / n2 * 1000:.1f} ms)"
        )
    figures: dict[str, float] = {}
    extra: dict[str, float] = {}
    figures.update(frontier_figures(done, together, notes))
    full = next((r for r in done if r.nodes >= TARGET_NODES and r.outcome == "succeeded"), None)
    if full is not None:
        figures["nodes_10k_wall_s"] = round(full.seconds, 1)
        figures["max_events_per_run"] = max(full.events)
        figures["workflow_task_ms_per_node"] = round(full.workflow_task_ms_per_node(), 3)
        extra["runs_in_chain"] = len(full.runs)
        notes.append(
            f"10,000-node goal: {len(full.runs)} run(s) in its chain, at most {max(full.events)} events per run"
        )
        loaded = state_load_seconds(full.largest_offloaded_path) if full.largest_offloaded_path else None
        if loaded is not None:
            extra["state_load_s"] = round(loaded, 3)
            notes.append(
                f"its carried state ({full.largest_offloaded:,} B): decoded and loaded in {loaded:.2f} s "
                "(what a continued run's first workflow task does first; the SDK allows 2 s per task)"
            )
    else:
        largest = max((n for r in done for n in r.events), default=0)
        notes.append(
            "nodes_10k_wall_s and max_events_per_run not recorded: no 10,000-node goal finished "
            f"(largest run measured: {largest} events)"
        )
    return Section(figures=figures, notes=notes, extra=extra)


async def run_together(
    client: Client,
    task_queue: str,
    workspace: Path,
    payloads: Path,
    width: int,
    count: int,
    deadline: float,
    home: Path,
) -> list[SizeRun]:
    """`count` goals of 10,000 nodes at once on the one worker (none when the budget is spent)."""
    left = deadline - time.monotonic()
    if count <= 0 or left < 60:
        return []
    return list(
        await asyncio.gather(
            *(
                run_size(client, task_queue, workspace, payloads, width, TARGET_NODES, left, home, f"-together-{i}")
                for i in range(count)
            )
        )
    )


def frontier_figures(done: list[SizeRun], together: list[SizeRun], notes: list[str]) -> dict[str, float]:
    """What grows with a goal's past, if anything: the state carried into its runs, its longest
    workflow task, its cost per node at 100,000 nodes against 1,000."""
    figures: dict[str, float] = {}
    finished = [r for r in done if r.outcome == "succeeded"]
    if finished:
        largest = max(finished, key=lambda r: r.nodes)
        figures["carried_state_bytes"] = max(largest.carried, default=0)
        figures["max_workflow_task_ms"] = round(max(r.longest_task_ms() for r in done), 1)
        notes.append(
            f"largest goal that finished: {largest.nodes:,} nodes, state carried into its runs at most "
            f"{figures['carried_state_bytes']:,} B; longest workflow task of any size "
            f"{figures['max_workflow_task_ms']:.0f} ms; workflow tasks timed out or failed: "
            f"{sum(r.workflow_task_failures() for r in done)}"
        )
    small = next((r for r in finished if r.nodes == 1_000), None)
    big = next((r for r in finished if r.nodes >= LARGEST_NODES), None)
    if big is not None:
        figures["nodes_100k_wall_s"] = round(big.seconds, 1)
        notes.append(f"100,000-node goal: workflow task time per node {big.workflow_task_ms_per_node():.3f} ms")
        if big.status_s:
            figures["status_100k_s"] = round(max(big.status_s.values()), 2)
            said = ", ".join(f"{when} {seconds:.2f} s" for when, seconds in big.status_s.items())
            notes.append(f"100,000-node goal: `perdure status` (the CLI, wall time) {said}")
    if big is not None and small is not None:
        ratio = (big.seconds / big.nodes) / (small.seconds / small.nodes)
        figures["ms_per_node_100k_over_1k"] = round(ratio, 3)
    if together:
        figures["concurrent_10k_max_task_ms"] = round(max(r.longest_task_ms() for r in together), 1)
        outcomes = ", ".join(r.outcome for r in together)
        notes.append(
            f"{len(together)} goals of 10,000 nodes at once on one worker: {outcomes}; slowest "
            f"{max(r.seconds for r in together):.1f} s, longest workflow task "
            f"{figures['concurrent_10k_max_task_ms']:.0f} ms, workflow tasks timed out or failed: "
            f"{sum(r.workflow_task_failures() for r in together)}"
        )
    return figures


def main(argv: list[str] | None = None) -> dict:
    from bench.common import run_standalone

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,30000,100000")
    parser.add_argument("--width", type=int, default=100)
    parser.add_argument("--budget-s", type=float, default=1500, help="for all sizes together")
    parser.add_argument("--concurrent", type=int, default=3, help="goals of 10,000 nodes run at once, after")
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    options = {"sizes": sizes, "width": args.width, "budget_s": args.budget_s, "profile": not args.no_profile}
    return run_standalone(measure, {**options, "concurrent": args.concurrent})


if __name__ == "__main__":
    main()
