"""`make soak`: the randomised crash soak of `testing/soak.py` on its own dev server.

`python -m tests.soak [--kills N] [--seed S]` (seed also from PERDURE_SOAK_SEED) prints each
kill, any problem found, and last `soak: kills=K effects=E duplicates=D missing=M completed=C/T`;
it exits 1 unless every effect happened exactly once and every goal completed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from runtime import converter
from testing.soak import run_soak
from tests.helpers import dev_server_options


async def _main(kills: int, seed: int) -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="perdure-soak-") as tmp:
        # One payload store for this client and the worker subprocesses, which inherit the environment.
        os.environ[converter.STORE_ENV] = f"disk:{tmp}/payloads"
        async with await WorkflowEnvironment.start_local(**dev_server_options()) as env:
            print(f"soak: {kills} kills, seed {seed}, workers are `perdure worker` subprocesses", flush=True)
            report = await run_soak(
                env.client, Path(tmp), kills=kills, seed=seed, say=lambda text: print(text, flush=True)
            )
    for problem in report.problems:
        print(f"problem: {problem}", flush=True)
    print(
        f"model: {report.model_kills} calls killed in flight, {report.model_extra_requests} extra requests; "
        f"wall {time.monotonic() - started:.0f}s",
        flush=True,
    )
    print(report.line(), flush=True)
    ok = report.kills >= kills and report.duplicates == 0 and report.missing == 0
    ok = ok and report.model_extra_requests <= report.model_kills
    return 0 if ok and report.completed == report.goals else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("PERDURE_SOAK_SEED", 1)))
    args = parser.parse_args()
    code = asyncio.run(_main(args.kills, args.seed))
    sys.stdout.flush()
    os._exit(code)  # see TEMPORAL_NOTES: the SDK may crash at interpreter exit after a clean run


if __name__ == "__main__":
    main()
