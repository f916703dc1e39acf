"""The frontier's pure rules (workflows/goal/rules/frontier.py) and the node index of a
goal whose steps have no node yet or are stored in the past."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from perdure.workflows.goal.contracts.plan import Plan, ToolStep
from perdure.workflows.goal.contracts.state import GoalState, Node, PastLog, PlanVersion
from perdure.workflows.goal.rules import frontier
from perdure.workflows.goal.rules.forking import ForkPointInput, fork_point
from perdure.workflows.goal.rules.node_index import NodeIndex
from tests.builders import spec

SIZES = st.integers(min_value=0, max_value=3_000)


@given(SIZES.flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, max(n - 1, 0))))))
def test_the_stored_bitmap_round_trips_through_its_carried_text(case):
    size, chosen = case
    chosen = {i for i in chosen if i < size}
    bits = bytearray((size + 7) // 8)
    for i in chosen:
        frontier.set_bit(bits, i)
    names = [f"s{i}" for i in range(size)]
    carried = frontier.encode_bits(bits)
    assert set(frontier.marked(frontier.decode_bits(carried, size), names)) == {names[i] for i in chosen}
    assert (carried == "") == (not chosen)


def chain(n: int) -> Plan:
    steps = [ToolStep(name=f"s{i}", tool="list_dir", needs=[f"s{i - 1}"] if i else []) for i in range(n)]
    return Plan.model_construct(steps=steps)


def node(name: str, status: str) -> Node:
    made = Node(name=name, kind="tool")
    object.__setattr__(made, "__dict__", {**made.__dict__, "status": status})
    return made


def test_a_settled_step_is_stored_only_once_no_step_to_start_needs_it():
    held: set[str] = set()
    statuses = {"a": "succeeded", "b": "pending", "c": "running"}
    assert not frontier.storable(node("a", "succeeded"), ["b"], statuses.__getitem__, held)
    assert frontier.storable(node("a", "succeeded"), ["c"], statuses.__getitem__, held)
    assert not frontier.storable(node("a", "succeeded"), ["c"], statuses.__getitem__, {"a"})
    assert not frontier.storable(node("a", "uncertain"), [], statuses.__getitem__, held)


def test_the_index_counts_steps_without_a_node_as_pending_and_stored_ones_by_status():
    """A chain of 10: s0-s5 stored, s6 succeeded with a node, s7-s9 have none yet."""
    plan = chain(10)
    nodes = {"s6": node("s6", "succeeded")}
    stored = {f"s{i}" for i in range(6)}
    index = NodeIndex(plan, nodes, stored, {"succeeded": {"tool": 6}})
    assert index.total == 10
    assert index.counts() == {"succeeded": 7, "pending": 3}
    assert index.ready() == ["s7"]
    assert index.names(("pending",)) == ["s7", "s8", "s9"]
    assert index.names(("succeeded",)) == ["s6"]  # stored steps are counted, never listed
    assert index.status_of("s2") == "stored" and index.status_of("s8") == "pending"
    index.stored([nodes["s6"]])
    del nodes["s6"]
    assert index.fits(plan, nodes) and index.counts() == {"succeeded": 7, "pending": 3}


def test_a_goal_with_stored_steps_is_not_forked_and_says_why(tmp_path):
    plan = chain(1_200)
    state = GoalState(
        spec=spec(tmp_path),
        plan_versions=[PlanVersion(version=1, plan=plan, reason="plan file", source="plan-file")],
        past=PastLog(plan_version=1, count=600, counts={"succeeded": {"tool": 600}}),
    )
    point = fork_point(state, ForkPointInput(node="s700"))
    assert point.plan is None and "keeps 600 settled ones in the artifact store" in point.refusal
