"""Versioned, fenced writes to workspace files: the check-and-write, and the fence store.

Two rules every versioned workspace write follows (activities/tools/workspace_files.py write_file):

- A write is based on a version of its file: the sha256 of the bytes its writer last
  read or wrote (`Basis`), or the knowledge that the file did not exist. If the file
  holds anything else now (a person's edit, another branch's write), the write is
  refused as a conflict and the refusal says what changed (a bounded unified diff from
  the version the writer saw, when the artifact store keeps it). A file that already
  holds exactly the new content is left alone and the write succeeds: a retried write
  whose first attempt landed. A writer that never saw an existing file may not replace
  it (unless it says `base_version: "any"`); a new file needs no base.
- A write carries a fencing token (`FenceToken`: the node's run, the workflow task that
  made the call, the activity attempt). The store keeps, per goal and node, the newest
  (run, task) any of its calls has presented and, within it, each call's highest
  attempt; a write from an older token is refused as a superseded attempt (a zombie
  after a timeout, a voided run still running after a rewind started the next one).

The check and the rename happen under a per-file lock (fcntl.flock on a lock file in the
store), with the node's fence locked inside it, so two perdure writers cannot both pass
the check and a claim from a newer run cannot slip between a fence check and its write.
A person's editor takes no lock: the file is stat'ed again right before the rename, and a
change seen then is a conflict too, which leaves the microseconds between that stat and
the rename.

The store lives in the artifact store's directory (`workspace-versions/`; in PERDURE_HOME
when the artifact store is an object store), which every command sandbox masks wherever it
lies (activities/tools/sandbox.py hidden_paths), so an agent's commands cannot edit a fence
or hold a lock. Versions small enough are kept in the
artifact store itself (content-addressed: a version's digest is its address), so a
conflict can show the diff from the version a writer saw. Worker code: blocking file
I/O, to run off the event loop. It must not decide which version a call is based on
(the goal does, from its nodes' fingerprints: workflows/goal/tool_runner.py).
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from perdure.activities.artifacts import ArtifactCorrupt, ArtifactMissing, ArtifactStore
from perdure.runtime import settings

STORE_DIR = "workspace-versions"
# Read in 64 KiB pieces: a `read(n)` allocates n bytes before it knows how much there
# is, so 1 MiB pieces cost 1 MiB for every small file read (twice, with the read that
# finds the end), and concurrent reads held tens of megabytes of a worker's peak.
CHUNK = 1 << 16
KEEP_BYTES = 1 << 20
"""Versions up to this size are kept in the artifact store, so a later conflict can diff against them."""
DIFF_INPUT_BYTES = 256 * 1024
"""A diff is computed only when both versions are at most this big (difflib is quadratic at worst)."""
DIFF_LINES = 120
DIFF_CHARS = 8_000
"""A conflict's diff is cut at this many lines or characters, whichever comes first, and says so."""
HEAD_LINES = 40
HEAD_CHARS = 3_000
"""Without a diff, a conflict shows the current file's head, this long at most."""
REFUSALS_KEPT = 20
"""Refused superseded writes remembered per node (newest last), for a person or a test to see."""


