"""Node keys and graph order: pure logic, property-tested where an invariant exists."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.workflows.goal.contracts.plan import LlmStep, Plan, ToolStep
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.shared import graph

names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
text = st.text(min_size=1, max_size=40)
digests = st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20))
json_args = st.dictionaries(st.text(min_size=1, max_size=8), json_scalars, max_size=4)


@given(prompt=text, deps=st.dictionaries(names, digests, max_size=4))
def test_key_is_stable_across_runs_and_names(prompt, deps):
    a = LlmStep(name="one", prompt=prompt, needs=list(deps))
    b = LlmStep(name="two", prompt=prompt, needs=list(reversed(list(deps))))
    # Same kind, input and dependency outputs -> same key, whatever the step is called
    # or the order its dependencies are listed in.
    assert graph.node_key(a, deps) == graph.node_key(b, dict(reversed(list(deps.items()))))


@given(args=json_args, deps=st.dictionaries(names, digests, min_size=1, max_size=4), data=st.data())
@pytest.mark.slow
def test_key_changes_when_a_dependency_output_changes(args, deps, data):
    step = ToolStep(name="t", tool="read_file", args=args, needs=list(deps))
    changed_dep = data.draw(st.sampled_from(sorted(deps)))
    new_digest = data.draw(digests.filter(lambda d: d != deps[changed_dep]))
    assert graph.node_key(step, deps) != graph.node_key(step, {**deps, changed_dep: new_digest})


@given(first=text, second=text)
def test_key_changes_when_the_input_changes(first, second):
    a, b = LlmStep(name="s", prompt=first), LlmStep(name="s", prompt=second)
    assert (graph.node_key(a, {}) == graph.node_key(b, {})) == (first == second)


def test_key_depends_on_kind():
    tool = ToolStep(name="s", tool="read_file", args={"path": "x"})
    other = ToolStep(name="s", tool="list_dir", args={"path": "x"})
    assert graph.node_key(tool, {}) != graph.node_key(other, {})


def _plan() -> Plan:
    return Plan(
        steps=[
            LlmStep(name="a", prompt="a"),
            LlmStep(name="b", prompt="b"),
            LlmStep(name="c", prompt="c", needs=["a", "b"]),
            LlmStep(name="d", prompt="d", needs=["c"]),
            LlmStep(name="e", prompt="e", needs=["a"]),
        ]
    )


def _nodes(plan: Plan, **status) -> dict[str, Node]:
    return {
        s.name: Node(name=s.name, kind=s.kind, needs=s.needs, status=status.get(s.name, "pending")) for s in plan.steps
    }


def test_ready_set_follows_dependencies():
    plan = _plan()
    assert graph.ready_steps(plan, _nodes(plan)) == ["a", "b"]
    assert graph.ready_steps(plan, _nodes(plan, a="succeeded")) == ["b", "e"]
    assert graph.ready_steps(plan, _nodes(plan, a="succeeded", b="running")) == ["e"]
    assert graph.ready_steps(plan, _nodes(plan, a="succeeded", b="succeeded")) == ["c", "e"]
    assert graph.ready_steps(plan, _nodes(plan, a="failed", b="succeeded")) == []


def test_downstream_is_transitive():
    plan = _plan()
    assert graph.downstream(plan, "a") == ["c", "d", "e"]
    assert graph.downstream(plan, "b") == ["c", "d"]
    assert graph.downstream(plan, "d") == []


@given(st.permutations(["a", "b", "c", "d", "e"]))
def test_topological_order_puts_dependencies_first(order):
    steps = {s.name: s for s in _plan().steps}
    plan = Plan(steps=[steps[n] for n in order])
    placed = graph.topological_order(plan)
    assert sorted(placed) == sorted(order)
    for step in plan.steps:
        assert all(placed.index(d) < placed.index(step.name) for d in step.needs)


def _first_fit_order(plan: Plan) -> list[str]:
    """The definition of the stable order: repeatedly place the first step in plan order
    whose needs are all placed (the quadratic version topological_order replaced)."""
    placed: list[str] = []
    remaining = list(plan.steps)
    while remaining:
        step = next(s for s in remaining if set(s.needs) <= set(placed))
        placed.append(step.name)
        remaining.remove(step)
    return placed


@given(st.data())
def test_topological_order_is_the_stable_first_fit_order(data):
    size = data.draw(st.integers(min_value=1, max_value=12))
    steps = [
        LlmStep(
            name=f"s{i}", prompt="p", needs=[f"s{d}" for d in data.draw(st.sets(st.integers(0, i - 1)))] if i else []
        )
        for i in range(size)
    ]
    plan = Plan(steps=data.draw(st.permutations(steps)))
    assert graph.topological_order(plan) == _first_fit_order(plan)


@pytest.mark.slow
def test_topological_order_of_a_long_chain_listed_last_first():
    # 10,000 steps listed in reverse: the first-fit scan is quadratic (tens of seconds); the
    # report of a goal of that size runs inside one workflow task.
    steps = [LlmStep(name=f"s{i:05d}", prompt="p", needs=[f"s{i - 1:05d}"] if i else []) for i in range(10_000)]
    plan = Plan(steps=list(reversed(steps)))
    assert graph.topological_order(plan) == [s.name for s in steps]
