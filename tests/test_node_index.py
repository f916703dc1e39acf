"""The goal's status index agrees with a scan of every node, whatever happens to them.

`graph.ready_steps` and plain counting over the node table are the definitions;
the index must give the same answers (and in the same order: dispatch order is
recorded in history) after any sequence of status changes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perdure.workflows.goal.contracts.plan import LlmStep, Plan, ToolStep
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.rules.node_index import NodeIndex
from perdure.workflows.shared import graph
from perdure.workflows.shared.statuses import TERMINAL, NodeStatus

STATUSES: list[NodeStatus] = [
    "pending",
    "running",
    "blocked",
    "parked",
    "succeeded",
    "failed",
    "uncertain",
    "invalidated",
    "abandoned",
]
IN_FLIGHT = ("running", "blocked", "parked", "uncertain")


@st.composite
def plans(draw) -> Plan:
    """A DAG: each step may need any of the steps listed before it."""
    size = draw(st.integers(min_value=1, max_value=12))
    steps = []
    for i in range(size):
        needs = sorted(draw(st.sets(st.integers(min_value=0, max_value=i - 1), max_size=3))) if i else []
        kind = draw(st.sampled_from(["llm", "tool"]))
        common = {"name": f"s{i}", "needs": [f"s{n}" for n in needs]}
        steps.append(LlmStep(prompt="p", **common) if kind == "llm" else ToolStep(tool="read_file", **common))
    # Listed in a shuffled order: plan order is not dependency order.
    return Plan(steps=draw(st.permutations(steps)))


def table(plan: Plan) -> dict[str, Node]:
    return {s.name: Node(name=s.name, kind=s.kind, needs=list(s.needs)) for s in plan.steps}


def assert_agrees(index: NodeIndex, plan: Plan, nodes: dict[str, Node]) -> None:
    assert index.ready() == graph.ready_steps(plan, nodes)
    for status in STATUSES:
        assert index.count((status,)) == sum(1 for n in nodes.values() if n.status == status)
        assert index.names((status,)) == [n.name for n in nodes.values() if n.status == status]
    assert index.any(IN_FLIGHT) == any(n.status in IN_FLIGHT for n in nodes.values())
    assert index.names(IN_FLIGHT) == [n.name for n in nodes.values() if n.status in IN_FLIGHT]
    assert index.count(TERMINAL) == sum(1 for n in nodes.values() if n.status in TERMINAL)
    unsettled: dict[str, int] = {}
    for node in nodes.values():
        if node.status not in TERMINAL:
            unsettled[node.kind] = unsettled.get(node.kind, 0) + 1
    assert index.unsettled_by_kind() == unsettled


@settings(max_examples=200)
@given(plan=plans(), data=st.data())
@pytest.mark.slow
def test_the_index_answers_as_a_scan_would_after_any_status_changes(plan, data):
    nodes = table(plan)
    index = NodeIndex(plan, nodes)
    assert_agrees(index, plan, nodes)
    for _ in range(data.draw(st.integers(min_value=1, max_value=40))):
        name = data.draw(st.sampled_from(sorted(nodes)))
        index.set_status(nodes[name], data.draw(st.sampled_from(STATUSES)))
        assert_agrees(index, plan, nodes)
    # An index built from the same table now (as after continue-as-new) agrees too.
    assert_agrees(NodeIndex(plan, nodes), plan, nodes)


def test_a_node_status_cannot_be_written_past_the_index():
    node = Node(name="a", kind="llm")
    with pytest.raises(AttributeError, match="NodeIndex.set_status"):
        node.status = "running"
    assert node.status == "pending"
    node.preview = "other fields are written as usual"


def test_a_node_no_longer_in_the_table_does_not_move_the_counts():
    plan = Plan(steps=[LlmStep(name="a", prompt="p"), LlmStep(name="b", prompt="p", needs=["a"])])
    nodes = table(plan)
    index = NodeIndex(plan, nodes)
    voided = Node(name="a", kind="llm")  # a run's node replaced in the table by a new plan version
    index.set_status(voided, "succeeded")
    assert voided.status == "succeeded"
    assert index.count(("succeeded",)) == 0
    assert index.ready() == ["a"]


def test_an_index_knows_when_it_was_built_for_another_plan_or_table():
    plan = Plan(steps=[LlmStep(name="a", prompt="p")])
    nodes = table(plan)
    index = NodeIndex(plan, nodes)
    assert index.fits(plan, nodes)
    assert not index.fits(Plan(steps=[LlmStep(name="a", prompt="p")]), nodes)
    nodes["b"] = Node(name="b", kind="llm")
    assert not index.fits(plan, nodes)
