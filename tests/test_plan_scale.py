"""Plan lookups and validation by index rather than by scan (bench/scale.py found both
quadratic; `make bench` measures their speed): the same answers as before."""

from __future__ import annotations

import pytest

from perdure.workflows.goal.contracts.plan import Plan, ToolStep


def big_plan(n: int) -> Plan:
    # Built without validation: MAX_STEPS keeps real plans small, the methods must not care.
    steps = [ToolStep(name=f"s{i:05d}", tool="list_dir", needs=[f"s{i - 1:05d}"] if i else []) for i in range(n)]
    return Plan.model_construct(steps=steps)


def test_step_finds_every_step_and_refuses_unknown_names():
    plan = big_plan(50)
    assert [plan.step(s.name) for s in plan.steps] == plan.steps
    with pytest.raises(KeyError):
        plan.step("missing")


def test_step_follows_a_replaced_or_edited_step_list():
    plan = big_plan(5)
    plan.step("s00004")
    shorter = plan.model_copy(update={"steps": plan.steps[2:]})
    assert shorter.step("s00004") is plan.steps[4]
    with pytest.raises(KeyError):
        shorter.step("s00000")
    plan.steps.reverse()
    assert plan.step("s00000").name == "s00000"


def test_lookup_leaves_equality_and_serialisation_alone():
    plan = Plan.model_validate(big_plan(5).model_dump())
    twin = Plan.model_validate(plan.model_dump())
    plan.step("s00003")
    assert plan == twin and twin == plan
    assert plan.model_dump() == twin.model_dump()
    assert plan.model_dump_json() == twin.model_dump_json()


def test_duplicate_names_are_still_named_once_each_in_order():
    steps = [ToolStep(name=n, tool="list_dir") for n in ("b", "a", "b", "c", "a", "b")]
    with pytest.raises(ValueError, match="repeated: a, b$"):
        Plan.model_construct(steps=steps)._graph_is_sound()
