"""The work of the file tools (activities/tools/catalogue/file_tools.py) on this machine:
reads and versioned writes confined to the workspace, and reads of the artifact store.

write_file is versioned and fenced (activities/tools/workspace_versions.py): it replaces a
file only if the file still holds the version the call is based on (its `base_version`,
else what the goal says its node last read or wrote: `ToolInput.based_on`), and only for
a call whose fencing token (`ToolInput.fence` and the attempt) is still its node's
newest. A read's version is the digest of exactly the bytes it read, so a write based on
it never passes over an edit made just after the read. Worker code: disk I/O runs off
the event loop, so a slow disk does not stall heartbeats of other activities.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from perdure.activities.artifacts import ArtifactCorrupt, ArtifactMissing, ArtifactStore
from perdure.activities.tools.catalogue.file_tools import ListDirArgs, ReadArtifactArgs, ReadFileArgs, WriteFileArgs
from perdure.activities.tools.catalogue.tool_base import decoded
from perdure.activities.tools.catalogue.tool_errors import ToolError
from perdure.activities.tools.workspace import (
    WorkspaceEscape,
    WorkspaceMissing,
    confine,
    resolve_in_workspace,
    workspace_root,
)
from perdure.activities.tools.workspace_versions import (
    UNCHECKED,
    Basis,
    FenceToken,
    FileVersion,
    WorkspaceVersions,
    WriteRefused,
)
from perdure.runtime.files import write_atomically

LIST_DIR_CAP = 1_000
"""Entries listed before the rest is summarised; a node_modules must not flood the model's context."""


def _confined(root: Path, relative: str) -> Path:
    """`relative` inside `root`, the workspace's real path (run_tool resolves it once per call)."""
    try:
        return confine(root, relative)
    except WorkspaceEscape as err:
        raise ToolError(str(err)) from None


@dataclass
class FileCall:
    """A workspace tool call's part in versioning: the store, the call's fencing token and
    what its goal says it is based on; read_file and write_file set `seen`, the version they
    read or wrote (what their fingerprint records)."""

    versions: WorkspaceVersions
    token: FenceToken | None = None
    based_on: dict[str, str | None] | None = None
    seen: FileVersion | None = None


def _read_file_sync(root: Path, args: ReadFileArgs, call: FileCall | None = None) -> str:
    path = _confined(root, args.path)
    missing = ToolError(f"'{args.path}' does not exist in the workspace")
    try:
        if call is None:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                data = f.read(args.max_bytes + 1)
        else:
            # One open for the text and the version: the digest is of the bytes read.
            data, call.seen = call.versions.read(path, args.max_bytes + 1)
            if call.seen.digest is None:
                raise missing
            size = call.seen.size
    except FileNotFoundError:
        raise missing from None
    except IsADirectoryError:
        raise ToolError(f"'{args.path}' is a directory; use list_dir to see its entries") from None
    except OSError as err:
        raise ToolError(f"cannot read '{args.path}': {err.strerror or err}") from None
    text = capped_text(data, args.max_bytes, size, f"'{args.path}'", "read_file")
    if call is not None and call.seen is not None:
        call.versions.keep(call.seen)
    return text


def capped_text(data: bytes, max_bytes: int, size: int, what: str, tool: str) -> str:
    """`data` (read up to max_bytes + 1 of `size` bytes) as text: refused when binary,
    with a note when cut."""
    if b"\x00" in data[:8192]:
        raise ToolError(f"{what} looks like a binary file (it contains NUL bytes); {tool} returns text only")
    if len(data) <= max_bytes:
        return decoded(data)
    text = decoded(data[:max_bytes], capped=True)
    return text + f"\n[truncated: showing the first {max_bytes} of {size} bytes of {what}]"


async def read_file(root: Path, args: ReadFileArgs, *, call: FileCall | None = None) -> str:
    # Disk I/O off the event loop: a slow disk must not stall heartbeats of other activities.
    return await asyncio.to_thread(_read_file_sync, root, args, call)


