"""perdure beside LangGraph and DBOS on the same steps, the same crash and the same storage (`make bench-peers`).

LangGraph with its SQLite checkpointer and DBOS on SQLite, against perdure on one dev
server, on the same two tests, run twice in one run on equal storage (bench/storage.py):
first with the dev server on a SQLite db file as `perdure server start` runs it and
the peers' SQLite files beside it on the same disk (the headline), then with the server
in memory and the peers' files on a tmpfs (/dev/shm).

- steps: N sequential steps, each reading its own 2-byte file (perdure has no step
  that does nothing; a read step is its cheapest, what `read_step_ms` reports). perdure
  runs them as a goal of read steps and as a raw Temporal workflow of local
  activities (bench/raw.py); each peer as its own durable steps (bench/peers/). Per
  step is the slope between a small and an N-step run (medians of the repeats), so
  each one's fixed cost (process, start, result) cancels out: the same for all. Each
  system's fsyncs per step are counted by strace (bench/fsyncs.py) in untimed runs of
  the same two sizes: perdure's server and worker, each peer's process.
- writes: perdure's write steps on the same storage (bench/peers_writes.py): a keyed write
  (a local activity) against LangGraph's step, a once write (an activity) against a raw
  Temporal activity with the same call, each read off histories of `--writes` long chains.
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
bench/peers_results.json (bench/peers_report.py): the db-file row's under their plain
names, the in-memory row's with `_memory` at the end, each system's storage beside them.

    .venv/bin/python -m bench.peers_run [--n 300] [--small 30] [--repeats 3] [--crash-n 100] [--block-at 39]
                                        [--writes 30] [--disk-dir /tmp] [--memory-dir /dev/shm] [--results FILE]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from inotify_simple import INotify, flags
from rich.console import Console
from temporalio.client import Client

from bench import fsyncs
from bench import peers_report as report
from bench.common import (
    ROOT,
    chain_steps,
    goal_spec,
    median,
    new_id,
    parse_options,
    perdure_worker,
    raw_worker,
    slope_ms,
    start_goal,
    use_home,
)
from bench.fsyncs import STRACE
from bench.overhead import run_perdure, run_raw
from bench.peers_report import PEERS, RESTART, WRITE_PEER, Row
from bench.peers_writes import writes_perdure
from bench.storage import Server, Storage, start_server
from bench.storage import settings as storage_settings
from perdure.testing.crash import CrashRig, open_writer, serve_fifo
from perdure.testing.fakes import LedgerAPI

PEERS_DIR = ROOT / "bench" / "peers"
PEER_PYTHON = PEERS_DIR / ".venv" / "bin" / "python"
RESULTS = ROOT / "bench" / "peers_results.json"


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


async def start_peer(
    peer: str, mode: str, db: Path, workspace: Path, log: Path, *options: str, summary: Path | None = None
):
    """The peer program in its own venv; under strace, its fsyncs counted into `summary`, when given."""
    argv = [str(PEER_PYTHON), str(PEERS_DIR / f"{peer}_peer.py"), mode, "--db", str(db), "--workspace", str(workspace)]
    argv += options
    with open(log, "ab") as err:
        return await asyncio.create_subprocess_exec(
            *(fsyncs.traced(argv, summary) if summary else argv),
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
    # fsyncs per step of each process that makes them ("server", "worker"; "peer"), the
    # slope between two counted runs; None: not counted (no strace)
    fsyncs: dict[str, float] | None = None
    # perdure's only: its processes' fsyncs in one goal run of the large size
    fsyncs_per_run: dict[str, float] | None = None


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
    steps = Steps(per_step_ms(runs, small, large), runs_per_step(closes, steps_run(small, large, repeats)))
    if STRACE:
        steps.fsyncs = await uncounted_if_failed(PEERS[peer], peer_fsyncs(peer, root, workspace, dbs, small, large))
    return steps


async def writes_peer(peer: str, root: Path, count: int, repeats: int, dbs: Path) -> float:
    """The peer's keyed write step, ms: chains of `count` steps each making the call perdure's
    keyed write step makes (a POST with an Idempotency-Key to the same fake ledger), the slope
    between chains of a third as many and of `count` (bench/peers/peer_common.py `writes`)."""
    small, count = report.write_sizes(count)
    workspace = root / "ws"
    workspace.mkdir(parents=True)
    with LedgerAPI() as ledger:
        options = ("--url", f"{ledger.base_url}/entries", "--sizes", f"{small},{count}", "--repeats", str(repeats))
        log = root / f"{peer}-writes.log"
        proc = await start_peer(peer, "writes", dbs / f"{peer}-writes.db", workspace, log, *options)
        runs = parse_runs(await peer_output(proc, peer, log))
        made = len(ledger.ledger())
    expected = WARM_UP + repeats * (small + count)
    if made != expected:
        raise RuntimeError(f"the ledger holds {made} writes of {peer}'s, not {expected}")
    return per_step_ms(runs, small, count)


async def peer_fsyncs(peer: str, root: Path, workspace: Path, dbs: Path, small: int, large: int) -> dict[str, float]:
    """Counted in runs of their own (strace slows what it traces): one of each size, each on a
    new database (a peer's count does not vary between runs, perdure's does: see perdure_fsyncs)."""
    counts = {}
    for size in (small, large):
        summary, log, db = root / f"{peer}-fsyncs-{size}.strace", root / f"{peer}-fsyncs.log", dbs / f"{peer}-{size}.db"
        options = ("--sizes", str(size), "--repeats", "1")
        proc = await start_peer(peer, "steps", db, workspace, log, *options, summary=summary)
        await peer_output(proc, peer, log)
        counts[size] = fsyncs.calls(summary.read_text())
    return {"peer": fsyncs.per_step(counts)}


async def uncounted_if_failed(name: str, counting):
    """What `counting` returns, or None, said, when strace could not count: the timings stand."""
    try:
        return await counting
    except (RuntimeError, OSError) as err:
        print(f"  {name}: fsyncs not counted: {str(err).splitlines()[0]}", flush=True)
        return None


async def perdure_fsyncs(
    server_pid: int, root: Path, goal_run, small: int, large: int, repeats: int
) -> tuple[dict[str, float], dict[str, float]]:
    """fsyncs per step of the server and of this process (the worker runs in it), and per
    goal run of `large` steps, from goals of each size run with strace attached to both
    (medians of `repeats`: how many workflow tasks record a goal varies from run to run)."""
    counts: dict[str, dict[int, list[int]]] = {"server": {}, "worker": {}}
    for repeat in range(repeats):
        for size in (small, large):
            async with (
                fsyncs.attached(server_pid, root / f"server-{size}-{repeat}.strace") as server,
                fsyncs.attached(os.getpid(), root / f"worker-{size}-{repeat}.strace") as worker,
            ):
                await goal_run(size)
            counts["server"].setdefault(size, []).append(server[0])
            counts["worker"].setdefault(size, []).append(worker[0])
    medians = {process: {size: median(runs) for size, runs in by_size.items()} for process, by_size in counts.items()}
    per_step = {process: fsyncs.per_step(by_size) for process, by_size in medians.items()}
    return per_step, {process: by_size[large] for process, by_size in medians.items()}


async def steps_perdure(
    root: Path, client: Client, server_pid: int, small: int, large: int, repeats: int
) -> tuple[Steps, float]:
    """A goal of read steps and the raw local activities' ms per step, each warmed up
    first. Only the goal's warm-up is watched by the ledger: its thread would share the
    in-process worker's interpreter lock during the timed runs (a peer's runs are in
    another process). The raw workflow reads a workspace of its own. The fsyncs are
    counted after the timed runs, in goal runs of their own."""
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
        steps = Steps(per_step_ms(goal, small, large), runs_per_step(closes, WARM_UP))
        if STRACE:
            counting = perdure_fsyncs(server_pid, root, goal_run, small, large, repeats)
            steps.fsyncs, steps.fsyncs_per_run = await uncounted_if_failed("perdure", counting) or (None, None)
    return steps, per_step_ms(raw, small, large)


# --- the run ---------------------------------------------------------------------


def unmeasured(storage: Storage) -> dict[str, Row]:
    """Every row of a storage's table, nothing measured yet."""
    return {
        "perdure": Row("perdure goal, read steps", storage.server()),
        RESTART: Row("  the same, worker restarted", storage.server()),
        "raw": Row("raw Temporal, local activities", storage.server()),
        **{peer: Row(name, storage.files()) for peer, name in PEERS.items()},
    }


