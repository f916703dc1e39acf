"""Plumbing shared by the benchmarks: the dev server, in-process workers, scratch
workspaces, plan-file goals, timing, and facts read out of real histories.

Benchmarks drive perdure only through its public surface (a `GoalSpec` started
as `GoalWorkflow`, a `perdure worker` subprocess) so they measure whatever the
workflow code does at run time. Nothing here changes how perdure behaves.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.worker import Worker

from bench.storage import Server, Storage
from bench.storage import start_server as start_storage_server
from perdure.activities.artifacts import ArtifactStore, DiskArtifactStore, artifact_store
from perdure.activities.models.model_activities import ModelActivities
from perdure.activities.models.profiles import ModelConfig
from perdure.activities.tools.run_tool import ToolActivities
from perdure.runtime import settings
from perdure.runtime.converter import STORE_ENV, THRESHOLD_ENV
from perdure.workers import heap
from perdure.workers.orchestrator import build_worker
from perdure.workflows.goal.contracts.goal_contracts import GoalResult, GoalSpec
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent


def use_home(home: Path) -> None:
    """Point PERDURE_HOME and the payload store of this process (and of the workers it
    starts, which inherit the environment) at a scratch directory, never ~/.perdure."""
    home.mkdir(parents=True, exist_ok=True)
    os.environ["PERDURE_HOME"] = str(home)
    os.environ[STORE_ENV] = f"disk:{home / 'payloads'}"
    os.environ.pop(THRESHOLD_ENV, None)
    # Workers started by benchmarks must not create a watchdog schedule that runs every minute.
    os.environ["PERDURE_WATCHDOG_INTERVAL_S"] = "0"


async def start_server(workdir: Path) -> Server:
    """The dev server `perdure server start` runs, its history in a SQLite db file in
    `workdir` (bench/storage.py, as the headline row of `make bench-peers`): a figure that
    waits on the server pays the db file's writes, as on a real deployment. RuntimeError
    when `workdir` is in memory (a tmpfs would leave those writes out under a disk's name)."""
    problem = bench_storage(workdir).refusal()
    if problem:
        raise RuntimeError(problem)
    return await start_storage_server(workdir / "temporal-dev", on_file=True)


def bench_storage(workdir: Path) -> Storage:
    """The storage `make bench` runs on: the db-file row of bench/storage.py."""
    return Storage("db file", "", workdir, server_on_file=True)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def bench_store(home: Path) -> ArtifactStore:
    """The store PERDURE_ARTIFACT_STORE names when it is set (a run against an object store:
    `PERDURE_ARTIFACT_STORE=s3://… make bench`), else `home`'s own directory."""
    return artifact_store() if os.environ.get(settings.ARTIFACT_STORE_ENV) else DiskArtifactStore(home / "artifacts")


def perdure_worker(client: Client, task_queue: str, home: Path, model_config: ModelConfig | None = None) -> Worker:
    """The production worker (same workflows, activities and options), in this process,
    with the process's collector set as `perdure worker` sets it (workers/heap.py)."""
    worker = build_worker(
        client,
        task_queue=task_queue,
        store=bench_store(home),
        model_config=model_config or ModelConfig(profiles={}),
    )
    heap.settle()
    return worker


def raw_worker(client: Client, task_queue: str, home: Path, model_config: ModelConfig | None = None) -> Worker:
    """The baseline: the raw workflows of bench/raw.py and the very same tool activity (and,
    given a model config, the very same agent-turn activity), in a process whose collector is
    set as for perdure's worker (the ratios compare code, not settings)."""
    from bench.raw import RAW_WORKFLOWS

    heap.settle()
    store = bench_store(home)
    activities = [ToolActivities(store).run_tool]
    if model_config is not None:
        activities.append(ModelActivities(model_config, store).agent_turn)
    return Worker(client, task_queue=task_queue, workflows=RAW_WORKFLOWS, activities=activities)


def make_workspace(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def goal_spec(workspace: Path, steps: list[dict], **overrides) -> GoalSpec:
    """A plan-file goal with no model in the loop unless a step asks for one. Drift checks
    are off: they are model calls every 12 nodes, which would be timed as node overhead."""
    fields: dict = dict(
        goal="bench: " + (overrides.pop("label", None) or f"{len(steps)} steps"),
        plan={"steps": steps},
        model_profile="none",
        workspace=str(workspace),
        drift_every=0,
        local_keyed_writes=True,  # as every start (starters/client/goal_specs.py)
    )
    fields.update(overrides)
    return GoalSpec(**fields)


async def start_goal(client: Client, task_queue: str, spec: GoalSpec, prefix: str) -> WorkflowHandle:
    """Start a goal with the options `perdure start` uses (starters/client/), on any task queue."""
    return await client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=spec),
        id=new_id(prefix),
        task_queue=task_queue,
        static_summary=spec.goal[:200],
        task_timeout=spec.task_timeout(),
    )


