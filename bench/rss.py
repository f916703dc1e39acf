"""Peak memory of one worker process running 100 goals at once (`worker_peak_rss_mb`).

Starts `perdure worker` as a subprocess, exactly as a user does (PERDURE_TEMPORAL,
PERDURE_HOME, PERDURE_TASK_QUEUE, PERDURE_CONFIG), with a model profile speaking the
OpenAI format to the scripted model server, which runs in the benchmark's process as
a provider's API runs elsewhere: the worker's memory is the worker's, not a model
server's. Then starts 100 small goals together, each three tool steps (list_dir, two
read_file) and an llm step that needs them, waits for all of them, and reads the
worker's VmHWM (peak resident set) from /proc.

    .venv/bin/python -m bench.rss [--goals 100]
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

from temporalio.client import Client

from bench.common import (
    BIN,
    Section,
    goal_spec,
    kill_child,
    make_workspace,
    new_id,
    parse_options,
    run_standalone,
    start_goal,
)
from perdure.activities.models.scripted import ScriptedServer

KEYS = ("worker_peak_rss_mb",)
PROFILE = "bench-rss"
STEPS = [
    {"name": "inventory", "kind": "tool", "tool": "list_dir", "args": {"path": "."}},
    {"name": "read-a", "kind": "tool", "tool": "read_file", "args": {"path": "a.txt"}},
    {"name": "read-b", "kind": "tool", "tool": "read_file", "args": {"path": "b.txt"}},
    {"name": "sum-up", "kind": "llm", "needs": ["inventory", "read-a", "read-b"], "prompt": "Sum these up."},
]


def proc_status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(f"{field} not in /proc/{pid}/status")


SCRIPT = {"replies": [{"when": "PERDURE-STEP", "content": "A short summary of a.txt and b.txt."}]}


def start_worker(
    client: Client,
    home: Path,
    task_queue: str,
    log: Path,
    env: dict[str, str] | None = None,
    model_url: str | None = None,
) -> subprocess.Popen:
    """`perdure worker` as a user starts it, with `env` added to its environment; with
    `model_url`, its profile PROFILE calls the OpenAI-compatible server there."""
    config = home / "config.toml"
    profile = f'[profiles.{PROFILE}]\nprovider = "openai"\nmodel = "scripted-gpt"\nbase_url = "{model_url}"\n'
    config.write_text(profile if model_url else "")
    env = {
        **os.environ,
        "PERDURE_TEMPORAL": client.service_client.config.target_host,
        "PERDURE_NAMESPACE": client.namespace,
        "PERDURE_TASK_QUEUE": task_queue,
        "PERDURE_HOME": str(home),
        "PERDURE_CONFIG": str(config),
        "PERDURE_WATCHDOG_INTERVAL_S": "0",
        **(env or {}),
    }
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(BIN / "perdure"), "worker"], env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


async def wait_polling(proc: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while "worker polling" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not start; log:\n{log.read_text(errors='replace')[-3000:]}")
        await asyncio.sleep(0.1)


async def measure(client: Client, workdir: Path, goals: int = 100) -> Section:
    home = workdir / "rss"
    workspace = make_workspace(home / "ws", {"a.txt": "alpha\n", "b.txt": "beta\n"})
    task_queue = new_id("bench-rss")
    log = home / "worker.log"
    with ScriptedServer(SCRIPT) as model:
        return await measure_worker(client, home, workspace, task_queue, log, model.openai_base_url, goals)


async def measure_worker(
    client: Client, home: Path, workspace: Path, task_queue: str, log: Path, model_url: str, goals: int
) -> Section:
    proc = start_worker(client, home, task_queue, log, model_url=model_url)
    try:
        await wait_polling(proc, log)
        idle_mb = proc_status_kb(proc.pid, "VmRSS") / 1024
        spec = goal_spec(workspace, STEPS, model_profile=PROFILE, allowed_tools=["list_dir", "read_file"])
        started = time.perf_counter()
        handles = await asyncio.gather(
            *(start_goal(client, task_queue, spec, f"bench-rss-{i:03d}") for i in range(goals))
        )
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 600)
        seconds = time.perf_counter() - started
        peak_mb = proc_status_kb(proc.pid, "VmHWM") / 1024
        end_mb = proc_status_kb(proc.pid, "VmRSS") / 1024
        threads = proc_status_kb(proc.pid, "Threads")
    finally:
        kill_child(proc)
    reasons = Counter(f"{r.outcome}: {'; '.join(r.unfinished)}" for r in results if r.outcome != "succeeded")
    ok = goals - sum(reasons.values())
    notes = [
        f"one `perdure worker` process, {goals} concurrent goals (3 tool steps + 1 llm step each; "
        "the model server outside the worker): "
        f"{ok} of {goals} succeeded in {seconds:.1f} s; RSS idle {idle_mb:.0f} MB, after {end_mb:.0f} MB, "
        f"peak (VmHWM) {peak_mb:.0f} MB ({(peak_mb - idle_mb) / goals:.2f} MB per goal above idle); "
        f"{threads} threads at the end"
    ]
    notes += [f"  NOT SUCCEEDED x{count}: {reason}" for reason, count in reasons.most_common(5)]
    return Section(figures={"worker_peak_rss_mb": round(peak_mb, 1)}, notes=notes)


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, goals=100))


if __name__ == "__main__":
    main()
