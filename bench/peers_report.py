"""What `make bench-peers` (bench/peers_run.py) prints and writes: one table per storage,
how to read them, the targets judged on this run, and bench/peers_results.json's figures.

Nothing here measures: it turns the rows the harness measured on each storage into text and
numbers. A figure is only ever set beside one measured on the same storage (a row says which),
and the results file names every figure's storage in a key of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.table import Table

from bench.fsyncs import STRACE, SYSCALLS

if TYPE_CHECKING:
    from bench.peers_run import Crash, Steps
    from bench.peers_writes import Writes
    from bench.storage import Storage

# Peer -> how the table names it.
PEERS = {"langgraph": "LangGraph, SqliteSaver (sync)", "dbos": "DBOS on SQLite"}
# The row of perdure's crash test resumed by a restarted worker instead of a standby.
RESTART = "perdure_restart"


@dataclass
class Row:
    name: str
    storage: str = ""  # where this system's durable state was written in this run
    steps: Steps | None = None
    crash: Crash | None = None
    failures: list[str] = field(default_factory=list)
    raw_ms: float | None = None  # only the raw Temporal row, which has no ledger
    writes: Writes | None = None  # only perdure's row
    # WRITE_PEER's row: its keyed write step, the same call to the same ledger as perdure's
    write_ms: float | None = None

    @property
    def step_ms(self) -> float | None:
        return self.steps.ms if self.steps else self.raw_ms

    @property
    def fsyncs(self) -> float | None:
        """fsyncs per step, every process of the system together; None: not counted."""
        counted = self.steps.fsyncs if self.steps else None
        return sum(counted.values()) if counted is not None else None


def ratio(perdure: float | None, peer: float | None) -> float | None:
    return round(perdure / peer, 2) if perdure is not None and peer else None


def resume_s(row: Row) -> float | None:
    return row.crash.resume_s if row.crash else None


def figures(rows: dict[str, Row], suffix: str = "") -> dict[str, float | int | str]:
    """The results file's keys for one storage, each ending in `suffix`: each system's
    figures (perdure's, then `peer_<name>_...`), its storage, its fsyncs per step, and
    perdure's ratio to each peer (perdure ÷ peer: below 1, perdure is faster)."""
    out: dict[str, float | int | str] = {}
    perdure, raw = rows["perdure"], rows["raw"]
    if raw.step_ms is not None:
        out["raw_local_activity_ms"] = round(raw.step_ms, 3)
    for key, prefix in {
        "perdure": "perdure_",
        **{peer: f"peer_{peer}_" for peer in PEERS},
        RESTART: "perdure_restart_",
    }.items():
        row = rows[key]
        if key != RESTART and row.storage:
            out[prefix + "storage"] = row.storage
        if row.step_ms is not None:
            out[prefix + ("read_step_ms" if key == "perdure" else "step_ms")] = round(row.step_ms, 3)
        if row.steps is not None and row.steps.fsyncs is not None:
            out[prefix + "fsyncs_per_step"] = round(row.fsyncs, 2)
            if key == "perdure":
                for process, count in row.steps.fsyncs.items():
                    out[f"perdure_{process}_fsyncs_per_step"] = round(count, 2)
                for process, count in (row.steps.fsyncs_per_run or {}).items():
                    out[f"perdure_{process}_fsyncs_per_run"] = count
        if row.crash is not None:
            out[f"{prefix}rerun_steps"] = len(row.crash.rerun)
            for name, value in (("recovery_s", row.crash.resume_s), ("done_after_kill_s", row.crash.done_s)):
                if value is not None:
                    out[prefix + name] = round(value, 2)
    if perdure.writes is not None:
        writes = perdure.writes
        out["perdure_write_step_ms"] = round(writes.keyed_ms, 3)
        out["raw_local_write_ms"] = round(writes.raw_local_keyed_ms, 3)
        out["perdure_once_write_step_ms"] = round(writes.once_ms, 3)
        out["raw_once_write_activity_ms"] = round(writes.raw_once_ms, 3)
        out["perdure_once_write_ratio_to_raw"] = ratio(writes.once_ms, writes.raw_once_ms) or 0.0
        peer_write = rows[WRITE_PEER].write_ms
        if peer_write is not None:
            out[f"{WRITE_PEER}_write_step_ms"] = round(peer_write, 3)
        write = ratio(writes.keyed_ms, peer_write)
        if write is not None:
            out[f"perdure_write_step_ratio_to_{WRITE_PEER}"] = write
    for peer in PEERS:
        row = rows[peer]
        step = ratio(perdure.step_ms, row.step_ms)
        if step is not None:
            out[f"perdure_step_ratio_to_{peer}"] = step
        for key, prefix in (("perdure", "perdure_"), (RESTART, "perdure_restart_")):
            resume = ratio(resume_s(rows[key]), resume_s(row))
            if resume is not None:
                out[f"{prefix}recovery_ratio_to_{peer}"] = resume
    return {key + suffix: value for key, value in out.items()}


def table(rows: dict[str, Row], block_at: int, storage: Storage) -> Table:
    perdure = rows["perdure"]
    result = Table(title=f"{storage.title()} (ratio = perdure ÷ the row; below 1: perdure faster)")
    for column in (
        "system",
        "storage",
        "ms/step",
        "fsyncs/step",
        "steps re-run",
        f"s to step {block_at} again",
        "s to done",
        "ratio ms/step",
        "ratio resume",
    ):
        result.add_column(column, justify="left" if column in ("system", "storage") else "right")

    def shown(value: float | None, digits: int = 2) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    for key, row in rows.items():
        crash = row.crash
        ours = key in ("perdure", RESTART)
        resume = None if ours else ratio(resume_s(perdure), resume_s(row))
        step = None if ours else ratio(perdure.step_ms, row.step_ms)
        per_run = row.steps.fsyncs_per_run if row.steps else None
        result.add_row(
            row.name,
            row.storage,
            shown(row.step_ms),
            shown(row.fsyncs, 2) + (f" ({sum(per_run.values()):g} a run)" if per_run else ""),
            "—" if crash is None else str(len(crash.rerun)),
            shown(crash.resume_s if crash else None),
            shown(crash.done_s if crash else None),
            shown(step),
            shown(resume),
        )
    return result


# perdure's targets beside its peers (issues 24 and 39): a bound of its own, and below a
# peer's figure measured on the same storage, on each storage.
STEP_TARGET_MS, STEP_PEER = 1.0, "langgraph"
RECOVERY_TARGET_S, RECOVERY_PEER = 2.5, "dbos"
# issue 39: a keyed write step within this many of the peer's durable step making the same
# call (a POST with an Idempotency-Key to the same fake ledger); a once write's within this
# many of a raw Temporal activity with the same call.
WRITE_TARGET_RATIO, WRITE_PEER = 2.0, "langgraph"


def write_sizes(count: int) -> tuple[int, int]:
    """The two chain lengths whose slope is the peer's write step (`--writes` is the longer)."""
    return max(2, count // 3), count


ONCE_TARGET_RATIO = 1.05


def targets(measured: dict[Storage, dict[str, Row]]) -> list[str]:
    """Each target judged on this run's figures on each storage, or said to be unmeasured."""
    lines = []
    for storage, rows in measured.items():
        perdure = rows["perdure"]
        judged = (
            ("read step", "ms", perdure.step_ms, STEP_TARGET_MS, STEP_PEER, rows[STEP_PEER].step_ms),
            ("recovery", "s", resume_s(perdure), RECOVERY_TARGET_S, RECOVERY_PEER, resume_s(rows[RECOVERY_PEER])),
        )
        for what, unit, ours, bound, peer, theirs in judged:
            goal = f"target ({storage.name}): perdure's {what} ≤ {bound:g} {unit} and below {PEERS[peer]}'s"
            if ours is None or theirs is None:
                lines.append(f"{goal}: not measured this run")
                continue
            if ours <= 0 or theirs <= 0:
                # A slope at or below 0 is the machine's noise, too few steps or repeats to see a step in.
                lines.append(f"{goal}: not judged, a figure at or below 0 ({ours:.2f} against {theirs:.2f} {unit})")
                continue
            met = ours <= bound and ours < theirs
            lines.append(f"{goal}: {'met' if met else 'MISSED'} ({ours:.2f} against {theirs:.2f} {unit})")
        lines += write_targets(storage, rows)
    return lines


def write_targets(storage: Storage, rows: dict[str, Row]) -> list[str]:
    writes, peer = rows["perdure"].writes, rows[WRITE_PEER].write_ms
    keyed = (
        f"target ({storage.name}): perdure's keyed write step ≤ {WRITE_TARGET_RATIO:g}× {PEERS[WRITE_PEER]}'s "
        "step making the same call"
    )
    once = f"target ({storage.name}): perdure's once write step ≤ {ONCE_TARGET_RATIO:g}× a raw Temporal activity's"
    if writes is None:
        return [f"{keyed}: not measured this run", f"{once}: not measured this run"]
    lines = []
    if peer is None or peer <= 0:
        lines.append(f"{keyed}: not measured this run")
    else:
        met = writes.keyed_ms <= WRITE_TARGET_RATIO * peer
        lines.append(f"{keyed}: {'met' if met else 'MISSED'} ({writes.keyed_ms:.2f} against {peer:.2f} ms)")
    met = writes.once_ms <= ONCE_TARGET_RATIO * writes.raw_once_ms
    lines.append(f"{once}: {'met' if met else 'MISSED'} ({writes.once_ms:.2f} against {writes.raw_once_ms:.2f} ms)")
    return lines


def method(measured: dict[Storage, dict[str, Row]], options: dict) -> list[str]:
    """How to read the tables, with what each crash run did and where the fsyncs were made."""
    lines = [
        f"ms per step: slope between {options['small']} and {options['n']} steps, medians of {options['repeats']} "
        "runs each (perdure timed at its client, start to result; a peer in its own process, run to result)",
        "steps re-run: each step's runs counted by the kernel's closes of its file, the killed step included",
        f"s to step {options['block_at']} again: from the SIGKILL until a process opens that step's FIFO again; "
        "s to done: until the run's result. perdure resumes on a standby worker already polling (ratios), "
        "or on a worker started right after the kill; each peer is started again in place",
    ]
    if STRACE:
        lines.append(
            f"fsyncs per step: calls to {', '.join(SYSCALLS)} counted by `strace -f -c` (never while timed), slope "
            f"between a {options['small']}- and an {options['n']}-step run: perdure's dev server and its worker "
            "(this process), each peer's process"
        )
    else:
        lines.append("fsyncs per step: not counted, strace is not installed (apt-get install strace)")
    for storage, rows in measured.items():
        lines.append(f"{storage.title()}:")
        per_step = {row.name: row.steps.per_step for row in rows.values() if row.steps}
        if per_step:
            closes = "; ".join(f"{name}: {count}" for name, count in per_step.items())
            lines.append(f"  the ledger's closes per uninterrupted step: {closes}")
        steps = rows["perdure"].steps
        if steps and steps.fsyncs and steps.fsyncs_per_run:
            lines.append(
                "  perdure's fsyncs: "
                + "; ".join(
                    f"{process} {per_step:.2f} per step, {steps.fsyncs_per_run[process]:g} in a goal run "
                    f"of {options['n']} steps"
                    for process, per_step in steps.fsyncs.items()
                )
            )
        writes = rows["perdure"].writes
        if writes is not None:
            lines.append(
                f"  perdure's write steps (median step of chains of {options['writes']}, from histories): keyed "
                f"{writes.keyed_ms:.2f} ms as local activities (a raw local activity with the same call: "
                f"{writes.raw_local_keyed_ms:.2f}); once {writes.once_ms:.2f} ms as activities (a raw activity: "
                f"{writes.raw_once_ms:.2f})"
            )
        peer_write = rows[WRITE_PEER].write_ms
        if peer_write is not None:
            lines.append(
                f"  {PEERS[WRITE_PEER]}'s write step, the same keyed call to the same ledger (slope between chains "
                "of {} and {}): {:.2f} ms".format(*write_sizes(options["writes"]), peer_write)
            )
        lines += ["  " + row.crash.describe(options["block_at"]) for row in rows.values() if row.crash]
    return lines