async def run_goal(
    client: Client, task_queue: str, spec: GoalSpec, prefix: str
) -> tuple[GoalResult, float, WorkflowHandle]:
    """Start a goal and wait for its result: (result, wall seconds from start to result, the start handle)."""
    started = time.perf_counter()
    handle = await start_goal(client, task_queue, spec, prefix)
    result = await handle.result()
    return result, time.perf_counter() - started, handle


def chain_steps(tool: str, args: list[dict], prefix: str = "s") -> list[dict]:
    """One tool step per args, each needing the one before (a chain)."""
    steps = []
    for i, step_args in enumerate(args):
        step = {"name": f"{prefix}{i:05d}", "kind": "tool", "tool": tool, "args": step_args}
        if i:
            step["needs"] = [f"{prefix}{i - 1:05d}"]
        steps.append(step)
    return steps


def slope_ms(small: tuple[int, float], large: tuple[int, float]) -> float:
    """Milliseconds per unit from two (count, seconds) runs: the fixed cost (start, report,
    first workflow task) cancels out, leaving the cost of one more unit."""
    (n_small, s_small), (n_large, s_large) = small, large
    if n_large <= n_small:
        raise ValueError(f"need two different sizes, got {n_small} and {n_large}")
    return (s_large - s_small) / (n_large - n_small) * 1000


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def p95(values: Iterable[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


# --- histories -------------------------------------------------------------------


async def run_chain(client: Client, handle: WorkflowHandle) -> list[WorkflowHistory]:
    """Every run of a goal's continue-as-new chain, first run first (from the start handle)."""
    workflow_id, run_id = handle.id, handle.first_execution_run_id or handle.run_id
    histories = []
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        histories.append(history)
        run_id = next_run_id(history)
    return histories


def next_run_id(history: WorkflowHistory) -> str | None:
    last = history.events[-1]
    if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
        return last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return None


def payloads_in(message) -> Iterator[Payload]:
    """Every Payload anywhere inside a protobuf message (inputs, results, markers, memo,
    search attributes, failures' details)."""
    if isinstance(message, Payload):
        yield message
        return
    for descriptor, value in message.ListFields():
        if descriptor.type != descriptor.TYPE_MESSAGE:
            continue
        if hasattr(value, "ListFields"):
            yield from payloads_in(value)
            continue
        # A repeated field, or a map (whose values may be scalars).
        items = value.values() if descriptor.message_type.GetOptions().map_entry else value
        for item in items:
            if hasattr(item, "ListFields"):
                yield from payloads_in(item)


def max_payload_bytes(history: WorkflowHistory) -> int:
    return max((p.ByteSize() for e in history.events for p in payloads_in(e)), default=0)


def event_seconds(event) -> float:
    return event.event_time.ToDatetime().timestamp()


def kill_child(proc) -> None:
    """End a worker subprocess this benchmark started (by its own handle, never by name)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


@dataclass
class Section:
    """What one benchmark hands back to bench/run.py: headline figures (merged into
    results.json) and lines that explain them (printed only)."""

    figures: dict[str, float]
    notes: list[str]
    extra: dict[str, float] = field(default_factory=dict)


def parse_options(doc: str, argv: list[str] | None, **defaults: int | float | str) -> dict:
    """A benchmark's command line: one `--name` per keyword (dashes for underscores), typed like its default;
    the module docstring's first line is the help text."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name, default in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    return vars(parser.parse_args(argv))


def on_own_server(measure, options: dict):
    """`await measure(client, workdir, **options)` on a dev server of its own, with a
    scratch PERDURE_HOME; what it returns."""
    import tempfile

    async def _main():
        with tempfile.TemporaryDirectory(prefix="perdure-bench-") as tmp:
            use_home(Path(tmp) / "home")
            server = await start_server(Path(tmp))
            try:
                return await measure(server.client, Path(tmp), **options)
            finally:
                server.stop()

    return asyncio.run(_main())


def run_standalone(measure, argv_options: dict) -> dict:
    """Run one benchmark module on its own dev server (`python -m bench.<module>`)."""
    section: Section = on_own_server(measure, argv_options)
    for line in section.notes:
        print(line, flush=True)
    for key, value in {**section.figures, **section.extra}.items():
        print(f"{key} = {value}", flush=True)
    return section.figures
