"""A worker's validated large plans, by content: what lets a large goal's next run on the same
worker start without validating its plan again (workflows/goal/past.py loads it).

A run of a large goal loads its plan by local activities (recorded: a replay, and every worker,
sees the same text) and needs it validated, with the graph and risk facts built on it: a second
or more per 100,000 steps, in every run. The text is content-addressed, so the worker keeps what
it validated by digest: the activity that reads a chunk validates it (off the workflow task, in
the activity's thread), and the goal takes the validated steps from here, or validates the text
itself when they are not here (a replay on another worker, or evicted meanwhile). What the goal
decides is the same either way (the same text is the same plan); only the time differs.

Plans and their steps are never changed in place by the goal's code (a plan change is a new
plan), so runs of one goal on one worker share a plan object and what is derived and kept beside
it (rules/node_index.py plan_graph, rules/risk_order.py risk_facts: the latter depends on the
goal's tools, so plans are never shared between goals). Bounded, the oldest going first. Workflow
tasks and activities of different goals run in threads of their own; each step here is one
dict operation (atomic in CPython) or works on a copy, so no lock is needed (a workflow module
imports no threading: tests/test_workflow_code_sources.py), and a race costs at most a
validation done twice.
"""

from __future__ import annotations

from perdure.workflows.goal.contracts.migrations import collector_paused
from perdure.workflows.goal.contracts.past_chunks import PlanChunk
from perdure.workflows.goal.contracts.plan import Plan, StoredPlan, mark_checked
from perdure.workflows.shared.contracts import ArtifactRef

# Steps kept validated (about a kilobyte each in memory), and plans.
PLAN_STEPS_CACHED = 100_000
PLANS_CACHED = 2

_chunks: dict[str, list] = {}  # chunk digest -> its validated steps
_plans: dict[tuple, Plan] = {}  # (goal id, first run id, chunk digests, other fields) -> the plan


def validated(ref: ArtifactRef, text: str) -> list:
    """The steps of the plan chunk `text` (whose digest `ref` names), validated once."""
    steps = _chunks.get(ref.digest)
    if steps is not None:
        return steps
    with collector_paused():
        steps = PlanChunk.model_validate_json(text).steps
    _chunks[ref.digest] = steps
    _evict(_chunks, lambda kept: sum(len(s) for s in kept.values()) > PLAN_STEPS_CACHED)
    return steps


def plan_of(owner: tuple[str, str], stored: StoredPlan, chunk_steps: list[list]) -> Plan:
    """The plan whose chunks hold `chunk_steps` (each validated as it was read: `validated`), as
    its goal had it in its last run on this worker. `owner`: the goal's id and the run id of
    its chain's first run, so a goal started again under the same id (`perdure start
    --replace`, whose tools may say other risks) never takes the risk facts kept beside
    another chain's plan."""
    deadline = stored.question_deadline.model_dump_json() if stored.question_deadline is not None else None
    key = (*owner, tuple(ref.digest for ref in stored.chunks), deadline)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    steps = [step for part in chunk_steps for step in part]
    # Validated when it was adopted (a plan file the client stored: by the planner, before it
    # adopts it), and each chunk as it was read: the graph is not checked again.
    plan = Plan.model_construct(steps=steps, question_deadline=stored.question_deadline)
    mark_checked(plan)
    _plans[key] = plan
    _evict(_plans, lambda kept: len(kept) > PLANS_CACHED)
    return plan


def _evict(cache: dict, too_big) -> None:
    """Drop the oldest entries while `too_big(a copy of cache)` holds, keeping at least one."""
    while True:
        kept = dict(cache)  # one copy: another thread may add or drop meanwhile
        if len(kept) <= 1 or not too_big(kept):
            return
        cache.pop(next(iter(kept)), None)