class WriteRefused(Exception):
    """A versioned write was not made: `message` says why and how to go on, `detail`
    (when any) shows what changed."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


@dataclass(frozen=True)
class FenceToken:
    """Who writes: a call (`call`, its node key) of node `node` of goal `goal` (its chain of
    runs `chain`), made in the node's run `run` by the workflow task at history length
    `task`, in activity attempt `attempt`. Compared as (run, task) per node, then attempt
    per call: a call made again after its worker was lost has a higher task, a retried
    activity a higher attempt, a rewound node a higher run."""

    goal: str
    chain: str
    node: str
    run: int
    task: int
    attempt: int
    call: str

    def describe(self) -> str:
        return f"step '{self.node}' run {self.run}, workflow task {self.task}, attempt {self.attempt}"


@dataclass(frozen=True)
class Basis:
    """What a write expects the file to hold now. `check` False: anything may be replaced
    (`base_version: "any"`, or a caller with no version context). Otherwise `seen` says
    whether the writer has a version of the file at all, `digest` which (None: the file
    did not exist then), and `why` where that version came from, for the messages."""

    check: bool
    seen: bool = False
    digest: str | None = None
    why: str = ""


UNCHECKED = Basis(check=False, why="no version to check")


@dataclass(frozen=True)
class FileVersion:
    """A file's version as a tool call saw it: its digest and size, and its bytes when
    they are kept (at most KEEP_BYTES)."""

    digest: str | None
    size: int
    data: bytes | None = None


@dataclass
class _Current:
    version: FileVersion
    identity: tuple[int, int, int] | None
    head: bytes = b""


@dataclass
class _Fence:
    """One node's fence record, as stored."""

    run: int = 0
    task: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    refused: list[dict] = field(default_factory=list)

    def newer_than(self, token: FenceToken) -> str | None:
        """Why `token` is superseded (None: it is current)."""
        if (token.run, token.task) < (self.run, self.task):
            if token.run < self.run:
                return f"the step's run {self.run} has started since"
            return f"a later workflow task ({self.task}) of the same run has made a call since"
        highest = self.calls.get(token.call, 0) if (token.run, token.task) == (self.run, self.task) else 0
        if token.attempt < highest:
            return f"attempt {highest} of the same call has started since"
        return None

    def claim(self, token: FenceToken) -> bool:
        """Record `token` (known to be current); True when the record changed."""
        if (token.run, token.task) > (self.run, self.task):
            self.run, self.task, self.calls = token.run, token.task, {}
        if self.calls.get(token.call, 0) >= token.attempt:
            return False
        self.calls[token.call] = token.attempt
        return True


def superseded(token: FenceToken, why: str) -> str:
    return (
        f"a superseded attempt: {token.describe()} is no longer the step's current work ({why}); a late "
        "write from it would overwrite newer work, so nothing was done"
    )


def superseded_message(tool: str, token: FenceToken, why: str) -> str:
    return f"{tool} refused: {superseded(token, why)}"


def short(digest: str | None) -> str:
    return "none (no file)" if digest is None else digest[: len("sha256:") + 12] + "…"


