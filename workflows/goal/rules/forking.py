"""What a goal offers a fork of itself (`perdure fork GOAL NODE`): its current plan, and the
finished work a new goal may take as its own by node key. Pure: read off the state by the
goal's `fork_point` query, so a running and a finished goal answer alike and the goal itself
is never changed.

A fork runs NODE and everything downstream of it anew, and so does every step whose
declared premise a `--set` change leaves it not holding for (a loose `null` premise, or a
list without the new value), with its downstream. Everything else the goal finished is
offered under the key the fork will compute for it (the fork's premises, the same
dependency outputs), so the fork's scheduler finds it as it finds its own finished work.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

from perdure.workflows.goal.contracts.goal_contracts import GoalSpec
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.goal.contracts.state import GoalState
from perdure.workflows.goal.rules import frontier
from perdure.workflows.shared.contracts import ArtifactRef
from perdure.workflows.shared.graph import downstream, node_key, topological_order

FORK_POINT_QUERY = "fork_point"
# A refusal names the plan's steps; a 10,000-step plan is named by its first few.
NAMED_STEPS = 12


class ForkPointInput(BaseModel):
    node: str | None = Field(
        default=None, description="The step the fork runs anew from; None: only what the goal is (for a diff)."
    )
    premises: dict[str, str] = Field(default_factory=dict, description="The fork's premise changes (`--set`).")


class ForkPoint(BaseModel):
    """The goal as a fork of it starts from, or why it cannot be forked there."""

    refusal: str | None = None
    spec: GoalSpec | None = Field(default=None, description="The goal's spec, without its plan file and reused work.")
    plan: Plan | None = None
    plan_version: int = 0
    premises: dict[str, str] = Field(default_factory=dict, description="The fork's: the goal's now, with the changes.")
    reuse_outputs: dict[str, ArtifactRef] = Field(
        default_factory=dict, description="Node key (as the fork computes it) -> the goal's output."
    )
    reused: list[str] = Field(default_factory=list, description="Steps the fork takes as done, in plan order.")
    rerun: dict[str, str] = Field(default_factory=dict, description="Step -> why the fork runs it, in plan order.")
    warnings: list[str] = Field(default_factory=list)
    reused_here: list[str] = Field(
        default_factory=list, description="Steps of this goal that succeeded by reusing finished work, not by running."
    )


def fork_point(state: GoalState, request: ForkPointInput) -> ForkPoint:
    plan = state.plan
    if plan is None:
        return ForkPoint(refusal="the goal has no plan yet (it is still planning): fork it once it has one")
    if frontier.is_large(len(plan.steps)):
        # Its node table holds only its frontier: the work a fork would reuse is stored in
        # chunks or not touched yet (workflows/goal/past.py), and a fork's input would carry the plan.
        return ForkPoint(
            refusal=f"the goal's plan has {len(plan.steps)} steps: a goal of {frontier.FRONTIER_STEPS} steps or more "
            "cannot be forked; start a new goal with a plan file instead"
        )
    point = ForkPoint(
        spec=state.spec.model_copy(update={"plan": None, "stored_plan": None, "reuse_outputs": {}}),
        plan=plan,
        plan_version=len(state.plan_versions),
        premises={**state.premises, **request.premises},
        reused_here=[s.name for s in plan.steps if _succeeded(state, s.name) and state.nodes[s.name].reused],
    )
    if request.node is None:
        return point
    refusal = _refusal(state, plan, request)
    if refusal:
        return ForkPoint(refusal=refusal)
    point.warnings = _premise_warnings(state, plan, request.premises)
    forced = _rerun_by_the_fork(state, plan, request.node, request.premises)
    while True:
        reuse, reused, rerun, twins = _reusable(state, plan, point.premises, forced)
        if not twins:
            break
        # A step the fork runs anew whose key a reused step has would be "reused" by that
        # key: the twin runs anew with it (the scheduler lets them share one run).
        forced.update(twins)
    order = [s.name for s in plan.steps]
    point.reuse_outputs = reuse
    point.reused = [n for n in order if n in reused]
    point.rerun = {n: rerun[n] for n in order if n in rerun}
    return point


def _succeeded(state: GoalState, name: str) -> bool:
    node = state.nodes.get(name)
    return node is not None and node.status == "succeeded" and node.output is not None


def _refusal(state: GoalState, plan: Plan, request: ForkPointInput) -> str | None:
    node, version = request.node, len(state.plan_versions)
    names = [s.name for s in plan.steps]
    if node not in names:
        older = [r.plan_version for r in state.retired_nodes if r.node.name == node]
        shown = ", ".join(names[:NAMED_STEPS]) + (" …" if len(names) > NAMED_STEPS else "")
        if older:
            return (
                f"step '{node}' is of plan v{max(older)}, not of the current plan v{version}: fork from a step of "
                f"the current plan ({shown})"
            )
        return f"no step '{node}' in the goal's plan (v{version}); its steps: {shown}"
    declared = _declared(plan)
    unknown = sorted(k for k in request.premises if k not in declared and k not in state.premises)
    if unknown:
        named = ", ".join(sorted(set(declared) | set(state.premises))) or "none"
        return (
            f"premise {', '.join(repr(k) for k in unknown)} is not a premise of the goal and no step declares it "
            f"(premises the goal and its steps name: {named})"
        )
    return None


def _declared(plan: Plan) -> dict[str, list[str]]:
    """Premise -> the steps that declare it."""
    declared: dict[str, list[str]] = {}
    for step in plan.steps:
        for key in step.premises:
            declared.setdefault(key, []).append(step.name)
    return declared


def _premise_warnings(state: GoalState, plan: Plan, changes: Mapping[str, str]) -> list[str]:
    declared, warnings = _declared(plan), []
    for key, value in sorted(changes.items()):
        if state.premises.get(key) == value:
            warnings.append(f"premise {key} is already {value} in the goal: it re-runs nothing")
        elif key not in declared:
            warnings.append(
                f"no step declares premise {key}: nothing re-runs for it, only the steps that run anew see {value}"
            )
    return warnings


def _rerun_by_the_fork(state: GoalState, plan: Plan, node: str, changes: Mapping[str, str]) -> dict[str, str]:
    """Step -> why the fork runs it whatever the goal finished: NODE and its downstream, and
    each step a premise change leaves without a valid output, and its downstream."""
    rerun = {node: "the fork's step"}
    for name in downstream(plan, node):
        rerun.setdefault(name, f"downstream of {node}")
    for step in plan.steps:
        for key, value in sorted(changes.items()):
            if key not in step.premises or state.premises.get(key) == value:
                continue
            holds_for = step.premises[key]
            if holds_for is not None and value in holds_for:
                continue  # its output holds for the new value too (as a narrow keeps it)
            rerun.setdefault(step.name, f"declares premise {key}")
            for name in downstream(plan, step.name):
                rerun.setdefault(name, f"downstream of {step.name} (premise {key})")
    return rerun


def _reusable(
    state: GoalState, plan: Plan, premises: Mapping[str, str], forced: Mapping[str, str]
) -> tuple[dict[str, ArtifactRef], set[str], dict[str, str], dict[str, str]]:
    """(key -> output, steps reused, step -> why it runs, twins): a step is reused when it
    succeeded, is not forced, and every step it needs is reused; its key is the one the fork
    computes, with the fork's premises and the reused outputs it consumes."""
    reuse: dict[str, ArtifactRef] = {}
    reused: dict[str, str] = {}  # step -> its key
    digests: dict[str, str] = {}
    rerun = dict(forced)
    runs_anew_by_key: dict[str, str] = {}
    for name in topological_order(plan):
        step, node = plan.step(name), state.nodes.get(name)
        missing = [d for d in step.needs if d not in digests]
        if name not in rerun:
            if node is None or node.status != "succeeded" or node.output is None:
                rerun[name] = f"{node.status if node else 'pending'} in the goal"
            elif missing:
                rerun[name] = f"needs {missing[0]}, which runs anew"
        key = None if missing else node_key(step, {d: digests[d] for d in step.needs}, premises)
        if name in rerun:
            if key is not None and name in forced:
                runs_anew_by_key.setdefault(key, name)
            continue
        assert node is not None and node.output is not None and key is not None
        reuse[key], reused[name], digests[name] = node.output, key, node.output.digest
    twins = {
        name: f"the same work as {runs_anew_by_key[key]}, which runs anew"
        for name, key in reused.items()
        if key in runs_anew_by_key
    }
    return reuse, set(reused), rerun, twins