def _list_dir_sync(root: Path, args: ListDirArgs) -> str:
    path = _confined(root, args.path)
    try:
        if not path.exists():
            raise ToolError(f"'{args.path}' does not exist in the workspace")
        if not path.is_dir():
            raise ToolError(f"'{args.path}' is a file, not a directory; use read_file to read it")
        entries = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in path.iterdir())
    except OSError as err:
        raise ToolError(f"cannot list '{args.path}': {err.strerror or err}") from None
    if not entries:
        return f"(directory '{args.path}' is empty)"
    shown = entries[:LIST_DIR_CAP]
    text = "\n".join(shown)
    if len(entries) > LIST_DIR_CAP:
        text += f"\n[truncated: showing {LIST_DIR_CAP} of {len(entries)} entries]"
    return text


async def list_dir(root: Path, args: ListDirArgs) -> str:
    return await asyncio.to_thread(_list_dir_sync, root, args)


def _write_file_sync(root: Path, args: WriteFileArgs, call: FileCall | None = None) -> str:
    path = _confined(root, args.path)
    data = args.content.encode("utf-8")
    shown = path.relative_to(workspace_root(root)).as_posix()
    try:
        if path.is_dir():
            raise ToolError(f"'{args.path}' is a directory; give a file path")
        # Overwrite through a temp file and rename: a retried or crashed write leaves
        # either the old file or the new one, never a half-written or appended file.
        # `path` is already resolved and inside the workspace, so the parents it creates are too.
        # mkstemp creates 0600; keep an existing file's mode, give a new one the usual 0644.
        if call is None:
            write_atomically(path, data, mode=path.stat().st_mode & 0o7777 if path.exists() else 0o644)
        else:
            basis = _basis(root, path, args, call.based_on)
            call.seen = call.versions.write(path, data, shown=shown, basis=basis, token=call.token)
    except WriteRefused as err:
        raise ToolError(f"write_file refused: {err.message}", output=err.detail) from None
    except OSError as err:
        raise ToolError(f"cannot write '{args.path}': {err.strerror or err}") from None
    if call is not None and call.seen is not None:
        call.versions.keep(call.seen)
    return f"wrote {len(data)} bytes to {shown}"


def _basis(root: Path, path: Path, args: WriteFileArgs, based_on: dict[str, str | None] | None) -> Basis:
    """The version a write is based on: the call's own base_version, else the one its goal
    says the step (or a step it builds on) last read or wrote; no version context at all
    (a device's call, an older caller) checks nothing."""
    if args.base_version == "any":
        return Basis(check=False, why='base_version "any"')
    if args.base_version is not None:
        return Basis(check=True, seen=True, digest=args.base_version, why="the base_version you gave")
    if based_on is None:
        return UNCHECKED
    seen_by_step = "this step (or a step it builds on) last read or wrote it"
    key = posixpath.normpath(args.path)
    if key in based_on:
        return Basis(check=True, seen=True, digest=based_on[key], why=seen_by_step)
    # The same file under another spelling (`./a`, a symlink): compare real paths.
    for other, digest in based_on.items():
        try:
            if resolve_in_workspace(root, other) == path:
                return Basis(check=True, seen=True, digest=digest, why=seen_by_step)
        except (WorkspaceEscape, WorkspaceMissing):
            continue
    return Basis(check=True, seen=False)


async def write_file(root: Path, args: WriteFileArgs, *, call: FileCall | None = None) -> str:
    """Without a `call`, an unversioned overwrite (what the activity never does)."""
    return await asyncio.to_thread(_write_file_sync, root, args, call)


async def read_artifact(store: ArtifactStore, args: ReadArtifactArgs) -> str:
    """An earlier output in full, from the artifact store (the workspace plays no part)."""
    try:
        data = await asyncio.to_thread(store.get_bytes, args.digest)
    except ArtifactMissing:
        raise ToolError(f"no output with digest {args.digest}; use a digest shown in this conversation") from None
    except ArtifactCorrupt as err:
        raise ToolError(f"the output {args.digest} cannot be read: {err}") from None
    return capped_text(data, args.max_bytes, len(data), f"the output {args.digest}", "read_artifact")
