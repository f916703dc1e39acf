"""Checking finished work again before a goal goes on after a long wait: one activity,
`perdure.verify.nodes`, that says which of the nodes it is given no longer hold, and why.

Per node, as deep as its check asks: existence (its output artifact is in the store,
the files it wrote are in the workspace), fingerprint (the files and directories it
read digest as they did when it read them), semantic (its `verify` command, run in the
same sandbox as every shell command, exits as expected). The first failing check of a
node is its reason; nothing here changes the workspace or the goal.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio import activity

from activities import sandbox
from activities.artifacts import ArtifactStore
from activities.fingerprints import digest_of_source
from activities.heartbeat import Heartbeat
from activities.tool_errors import ToolError
from activities.tools import run_command
from workflows.contracts import Activities
from workflows.tool_specs import RunCommandArgs
from workflows.verify_contracts import NodeCheck, VerifyInput, VerifyResult


class VerificationActivities:
    def __init__(self, store: ArtifactStore) -> None:
        self.store = store

    @activity.defn(name=Activities.VERIFY_NODES)
    async def verify_nodes(self, input: VerifyInput) -> VerifyResult:
        root = Path(input.workspace)
        void: dict[str, str] = {}
        async with Heartbeat(lambda: f"checking {len(input.checks)} finished steps"):
            for check in input.checks:
                reason = await self._reason_void(root, check, input.network)
                if reason is not None:
                    void[check.node] = reason
        return VerifyResult(void=void, checked=len(input.checks))

    async def _reason_void(self, root: Path, check: NodeCheck, network: bool) -> str | None:
        if check.depth == "trust":
            return None
        for ref in check.artifacts:
            if not self.store.has(ref):
                return f"its output {ref.digest[:19]} is no longer in the artifact store"
        for print_ in check.fingerprints:
            path = print_.source.partition(":")[2]
            now = await asyncio.to_thread(digest_of_source, root, print_.source)
            if print_.kind == "wrote" and now is None:
                return f"{path}, which it wrote, is gone"
            if print_.kind == "read" and check.depth != "existence" and now != print_.digest:
                return f"{path} {'is gone' if now is None else 'changed'} since it was read"
        if check.depth == "semantic" and check.command:
            return await self._command_fails(root, check, network)
        return None

    async def _command_fails(self, root: Path, check: NodeCheck, network: bool) -> str | None:
        assert check.command is not None
        args = RunCommandArgs(command=check.command, timeout_s=check.timeout_s, replay="safe")
        hidden = tuple(sandbox.hidden_paths(self.store.root))
        try:
            await run_command(root, args, network=network, hidden=hidden)
            code = 0
        except ToolError as err:
            code = _exit_code(err.output or "")
            if code is None:
                return f"its check `{check.command}` could not run: {err.message[:200]}"
        if code != check.expect_exit:
            return f"its check `{check.command}` exited {code}, expected {check.expect_exit}"
        return None


def _exit_code(output: str) -> int | None:
    """The exit code run_command's output ends with (`[exit code N]`), None if it did not exit."""
    tail = output.rstrip().rpartition("[exit code ")[2]
    number = tail.removesuffix("]")
    return int(number) if tail.endswith("]") and number.isdigit() else None
