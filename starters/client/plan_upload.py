"""A plan file of thousands of steps goes to the artifact store before its goal starts, and
the goal is started with its refs (GoalSpec.stored_plan) instead of its steps: a workflow
task that decoded and validated 100,000 steps at once would outlast the SDK's two seconds.
The goal loads the chunks one per workflow task (workflows/goal/past.py).

Client-side; chunks are written exactly as the goal's own store would write them
(content-addressed: the same plan is the same artifacts).
"""

from __future__ import annotations

from perdure.activities.artifacts import ArtifactStore
from perdure.workflows.goal.contracts.goal_contracts import GoalSpec
from perdure.workflows.goal.contracts.past_chunks import PlanChunk
from perdure.workflows.goal.contracts.plan import StoredPlan
from perdure.workflows.goal.rules import frontier


async def with_stored_plan(spec: GoalSpec, store: ArtifactStore) -> GoalSpec:
    """`spec` with a large plan file stored and named by reference; any other spec as it is."""
    plan = spec.plan
    if plan is None or not frontier.is_large(len(plan.steps)):
        return spec
    size = frontier.PLAN_CHUNK_STEPS
    refs = [
        await store.aput_text(PlanChunk(steps=plan.steps[i : i + size]).model_dump_json(), "application/json")
        for i in range(0, len(plan.steps), size)
    ]
    stored = StoredPlan(chunks=refs, steps=len(plan.steps), question_deadline=plan.question_deadline)
    return spec.model_copy(update={"plan": None, "stored_plan": stored})
