"""Fingerprints of what a tool call read or wrote: workspace files and directories, and
URLs fetched by http_get, digested the same way when the call ran and when a goal checks
its finished work again (activities/goal/recheck.py).

A file's fingerprint is the sha256 of all its bytes (a read of its first bytes still
counts any change, so a check never keeps what may no longer hold); a directory's is the
sha256 of its sorted listing as list_dir shows it. A path that does not exist (or cannot
be read) digests to None. Worker code; the paths are confined to the workspace.

A URL's (`url:URL`, the URL exactly as the call's arguments hold it: never the address
a redirect led to, which may carry a signed token, and no header) is the sha256 of the
text http_get returned: the body as the step saw it, its first `max_bytes` decoded, so
a re-fetch by the same tool with the same cap digests equal exactly when the step would
see the same thing. A cap other than the tool's default is kept after the digest
(`;max_bytes=N`), since a re-fetch must use it. A body that differs on every fetch (a
timestamp) differs at every check; a step says `verify: {depth: existence}` for those.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

from perdure.activities.tools.catalogue.file_tools import ListDirArgs, ReadFileArgs, WriteFileArgs
from perdure.activities.tools.catalogue.http_tools import HttpGetArgs
from perdure.activities.tools.workspace import WorkspaceEscape, WorkspaceMissing, resolve_in_workspace
from perdure.workflows.shared.contracts import Fingerprint
from perdure.workflows.shared.tool_specs import ToolArgs

URL_PREFIX = "url:"
_CAP_MARK = ";max_bytes="
DEFAULT_HTTP_CAP: int = HttpGetArgs.model_fields["max_bytes"].default


def digest_of_source(root: Path, source: str) -> str | None:
    """The current digest of `file:PATH` or `dir:PATH` in the workspace at `root`."""
    kind, _, relative = source.partition(":")
    try:
        path = resolve_in_workspace(root, relative)
    except (WorkspaceEscape, WorkspaceMissing):
        return None
    try:
        if kind == "file" and path.is_file():
            with path.open("rb") as f:
                return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()
        if kind == "dir" and path.is_dir():
            listing = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in path.iterdir())
            return "sha256:" + hashlib.sha256("\n".join(listing).encode()).hexdigest()
    except OSError:
        return None
    return None


def fingerprints_of(
    tool: str, root: Path, args: ToolArgs, output: str = "", digest: str | None = None
) -> list[Fingerprint]:
    """What a successful call of `tool` read or wrote, digested now (just after the call);
    `output`: the text it returned (what an http_get fingerprint digests); `digest`: the
    version the call itself read or wrote, when it knows it (the file is not opened again)."""
    if isinstance(args, HttpGetArgs) and tool == "http_get":
        digest = url_digest(output, args.max_bytes)
        return [Fingerprint(kind="read", source=URL_PREFIX + args.url, digest=digest, at=datetime.now(UTC))]
    if isinstance(args, ReadFileArgs) and tool == "read_file":
        kind, source = "read", f"file:{args.path}"
    elif isinstance(args, ListDirArgs) and tool == "list_dir":
        kind, source = "read", f"dir:{args.path}"
    elif isinstance(args, WriteFileArgs) and tool == "write_file":
        kind, source = "wrote", f"file:{args.path}"
    else:
        return []
    digest = digest or digest_of_source(root, source)
    return [Fingerprint(kind=kind, source=source, digest=digest, at=datetime.now(UTC))]


def url_digest(text: str, max_bytes: int = DEFAULT_HTTP_CAP) -> str:
    """The digest of what http_get returned for a URL, with the cap it read under."""
    digest = "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return digest if max_bytes == DEFAULT_HTTP_CAP else f"{digest}{_CAP_MARK}{max_bytes}"


def url_cap(digest: str | None) -> int:
    """The cap a URL was read under, from its recorded digest (the default when none is kept)."""
    cap = (digest or "").partition(_CAP_MARK)[2]
    return int(cap) if cap.isdigit() else DEFAULT_HTTP_CAP