async def run_all(
    server: Server,
    work: Path,
    storage: Storage,
    n: int,
    small: int,
    repeats: int,
    crash_n: int,
    block_at: int,
    wait_s: float,
    writes: int = 0,
) -> dict[str, Row]:
    """Every system through both tests on `storage`: the peers' databases and perdure's
    files in `work`, perdure's goals on `server`."""
    client = server.client
    dbs = work / "peer-dbs"
    dbs.mkdir()
    rows = unmeasured(storage)
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
            rows[key].steps, rows["raw"].raw_ms = await steps_perdure(root, client, server.pid, small, n, repeats)
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

    print(storage.title(), flush=True)
    print(f"steps: {small} and {n} sequential read steps, {repeats} repeats each", flush=True)
    for key in systems:
        await attempt(key, "steps", lambda key=key: steps(key))
    if writes:
        print(f"writes: chains of {writes} keyed and of {writes} once writes, {repeats} repeats each", flush=True)

        async def measure_writes() -> None:
            rows["perdure"].writes = await writes_perdure(work / "writes", client, writes, repeats)

        async def measure_peer_writes() -> None:
            rows[WRITE_PEER].write_ms = await writes_peer(WRITE_PEER, work / "peer-writes", writes, repeats, dbs)

        await attempt("perdure", "writes", measure_writes)
        await attempt(WRITE_PEER, "writes", measure_peer_writes)
    print(f"crash: SIGKILL while step {block_at} of {crash_n} runs, then resume", flush=True)
    for key in ["perdure", RESTART, *PEERS]:
        await attempt(key, "crash", lambda key=key: crash(key))
    return rows


