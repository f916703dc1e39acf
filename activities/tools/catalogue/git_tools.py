"""git_commit and git_revert: a commit in the workspace's repository, and its undo.

Both are `check` remote writes: the commit carries its effect key as a trailer
(`Effect-Key: fx-...`), so a retry looks it up in HEAD's history before committing
again. A commit registers its revert as its compensation before it is made; the revert
names the commit only by that key, and one that never happened needs no revert. They run
where the workspace is, on the worker or on a device. The git plumbing is in
activities/tools/git_repo.py.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Any

from pydantic import Field

from perdure.activities.tools.catalogue.tool_base import EffectCall, EffectTool, how_confirmed
from perdure.activities.tools.catalogue.tool_errors import ToolError
from perdure.workflows.shared.tool_specs import EFFECT_KEY, REMOTE_TIMEOUTS, Compensation, Effect, ToolArgs, ToolSpec

EFFECT_TRAILER = "Effect-Key"
REVERTS_TRAILER = "Reverts-Effect-Key"


class GitCommitArgs(ToolArgs):
    message: str = Field(min_length=1, description="Commit message; perdure appends an Effect-Key trailer.")
    paths: list[str] | None = Field(
        default=None, description="Paths relative to the workspace to commit; default: every change in the workspace."
    )


class GitRevertArgs(ToolArgs):
    effect_key: str = Field(pattern=EFFECT_KEY, description="Effect-Key trailer of the commit to revert.")


class GitEffectTool(EffectTool):
    """A commit in the workspace's repository: found again by its effect-key trailer, written one at a time."""

    action: str
    """The effect's action on the repository (its target): commit or revert."""

    def effect(self, args: Any, workspace: str) -> Effect:
        return Effect(f"git:{workspace}", self.action, args.model_dump(mode="json"))

    def target(self, args: Any) -> str:
        return "the workspace's git repository"

    async def lookup(self, call: EffectCall, args: Any) -> dict | None:
        from perdure.activities.tools.git_repo import find_commit, repository

        root = await repository(call.workspace)
        sha = await find_commit(root, EFFECT_TRAILER, call.key)
        return {"commit": sha, "found_by": f"its {EFFECT_TRAILER} trailer"} if sha else None

    async def send(self, call: EffectCall, args: Any) -> dict:
        from perdure.activities.tools.git_repo import repo_lock, repository

        root = await repository(call.workspace)
        async with repo_lock(root):
            return await self.write(root, call, args)

    @abstractmethod
    async def write(self, root: Path, call: EffectCall, args: Any) -> dict:
        """The commit itself, under the repository's lock."""


class GitCommit(GitEffectTool):
    spec = ToolSpec(
        name="git_commit",
        risk="remote-write",
        replay="check",
        description="Commit changes in the workspace's git repository (all changes, or the given paths).",
        args_model=GitCommitArgs,
        compensation="git_revert",
        needs_workspace=True,
        on_devices=True,
        **REMOTE_TIMEOUTS,
    )
    example = {"message": "Add the summary\n\nWritten by the summarise step.", "paths": ["SUMMARY.md"]}
    action = "commit"

    def undo(self, key: str, args: GitCommitArgs) -> Compensation:
        subject = args.message.strip().splitlines()[0] if args.message.strip() else args.message
        return Compensation(tool="git_revert", args={"effect_key": key}, reason=f"revert the commit '{subject[:80]}'")

    async def write(self, root: Path, call: EffectCall, args: GitCommitArgs) -> dict:
        from perdure.activities.tools.git_repo import commit_keyed, git, pathspecs

        specs = pathspecs(call.workspace, args.paths)
        await git(root, "add", "-A", "--", *specs)
        code, _ = await git(root, "diff", "--cached", "--quiet", "--", *specs, check=False)
        if code == 0:
            raise ToolError(f"nothing to commit in {', '.join(args.paths or ['the workspace'])}")
        return {"commit": await commit_keyed(root, call.key, args.message, "--", *specs)}

    def describe(self, call: EffectCall, args: GitCommitArgs, receipt: dict) -> str:
        subject = args.message.strip().splitlines()[0] if args.message.strip() else ""
        return f"committed {receipt.get('commit')} '{subject}' ({EFFECT_TRAILER}: {call.key}{how_confirmed(receipt)})"


class GitRevert(GitEffectTool):
    spec = ToolSpec(
        name="git_revert",
        risk="remote-write",
        replay="check",
        description="Revert the commit perdure made under an effect key (a compensation).",
        args_model=GitRevertArgs,
        needs_workspace=True,
        on_devices=True,
        **REMOTE_TIMEOUTS,
    )
    example = {"effect_key": "fx-" + "0" * 32}
    action = "revert"

    async def write(self, root: Path, call: EffectCall, args: GitRevertArgs) -> dict:
        from perdure.activities.artifacts import preview
        from perdure.activities.tools.git_repo import commit_keyed, find_commit, git, identity

        original = await find_commit(root, EFFECT_TRAILER, args.effect_key)
        if original is None:
            # The commit this compensates never happened (or is not in HEAD's history).
            return {"commit": None, "reverted": None}
        code, out = await git(root, *await identity(root), "revert", "--no-commit", original, check=False)
        if code != 0:
            await git(root, "revert", "--abort", check=False)
            raise ToolError(f"cannot revert {original} cleanly: {preview(out, 600)}")
        staged, _ = await git(root, "diff", "--cached", "--quiet", check=False)
        if staged == 0:
            await git(root, "revert", "--quit", check=False)
            return {"commit": None, "reverted": original, "already": True}
        _, subject = await git(root, "log", "-1", "--format=%s", original)
        message = f'Revert "{subject}"\n\nThis reverts commit {original}.'
        sha = await commit_keyed(root, call.key, message, "--trailer", f"{REVERTS_TRAILER}: {args.effect_key}")
        return {"commit": sha, "reverted": original}

    def describe(self, call: EffectCall, args: GitRevertArgs, receipt: dict) -> str:
        if receipt.get("reverted") is None and receipt.get("commit") is None:
            return f"nothing to revert: no commit in HEAD's history carries {EFFECT_TRAILER}: {args.effect_key}"
        if receipt.get("already"):
            return f"commit {receipt['reverted']} is already undone in the working tree; no revert commit needed"
        return (
            f"reverted {receipt.get('reverted') or 'the commit'} with {receipt.get('commit')}{how_confirmed(receipt)}"
        )


DECLARED = (GitCommit(), GitRevert())
