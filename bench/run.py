"""Run every benchmark in bench/ and merge their headline figures into
bench/results.json (`make bench`).

One dev server serves all of them, one after another, each on its own task
queues: the server `perdure server start` runs, its history in a SQLite db file on
disk, as in the headline row of `make bench-peers` (bench/storage.py), so every
figure that waits on the server pays its writes; PERDURE_HOME and the payload
store point at the same scratch directory (`--disk-dir`, the system's temporary
directory by default; a tmpfs is refused). Every figure is printed with its target and, where it has one, as a
ratio of the raw-Temporal baseline measured in the same run (bench/raw.py).
A benchmark that cannot produce a figure says why and leaves the key out of
results.json rather than keeping an old value.

    .venv/bin/python bench/run.py [--only overhead,scale,...] [--disk-dir /tmp]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script (`python bench/run.py`), so the repository is not on the path yet.
sys.path.insert(0, str(ROOT))

from bench import (  # noqa: E402
    agent_turn,
    artifact_store,
    command_sandbox,
    device_resume,
    max_goals,
    overhead,
    overhead_tokens,
    quota,
    recovery,
    replay,
    rss,
    scale,
    task_timeout,
    ui_events,
    watchdog,
)
from bench.common import Section, bench_storage, start_server, use_home  # noqa: E402

RESULTS = ROOT / "bench" / "results.json"

# Headline figure -> (comparison, target). Figures without one are informational.
TARGETS: dict[str, tuple[str, float]] = {
    "node_overhead_ratio": ("<=", 1.2),
    "fanout_ratio": (">=", 0.8),
    "max_events_per_run": ("<=", 10_000),
    "workflow_task_ms_per_node": ("<=", 0.5),  # issue 24: the goal's bookkeeping per node settled
    # issue 24: the worst of a remote write, a read segment, a model call and a command
    # (each printed: recovery_write_s, recovery_read_s, recovery_model_s, recovery_command_s).
    "recovery_s": ("<=", 2.5),
    "agent_turn_overhead_pct": ("<=", 1.5),  # issue 24 (it was 3.0)
    watchdog.KEY: ("<=", 60.0),  # the watchdog's default interval
    device_resume.KEY: ("<=", 2.0),
    "ui_event_latency_ms": ("<=", 300.0),
    quota.KEY: (">=", 0.9),  # within 10 % of the limit's floor
    "worker_peak_rss_mb": ("<=", 150.0),  # issue 24
    "max_goals_one_worker": (">=", 1000),  # issue 24: "try 1,000"
    # issue 34: perdure's own calls for a plan of 3,000 reads ("<= 2,000 tokens in all").
    "overhead_tokens_3000_reads": ("<=", 2_000),
}
# Figure -> the raw-Temporal baselines it is shown as a ratio of.
BASELINES: dict[str, tuple[str, ...]] = {
    "read_step_ms": ("raw_activity_ms", "raw_local_activity_ms"),
    "write_step_ms": ("raw_write_activity_ms", "raw_local_write_ms"),
    "once_write_step_ms": ("raw_once_write_activity_ms",),
    "agent_turn_overhead_pct": ("raw_agent_turn_overhead_pct",),
}


async def watchdog_section(client, workdir: Path) -> Section:
    measured = await watchdog.measure(client=client)
    notes = [
        f"watchdog: one run over 100 open goals: {measured[watchdog.KEY]:.3f} s (median; runs {measured['runs_s']}, "
        f"scans {measured['scan_s']}; {measured['counts']})"
    ]
    return Section(figures={watchdog.KEY: measured[watchdog.KEY]}, notes=notes)


# In run order: scale last, since it takes whatever time its budget allows.
BENCHMARKS = {
    "replay": (replay.KEYS, replay.measure),
    "overhead": (overhead.KEYS, overhead.measure),
    "agent_turn": (agent_turn.KEYS, agent_turn.measure),
    # With the command's recovery (bench/recovery_command.py), so recovery_s is the worst of all.
    "recovery": (recovery.KEYS, recovery.measure),
    # Why a worker restarted in place takes a goal back no sooner: what a shorter workflow
    # task timeout costs busy workers, and how long `perdure worker` takes to start.
    "task_timeout": (task_timeout.KEYS, task_timeout.measure),
    "command_sandbox": (command_sandbox.KEYS, command_sandbox.measure),
    # Disk and an S3-compatible store (moto's server on localhost: said in its output).
    "artifact_store": (artifact_store.KEYS, artifact_store.measure),
    "device_resume": (device_resume.KEYS, device_resume.measure),
    "ui_events": (ui_events.KEYS, ui_events.measure),
    "rss": (rss.KEYS, rss.measure),
    "max_goals": (max_goals.KEYS, max_goals.measure),
    "watchdog": ((watchdog.KEY,), watchdog_section),
    "quota": (quota.KEYS, quota.measure),
    "overhead_tokens": (overhead_tokens.KEYS, overhead_tokens.measure),
    "scale": (scale.KEYS, scale.measure),
}


def judge(key: str, value: float) -> str:
    if key not in TARGETS:
        return ""
    op, target = TARGETS[key]
    met = value <= target if op == "<=" else value >= target
    symbol = "≤" if op == "<=" else "≥"
    return f"  [target {symbol} {target:g}: {'met' if met else 'MISSED'}]"


def ratios(key: str, value: float, known: dict[str, float]) -> str:
    shown = [f"{value / known[b]:.2f}x {b}" for b in BASELINES.get(key, ()) if known.get(b)]
    return f"  (= {', '.join(shown)})" if shown else ""


def merge(figures: dict[str, float], dropped: set[str], storage: str) -> dict:
    """Merge headline figures into results.json, keeping keys other benchmarks wrote;
    keys a benchmark owns but could not measure this time are removed. `bench_storage`
    says what the server kept its history on."""
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for key in dropped:
        results.pop(key, None)
    results.update(figures)
    results["bench_storage"] = storage
    RESULTS.write_text(json.dumps(dict(sorted(results.items())), indent=2) + "\n")
    return results


async def run(names: list[str], disk_dir: Path) -> tuple[dict[str, float], set[str], list[str]]:
    figures: dict[str, float] = {}
    extra: dict[str, float] = {}
    dropped: set[str] = set()
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="perdure-bench-", dir=disk_dir) as tmp:
        workdir = Path(tmp)
        use_home(workdir / "home")
        server = await start_server(workdir)
        print(f"storage: {bench_storage(workdir).server()} ({server.db})", flush=True)
        try:
            for name in names:
                keys, measure = BENCHMARKS[name]
                print(f"\n== {name} ==", flush=True)
                started = time.monotonic()
                try:
                    section: Section = await measure(server.client, workdir)
                except Exception:
                    failed.append(name)
                    print(f"{name} FAILED:\n{traceback.format_exc()}", flush=True)
                    continue
                for line in section.notes:
                    print(line, flush=True)
                missing = set(keys) - set(section.figures)
                dropped |= missing
                figures.update(section.figures)
                extra.update(section.extra)
                print(f"({name}: {time.monotonic() - started:.0f} s)", flush=True)
        finally:
            server.stop()
    known = {**extra, **figures}
    print("\n== figures ==")
    for key, value in figures.items():
        print(f"{key} = {value}{judge(key, value)}{ratios(key, value, known)}")
    for key, value in extra.items():
        print(f"  ({key} = {value}, printed only)")
    for key in sorted(dropped):
        print(f"{key}: not measured this run (see above); removed from results.json")
    return figures, dropped, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated: " + ", ".join(BENCHMARKS))
    parser.add_argument(
        "--disk-dir",
        default=tempfile.gettempdir(),
        help="where the server's db file and the scratch files go (on disk, not a tmpfs)",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    disk_dir = Path(args.disk_dir)
    problem = bench_storage(disk_dir).refusal()
    if problem:
        print(f"error: --disk-dir: {problem}", file=sys.stderr)
        return 2
    started = time.monotonic()
    figures, dropped, failed = asyncio.run(run(names, disk_dir))
    merge(figures, dropped, bench_storage(disk_dir).server())
    shown = RESULTS.relative_to(ROOT) if RESULTS.is_relative_to(ROOT) else RESULTS
    print(f"merged into {shown} ({time.monotonic() - started:.0f} s in all)")
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # The SDK's native runtime can crash at interpreter exit (sdk-python #300).
    os._exit(code)
