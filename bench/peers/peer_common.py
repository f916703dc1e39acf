"""The command line every peer program shares (`make bench-peers`), standard library only:
it runs in bench/peers/.venv, beside LangGraph or DBOS, never in perdure's venv.

A peer program measures nothing itself but the wall time of its own runs; the harness
(bench/peers.py, in perdure's venv) does the arithmetic, the killing and the counting.

    steps --db PATH --workspace DIR --sizes 30,300 --repeats 3
        one untimed warm-up run, then each size `repeats` times; one JSON line per run:
        {"n": N, "seconds": S}, the time from starting the run to its result.
    crash --db PATH --workspace DIR --n 100
        start the run "crash", or resume it when the database already holds it;
        prints {"done": N, "resumed": true|false} when it has finished.
    writes --db PATH --workspace DIR --url URL --sizes 10,30 --repeats 3
        as `steps`, but each step is a keyed write: POST {"bench": ..., "n": i} to URL with an
        Idempotency-Key header, the call perdure's keyed write step makes to the same fake ledger
        (bench/peers_writes.py), so the two write steps are compared like for like.

Step i of every run reads the file `s{i:05d}` in the workspace (the same 2-byte file
perdure's read steps read, or the FIFO the harness holds for the step that blocks):
the harness counts which steps ran by watching those opens, from outside.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

CRASH_RUN = "crash"


def step_file(workspace: str, index: int) -> Path:
    return Path(workspace) / f"s{index:05d}"


# Set by `writes`: every step POSTs to this URL instead of reading its file.
WRITE_URL: str | None = None


def read_step(workspace: str, index: int) -> int:
    """The body of every step: read its file (a FIFO blocks here until the harness writes),
    or in `writes`, make one keyed write."""
    if WRITE_URL is not None:
        return write_step(WRITE_URL, index)
    with open(step_file(workspace, index), "rb") as handle:
        handle.read()
    return index + 1


def write_step(url: str, index: int) -> int:
    """One keyed write to the fake ledger, answered before the step ends (a key of its own per
    call, as each of perdure's write steps has)."""
    body = json.dumps({"bench": "peer", "n": index}).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": uuid.uuid4().hex}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()
    return index + 1


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(run: Callable[[str, int], None], resume: Callable[[str], bool], setup: Callable[[str, str], None]) -> None:
    """run(run_id, n) runs n steps to the end; resume(run_id) finishes a run the database
    holds, returning False when it holds none; setup(db, workspace) opens the peer."""
    parser = argparse.ArgumentParser(description="one peer of `make bench-peers`")
    parser.add_argument("mode", choices=["steps", "crash", "writes"])
    parser.add_argument("--url", help="writes: the ledger's entries URL")
    parser.add_argument("--db", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--sizes", default="30,300")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n", type=int, default=100)
    args = parser.parse_args()
    if args.mode == "writes":
        global WRITE_URL
        WRITE_URL = args.url
    setup(args.db, args.workspace)
    if args.mode == "crash":
        resumed = resume(CRASH_RUN)
        if not resumed:
            run(CRASH_RUN, args.n)
        emit(done=args.n, resumed=resumed)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    run("warm-up", 3)
    for repeat in range(args.repeats):
        for n in sizes:
            started = time.perf_counter()
            run(f"steps-{repeat}-{n}", n)
            emit(n=n, seconds=time.perf_counter() - started)
    sys.stdout.flush()
