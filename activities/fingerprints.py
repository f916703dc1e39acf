"""Fingerprints of workspace files: what a tool call read or wrote, digested the same way
when the call ran and when a goal checks its finished work again (activities/verification.py).

A file's fingerprint is the sha256 of all its bytes (a read of its first bytes still
counts any change, so a check never keeps what may no longer hold); a directory's is the
sha256 of its sorted listing as list_dir shows it. A path that does not exist (or cannot
be read) digests to None. Worker code; the paths are confined to the workspace.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

from activities.workspace import WorkspaceEscape, WorkspaceMissing, resolve_in_workspace
from workflows.contracts import Fingerprint
from workflows.tool_specs import ListDirArgs, ReadFileArgs, ToolArgs, WriteFileArgs

CHUNK = 1 << 20


def digest_of_source(root: Path, source: str) -> str | None:
    """The current digest of `file:PATH` or `dir:PATH` in the workspace at `root`."""
    kind, _, relative = source.partition(":")
    try:
        path = resolve_in_workspace(root, relative)
    except (WorkspaceEscape, WorkspaceMissing):
        return None
    try:
        if kind == "file" and path.is_file():
            digest = hashlib.sha256()
            with path.open("rb") as f:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
            return "sha256:" + digest.hexdigest()
        if kind == "dir" and path.is_dir():
            listing = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in path.iterdir())
            return "sha256:" + hashlib.sha256("\n".join(listing).encode()).hexdigest()
    except OSError:
        return None
    return None


def fingerprints_of(tool: str, root: Path, args: ToolArgs) -> list[Fingerprint]:
    """What a successful call of `tool` read or wrote, digested now (just after the call)."""
    if isinstance(args, ReadFileArgs) and tool == "read_file":
        kind, source = "read", f"file:{args.path}"
    elif isinstance(args, ListDirArgs) and tool == "list_dir":
        kind, source = "read", f"dir:{args.path}"
    elif isinstance(args, WriteFileArgs) and tool == "write_file":
        kind, source = "wrote", f"file:{args.path}"
    else:
        return []
    return [Fingerprint(kind=kind, source=source, digest=digest_of_source(root, source), at=datetime.now(UTC))]
