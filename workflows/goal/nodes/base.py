"""What every node runner is given and what it returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from workflows.contracts import ArtifactRef
from workflows.goal.context import GoalContext
from workflows.goal.effect_guard import EffectGuard
from workflows.goal.model_calls import ModelCalls
from workflows.goal.pause import Pause
from workflows.goal.spend import Spend
from workflows.goal.tool_runner import ToolRunner
from workflows.plan import PlanStep
from workflows.state import Node


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
