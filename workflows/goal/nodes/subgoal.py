"""A subgoal node: a large independent part run as a goal of its own, a child GoalWorkflow.

The child gets its own plan or goal text, this goal's constraints verbatim, premises,
profile and workspace, its share of this goal's token and cost budget (the deadline
as is), its own inbox, and the link back (`spec.parent`). Its id is
`PARENT--STEP-RUN`: a step run again after a rewind starts a new goal. Parent-close
policy ABANDON: a child is never terminated with its parent, nor by its parent's
continue-as-new.

The wait for the child is state, not a task: once the child is started the node waits
(`waiting_on = subgoal:ID`, still running) and the goal may continue as new meanwhile.
The child tells its parent how it ended (a `subgoal_settled` signal to the parent's id,
so it reaches the parent's latest run); a child that ends without telling (terminated)
is seen by the run that started it. The node then runs again and settles: what the child
spent is charged to this goal and its report is the node's output. An abort, a rewind or a
failed fail_fast sibling asks the child to stop (workflows/goal/scheduler.py).

Workflow code.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ApplicationError, ChildWorkflowError
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

from perdure.workflows.goal.context import NodeFailed, NodeWaiting
from perdure.workflows.goal.contracts.goal_contracts import (
    GOAL_WORKFLOW,
    GoalResult,
    GoalSpec,
    ParentLink,
    SubgoalOutcome,
    Usage,
    goal_memo,
)
from perdure.workflows.goal.contracts.plan import SubgoalStep
from perdure.workflows.goal.contracts.state import GoalInput, GoalState, Node
from perdure.workflows.goal.nodes.base import NodeDeps
from perdure.workflows.shared.budget import child_budget
from perdure.workflows.shared.contracts import ArtifactRef
from perdure.workflows.shared.host_workspaces import WORKSPACE_MOVE, HostWorkspace, host_workspace, workspace_name

SUBGOAL_WAIT = "subgoal:"


class SubgoalNode:
    def __init__(self, deps: NodeDeps) -> None:
        self._ctx = deps.ctx
        self._spend = deps.spend

    async def run(self, step: SubgoalStep, node: Node) -> tuple[ArtifactRef, str]:
        ctx = self._ctx
        if node.child is None:
            node.child = f"{ctx.goal_id}--{step.name}-{node.runs}"
            node.budget_granted = self._spend.grant(step)
            child_spec = self._child_spec(step, node)
            handle = await workflow.start_child_workflow(
                GOAL_WORKFLOW,
                GoalInput(spec=child_spec),
                id=node.child,
                task_queue=workflow.info().task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON,
                task_timeout=child_spec.task_timeout(),
                static_summary=f"subgoal {step.name} of {ctx.goal_id}"[:200],
                memo=goal_memo(child_spec.goal),  # its text in lists, the message format it reads
                result_type=GoalResult,
            )
            asyncio.create_task(self._watch(handle, node.child))
        outcome = ctx.state.subgoal_outcomes.pop(node.child, None)
        if outcome is None:
            node.waiting_on = SUBGOAL_WAIT + node.child
            raise NodeWaiting(f"waiting for subgoal {node.child}")
        node.waiting_on = None
        return self._settle(step, node, outcome)

    def _settle(self, step: SubgoalStep, node: Node, outcome: SubgoalOutcome) -> tuple[ArtifactRef, str]:
        result = outcome.result
        if result is not None and (result.tokens or result.cost_usd):
            self._spend.charge(Usage(output_tokens=result.tokens, cost_usd=result.cost_usd), node)
        if result is None or result.outcome != "succeeded":
            ended = result.outcome if result is not None else "without a result"
            if step.join == "fail_fast":
                self._ctx.stop_children(f"subgoal {step.name} ({outcome.child_id}) ended {ended}", but=node.name)
            why = (result.failure if result is not None else outcome.failure) or ""
            raise NodeFailed(f"subgoal {outcome.child_id} ended {ended}" + (f": {why}" if why else ""))
        return result.report, f"subgoal {outcome.child_id}: {result.excerpt}"[:200]

    async def _watch(self, handle: ChildWorkflowHandle, child_id: str) -> None:
        """In the run that started the child: its end, for a child that ends without telling."""
        try:
            outcome = SubgoalOutcome(child_id=child_id, result=await handle)
        except ChildWorkflowError as err:
            outcome = _failed(child_id, err)
        self._ctx.subgoal_ended(outcome)

    def _child_spec(self, step: SubgoalStep, node: Node) -> GoalSpec:
        state = self._ctx.state
        spec = state.spec
        return GoalSpec(
            goal=step.goal or f"{spec.goal[:18_000]}\n\nThis part: subgoal '{step.name}' (its plan says what).",
            plan=step.plan,
            constraints=list(spec.constraints),
            budget=node.budget_granted or child_budget(spec.budget, step.budget_share),
            model_profile=spec.model_profile,
            allowed_tools=list(step.tools if step.tools is not None else spec.allowed_tools),
            workspace=_workspace_now(state),
            allow_network=spec.allow_network,
            premises=dict(state.premises),
            drift_every=spec.drift_every,
            recovery_mode=spec.recovery_mode,
            question_deadline=spec.question_deadline,
            local_keyed_writes=spec.local_keyed_writes,
            parent=ParentLink(goal_id=self._ctx.goal_id, node=node.name),
        )


def _workspace_now(state: GoalState) -> str:
    """The parent's workspace as it stands: on the host a person moved it to, if one did."""
    bound = host_workspace(state.spec.workspace)
    moved = state.device_moves.get(WORKSPACE_MOVE)
    if bound is None or not moved:
        return state.spec.workspace
    first = state.devices.get(bound.host)
    return str(HostWorkspace(moved, workspace_name(bound, first.workspaces if first is not None else None)))


def _failed(child_id: str, err: ChildWorkflowError) -> SubgoalOutcome:
    """A child that failed carries its result in the failure's details (GoalFailed); one
    terminated or timed out has none."""
    cause = err.cause
    details = cause.details if isinstance(cause, ApplicationError) else ()
    if details and isinstance(details[0], dict):
        try:
            return SubgoalOutcome(child_id=child_id, result=GoalResult.model_validate(details[0]))
        except ValueError:
            pass
    return SubgoalOutcome(child_id=child_id, failure=str(cause or err)[:2000])
