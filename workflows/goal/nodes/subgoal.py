"""A subgoal node: a large independent part run as a goal of its own, a child GoalWorkflow.

The child gets its own plan or goal text, this goal's constraints verbatim, premises,
profile and workspace, its share of this goal's token and cost budget (the deadline
as is), its own inbox, and the link back (`spec.parent`). Its id is
`PARENT--STEP-RUN`, so a run again after a rewind is a new goal, and the same run is
never started twice. The node waits for the child's result; while it waits it counts
as work in flight that must not be cut off: an abort, a rewind or a failed fail_fast
sibling asks the child to stop (an abort message, with rollback when this goal rolls
back or a sibling failed) and the node settles once the child has stopped,
compensations included. Parent-close policy ABANDON: a child outlives a worker's
death and is never terminated with its parent. What the child spent is charged to
this goal when it settles; its report is the node's output.

Workflow code.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError, ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

from workflows.contracts import (
    GOAL_WORKFLOW,
    ArtifactRef,
    Budget,
    GoalResult,
    GoalSpec,
    ParentLink,
    Usage,
)
from workflows.goal.context import NodeFailed
from workflows.goal.nodes.base import NodeDeps
from workflows.messages import Abort
from workflows.plan import SubgoalStep
from workflows.state import GoalInput, Node

# Goal task timeout, as starters/goals.py starts goals.
CHILD_TASK_TIMEOUT = timedelta(seconds=4)


class SubgoalNode:
    def __init__(self, deps: NodeDeps) -> None:
        self._ctx = deps.ctx
        self._spend = deps.spend

    async def run(self, step: SubgoalStep, node: Node) -> tuple[ArtifactRef, str]:
        ctx = self._ctx
        child_id = f"{ctx.goal_id}--{step.name}-{node.runs}"
        node.child = child_id
        flights = ctx.writes_in_flight
        flights[node.name] = flights.get(node.name, 0) + 1
        ctx.children[node.name] = (child_id, step.join)
        try:
            handle = await workflow.start_child_workflow(
                GOAL_WORKFLOW,
                GoalInput(spec=self._child_spec(step, node)),
                id=child_id,
                task_queue=workflow.info().task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON,
                task_timeout=CHILD_TASK_TIMEOUT,
                static_summary=f"subgoal {step.name} of {ctx.goal_id}"[:200],
                result_type=GoalResult,
            )
            result = await self._result_or_stop(handle, node, child_id)
        finally:
            ctx.children.pop(node.name, None)
            flights[node.name] -= 1
            if not flights[node.name]:
                del flights[node.name]
            ctx.wake()
        if result.tokens or result.cost_usd:
            self._spend.charge(Usage(output_tokens=result.tokens, cost_usd=result.cost_usd), node)
        if result.outcome != "succeeded":
            if step.join == "fail_fast":
                ctx.stop_children(f"subgoal {step.name} ({child_id}) ended {result.outcome}", but=node.name)
            why = f": {result.failure}" if result.failure else ""
            raise NodeFailed(f"subgoal {child_id} ended {result.outcome}{why}"[:1000])
        return result.report, f"subgoal {child_id}: {result.excerpt}"[:200]

    def _child_spec(self, step: SubgoalStep, node: Node) -> GoalSpec:
        state = self._ctx.state
        spec = state.spec
        return GoalSpec(
            goal=step.goal or f"{spec.goal[:18_000]}\n\nThis part: subgoal '{step.name}' (its plan says what).",
            plan=step.plan,
            constraints=list(spec.constraints),
            budget=child_budget(spec.budget, step.budget_share),
            model_profile=spec.model_profile,
            allowed_tools=list(step.tools if step.tools is not None else spec.allowed_tools),
            workspace=spec.workspace,
            allow_network=spec.allow_network,
            premises=dict(state.premises),
            drift_every=spec.drift_every,
            recovery_mode=spec.recovery_mode,
            parent=ParentLink(goal_id=self._ctx.goal_id, node=node.name),
        )

    async def _result_or_stop(self, handle: workflow.ChildWorkflowHandle, node: Node, child_id: str) -> GoalResult:
        """The child's result; if this goal stops the node meanwhile, the child is asked to
        stop once and its result (aborted, after its compensations) awaited all the same."""
        ctx = self._ctx
        done = asyncio.ensure_future(handle)
        await workflow.wait_condition(lambda: done.done() or node.name in ctx.stopping)
        if not done.done():
            rollback = ctx.state.pause.mode == "aborting" and ctx.state.pause.rollback
            stop = Abort(request_id="stop-by-parent", reason="its parent stops it", rollback=rollback)
            ctx.tell_child(child_id, stop)
        try:
            return await done
        except ChildWorkflowError as err:
            return _failed_result(err)


def _failed_result(err: ChildWorkflowError) -> GoalResult:
    """A child that failed carries its result in the failure's details (GoalFailed)."""
    cause = err.cause
    details = cause.details if isinstance(cause, ApplicationError) else ()
    if details and isinstance(details[0], dict):
        try:
            return GoalResult.model_validate(details[0])
        except ValueError:
            pass
    raise NodeFailed(f"subgoal ended without a result: {cause or err}"[:1000]) from None


def child_budget(budget: Budget, share: float) -> Budget:
    """The share of this goal's token and cost limits; the calendar deadline as is. Active
    time is the child's own (it is not taken from this goal's clock)."""
    return Budget(
        max_tokens=max(1, int(budget.max_tokens * share)) if budget.max_tokens else None,
        max_cost_usd=budget.max_cost_usd * share if budget.max_cost_usd else None,
        max_wall_seconds=budget.max_wall_seconds,
        deadline=budget.deadline,
    )
