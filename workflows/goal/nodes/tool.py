"""A tool node: one tool call with the plan step's arguments, under the effect rules."""

from __future__ import annotations

from workflows.canonical import canonical_json
from workflows.contracts import ArtifactRef, ToolInput
from workflows.goal.context import NodeFailed, short_key
from workflows.goal.nodes.base import NodeDeps
from workflows.plan import ToolStep
from workflows.state import Node


class ToolNode:
    def __init__(self, deps: NodeDeps) -> None:
        self._ctx = deps.ctx
        self._guard = deps.guard

    async def run(self, step: ToolStep, node: Node) -> tuple[ArtifactRef, str]:
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
        if not result.ok or result.output is None:
            raise NodeFailed(f"{step.tool} failed: {result.error}")
        return result.output, result.preview
