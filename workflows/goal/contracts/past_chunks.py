"""What a large goal keeps out of its carried state, by reference: the settled steps its
frontier no longer needs (their nodes, in chunks) and its plan (its steps, in chunks).
Pure contracts; workflows/goal/past.py stores and loads them, workflows/goal/rules/frontier.py
has the rules.

A goal whose plan has at least FRONTIER_STEPS steps (rules/frontier.py) carries into each
new run what is in flight, ready or about to be, plus these refs and counts, so the cost of
a run grows with its frontier and not with the steps settled before it.
"""

from __future__ import annotations

from pydantic import BaseModel

from perdure.workflows.goal.contracts.goal_contracts import StepOutcome
from perdure.workflows.goal.contracts.plan import PlanStep
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.shared.contracts import ArtifactRef

# Activity names (stable: histories depend on them); local activities, like the decision log's.
WRITE_PAST = "perdure.past.write_chunk"
READ_PAST = "perdure.past.read_chunk"
WRITE_PLAN = "perdure.plan.write_chunk"
READ_PLAN = "perdure.plan.read_chunk"


class WritePastInput(BaseModel):
    nodes: list[Node]


class PastChunk(BaseModel):
    """Settled nodes stored as one JSON object."""

    nodes: list[Node]


class WritePlanInput(BaseModel):
    steps: list[PlanStep]


class PlanChunk(BaseModel):
    """Consecutive steps of a plan, stored as one JSON object."""

    steps: list[PlanStep]


class ReadChunkInput(BaseModel):
    ref: ArtifactRef


class ReadPlanResult(BaseModel):
    """A plan chunk as its JSON text: the worker that read it validated it (workflows/goal/
    plan_cache.py); decoding it as steps here would validate it again in the workflow task."""

    text: str


def step_outcome(node: Node) -> StepOutcome:
    """A step's outcome as the report lists it (closing.py for the current steps, the report
    activity for stored ones). Built field by field: validating the node from its
    attributes looked up `plan_version`, which a node has not, through pydantic's slow
    missing-attribute path (most of a 1,000-step goal's report time)."""
    return StepOutcome(
        name=node.name,
        kind=node.kind,
        status=node.status,
        output=node.output,
        error=node.error,
        tokens=node.tokens,
        cost_usd=node.cost_usd,
        reused=node.reused,
    )
