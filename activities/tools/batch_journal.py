"""A batch's answers, kept on this machine until the goal's workflow task records them.

A batch of replay-safe calls (workflows/goal/read_batch.py: reads made together and a chain
of reads ahead of their steps) runs as a local activity, whose result reaches history only
when the goal's workflow task completes. A worker killed in the middle of that task takes
every answer of its batches with it, and the worker that takes the goal over runs the same
batches again (replay schedules the very same ones). So each call's answer is appended to
its batch's file here as the call ends, and a batch run again takes the answers kept for
it and runs only the calls that have none: a crash re-runs the plan's read steps that were
running (not an agent turn's calls: below).

Why not put them in history sooner (measured on the dev server with its db file, issue
39): the SDK completes no workflow task while a local activity is outstanding, except its
task heartbeat at 80 % of the task timeout (sdk-core, worker/workflow/managed_run.rs), and a
task completed and started again between batches costs a server round trip the reads
would wait for: 24 ms when the batch signals its own goal to end the task, 210 ms with a
1 ms timer, against ~0.7 ms per read in a batch. Appending a line costs microseconds.

Where: the artifact store's directory (PERDURE_HOME when the store is an object store),
shared by the workers of one machine and masked from every command
(activities/tools/sandbox.py hidden_paths). A worker on another machine finds nothing and
runs the batch again: the calls are replay-safe, so that only costs their time. Not
fsynced: a SIGKILL leaves the page cache alone; after a power loss a lost or torn line
only means its call runs again. A line holds a call's result (its preview is the content
read): when the store seals its blobs (payload keys set, runtime/codec.py) each line is
sealed the same way, base64 on its line (measured: 7 µs more a line, against ~0.7 ms a
read); a line no key here opens is skipped, and its call runs again.

Which calls a takeover finds here: those of a plan's read steps, whose call is the same
on every run of their node. A call that carries a fencing token (an agent turn's calls,
write_file) names the workflow task that made it, and the task that runs the batch again
after a crash is another one: its digest differs and it runs again, as without a journal.

An answer is served only to the same call (its digest) at the same place (its index) of
the same batch (the run's own count of its batches, the same on replay) of the same run.
A batch's file goes once a later batch of its run says the task that ran it was recorded
(`recorded_below`); what a run leaves behind (its last batches, a run that ended) goes
STALE_AFTER_S after its last write. A journal that cannot be read or written is only a
lost shortcut: the batch runs as it would without one.

Worker code. Lines are small writes to the page cache, made on the event loop: a thread's
hand-off costs more than the write.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from pydantic import ValidationError
from temporalio import activity

from perdure.activities.artifacts import ArtifactStore
from perdure.runtime import settings
from perdure.runtime.codec import DecryptionError, Keyring, seal, unseal
from perdure.workflows.shared.contracts import ToolBatchEntry, ToolInput

JOURNAL_DIR = "batch-journal"
SUFFIX = ".jsonl"
STALE_AFTER_S = 3600.0
"""A batch's answers matter until its workflow task completes or times out: seconds to minutes."""
SWEEP_EVERY_S = 600.0


def call_digest(call: ToolInput) -> str:
    return hashlib.sha256(call.model_dump_json().encode()).hexdigest()[:32]


class KeptBatch:
    """One batch's file: the answers it held when opened, and the ones its calls add."""

    def __init__(
        self, path: Path, answers: dict[tuple[int, str], ToolBatchEntry], keyring: Keyring | None = None
    ) -> None:
        self.path = path
        self._answers = answers
        self._keyring = keyring
        self._fd: int | None = None
        self.served = 0

    def answer(self, index: int, call: ToolInput) -> ToolBatchEntry | None:
        entry = self._answers.get((index, call_digest(call)))
        if entry is not None:
            self.served += 1
        return entry

    def keep(self, index: int, call: ToolInput, entry: ToolBatchEntry) -> None:
        line = json.dumps({"i": index, "call": call_digest(call), "entry": entry.model_dump(mode="json")})
        if self._keyring is not None:
            line = base64.b64encode(seal(self._keyring, line.encode())).decode()
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            # One write per line: a SIGKILL ends the process between writes, never inside one.
            os.write(self._fd, (line + "\n").encode())
        except OSError as err:
            activity.logger.warning("batch journal not written", extra={"path": str(self.path), "error": str(err)})

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class BatchJournal:
    """The kept answers of every batch run on this machine, one directory per goal run."""

    def __init__(self, root: Path, keyring: Keyring | None = None) -> None:
        self.root = root
        self._keyring = keyring  # the artifact store's: lines sealed as its blobs are
        self._swept_at = 0.0

    @classmethod
    def beside(cls, store: ArtifactStore) -> BatchJournal:
        return cls((store.local_dir or settings.perdure_home()) / JOURNAL_DIR, store.keyring)

    def open(self, run_id: str, batch: int, recorded_below: int) -> KeptBatch | None:
        """Batch `batch` of run `run_id`, with what an earlier attempt kept for it; the run's
        batches below `recorded_below` are in history and their files go. None when the
        journal cannot be used here (the batch then runs without one)."""
        run_dir = self.root / run_id.replace("/", "_")
        try:
            # First, and never the run being opened: a run quiet for an hour (a goal that
            # waited) is stale to the sweep, but this batch is about to use its directory.
            self._sweep(keep=run_dir)
            run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.utime(run_dir)  # in use: another worker's sweep on this machine leaves it too
            for path in run_dir.iterdir():
                number = path.name.removesuffix(SUFFIX)
                if number.isdigit() and int(number) < recorded_below:
                    path.unlink(missing_ok=True)
            path = run_dir / f"{batch}{SUFFIX}"
            return KeptBatch(path, _answers(path, self._keyring), self._keyring)
        except OSError as err:
            activity.logger.warning("batch journal not used", extra={"path": str(run_dir), "error": str(err)})
            return None

    def _sweep(self, keep: Path) -> None:
        """Now and then, the files of runs nobody wrote to for STALE_AFTER_S, but `keep`'s."""
        now = time.time()
        if now - self._swept_at < SWEEP_EVERY_S or not self.root.is_dir():
            return
        self._swept_at = now
        for run_dir in self.root.iterdir():
            if run_dir == keep:
                continue
            try:
                written = max([run_dir.stat().st_mtime, *(p.stat().st_mtime for p in run_dir.iterdir())])
                if now - written > STALE_AFTER_S:
                    shutil.rmtree(run_dir, ignore_errors=True)
            except OSError:
                continue  # another worker removed it meanwhile


def _answers(path: Path, keyring: Keyring | None) -> dict[tuple[int, str], ToolBatchEntry]:
    """Every whole, well-formed line of the file that opens here (none when there is no file)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return {}
    answers: dict[tuple[int, str], ToolBatchEntry] = {}
    for line in text.splitlines():
        try:
            if not line.startswith("{"):  # sealed (a store with payload keys)
                line = unseal(keyring, base64.b64decode(line, validate=True), str(path)).decode()
            kept = json.loads(line)
            answers[(int(kept["i"]), str(kept["call"]))] = ToolBatchEntry.model_validate(kept["entry"])
        except (ValueError, KeyError, TypeError, ValidationError, binascii.Error, DecryptionError):
            continue  # a torn last line, sealed with a key not here, or not ours: its call runs again
    return answers
