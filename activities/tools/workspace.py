"""Workspace confinement: turn a path a plan or a model wrote into a real path inside the workspace.

Owns the one rule every file tool follows: a path is relative, has no `..`
component, and once every symlink along it is resolved it still lies under the
workspace root. It must not open, create or delete files; the tools do that
with the path it returns.

The check and the later open are two steps, so a process that swaps a directory
for a symlink in between can still win the race. That is acceptable for v1:
the only writer inside the workspace besides the tools is `run_command`, which
runs with the same rights anyway.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath


class WorkspaceEscape(ValueError):
    """The path is not a safe relative path inside the workspace (empty, NUL, absolute, `..`, or a symlink out)."""


class WorkspaceMissing(ValueError):
    """The workspace root itself does not exist or is not a directory."""


def workspace_root(root: Path) -> Path:
    """The workspace root with symlinks resolved; raises WorkspaceMissing when it is unusable."""
    try:
        real = root.resolve(strict=True)
    except FileNotFoundError:
        raise WorkspaceMissing(f"workspace '{root}' does not exist") from None
    except (OSError, RuntimeError) as err:
        raise WorkspaceMissing(f"workspace '{root}' cannot be resolved: {err}") from None
    if not real.is_dir():
        raise WorkspaceMissing(f"workspace '{root}' is not a directory")
    return real


def resolve_in_workspace(root: Path, relative: str, *, must_exist: bool = False) -> Path:
    """The real path `relative` names inside `root`.

    Raises WorkspaceEscape when the path is not allowed, WorkspaceMissing when the
    root is unusable, and FileNotFoundError when `must_exist` and nothing is there.
    """
    return confine(workspace_root(root), relative, must_exist=must_exist)


def confine(real_root: Path, relative: str, *, must_exist: bool = False) -> Path:
    """resolve_in_workspace for a root already resolved by workspace_root: a tool call
    resolves its workspace once, not once per path it touches."""
    if not relative or not relative.strip():
        raise WorkspaceEscape("path is empty; give a path relative to the workspace")
    if "\x00" in relative:
        raise WorkspaceEscape(f"{relative!r} contains a NUL byte")
    pure = PurePosixPath(relative)
    if pure.is_absolute():
        raise WorkspaceEscape(f"'{relative}' is absolute; paths are relative to the workspace")
    if ".." in pure.parts:
        raise WorkspaceEscape(f"'{relative}' contains '..'; paths must stay inside the workspace")
    try:
        # strict=False resolves every symlink that exists along the way, a
        # dangling final symlink included, and keeps the not-yet-existing rest.
        resolved = (real_root / pure).resolve(strict=False)
    except (OSError, RuntimeError) as err:
        # Symlink loops: RuntimeError up to Python 3.12, OSError after.
        raise WorkspaceEscape(f"'{relative}' cannot be resolved: {err}") from None

    if not resolved.is_relative_to(real_root):
        # Absolute paths and `..` were refused above, so only a symlink gets here.
        raise WorkspaceEscape(f"'{relative}' resolves to '{resolved}' outside the workspace (via a symlink)")
    if must_exist and not resolved.exists():
        raise FileNotFoundError(f"'{relative}' does not exist in the workspace")
    return resolved