class WorkspaceVersions:
    """The fence store, the per-file locks and kept versions of one artifact store."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        # Fences and locks are files on this machine: beside a disk store, else in PERDURE_HOME
        # (an object store has no file to lock). Both are masked from every command.
        self.root = (store.local_dir or settings.perdure_home()) / STORE_DIR

    # --- versions -------------------------------------------------------------------

    def read(self, path: Path, head_bytes: int) -> tuple[bytes, FileVersion]:
        """The first `head_bytes` of the file and its version, from one open: the digest
        is of exactly the bytes a reader of this open saw, even if the file is replaced meanwhile."""
        current = _read_current(path, head_bytes)
        return current.head, current.version

    def keep(self, version: FileVersion) -> None:
        """Keep a small version's bytes in the artifact store (its address is its digest)."""
        if version.data is not None:
            self.store.put_bytes(version.data)

    def _kept(self, digest: str | None) -> bytes | None:
        if digest is None:
            return b""
        try:
            return self.store.get_bytes(digest) if self.store.has(digest) else None
        except (ArtifactMissing, ArtifactCorrupt):
            return None

    # --- the check-and-write --------------------------------------------------------

    def write(self, path: Path, data: bytes, *, shown: str, basis: Basis, token: FenceToken | None) -> FileVersion:
        """Replace the file at `path` (already confined) with `data` if `basis` still holds
        and `token` is current; WriteRefused otherwise. `shown` names the file in messages."""
        new = FileVersion(_digest(data), len(data), data if len(data) <= KEEP_BYTES else None)
        # Nothing to check and nobody to fence (a device's call, which keeps nothing between
        # calls, not even a lock file): the replace alone.
        locked = basis.check or token is not None
        with self._file_lock(path) if locked else contextlib.nullcontext():
            with self._fence(token) as fence:
                if fence is not None and token is not None:
                    why = fence.newer_than(token)
                    if why is not None:
                        fence.refused = [*fence.refused, _refusal(token, shown, why)][-REFUSALS_KEPT:]
                        raise WriteRefused(superseded(token, why))
                    fence.claim(token)
                current = _read_current(path, 0, keep_up_to=DIFF_INPUT_BYTES)
                if current.version.digest == new.digest:
                    return new  # it holds this content already: a retried write whose first attempt landed
                if basis.check:
                    self._check(shown, basis, current)
                mode = (path.stat().st_mode & 0o7777) if current.identity is not None else 0o644
                _replace_if_unchanged(path, data, mode, current.identity, shown)
        return new

    def _check(self, shown: str, basis: Basis, current: _Current) -> None:
        now = current.version
        if not basis.seen:
            if now.digest is None:
                return  # a new file needs no base
            raise WriteRefused(
                f"'{shown}' already exists ({now.size} bytes, version {short(now.digest)}) and this step has not "
                "read it: writing would replace content it has not seen, so nothing was written. Read the file "
                'first and write your change on top of what it holds, or pass base_version: "any" to replace it '
                "whatever it holds.",
                self._show(shown, None, current, based_on_missing=True),
            )
        if basis.digest == now.digest:
            return
        if now.digest is None:
            raise WriteRefused(
                f"'{shown}' was deleted since {basis.why} (version {short(basis.digest)}): nothing was written. "
                'Look at the directory again before writing it; pass base_version: "any" to create it anyway.'
            )
        if basis.digest is None:
            opening = (
                f"'{shown}' did not exist when {basis.why}, and now it does ({now.size} bytes, "
                f"version {short(now.digest)})"
            )
        else:
            opening = (
                f"'{shown}' changed since {basis.why} (your version {short(basis.digest)}, now "
                f"{short(now.digest)}, {now.size} bytes)"
            )
        raise WriteRefused(
            f"{opening}: someone else wrote it (a person, or another step), and your content was not written. Read "
            "the file again and re-apply your change to what it holds now; what changed is shown below.",
            self._show(shown, basis.digest, current),
        )

    def _show(self, shown: str, base: str | None, current: _Current, *, based_on_missing: bool = False) -> str:
        """What changed from the version `base` to the file now: a bounded unified diff when
        both are at hand and small, else the digests and the current file's head."""
        now = current.version
        before = None if based_on_missing else self._kept(base)
        if before is not None and now.data is not None and len(before) <= DIFF_INPUT_BYTES:
            lines = list(
                difflib.unified_diff(
                    _text(before).splitlines(keepends=True),
                    _text(now.data).splitlines(keepends=True),
                    f"{shown} (your version, {short(base)})",
                    f"{shown} (now, {short(now.digest)})",
                )
            )
            return "What changed since your version (unified diff):\n" + _bounded(lines, DIFF_LINES, DIFF_CHARS, "diff")
        if based_on_missing:
            why = "This step has no version of it"
        elif before is None:
            why = f"The version your change was based on ({short(base)}) is not kept, so there is no diff"
        else:
            why = "The file is too large to diff"
        if now.data is None:
            return f"{why}; the file is {now.size} bytes now (version {short(now.digest)})."
        head = _text(now.data).splitlines(keepends=True)
        return f"{why}; the file now starts:\n" + _bounded(head, HEAD_LINES, HEAD_CHARS, "file")

    # --- the fence ------------------------------------------------------------------

    def claim(self, token: FenceToken) -> str | None:
        """Present `token` for its node at the start of a call: recorded when it is the
        newest, otherwise why it is superseded (nothing is recorded then)."""
        with self._fence(token) as fence:
            assert fence is not None
            why = fence.newer_than(token)
            if why is None:
                fence.claim(token)
            return why

    def fence_of(self, goal: str, chain: str, node: str) -> dict:
        """A node's fence record as stored (empty when none): run, task, calls, refused."""
        path = self.fence_path(goal, chain, node)
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}

    def fence_path(self, goal: str, chain: str, node: str) -> Path:
        """Where a node's fence record lives (its lock file beside it, `.lock`)."""
        goal_dir = hashlib.sha256(f"{goal}\0{chain}".encode()).hexdigest()[:32]
        return self.root / "fences" / goal_dir / (hashlib.sha256(node.encode()).hexdigest()[:32] + ".json")

    @contextlib.contextmanager
    def _fence(self, token: FenceToken | None) -> Iterator[_Fence | None]:
        """The node's fence record under its lock, saved again if it changed."""
        if token is None:
            yield None
            return
        path = self.fence_path(token.goal, token.chain, token.node)
        with _locked(path.with_suffix(".lock")):
            try:
                raw = json.loads(path.read_text())
                fence = _Fence(raw["run"], raw["task"], dict(raw["calls"]), list(raw.get("refused", [])))
            except FileNotFoundError:
                fence = _Fence()
            except (OSError, ValueError, KeyError, TypeError):
                # A record this store cannot read: start it again rather than refuse every write.
                fence = _Fence()
            before = json.dumps(fence.__dict__, sort_keys=True)
            try:
                yield fence
            finally:
                after = {"goal": token.goal, "chain": token.chain, "node": token.node, **fence.__dict__}
                if json.dumps(fence.__dict__, sort_keys=True) != before:
                    _replace(path, json.dumps(after, sort_keys=True).encode())

    def lock_path(self, path: Path) -> Path:
        """The lock file of a workspace file (by its real path)."""
        return self.root / "locks" / (hashlib.sha256(str(path).encode()).hexdigest()[:40] + ".lock")

    def _file_lock(self, path: Path) -> contextlib.AbstractContextManager[None]:
        return _locked(self.lock_path(path))


