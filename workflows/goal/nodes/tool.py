"""A tool node: one tool call with the plan step's arguments, under the effect rules.

Around a command step (and a write_file into a directory the goal listed) the goal also
looks at the files and directories its steps have read, just before the call and just
after it, in a local activity each: what the step changed of them is kept on the node
(a `seen` and a `changed` fingerprint per file), so a later check of finished work
counts the change as the goal's own, like a write, and not as an edit from outside
(workflows/goal/verification.py). The look before is what tells the two apart: a file
that already differs from what the goal last knew was edited from outside, and stays
so. A change made by someone else while the call runs cannot be told from the step's.
Only sources already read by steps whose reads a check compares (depth fingerprint or
semantic) are looked at, the newest read first, at most MAX_LOOKED; a look that fails
only leaves the stricter rule: the change counts as one from outside. Steps on a device,
and those of a goal whose workspace is on a host, look at nothing (their files are there).
"""

from __future__ import annotations

import posixpath
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import FailureError

from perdure.workflows.goal.context import NodeFailed, short_key
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.plan import ToolStep
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.contracts.verify_contracts import VerifyInput, VerifyResult, source_key
from perdure.workflows.goal.nodes.base import NodeDeps
from perdure.workflows.goal.tool_runner import MAX_FINGERPRINTS
from perdure.workflows.shared.canonical import canonical_json
from perdure.workflows.shared.contracts import ArtifactRef, Fingerprint, ToolInput
from perdure.workflows.shared.host_workspaces import host_workspace

# A look at most digests this many sources (two fingerprints each when the step changed them).
MAX_LOOKED = MAX_FINGERPRINTS // 2
LOOK_TIMEOUT = timedelta(seconds=60)
LOOK_RETRY = RetryPolicy(maximum_attempts=2, initial_interval=timedelta(seconds=1))
# The depths at which what a step read is compared again (workflows/goal/contracts/plan.py VerifyDepth).
READS_CHECKED = ("fingerprint", "semantic")


class ToolNode:
    def __init__(self, deps: NodeDeps) -> None:
        self._ctx = deps.ctx
        self._guard = deps.guard

    async def run(self, step: ToolStep, node: Node) -> tuple[ArtifactRef, str]:
        sources = self._to_look_at(step)
        before = await self._look(node, sources, "before") if sources else None
        result = await self._guard.call(
            ToolInput(
                goal_id=self._ctx.goal_id,
                node_key=node.key or "",
                tool=step.tool,
                workspace=self._ctx.state.spec.workspace,
                args=step.args,
                inputs=self._ctx.inputs(step),
            ),
            summary=f"tool {step.tool} · {step.name} · {short_key(node.key)}",
            node=node,
            what=f"{step.tool} {canonical_json(step.args)[:300]}",
            why=f"plan step '{step.name}'",
        )
        if before is not None:
            after = await self._look(node, sources, "after")
            if after is not None:
                keep_own_changes(node, before, after)
        if not result.ok or result.output is None:
            raise NodeFailed(f"{step.tool} failed: {result.error}")
        return result.output, result.preview

    def _to_look_at(self, step: ToolStep) -> list[str]:
        """The sources read by the goal's steps that this call may change, the newest read first."""
        if step.device is not None or host_workspace(self._ctx.state.spec.workspace) is not None:
            return []
        if step.tool == "run_command":
            changes = None  # anything in the workspace
        elif step.tool == "write_file" and isinstance(path := step.args.get("path"), str) and "{{" not in path:
            # Its own file has its `wrote` fingerprint; a new file changes its directories' listings.
            changes, parent = set(), posixpath.dirname(posixpath.normpath(path))
            while True:
                changes.add(f"dir:{parent or '.'}")
                if parent in ("", ".", "/"):
                    break
                parent = posixpath.dirname(parent)
        else:
            return []
        reads = [
            print_
            for other in self._ctx.state.nodes.values()
            if other.fingerprints and self._reads_checked(other.name)
            for print_ in other.fingerprints
            if print_.kind == "read" and print_.source.startswith(("file:", "dir:"))
        ]
        sources: dict[str, None] = {}
        for print_ in sorted(reads, key=lambda p: p.at, reverse=True):
            key = source_key(print_.source)
            if changes is None or key in changes:
                sources.setdefault(key)
        return list(sources)[:MAX_LOOKED]

    def _reads_checked(self, name: str) -> bool:
        """Whether a check of finished work compares what step `name` read (only then does
        what the goal changed of it matter)."""
        try:
            step = self._ctx.plan().step(name)
        except KeyError:
            return False  # a step of an earlier plan version is never checked
        default = self._ctx.state.spec.recovery_mode
        depth = step.verify.depth_for(default) if step.verify else default
        return depth in READS_CHECKED and getattr(step, "device", None) is None

    async def _look(self, node: Node, sources: list[str], when: str) -> list[Fingerprint] | None:
        try:
            result = await workflow.execute_local_activity(
                Activities.VERIFY_NODES,
                VerifyInput(workspace=self._ctx.state.spec.workspace, look_at=sources),
                result_type=VerifyResult,
                start_to_close_timeout=LOOK_TIMEOUT,
                retry_policy=LOOK_RETRY,
                summary=f"look {when} {node.name}: {len(sources)} sources the goal read",
            )
        except FailureError:
            # A local activity's own failure comes bare (an ApplicationError), its timeout as an
            # ActivityError: either way no look, and the step goes on unverified.
            return None
        return result.looked if len(result.looked) == len(sources) else None


def keep_own_changes(node: Node, before: list[Fingerprint], after: list[Fingerprint]) -> None:
    """What the call changed, as a `seen` (before) and a `changed` (after) fingerprint each,
    the latest per source; a source it left as it was needs neither."""
    latest = {(p.kind, p.source): p for p in node.fingerprints}
    for seen, now in zip(before, after, strict=True):
        if seen.digest == now.digest:
            continue
        for print_ in (seen, now.model_copy(update={"kind": "changed"})):
            latest.pop((print_.kind, print_.source), None)
            latest[(print_.kind, print_.source)] = print_
    node.fingerprints = list(latest.values())[-MAX_FINGERPRINTS:]
