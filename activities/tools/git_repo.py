"""git on the worker, for the git tools (activities/tools/catalogue/git_tools.py): a git
command with the repository's own programs switched off, one write at a time per
repository, and the commit carrying its effect key as a trailer so it can be found again.

The workspace is the model's to write (run_command), .git included: git runs here outside
the command sandbox, so hooks, the filesystem monitor and signing are off for every call,
and a repository whose local config names other programs is refused.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from perdure.activities.artifacts import preview
from perdure.activities.tools.catalogue.git_tools import EFFECT_TRAILER
from perdure.activities.tools.catalogue.tool_errors import ToolError
from perdure.activities.tools.workspace import WorkspaceEscape, resolve_in_workspace, workspace_root

GIT_TIMEOUT_S = 45.0
"""Below the 60 s start-to-close recommended for git tools, so a hung hook fails the call, not the attempt."""


def git_env() -> dict[str, str]:
    """Enough for git and the user's own git config; no worker secrets, no inherited GIT_DIR."""
    env = {
        "PATH": os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "GIT_TERMINAL_PROMPT": "0",
    }
    if os.environ.get("HOME"):
        env["HOME"] = os.environ["HOME"]
    return env


# The workspace is the model's to write (run_command), .git included: none of the
# programs a repository's own hooks or config could make git run on the worker, outside
# the command sandbox, may run. Hooks, the filesystem monitor and signing are switched
# off for every call; a repository whose local config names other programs is refused.
GIT_OVERRIDES = (
    "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
    "-c", "commit.gpgSign=false", "-c", "tag.gpgSign=false",
)  # fmt: skip
LOCAL_PROGRAM_KEYS = (
    r"^(filter\..*|diff\..*\.(command|textconv)|merge\..*\.driver"
    r"|core\.(sshcommand|pager|editor|askpass|gitproxy)|gpg\..*)$"
)


async def refuse_repository_programs(root: Path) -> None:
    """Refuse a repository whose own config names a program git would run (a filter, a
    diff or merge driver, a pager, an ssh or gpg program)."""
    code, out = await git(root, "config", "--local", "--get-regexp", LOCAL_PROGRAM_KEYS, check=False)
    if code == 0 and out.strip():
        keys = sorted({line.split()[0] for line in out.splitlines() if line.strip()})
        raise ToolError(
            f"the repository's own config names programs git would run on the worker ({', '.join(keys)}); "
            "remove them from .git/config (a person's global git config is not affected)"
        )


async def git(cwd: Path, *args: str, check: bool = True) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "git",
        *GIT_OVERRIDES,
        *args,
        cwd=cwd,
        env=git_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=GIT_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ToolError(f"git {args[0]} did not finish in {GIT_TIMEOUT_S:g}s") from None
    text = out.decode("utf-8", errors="replace").strip()
    if check and proc.returncode != 0:
        raise ToolError(f"git {' '.join(args[:2])} failed (exit {proc.returncode}): {preview(text, 600)}")
    return proc.returncode or 0, text


_repo_locks: dict[Path, asyncio.Lock] = {}


def repo_lock(root: Path) -> asyncio.Lock:
    """One git write at a time per repository in this worker: parallel steps would race for index.lock."""
    return _repo_locks.setdefault(root, asyncio.Lock())


async def repository(workspace: Path) -> Path:
    """The root of the repository the workspace is in, refused when its config names programs."""
    root = workspace_root(workspace)
    code, _ = await git(root, "rev-parse", "--show-toplevel", check=False)
    if code != 0:
        raise ToolError(f"the workspace {workspace} is not inside a git repository")
    await refuse_repository_programs(root)
    return root


async def find_commit(root: Path, trailer: str, value: str) -> str | None:
    """The newest commit in HEAD's history whose `trailer:` equals value."""
    code, _ = await git(root, "rev-parse", "--verify", "-q", "HEAD", check=False)
    if code != 0:
        return None  # no commits yet
    _, out = await git(
        root,
        "log",
        "-F",
        f"--grep={trailer}: {value}",
        f"--format=%H%x09%(trailers:key={trailer},valueonly,separator=%x2C)",
        "HEAD",
    )
    for line in out.splitlines():
        sha, _, values = line.partition("\t")
        if value in [v.strip() for v in values.split(",")]:
            return sha
    return None


async def identity(root: Path) -> list[str]:
    """Use the repository's identity; fall back to perdure's own only when none is configured."""
    _, email = await git(root, "config", "user.email", check=False)
    return [] if email else ["-c", "user.name=perdure", "-c", "user.email=perdure@localhost"]


def pathspecs(root: Path, paths: list[str] | None) -> list[str]:
    if not paths:
        return ["."]
    specs = []
    real_root = workspace_root(root)
    for path in paths:
        try:
            resolved = resolve_in_workspace(root, path)
        except WorkspaceEscape as err:
            raise ToolError(str(err)) from None
        rel = resolved.relative_to(real_root).as_posix() or "."
        specs.append(f":(literal){rel}")
    return specs


async def commit_keyed(root: Path, key: str, message: str, *options: str) -> str:
    """Commit what is staged with the effect key as a trailer, so `lookup` can find it; the new commit's sha."""
    await git(
        root, *await identity(root), "commit", "-q", "-m", message, "--trailer", f"{EFFECT_TRAILER}: {key}", *options
    )
    _, sha = await git(root, "rev-parse", "HEAD")
    return sha
