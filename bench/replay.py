"""How long replaying the largest golden history takes (`replay_s`).

Replays the largest file under tests/histories/ with `temporalio.worker.Replayer`
(GoalWorkflow and WatchdogWorkflow, perdure's data converter), as the replay
test and any worker picking up an evicted goal do. Each attempt uses a fresh
Replayer; the first includes loading the workflow modules into the sandbox.
Needs no server.

    .venv/bin/python -m bench.replay [--repeats 3]
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from bench.common import ROOT, Section, median, parse_options
from perdure.runtime.plugin import PerdurePlugin
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.watchdog.watchdog_workflow import WatchdogWorkflow

KEYS = ("replay_s",)
HISTORIES = ROOT / "tests" / "histories"


def largest_history() -> Path:
    files = sorted(HISTORIES.glob("*.json"), key=lambda p: p.stat().st_size)
    if not files:
        raise FileNotFoundError(f"no golden histories in {HISTORIES}")
    return files[-1]


async def measure(client=None, workdir: Path | None = None, repeats: int = 3) -> Section:
    path = largest_history()
    history = WorkflowHistory.from_json(path.stem, path.read_text(encoding="utf-8"))
    seconds = []
    for _ in range(repeats):
        replayer = Replayer(workflows=[GoalWorkflow, WatchdogWorkflow], plugins=[PerdurePlugin()])
        started = time.perf_counter()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        seconds.append(time.perf_counter() - started)
        if result.replay_failure is not None:
            raise RuntimeError(f"{path.name} no longer replays: {result.replay_failure}")
    notes = [
        f"replay of {path.relative_to(ROOT)} ({len(history.events)} events, {path.stat().st_size} bytes): "
        f"median {median(seconds):.3f} s of {repeats} (each {', '.join(f'{s:.3f}' for s in seconds)} s; "
        "the first loads the sandbox)"
    ]
    return Section(figures={"replay_s": round(median(seconds), 3)}, notes=notes)


def main(argv: list[str] | None = None) -> dict:
    section = asyncio.run(measure(**parse_options(__doc__, argv, repeats=3)))
    for line in section.notes:
        print(line)
    print(f"replay_s = {section.figures['replay_s']}")
    return section.figures


if __name__ == "__main__":
    main()
