"""perdure beside LangGraph and DBOS on the same steps and the same crash (`make bench-peers`).

LangGraph with its SQLite checkpointer and DBOS on SQLite, against perdure on one dev
server, on the same two tests:

- steps: N sequential steps, each reading its own 2-byte file (perdure has no step
  that does nothing; a read step is its cheapest, what `read_step_ms` reports). perdure
  runs them as a goal of read steps and as a raw Temporal workflow of local
  activities (bench/raw.py); each peer as its own durable steps (bench/peers/). Per
  step is the slope between a small and an N-step run (medians of the repeats), so
  each one's fixed cost (process, start, result) cancels out: the same for all.
- crash: a 100-step run whose step 39 reads a FIFO the harness holds open, so the
  step blocks; the harness SIGKILLs the process running it, then serves the FIFO.
  A peer is started again in place (its database says what is left); perdure's goal
  is resumed by a standby `perdure worker` already polling (testing/crash.py), and in
  a second run by a worker started right after the kill, as a peer is. The
  ledger is the kernel's: every close of a step's file (inotify), so a step that ran
  twice is counted twice whoever ran it. Reported: steps re-run, seconds from the
  kill until step 39 opens its FIFO again, and until the run has finished.

The peers run as subprocesses of bench/peers/.venv (the Makefile builds it from
bench/peers/requirements.txt), never inside perdure's venv. Figures go to
bench/peers_results.json with perdure's ratio to each peer.

    .venv/bin/python -m bench.peers_run [--n 300] [--small 30] [--repeats 3] [--crash-n 100] [--block-at 39]
                                        [--peer-db-dir /dev/shm]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from inotify_simple import INotify, flags
from rich.console import Console
from rich.table import Table
from temporalio.client import Client

from bench.common import (
    ROOT,
    chain_steps,
    goal_spec,
    median,
    new_id,
    on_own_server,
    parse_options,
    perdure_worker,
    raw_worker,
    slope_ms,
    start_goal,
)
from bench.overhead import run_perdure, run_raw
from perdure.testing.crash import CrashRig, open_writer, serve_fifo

PEERS_DIR = ROOT / "bench" / "peers"
PEER_PYTHON = PEERS_DIR / ".venv" / "bin" / "python"
RESULTS = ROOT / "bench" / "peers_results.json"
# Peer -> how the table names it.
PEERS = {"langgraph": "LangGraph, SqliteSaver (sync)", "dbos": "DBOS on SQLite"}
# The row of perdure's crash test resumed by a restarted worker instead of a standby.
RESTART = "perdure_restart"


def step_name(index: int) -> str:
    """The file step `index` reads, in every system (bench/peers/peer_common.py's step_file)."""
    return f"s{index:05d}"


def step_workspace(root: Path, count: int, blocking: int | None = None) -> Path:
    """One 2-byte file per step; the blocking step's is a FIFO instead."""
    root.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        path = root / step_name(index)
        if index == blocking:
            os.mkfifo(path)
        else:
            path.write_bytes(b"x\n")
    return root


# --- arithmetic ------------------------------------------------------------------


def parse_runs(text: str) -> dict[int, list[float]]:
    """A peer's `steps` output (one JSON object per line) as seconds per run, by size."""
    runs: dict[int, list[float]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            run = json.loads(line)
            size, seconds = int(run["n"]), float(run["seconds"])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"not a peer's run line: {line[:200]!r} ({err})") from None
        runs.setdefault(size, []).append(seconds)
    return runs


def per_step_ms(runs: dict[int, list[float]], small: int, large: int) -> float:
    """The slope between the medians of the small and the large runs."""
    missing = [size for size in (small, large) if not runs.get(size)]
    if missing:
        raise ValueError(f"no run of {missing[0]} steps (runs of {sorted(runs)})")
    return slope_ms((small, median(runs[small])), (large, median(runs[large])))


def step_index(name: str) -> int | None:
    if len(name) == 6 and name.startswith("s") and name[1:].isdigit():
        return int(name[1:])
    return None


def runs_per_step(closes: Counter[int], steps_run: int) -> int:
    """How many times one uninterrupted step closes its file (a perdure read step reads it,
    then digests it for its fingerprint: two), from a run of `steps_run` steps."""
    total = sum(closes.values())
    if steps_run < 1 or total < steps_run or total % steps_run:
        raise ValueError(f"{total} closes of step files over {steps_run} uninterrupted steps")
    return total // steps_run


def reruns(closes: Counter[int], per_step: int, gate: int) -> list[int]:
    """Each step once for every time it ran beyond the first, in step order. A step's
    closes make one run per `per_step`; the gate's FIFO is read once a run by everyone (a
    fingerprint digests regular files only), and its killed read counts as a run."""
    runs = {index: count if index == gate else -(-count // per_step) for index, count in closes.items()}
    return [index for index in sorted(runs) for _ in range(runs[index] - 1)]


def spans(steps: list[int]) -> str:
    """Steps as runs of consecutive numbers: [0, 1, 2, 5, 5] -> "0-2, 5 (2 times)"."""
    counts = Counter(steps)
    parts: list[list[int]] = []
    for index in sorted(counts):
        last = parts[-1] if parts else None
        if last and index == last[1] + 1 and counts[index] == counts[last[0]]:
            last[1] = index
        else:
            parts.append([index, index])
    return ", ".join(
        (f"{lo}" if lo == hi else f"{lo}-{hi}") + (f" ({counts[lo]} times)" if counts[lo] > 1 else "")
        for lo, hi in parts
    )


def ratio(perdure: float | None, peer: float | None) -> float | None:
    return round(perdure / peer, 2) if perdure is not None and peer else None


class Ledger:
    """Which steps ran, counted from outside by the kernel: every close of a step's file
    opened for reading (a killed process's open file is closed too). The harness opens
    the FIFO only for writing, so its own closes are not counted."""

    def __init__(self, workspace: Path) -> None:
        self._inotify = INotify()
        # Opens are watched too, only so that two closes in a row are never two identical
        # events in the queue, which the kernel would merge into one.
        self._inotify.add_watch(str(workspace), flags.OPEN | flags.CLOSE_NOWRITE)
        self._names: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ledger", daemon=True)

    def __enter__(self) -> Ledger:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._inotify.close()

    def _watch(self) -> None:
        while not self._stop.is_set():
            events = self._inotify.read(timeout=50)
            self._names += [event.name for event in events if event.mask & flags.CLOSE_NOWRITE]

    def closes(self) -> Counter[int]:
        indexes = (step_index(name) for name in list(self._names))
        return Counter(index for index in indexes if index is not None)


# --- the crash test --------------------------------------------------------------


@dataclass
class Crash:
    resume_s: float | None  # kill -> step's FIFO opened again; None: never
    done_s: float | None  # kill -> the run's result; None: not within the wait
    rerun: list[int]
    ran: int  # distinct steps the ledger saw
    how: str

    def describe(self, block_at: int) -> str:
        again = f"{self.resume_s:.2f} s" if self.resume_s is not None else "never"
        done = f"{self.done_s:.2f} s" if self.done_s is not None else "not finished"
        shown = spans(self.rerun)
        return (
            f"{self.how}: step {block_at} again after {again}, done after {done}; "
            f"{len(self.rerun)} step(s) re-run ({shown or 'none'}); {self.ran} distinct steps ran"
        )


async def settle(ledger: Ledger, quiet_s: float = 0.5, most_s: float = 10) -> Counter[int]:
    """The ledger once no close has come in for `quiet_s`: the kernel reports a close a
    moment after it, and the watching thread shares a busy machine."""
    deadline = time.monotonic() + most_s
    seen = sum(ledger.closes().values())
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < quiet_s and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        now = sum(ledger.closes().values())
        if now != seen:
            seen, quiet_since = now, time.monotonic()
    return ledger.closes()


@dataclass
class CrashRun:
    """One crash test's setting: the run's size, the step that blocks, the ledger's
    closes per uninterrupted step of this system, how long to wait for the end."""

    count: int
    block_at: int
    per_step: int
    wait_s: float


async def resumed(kill, finished, gate: Path, ledger: Ledger, run: CrashRun, how: str) -> Crash:
    """SIGKILL (`await kill()`, which returns once the process is dead, with the kill's time)
    while the gate's step blocks, serve the gate to whoever reads it next, and wait for
    `finished()`; both are timed from the kill."""
    killed_at = await kill()
    first: asyncio.Future = asyncio.get_running_loop().create_future()
    served = asyncio.create_task(serve_fifo(gate, first))
    try:
        done_s = None
        try:
            await asyncio.wait_for(finished(), run.wait_s)
            done_s = time.time() - killed_at
        except TimeoutError:
            pass
        resume_s = first.result() - killed_at if first.done() else None
    finally:
        served.cancel()
    closes = await settle(ledger)
    return Crash(resume_s, done_s, reruns(closes, run.per_step, run.block_at), len(closes), how)


async def crash_perdure(client: Client, root: Path, run: CrashRun, standby: bool = True) -> Crash:
    """The goal on two workers, resumed by the one not killed (`standby`); or on one
    worker, resumed by a new `perdure worker` started right after the kill, as a peer is."""
    workspace = step_workspace(root / "ws", run.count, blocking=run.block_at)
    gate = workspace / step_name(run.block_at)
    rig = CrashRig(client=client, root=root)
    try:
        with Ledger(workspace) as ledger:
            for _ in range(2 if standby else 1):
                rig.start_worker()
            await rig.wait_polling()
            steps = chain_steps("read_file", [{"path": step_name(i)} for i in range(run.count)])
            spec = goal_spec(workspace, steps, allowed_tools=["read_file"], label=f"peers crash, {run.count} reads")
            handle = await start_goal(client, rig.task_queue, spec, "bench-peers-crash")
            # Held open without a write: the step now waits inside its read.
            held = await open_writer(gate, timeout_s=60)
            victim = await rig.reader_of(gate)

            async def kill() -> float:
                victim.kill()
                killed_at = time.time()
                os.close(held)
                if not standby:
                    rig.start_worker()
                return killed_at

            async def finished() -> None:
                result = await handle.result()
                if result.outcome != "succeeded":
                    raise RuntimeError(f"the crash goal ended {result.outcome}: {result.unfinished[:3]}")

            how = "perdure, standby worker" if standby else "perdure, worker restarted in place"
            return await resumed(kill, finished, gate, ledger, run, how)
    finally:
        rig.close()


class PeerFailed(RuntimeError):
    pass


async def start_peer(peer: str, mode: str, db: Path, workspace: Path, log: Path, *options: str):
    with open(log, "ab") as err:
        return await asyncio.create_subprocess_exec(
            str(PEER_PYTHON),
            str(PEERS_DIR / f"{peer}_peer.py"),
            mode,
            "--db",
            str(db),
            "--workspace",
            str(workspace),
            *options,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            stdin=asyncio.subprocess.DEVNULL,
        )


async def peer_output(proc, peer: str, log: Path) -> str:
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise PeerFailed(f"{peer} exited with {proc.returncode}:\n{tail}")
    return out.decode()


async def crash_peer(peer: str, root: Path, run: CrashRun, dbs: Path) -> Crash:
    workspace = step_workspace(root / "ws", run.count, blocking=run.block_at)
    gate = workspace / step_name(run.block_at)
    db, log = dbs / f"{peer}-crash.db", root / f"{peer}.log"
    options = ("--n", str(run.count))
    with Ledger(workspace) as ledger:
        victim = await start_peer(peer, "crash", db, workspace, log, *options)
        try:
            held = await open_writer(gate, timeout_s=60)
        except RuntimeError as err:
            victim.kill()
            await victim.wait()
            raise PeerFailed(
                f"{peer} never reached step {run.block_at}:\n{log.read_text(errors='replace')[-1500:]}"
            ) from err
        again: list = []

        async def kill() -> float:
            victim.send_signal(signal.SIGKILL)
            killed_at = time.time()
            # Dead before the gate is served: its own read must not take the first serving.
            await victim.wait()
            os.close(held)
            return killed_at

        async def finished() -> None:
            again.append(await start_peer(peer, "crash", db, workspace, log, *options))
            out = await peer_output(again[0], peer, log)
            if '"resumed": true' not in out:
                raise PeerFailed(f"{peer} started the run anew instead of resuming it: {out.strip()}")

        try:
            return await resumed(kill, finished, gate, ledger, run, f"{PEERS[peer]}, restarted in place")
        finally:
            for proc in [victim, *again]:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


# --- the steps test --------------------------------------------------------------


@dataclass
class Steps:
    ms: float  # per step, the slope
    per_step: int  # closes of step files per step (the crash test's ledger divides by it)


WARM_UP = 3  # steps of the untimed first run, in every system (peer_common.py's too)


def steps_run(small: int, large: int, repeats: int) -> int:
    """Steps a peer runs in the steps test: the warm-up, then every size, repeated."""
    return WARM_UP + repeats * (small + large)


async def steps_peer(peer: str, root: Path, small: int, large: int, repeats: int, dbs: Path) -> Steps:
    workspace = step_workspace(root / "ws", large)
    log = root / f"{peer}-steps.log"
    options = ("--sizes", f"{small},{large}", "--repeats", str(repeats))
    with Ledger(workspace) as ledger:
        proc = await start_peer(peer, "steps", dbs / f"{peer}-steps.db", workspace, log, *options)
        runs = parse_runs(await peer_output(proc, peer, log))
        closes = await settle(ledger)
    return Steps(per_step_ms(runs, small, large), runs_per_step(closes, steps_run(small, large, repeats)))


async def steps_perdure(root: Path, client: Client, small: int, large: int, repeats: int) -> tuple[Steps, float]:
    """A goal of read steps and the raw local activities' ms per step, each warmed up
    first. Only the goal's warm-up is watched by the ledger: its thread would share the
    in-process worker's interpreter lock during the timed runs (a peer's runs are in
    another process). The raw workflow reads a workspace of its own."""
    workspace, raw_workspace = step_workspace(root / "ws", large), step_workspace(root / "raw-ws", large)
    tq_goal, tq_raw = new_id("bench-peers"), new_id("bench-peers-raw")
    goal: dict[int, list[float]] = {}
    raw: dict[int, list[float]] = {}

    def args(size: int) -> list[dict]:
        return [{"path": step_name(i)} for i in range(size)]

    async def goal_run(size: int) -> float:
        seconds, _ = await run_perdure(client, tq_goal, workspace, chain_steps("read_file", args(size)), ["read_file"])
        return seconds

    async with perdure_worker(client, tq_goal, root), raw_worker(client, tq_raw, root):
        with Ledger(workspace) as ledger:
            await goal_run(WARM_UP)
            closes = await settle(ledger)
        await run_raw(client, tq_raw, raw_workspace, "read_file", args(WARM_UP), "local")
        for _ in range(repeats):
            for size in (small, large):
                goal.setdefault(size, []).append(await goal_run(size))
                seconds = await run_raw(client, tq_raw, raw_workspace, "read_file", args(size), "local")
                raw.setdefault(size, []).append(seconds)
    per_step = runs_per_step(closes, WARM_UP)
    return Steps(per_step_ms(goal, small, large), per_step), per_step_ms(raw, small, large)


# --- the run ---------------------------------------------------------------------


@dataclass
class Row:
    name: str
    steps: Steps | None = None
    crash: Crash | None = None
    failures: list[str] = field(default_factory=list)
    raw_ms: float | None = None  # only the raw Temporal row, which has no ledger

    @property
    def step_ms(self) -> float | None:
        return self.steps.ms if self.steps else self.raw_ms


def figures(rows: dict[str, Row]) -> dict[str, float | int]:
    """The results file: each system's figures (perdure's, then `peer_<name>_...`) and
    perdure's ratio to each peer (perdure ÷ peer: below 1, perdure is faster)."""
    out: dict[str, float | int] = {}
    perdure, raw = rows["perdure"], rows["raw"]
    if raw.step_ms is not None:
        out["raw_local_activity_ms"] = round(raw.step_ms, 3)
    for key, prefix in {
        "perdure": "perdure_",
        **{peer: f"peer_{peer}_" for peer in PEERS},
        RESTART: "perdure_restart_",
    }.items():
        row = rows[key]
        if row.step_ms is not None:
            out[prefix + ("read_step_ms" if key == "perdure" else "step_ms")] = round(row.step_ms, 3)
        if row.crash is not None:
            out[f"{prefix}rerun_steps"] = len(row.crash.rerun)
            for name, value in (("recovery_s", row.crash.resume_s), ("done_after_kill_s", row.crash.done_s)):
                if value is not None:
                    out[prefix + name] = round(value, 2)
    for peer in PEERS:
        row = rows[peer]
        step = ratio(perdure.step_ms, row.step_ms)
        if step is not None:
            out[f"perdure_step_ratio_to_{peer}"] = step
        for key, prefix in (("perdure", "perdure_"), (RESTART, "perdure_restart_")):
            resume = ratio(resume_s(rows[key]), resume_s(row))
            if resume is not None:
                out[f"{prefix}recovery_ratio_to_{peer}"] = resume
    return out


def resume_s(row: Row) -> float | None:
    return row.crash.resume_s if row.crash else None


def table(rows: dict[str, Row], block_at: int) -> Table:
    perdure = rows["perdure"]
    result = Table(title="perdure beside its peers (ratio = perdure ÷ the row; below 1: perdure faster)")
    for column in (
        "system",
        "ms per step",
        "steps re-run",
        f"s to step {block_at} again",
        "s to done",
        "ratio ms/step",
        "ratio resume",
    ):
        result.add_column(column, justify="left" if column == "system" else "right")

    def shown(value: float | None, digits: int = 2) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    for key, row in rows.items():
        crash = row.crash
        ours = key in ("perdure", RESTART)
        resume = None if ours else ratio(resume_s(perdure), resume_s(row))
        step = None if ours else ratio(perdure.step_ms, row.step_ms)
        result.add_row(
            row.name,
            shown(row.step_ms),
            "—" if crash is None else str(len(crash.rerun)),
            shown(crash.resume_s if crash else None),
            shown(crash.done_s if crash else None),
            shown(step),
            shown(resume),
        )
    return result


async def run(client: Client, work: Path, peer_db_dir: str, **settings) -> dict[str, Row]:
    # The peers' SQLite files: in the scratch directory (on disk), or where asked (/dev/shm
    # keeps them in memory, as the dev server keeps its history here).
    dbs = Path(tempfile.mkdtemp(prefix="perdure-peers-", dir=peer_db_dir or work))
    try:
        return await run_all(client, work, dbs, **settings)
    finally:
        shutil.rmtree(dbs, ignore_errors=True)


async def run_all(
    client: Client,
    work: Path,
    dbs: Path,
    n: int,
    small: int,
    repeats: int,
    crash_n: int,
    block_at: int,
    wait_s: float,
) -> dict[str, Row]:
    rows = {
        "perdure": Row("perdure goal, read steps"),
        RESTART: Row("  the same, worker restarted"),
        "raw": Row("raw Temporal, local activities"),
        **{peer: Row(name) for peer, name in PEERS.items()},
    }
    systems = ["perdure", *PEERS]

    async def attempt(key: str, what: str, action) -> None:
        started = time.monotonic()
        try:
            await action()
            print(f"  {rows[key].name}: {what} done ({time.monotonic() - started:.0f} s)", flush=True)
        except (PeerFailed, RuntimeError, ValueError, OSError) as err:
            rows[key].failures.append(f"{what}: {err}")
            print(f"  {rows[key].name}: {what} FAILED: {err}", flush=True)

    async def steps(key: str) -> None:
        root = work / f"{key}-steps"
        if key == "perdure":
            rows[key].steps, rows["raw"].raw_ms = await steps_perdure(root, client, small, n, repeats)
        else:
            rows[key].steps = await steps_peer(key, root, small, n, repeats, dbs)

    async def crash(key: str) -> None:
        calibrated = rows["perdure" if key == RESTART else key].steps
        if calibrated is None:
            raise RuntimeError("not run: the ledger's closes per step come from the steps test, which failed")
        setting = CrashRun(crash_n, block_at, calibrated.per_step, wait_s)
        root = work / f"{key}-crash"
        if key in PEERS:
            rows[key].crash = await crash_peer(key, root, setting, dbs)
        else:
            rows[key].crash = await crash_perdure(client, root, setting, standby=key == "perdure")

    print(f"steps: {small} and {n} sequential read steps, {repeats} repeats each", flush=True)
    for key in systems:
        await attempt(key, "steps", lambda key=key: steps(key))
    print(f"crash: SIGKILL while step {block_at} of {crash_n} runs, then resume", flush=True)
    for key in ["perdure", RESTART, *PEERS]:
        await attempt(key, "crash", lambda key=key: crash(key))
    return rows


def main(argv: list[str] | None = None) -> int:
    options = parse_options(
        __doc__, argv, n=300, small=30, repeats=3, crash_n=100, block_at=39, wait_s=120.0, peer_db_dir=""
    )
    problem = refusal(options)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    started = time.monotonic()
    rows: dict[str, Row] = on_own_server(run, options)
    console = Console(width=130)
    console.print(table(rows, options["block_at"]))
    for line in method(rows, options) + targets(rows):
        print(line)
    results = {
        **figures(rows),
        "n": options["n"],
        "small": options["small"],
        "crash_n": options["crash_n"],
        "block_at": options["block_at"],
    }
    RESULTS.write_text(json.dumps(dict(sorted(results.items())), indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)} ({time.monotonic() - started:.0f} s in all)")
    failed = [f"{row.name}: {failure}" for row in rows.values() for failure in row.failures]
    for line in failed:
        print(f"not measured: {line.splitlines()[0]}")
    return 1 if failed else 0


# perdure's targets beside its peers (issue 24): a bound of its own, and below a peer's figure.
STEP_TARGET_MS, STEP_PEER = 1.0, "langgraph"
RECOVERY_TARGET_S, RECOVERY_PEER = 2.5, "dbos"


def targets(rows: dict[str, Row]) -> list[str]:
    """Each target judged on this run's figures, or said to be unmeasured."""
    perdure = rows["perdure"]
    judged = (
        ("read step", "ms", perdure.step_ms, STEP_TARGET_MS, STEP_PEER, rows[STEP_PEER].step_ms),
        ("recovery", "s", resume_s(perdure), RECOVERY_TARGET_S, RECOVERY_PEER, resume_s(rows[RECOVERY_PEER])),
    )
    lines = []
    for what, unit, ours, bound, peer, theirs in judged:
        goal = f"perdure's {what} ≤ {bound:g} {unit} and below {PEERS[peer]}'s"
        if ours is None or theirs is None:
            lines.append(f"target: {goal}: not measured this run")
            continue
        met = ours <= bound and ours < theirs
        lines.append(f"target: {goal}: {'met' if met else 'MISSED'} ({ours:.2f} against {theirs:.2f} {unit})")
    return lines


def method(rows: dict[str, Row], options: dict) -> list[str]:
    """How to read the table, with what each crash run did."""
    per_step = {row.name: row.steps.per_step for row in rows.values() if row.steps}
    lines = [
        f"ms per step: slope between {options['small']} and {options['n']} steps, medians of {options['repeats']} "
        "runs each (perdure timed at its client, start to result; a peer in its own process, run to result)",
        "steps re-run: each step's runs counted by the kernel's closes of its file (closes per uninterrupted "
        f"step: {'; '.join(f'{name}: {count}' for name, count in per_step.items())}), the killed step included",
        f"s to step {options['block_at']} again: from the SIGKILL until a process opens that step's FIFO again; "
        "s to done: until the run's result. perdure resumes on a standby worker already polling (ratios), "
        "or on a worker started right after the kill; each peer is started again in place",
    ]
    lines += ["  " + row.crash.describe(options["block_at"]) for row in rows.values() if row.crash]
    return lines


def refusal(options: dict) -> str | None:
    """Why these options cannot run, or None."""
    if not PEER_PYTHON.exists():
        return f"{PEER_PYTHON.relative_to(ROOT)} does not exist: `make bench-peers` creates it"
    if not 1 <= options["small"] < options["n"]:
        return f"--small ({options['small']}) must be at least 1 and below --n ({options['n']})"
    if not 0 <= options["block_at"] < options["crash_n"]:
        return f"--block-at ({options['block_at']}) must be a step of the crash run (0 to {options['crash_n'] - 1})"
    if options["peer_db_dir"] and not Path(options["peer_db_dir"]).is_dir():
        return f"--peer-db-dir ({options['peer_db_dir']}) is not a directory"
    if options["repeats"] < 1 or options["wait_s"] <= 0:
        return "--repeats and --wait-s must be positive"
    return None


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # The SDK's native runtime can crash at interpreter exit (sdk-python #300).
    os._exit(code)
