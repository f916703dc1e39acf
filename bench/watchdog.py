"""How long one watchdog run takes over 100 open goals (`watchdog_run_s_100_goals`).

Starts its own dev server (in-memory) and one production worker, then 100
plan-file goals that stay open cheaply: half parked before they start (no
activity at all), half waiting in a `run_command` gate that polls a file
twice a second. It times whole watchdog runs as a client sees them (start to
result: recall, scan with one query and one describe per goal, rules,
remember) and reports the median of a few. The interval it must fit in is 60 s.

    .venv/bin/python -m bench.watchdog [--goals 100] [--runs 3]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from bench.common import parse_options
from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.models.profiles import ModelConfig
from perdure.runtime.plugin import PerdurePlugin
from perdure.workers.orchestrator import build_worker
from perdure.workflows.goal.contracts.goal_contracts import GoalSpec
from perdure.workflows.goal.contracts.messages import Park
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared.search_attributes import ALL_KEYS
from perdure.workflows.watchdog.watchdog_contracts import WatchdogInput, WatchdogResult
from perdure.workflows.watchdog.watchdog_workflow import WatchdogWorkflow

KEY = "watchdog_run_s_100_goals"
GATE = "while [ ! -f GO ]; do sleep 0.5; done; echo gate open"


def goal_spec(workspace: Path, parked: bool) -> GoalSpec:
    step = (
        {"name": "later", "kind": "llm", "prompt": "Never runs: the goal is parked."}
        if parked
        else {"name": "gate", "kind": "tool", "tool": "run_command", "args": {"command": GATE, "timeout_s": 600}}
    )
    return GoalSpec(goal="bench: stay open", plan={"steps": [step]}, model_profile="none", workspace=str(workspace))


async def measure(goals: int = 100, runs: int = 3, client: Client | None = None) -> dict:
    """On `client`'s server (bench/run.py shares one), or on a dev server of its own."""
    env = None
    if client is None:
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
            search_attributes=ALL_KEYS,
            plugins=[PerdurePlugin()],
            dev_server_log_level="error",
        )
        client = env.client
    task_queue = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workspace = Path(tmp) / "ws"
            workspace.mkdir()
            store = DiskArtifactStore(Path(tmp) / "artifacts")
            worker = build_worker(client, task_queue=task_queue, store=store, model_config=ModelConfig(profiles={}))
            async with worker:
                handles = []
                for i in range(goals):
                    parked = i % 2 == 0
                    handle = await client.start_workflow(
                        GoalWorkflow.run,
                        GoalInput(spec=goal_spec(workspace, parked)),
                        id=f"bench-goal-{i:03d}-{uuid.uuid4().hex[:6]}",
                        task_queue=task_queue,
                        start_signal="message" if parked else None,
                        start_signal_args=[Park(request_id="bench", reason="bench").model_dump(mode="json")]
                        if parked
                        else [],
                    )
                    handles.append(handle)
                await wait_all_settled(handles)
                seconds, results = [], []
                for _ in range(runs):
                    started = time.perf_counter()
                    result: WatchdogResult = await client.execute_workflow(
                        WatchdogWorkflow.run,
                        WatchdogInput(task_queue=task_queue),
                        id=f"bench-watchdog-{uuid.uuid4().hex[:8]}",
                        task_queue=task_queue,
                    )
                    seconds.append(time.perf_counter() - started)
                    results.append(result)
                # Gates open and those goals finish on their own (terminating them would leave
                # their tool activities completing into closed workflows); parked ones are ended.
                (workspace / "GO").touch()
                await asyncio.gather(*(h.result() for i, h in enumerate(handles) if i % 2))
                await asyncio.gather(*(h.terminate("bench over") for i, h in enumerate(handles) if not i % 2))
    finally:
        if env is not None:
            await env.shutdown()
    last = results[-1]
    if last.goals != goals:
        raise RuntimeError(f"the watchdog saw {last.goals} goals, expected {goals}")
    return {
        KEY: round(statistics.median(seconds), 3),
        "runs_s": [round(s, 3) for s in seconds],
        "scan_s": [r.scan_seconds for r in results],
        "counts": last.counts,
    }


async def wait_all_settled(handles, timeout_s: float = 120) -> None:
    """Every goal parked or with its gate running, so each run sees the same picture."""
    deadline = time.monotonic() + timeout_s
    for handle in handles:
        while True:
            snapshot = await handle.query(GoalWorkflow.progress)
            if snapshot.parked or snapshot.running:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{handle.id} did not settle: {snapshot.phase}")
            await asyncio.sleep(0.1)


def main(argv: list[str] | None = None) -> dict:
    options = parse_options(__doc__, argv, goals=100, runs=3)
    figures = asyncio.run(measure(**options))
    print(
        f"watchdog: one run over {options['goals']} open goals: {figures[KEY]:.3f} s (median of {options['runs']}; "
        f"runs {figures['runs_s']}, scans {figures['scan_s']}; {figures['counts']})",
        flush=True,
    )
    return figures


if __name__ == "__main__":
    main()