# --- plain file helpers ---------------------------------------------------------------


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _read_current(path: Path, head_bytes: int, keep_up_to: int = KEEP_BYTES) -> _Current:
    """The file's version (None digest when it does not exist), its identity, its first
    `head_bytes`, and all its bytes when it is at most `keep_up_to` long."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return _Current(FileVersion(None, 0, b""), None)
    with f:
        stat = os.fstat(f.fileno())
        digest, head, kept, size = hashlib.sha256(), bytearray(), bytearray(), 0
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            if len(head) < head_bytes:
                head += chunk[: head_bytes - len(head)]
            size += len(chunk)
            if size <= keep_up_to:
                kept += chunk
    data = bytes(kept) if size <= keep_up_to else None
    version = FileVersion("sha256:" + digest.hexdigest(), size, data)
    return _Current(version, (stat.st_ino, stat.st_size, stat.st_mtime_ns), bytes(head))


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _replace_if_unchanged(
    path: Path, data: bytes, mode: int, identity: tuple[int, int, int] | None, shown: str
) -> None:
    """Write `data` to a temp file beside `path` and rename it over `path`, unless the
    file's identity changed since it was checked (an editor saved it meanwhile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if _identity(path) != identity:
            raise WriteRefused(
                f"'{shown}' changed while your write was being made (someone saved it at that moment): nothing "
                "was written. Read the file again and re-apply your change to what it holds now."
            )
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _replace(path: Path, data: bytes) -> None:
    """Replace a small store file; no fsync: a fence matters only while the processes it
    fences live, and a machine that loses power loses them too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    """An exclusive flock on `lock` (created if missing; never deleted, since removing a
    lock file another process waits on would let a third one in)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _bounded(lines: list[str], max_lines: int, max_chars: int, what: str) -> str:
    shown, chars = [], 0
    for line in lines[:max_lines]:
        if chars + len(line) > max_chars:
            break
        shown.append(line if line.endswith("\n") else line + "\n")
        chars += len(line)
    text = "".join(shown)
    if len(shown) < len(lines):
        text += f"[{what} cut: showing {len(shown)} of {len(lines)} lines]\n"
    return text


def _refusal(token: FenceToken, shown: str, why: str) -> dict:
    return {
        "path": shown,
        "run": token.run,
        "task": token.task,
        "attempt": token.attempt,
        "call": token.call,
        "why": why,
        "at": datetime.now(UTC).isoformat(),
    }
