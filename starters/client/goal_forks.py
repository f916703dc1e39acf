"""Forking and comparing goals: read a goal's fork point (its `fork_point` query), build
the forked goal's spec from it, and compare two goals step by step (`perdure fork` and
`perdure diff` print them).

Talks to Temporal only through queries (the fork is started as any goal is); never sends
the original anything, so forking leaves it as it was. What may be reused is decided by the
goal itself, in workflows/goal/rules/forking.py.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from pydantic import BaseModel, Field, ValidationError
from temporalio.client import Client, WorkflowQueryFailedError, WorkflowQueryRejectedError
from temporalio.service import RPCError

from perdure.starters.client import goal_reads
from perdure.starters.client.client_errors import ForkRefused, NoAnswer
from perdure.starters.client.start_checks import has_pollers
from perdure.workflows.goal.contracts.goal_contracts import ForkOrigin, GoalSpec, ProgressSnapshot
from perdure.workflows.goal.contracts.plan import describe_validation_error
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.rules.forking import ForkPoint, ForkPointInput

# A healthy worker answers in milliseconds; a finished goal is replayed first (its whole history).
QUERY_TIMEOUT_S = 10.0
# Costs closer than this are the same (sums of float charges).
COST_EPSILON = 1e-9


async def _query(client: Client, goal_id: str, query, *args, what: str):
    """Ask `goal_id` by query, or NoAnswer saying why not. A closed goal is answered by a
    worker too (it replays the history), so every query needs one."""
    desc = await goal_reads.describe(client, goal_id)
    failure = await goal_reads.workflow_task_failure(client, desc)
    if failure is not None:
        raise NoAnswer(f"goal {goal_id} is stuck (its workflow task fails: {failure}); see `perdure status {goal_id}`")
    queue = desc.task_queue
    if not await has_pollers(client, queue):
        raise NoAnswer(
            f"no worker polls task queue '{queue}', and {what} is read from goal {goal_id} by a query that a worker "
            "answers (for a finished goal too): start one (`perdure worker`) and try again"
        )
    handle = client.get_workflow_handle(goal_id)
    try:
        return await handle.query(query, *args, rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S))
    except RPCError as err:
        raise NoAnswer(f"no worker answered the query for {what} of goal {goal_id} ({err.message})") from None
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError) as err:
        # A worker of an older perdure has no such query.
        raise NoAnswer(f"the worker running goal {goal_id} cannot answer the query for {what}: {err}") from None


async def read_fork_point(client: Client, goal_id: str, node: str, premises: dict[str, str]) -> ForkPoint:
    point = await _query(
        client, goal_id, GoalWorkflow.fork_point, ForkPointInput(node=node, premises=premises), what="its fork point"
    )
    if point.refusal:
        raise ForkRefused(f"cannot fork goal {goal_id} at '{node}': {point.refusal}")
    return point


def fork_id(goal_id: str) -> str:
    """A new id naming the goal it forks (cut to fit the id pattern's 200 characters)."""
    return f"{goal_id[:180]}-fork-{uuid.uuid4().hex[:6]}"


def fork_spec(
    point: ForkPoint, goal_id: str, node: str, why: str, premises: dict[str, str], profile: str | None
) -> GoalSpec:
    """The original's spec with its current plan as a plan file (no planner call), the fork's
    premises and profile, where it came from, and the work it reuses by key."""
    assert point.spec is not None and point.plan is not None
    changes = dict(premises)
    if profile is not None:
        changes["profile"] = profile
    try:
        origin = ForkOrigin(goal_id=goal_id, node=node, why=why, changes=changes)
        fields = point.spec.model_dump()
        fields.update(
            plan=point.plan.model_dump(),
            premises=point.premises,
            model_profile=profile or point.spec.model_profile,
            forked_from=origin.model_dump(),
            reuse_outputs={k: ref.model_dump() for k, ref in point.reuse_outputs.items()},
        )
        return GoalSpec.model_validate(fields)
    except ValidationError as err:
        raise ForkRefused(describe_validation_error(err)) from None


# --- diff ---------------------------------------------------------------------------


class StepSide(BaseModel):
    """One step as one goal has it."""

    kind: str
    status: str
    output: str | None = Field(default=None, description="The output's digest.")
    key: str | None = None
    reused: bool = Field(default=False, description="Succeeded by reusing finished work, not by running.")
    tokens: int = 0
    cost_usd: float = 0.0


class StepDiff(BaseModel):
    name: str
    a: StepSide | None = None
    b: StepSide | None = None
    differs: list[str] = Field(
        default_factory=list,
        description="What differs: 'only in A' / 'only in B', 'status', 'output', 'cost' (only when both ran it: "
        "a reused step cost its goal nothing for the same work).",
    )
    tokens_delta: int = 0
    cost_delta_usd: float = 0.0


class Totals(BaseModel):
    a: int | float
    b: int | float
    delta: int | float


class GoalDiff(BaseModel):
    a: str
    b: str
    a_forked_from: ForkOrigin | None = None
    b_forked_from: ForkOrigin | None = None
    steps: list[StepDiff]
    same: list[str] = Field(description="Steps in both with the same status and output (and cost, when both ran).")
    differing: list[str]
    tokens: Totals
    cost_usd: Totals
    source: str = Field(
        default="progress snapshots",
        description="Both goals were read by their progress query (closed ones too): results have no per-step cost.",
    )


class GoalSide(BaseModel):
    goal_id: str
    snapshot: ProgressSnapshot
    reused: list[str]


async def read_side(client: Client, goal_id: str) -> GoalSide:
    """A goal's progress snapshot and which of its steps succeeded by reuse, read together."""
    snapshot, point = await asyncio.gather(
        _query(client, goal_id, GoalWorkflow.progress, what="its progress"),
        _query(client, goal_id, GoalWorkflow.fork_point, ForkPointInput(), what="its reused steps"),
    )
    return GoalSide(goal_id=goal_id, snapshot=snapshot, reused=point.reused_here)


def _side(side: GoalSide, name: str) -> StepSide | None:
    for node in side.snapshot.nodes:
        if node.name == name:
            return StepSide(
                kind=node.kind,
                status=node.status,
                output=side.snapshot.results.get(name),
                key=node.key,
                reused=name in side.reused,
                tokens=node.tokens,
                cost_usd=node.cost_usd,
            )
    return None


def diff_goals(a: GoalSide, b: GoalSide) -> GoalDiff:
    names = list(dict.fromkeys([n.name for n in a.snapshot.nodes] + [n.name for n in b.snapshot.nodes]))
    steps = []
    for name in names:
        left, right = _side(a, name), _side(b, name)
        step = StepDiff(name=name, a=left, b=right)
        if left is None or right is None:
            step.differs = ["only in B" if left is None else "only in A"]
        else:
            if left.status != right.status:
                step.differs.append("status")
            if left.output != right.output:
                step.differs.append("output")
            both_ran = not left.reused and not right.reused
            if both_ran and abs(left.cost_usd - right.cost_usd) > COST_EPSILON:
                step.differs.append("cost")
        step.tokens_delta = (right.tokens if right else 0) - (left.tokens if left else 0)
        step.cost_delta_usd = (right.cost_usd if right else 0.0) - (left.cost_usd if left else 0.0)
        steps.append(step)
    sa, sb = a.snapshot, b.snapshot
    return GoalDiff(
        a=a.goal_id,
        b=b.goal_id,
        a_forked_from=sa.forked_from,
        b_forked_from=sb.forked_from,
        steps=steps,
        same=[s.name for s in steps if not s.differs],
        differing=[s.name for s in steps if s.differs],
        tokens=Totals(a=sa.tokens, b=sb.tokens, delta=sb.tokens - sa.tokens),
        cost_usd=Totals(a=sa.cost_usd, b=sb.cost_usd, delta=sb.cost_usd - sa.cost_usd),
    )
