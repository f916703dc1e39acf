"""Counting a process's fsyncs from outside, with strace (`make bench-peers`).

A durable step costs what its store makes the disk do: the calls that wait for the
disk (`fsync`, `fdatasync`, `sync_file_range`, `syncfs`) are counted by
`strace -f -c -e trace=...` on the process that makes them: a command started under
strace (`traced`), or a running process attached to for a while (`attached`: the
Temporal server, the harness's own in-process worker). strace stops a traced process
at its system calls, so nothing is ever timed while it is attached: counts come from
runs of their own. Without strace on the machine nothing is counted, and the caller
says so (`STRACE` is None).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

SYSCALLS = ("fsync", "fdatasync", "sync_file_range", "syncfs")
STRACE = shutil.which("strace")


def strace_argv(summary: Path) -> list[str]:
    """strace counting SYSCALLS in every thread and child, its summary (-c) written to `summary`."""
    if STRACE is None:
        raise RuntimeError("strace is not installed (apt-get install strace): fsyncs cannot be counted")
    return [STRACE, "-f", "-c", "-e", "trace=" + ",".join(SYSCALLS), "-o", str(summary)]


def traced(argv: list[str], summary: Path) -> list[str]:
    """`argv` run under strace: its calls to SYSCALLS are in `summary` once it has exited."""
    return [*strace_argv(summary), *argv]


def calls(summary: str) -> int:
    """How many SYSCALLS calls an `strace -c` summary counts (0 when the table is empty).

    A row is `% time, seconds, usecs/call, calls, [errors,] syscall`; the errors column is
    blank when there were none."""
    total = 0
    for line in summary.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in SYSCALLS:
            total += int(fields[3])
    return total


def _tracers(pid: int) -> list[int]:
    """The tracer of every thread of `pid` (0: not traced); [] once it has gone."""
    tracers = []
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        tracers += [int(line.split()[1]) for line in text.splitlines() if line.startswith("TracerPid:")]
    return tracers


@asynccontextmanager
async def attached(pid: int, summary: Path, timeout_s: float = 30) -> AsyncIterator[list[int]]:
    """strace attached to every thread of running process `pid` inside the block (threads
    it starts meanwhile too); the count of SYSCALLS is appended to the yielded list once
    strace has detached (SIGINT makes it detach and write its summary)."""
    counted: list[int] = []
    with open(summary.with_suffix(".log"), "wb") as log:
        strace = subprocess.Popen([*strace_argv(summary), "-p", str(pid)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + timeout_s
        # Attached once every thread names strace as its tracer: the block starts only then.
        while not (tracers := _tracers(pid)) or any(t != strace.pid for t in tracers):
            if strace.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"strace could not attach to {pid}: {summary.with_suffix('.log').read_text()[-500:]}"
                )
            await asyncio.sleep(0.02)
        yield counted
    finally:
        if strace.poll() is None:
            strace.send_signal(signal.SIGINT)
        try:
            await asyncio.to_thread(strace.wait, 30)
        except subprocess.TimeoutExpired:
            strace.kill()
            strace.wait()
    counted.append(calls(summary.read_text()))


def per_step(counts: dict[int, int]) -> float:
    """Calls per step from the counts of two runs of different sizes, as the timings are
    taken: the slope, so what a run costs once (start, schema, result) cancels out."""
    (small, at_small), (large, at_large) = sorted(counts.items())
    return (at_large - at_small) / (large - small)
