"""Node keys and graph order: pure logic, property-tested where an invariant exists."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workflows import graph
from workflows.plan import LlmStep, Plan, ToolStep
from workflows.state import Node

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
