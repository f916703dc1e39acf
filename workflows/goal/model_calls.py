"""Every model call of a goal: the context it is told (pending steers apply here,
at the model-turn boundary), one set of activity options, and the charge of its
usage. Planner, drift check, llm nodes and agent turns all call through here.

Workflow code: it schedules activities. A new model-backed activity needs only an
input and a result type in workflows/contracts.py and a call to `ModelCalls.run`.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from pydantic import BaseModel
from temporalio import workflow

from workflows.contracts import ModelContext, Usage
from workflows.goal.context import GoalContext
from workflows.goal.inbox import Inbox
from workflows.goal.spend import Spend
from workflows.retries import MODEL_OPTIONS
from workflows.state import Node


class _Charged(Protocol):
    usage: Usage


R = TypeVar("R", bound=_Charged)


class ModelCalls:
    def __init__(self, ctx: GoalContext, inbox: Inbox, spend: Spend) -> None:
        self._ctx = ctx
        self._inbox = inbox
        self._spend = spend

    def context(self, boundary: str, node: Node | None = None) -> ModelContext:
        """The context for a model call about to start: pending steers apply here."""
        state, spec = self._ctx.state, self._ctx.state.spec
        for entry in self._inbox.pending(("steer",)):
            state.guidance.append(entry.message.text)
            self._inbox.settle(entry, "applied", f"applied at {boundary}")
        return ModelContext(
            profile=spec.model_profile,
            goal=spec.goal,
            constraints=spec.constraints,
            premises=state.premises,
            guidance=state.guidance,
            rejected=[path.for_prompt() for path in state.rejected_paths],
            degraded=bool(node and node.degraded),
        )

    async def run(
        self, activity: str, payload: BaseModel, result_type: type[R], summary: str, node: Node | None = None
    ) -> R:
        """One model activity; its usage is charged to the goal (and to `node`) as it returns.
        An ActivityError (out of retries) propagates: what it means is the caller's call."""
        result = await workflow.execute_activity(
            activity, payload, result_type=result_type, summary=summary, **MODEL_OPTIONS
        )
        self._spend.charge(result.usage, node)
        return result