async def run_storages(storages: list[Storage], **settings) -> dict[Storage, dict[str, Row]]:
    """The whole run once on each storage, each on a server and in a scratch directory of
    its own (made in the storage's directory, so the peers' files and the server's db file
    share one filesystem); a server that does not start leaves its rows empty."""
    measured: dict[Storage, dict[str, Row]] = {}
    for storage in storages:
        with tempfile.TemporaryDirectory(prefix="perdure-peers-", dir=storage.parent) as tmp:
            work = Path(tmp)
            use_home(work / "home")
            try:
                server = await start_server(work / "temporal-dev", on_file=storage.server_on_file)
            except RuntimeError as err:
                print(f"{storage.title()}: {err}", flush=True)
                measured[storage] = unmeasured(storage)
                measured[storage]["perdure"].failures.append(str(err))
                continue
            try:
                measured[storage] = await run_all(server, work, storage, **settings)
            finally:
                server.stop()
    return measured


def main(argv: list[str] | None = None) -> int:
    options = parse_options(
        __doc__,
        argv,
        n=300,
        small=30,
        repeats=3,
        writes=30,
        crash_n=100,
        block_at=39,
        wait_s=120.0,
        disk_dir=tempfile.gettempdir(),
        memory_dir="/dev/shm",
        results=str(RESULTS),
    )
    storages = storage_settings(options.pop("disk_dir"), options.pop("memory_dir"))
    results_file = Path(options.pop("results"))
    problem = refusal(options, storages) or (
        None if results_file.parent.is_dir() else f"--results: {results_file.parent} is not a directory"
    )
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    started, load_at_start = time.monotonic(), os.getloadavg()[0]
    measured = asyncio.run(run_storages(storages, **options))
    console = Console(width=160)
    results: dict[str, float | int | str] = {}
    for storage, rows in measured.items():
        console.print(report.table(rows, options["block_at"], storage))
        results.update(report.figures(rows, storage.suffix))
    for line in report.method(measured, options) + report.targets(measured):
        print(line)
    for key in ("n", "small", "crash_n", "block_at"):
        results[key] = options[key]
    # The machine is shared: what else ran beside the figures (1-minute load average, on this many cores).
    load_at_start, load_at_end = round(load_at_start, 2), round(os.getloadavg()[0], 2)
    results.update(load_at_start=load_at_start, load_at_end=load_at_end, cores=os.cpu_count())
    print(f"machine load (1 min): {load_at_start} at the start, {load_at_end} at the end, on {os.cpu_count()} cores")
    results_file.write_text(json.dumps(dict(sorted(results.items())), indent=2) + "\n")
    shown = results_file.relative_to(ROOT) if results_file.is_relative_to(ROOT) else results_file
    print(f"wrote {shown} ({time.monotonic() - started:.0f} s in all)")
    failed = [
        f"{storage.name}: {row.name}: {failure}"
        for storage, rows in measured.items()
        for row in rows.values()
        for failure in row.failures
    ]
    for line in failed:
        print(f"not measured: {line.splitlines()[0]}")
    return 1 if failed else 0


def refusal(options: dict, storages: list[Storage]) -> str | None:
    """Why these options cannot run, or None."""
    if not PEER_PYTHON.exists():
        return f"{PEER_PYTHON.relative_to(ROOT)} does not exist: `make bench-peers` creates it"
    if not 1 <= options["small"] < options["n"]:
        return f"--small ({options['small']}) must be at least 1 and below --n ({options['n']})"
    if not 0 <= options["block_at"] < options["crash_n"]:
        return f"--block-at ({options['block_at']}) must be a step of the crash run (0 to {options['crash_n'] - 1})"
    if options["repeats"] < 1 or options["wait_s"] <= 0:
        return "--repeats and --wait-s must be positive"
    if options["writes"] == 1 or options["writes"] < 0:
        return "--writes must be 0 (no write steps) or at least 2"
    for storage, flag in zip(storages, ("--disk-dir", "--memory-dir"), strict=True):
        problem = storage.refusal()
        if problem:
            return f"{flag}: {problem}"
    return None


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # The SDK's native runtime can crash at interpreter exit (sdk-python #300).
    os._exit(code)
