"""An llm node: one model call with the step's prompt and its inputs' outputs."""

from __future__ import annotations

from perdure.workflows.goal.context import short_key
from perdure.workflows.goal.contracts.goal_contracts import Activities, GenerateInput, GenerateResult
from perdure.workflows.goal.contracts.plan import LlmStep
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.goal_memory import GoalMemoryRoom
from perdure.workflows.goal.nodes.base import NodeDeps
from perdure.workflows.shared.contracts import ArtifactRef


class LlmNode:
    def __init__(self, deps: NodeDeps) -> None:
        self._ctx = deps.ctx
        self._calls = deps.calls
        self._memory = GoalMemoryRoom(deps.ctx)

    async def run(self, step: LlmStep, node: Node) -> tuple[ArtifactRef, str]:
        summary = f"llm · {step.name} · {short_key(node.key)}"
        # The memories the scheduler attached, and any this goal used that were revoked since.
        untold = await self._memory.untold_revocations(node)
        payload = GenerateInput(
            context=self._calls.context(summary, node),
            step=step.name,
            prompt=self._memory.prompt_for(step.prompt, node, untold),
            inputs=self._ctx.inputs(step),
        )
        result = await self._calls.run(Activities.GENERATE, payload, GenerateResult, summary, node)
        node.statements = result.statements  # what its whole output states, for the evidence log
        return result.output, result.preview
