"""What every node runner is given and what it returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts.plan import PlanStep
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.effect_guard import EffectGuard
from perdure.workflows.goal.model_calls import ModelCalls
from perdure.workflows.goal.pause import Pause
from perdure.workflows.goal.spend import Spend
from perdure.workflows.goal.tool_runner import ToolRunner
from perdure.workflows.shared.contracts import ArtifactRef


@dataclass(frozen=True)
class NodeDeps:
    """The rooms a node runner may call; each runner keeps the ones it needs."""

    ctx: GoalContext
    calls: ModelCalls
    guard: EffectGuard
    tools: ToolRunner
    pause: Pause
    spend: Spend


class NodeRunner(Protocol):
    def __init__(self, deps: NodeDeps) -> None: ...

    async def run(self, step: PlanStep, node: Node) -> tuple[ArtifactRef, str]:
        """The node's output and a short preview; NodeFailed or ActivityError when there is none."""
        ...
