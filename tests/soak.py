"""`make soak`: the crash soaks of `testing/soak.py` (kills aimed at chosen steps) and
`testing/timed_soak.py` (kills every 2-5 s whatever runs, and during `perdure start`), on
their own dev server.

`python -m tests.soak [--kills N] [--seed S | --seeds 1,2,3] [--timed]` (seed also from
PERDURE_SOAK_SEED) runs one soak per seed, printing each kill, any problem found and each
run's `soak: kills=K effects=E duplicates=D missing=M completed=C/T lost_attempts=L`, and
last the same line for all runs together; it exits 1 unless every effect happened exactly
once, every goal completed and every model request is one per attempt (the timed soak: and
no `perdure start` failed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from perdure.runtime import converter
from perdure.testing.soak import SoakReport, run_soak
from perdure.testing.timed_soak import run_timed_soak
from tests.helpers import dev_server_options

SUMMED = ("kills", "effects", "duplicates", "missing", "completed", "goals", "model_kills", "model_extra_requests")
SUMMED += ("lost_attempts", "model_requests_unexplained", "attempts_cut", "scheduled_again")


async def _main(kills: int, seeds: list[int], timed: bool) -> int:
    started = time.monotonic()
    say = lambda text: print(text, flush=True)  # noqa: E731
    reports: list[tuple[int, SoakReport]] = []
    with tempfile.TemporaryDirectory(prefix="perdure-soak-") as tmp:
        # One payload store for this client and the worker subprocesses, which inherit the environment.
        os.environ[converter.STORE_ENV] = f"disk:{tmp}/payloads"
        async with await WorkflowEnvironment.start_local(**dev_server_options()) as env:
            for seed in seeds:
                kind = "timed kills every 2-5 s and at `perdure start`" if timed else "kills at chosen steps"
                say(f"soak: {kills} {kind}, seed {seed}, workers are `perdure worker` subprocesses")
                root = Path(tmp) / f"seed-{seed}"
                if timed:
                    report = await run_timed_soak(env.client, root, kills=kills, seed=seed, say=say)
                else:
                    report = await run_soak(env.client, root, kills=kills, seed=seed, say=say)
                for problem in report.problems:
                    say(f"problem: {problem}")
                cut = cut_text(report) if timed else ""
                say(f"seed {seed}: kills by kind: {report.kinds_text() or 'at chosen steps'}{cut}")
                say(report.line())
                reports.append((seed, report))
    total = SoakReport(kill_kinds=sum((r.kill_kinds for _, r in reports), Counter()))
    for name in SUMMED:
        setattr(total, name, sum(getattr(r, name) for _, r in reports))
    say(
        f"model: {total.model_extra_requests} extra requests, {total.model_requests_unexplained} not explained by a "
        f"lost attempt; wall {time.monotonic() - started:.0f}s"
    )
    cut = cut_text(total) if timed else ""
    kinds = total.kinds_text() or "at chosen steps"
    say(f"all {len(reports)} run(s), seeds {','.join(str(s) for s in seeds)}: kills by kind: {kinds}{cut}")
    say(total.line())
    return 0 if all(_ok(report, kills, timed) for _, report in reports) else 1


def cut_text(report: SoakReport) -> str:
    return (
        f"; from history: {report.attempts_cut} activity attempts cut by the kills, {report.scheduled_again} "
        "activities out of attempts to dead workers and scheduled again"
    )


def _ok(report: SoakReport, kills: int, timed: bool) -> bool:
    ok = report.kills >= kills and report.duplicates == 0 and report.missing == 0
    ok = ok and report.completed == report.goals and report.model_requests_unexplained == 0
    # The timed soak's problems are its failures (a lost or failed start among them).
    return ok and not (timed and report.problems)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="kills per seed")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("PERDURE_SOAK_SEED", 1)))
    parser.add_argument("--seeds", help="comma-separated seeds, one run each (instead of --seed)")
    parser.add_argument("--timed", action="store_true", help="the timed soak (testing/timed_soak.py)")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed]
    code = asyncio.run(_main(args.kills, seeds, args.timed))
    sys.stdout.flush()
    os._exit(code)  # see TEMPORAL_NOTES: the SDK may crash at interpreter exit after a clean run


if __name__ == "__main__":
    main()
