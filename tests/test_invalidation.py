"""Invalidation by premise and by rewind: pure, property-tested for closure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from perdure.workflows.goal.contracts.plan import LlmStep, Plan
from perdure.workflows.goal.rules.invalidation import held_by, invalidate_by_premise, invalidate_from
from perdure.workflows.shared.graph import downstream

VALUES = ["all", "module_a", "module_b"]


@st.composite
def plans(draw):
    size = draw(st.integers(min_value=1, max_value=10))
    steps = []
    for i in range(size):
        needs = draw(st.lists(st.sampled_from([f"s{j}" for j in range(i)]), unique=True, max_size=3)) if i else []
        premises = draw(
            st.one_of(
                st.just({}),
                st.just({"scope": None}),
                st.lists(st.sampled_from(VALUES), min_size=1, unique=True).map(lambda v: {"scope": v}),
            )
        )
        steps.append(LlmStep(name=f"s{i}", prompt=f"p{i}", needs=needs, premises=premises))
    plan = Plan(steps=steps)
    statuses = {
        s.name: draw(st.sampled_from(["succeeded", "succeeded", "pending", "failed", "running"])) for s in steps
    }
    return plan, statuses


@given(plans(), st.sampled_from(VALUES))
def test_narrow_partitions_what_ran_and_is_closed(plan_and_statuses, new_value):
    plan, statuses = plan_and_statuses
    result = invalidate_by_premise(plan, statuses, {"scope": new_value})
    void, kept, unsure = set(result.void), set(result.kept), set(result.to_confirm)
    ran = {n for n, s in statuses.items() if s in ("succeeded", "failed", "running")}
    # Every node that ran is in exactly one list; nothing else is.
    assert void | kept | unsure == ran
    assert not (void & kept) and not (void & unsure) and not (kept & unsure)
    for name in void:
        # Closure: whatever consumed void output is void.
        assert {d for d in downstream(plan, name) if d in ran} <= void
    for name in kept:
        step = plan.step(name)
        # Nothing kept depends on void or undecided work, and its own premise still holds.
        ancestors = {a for a in ran if name in downstream(plan, a)}
        assert not ancestors & (void | unsure)
        assert "scope" not in step.premises or (
            step.premises["scope"] is not None and new_value in step.premises["scope"]
        )


def _chain() -> tuple[Plan, dict[str, str]]:
    plan = Plan(
        steps=[
            LlmStep(name="survey", prompt="p", premises={"scope": ["all", "module_a"]}),
            LlmStep(name="scan-b", prompt="p", premises={"scope": ["all"]}),
            LlmStep(name="style", prompt="p"),
            LlmStep(name="judge", prompt="p", premises={"scope": None}),
            LlmStep(name="merge", prompt="p", needs=["scan-b", "style"]),
            LlmStep(name="final", prompt="p", needs=["judge"]),
            LlmStep(name="later", prompt="p", needs=["merge"]),
        ]
    )
    statuses = {s.name: "succeeded" for s in plan.steps} | {"later": "pending", "final": "pending"}
    return plan, statuses


def test_narrow_example():
    plan, statuses = _chain()
    result = invalidate_by_premise(plan, statuses, {"scope": "module_a"})
    assert result.void == ["scan-b", "merge"]
    assert result.kept == ["survey", "style"]
    assert result.to_confirm == ["judge"]
    assert held_by(plan, result.to_confirm) == ["final"]


def test_narrow_within_the_declared_values_keeps_everything_declared():
    plan, statuses = _chain()
    result = invalidate_by_premise(plan, statuses, {"scope": "all"})
    assert result.void == [] and result.to_confirm == ["judge"]


def test_rewind_voids_the_node_and_its_downstream():
    plan, statuses = _chain()
    statuses["later"] = "succeeded"
    result = invalidate_from(plan, statuses, "style")
    assert result.void == ["style", "merge", "later"]
    assert "survey" in result.kept and "scan-b" in result.kept


def test_a_rewind_reaches_downstream_work_waiting_for_a_person_or_parked():
    plan, statuses = _chain()
    statuses["merge"], statuses["later"] = "blocked", "parked"
    assert invalidate_from(plan, statuses, "style").void == ["style", "merge", "later"]
