"""The frontier's pure rules (workflows/goal/rules/frontier.py) and the node index of a
goal whose steps have no node yet or are stored in the past."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from perdure.workflows.goal import plan_cache
from perdure.workflows.goal.contracts.plan import Plan, StoredPlan, ToolStep
from perdure.workflows.goal.contracts.state import GoalState, Node, PastLog, PlanVersion
from perdure.workflows.goal.rules import frontier, risk_order
from perdure.workflows.goal.rules.forking import ForkPointInput, fork_point
from perdure.workflows.goal.rules.node_index import NodeIndex
from perdure.workflows.shared.contracts import ArtifactRef
from perdure.workflows.shared.tool_specs import ToolSpec
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


@pytest.mark.parametrize("dependant", ["pending", "running", "blocked", "parked", "offline", "uncertain"])
def test_a_settled_step_is_not_stored_while_a_step_that_needs_it_has_not_settled(dependant):
    """A dependant in flight or waiting reads its inputs again (an agent's next turn, a retried
    call): the step it needs must still have its node then."""
    statuses = {"a": "succeeded", "b": dependant}
    assert not frontier.storable(node("a", "succeeded"), ["b"], statuses.__getitem__, set())


@pytest.mark.parametrize("dependant", ["succeeded", "failed", "abandoned", "invalidated", "stored"])
def test_a_settled_step_is_stored_once_every_step_that_needs_it_settled(dependant):
    statuses = {"a": "succeeded", "b": dependant}
    assert frontier.storable(node("a", "succeeded"), ["b"], statuses.__getitem__, set())
    assert not frontier.storable(node("a", "succeeded"), ["b"], statuses.__getitem__, {"a"})  # a question names it
    assert not frontier.storable(node("a", "uncertain"), [], statuses.__getitem__, set())


def test_a_step_a_write_not_settled_builds_on_stays_until_the_write_settles():
    """r0 -> r1 -> w (write_file), and x apart: what w is checked against is what r0 and r1
    saw, so they are pinned while w is pending and free once it settled; x never is."""
    steps = [
        ToolStep(name="r0", tool="read_file", args={"path": "a.txt"}),
        ToolStep(name="r1", tool="read_file", args={"path": "b.txt"}, needs=["r0"]),
        ToolStep(name="w", tool="write_file", args={"path": "a.txt", "content": "x"}, needs=["r1"]),
        ToolStep(name="x", tool="read_file", args={"path": "c.txt"}),
    ]
    plan = Plan(steps=steps)
    assert frontier.write_steps(plan) == {"w"}
    statuses = {"r0": "succeeded", "r1": "succeeded", "w": "pending", "x": "succeeded"}
    assert frontier.upstream_of_unsettled_writes(plan, statuses.__getitem__) == {"r0", "r1"}
    statuses["w"] = "succeeded"
    assert frontier.upstream_of_unsettled_writes(plan, statuses.__getitem__) == set()


def test_an_emergency_stop_abandons_the_steps_without_a_node_by_count_and_readies_the_wrap_up():
    """A chain of 1,200 and a wrap-up step after it; s0 and s1 have nodes. The stop abandons
    the other 1,198 without a node each, the wrap-up step becomes ready, and an index built
    again from the state (GoalState.stopped_untouched) says the same."""
    plan = chain(1_200)
    wrap = ToolStep(name="notify", tool="list_dir", needs=["s1199"], wrap_up=True)
    plan = Plan.model_construct(steps=[*plan.steps, wrap])
    nodes = {"s0": node("s0", "succeeded"), "s1": node("s1", "abandoned"), "notify": node("notify", "pending")}
    index = NodeIndex(plan, nodes)
    assert index.count(("pending",)) == 1_199 and index.ready() == []
    index.abandon_untouched()
    assert index.counts() == {"succeeded": 1, "abandoned": 1_199, "pending": 1}
    assert index.ready() == ["notify"] and index.status_of("s500") == "abandoned"
    rebuilt = NodeIndex(plan, nodes, untouched="abandoned")
    assert rebuilt.counts() == index.counts() and rebuilt.ready() == ["notify"]


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


@pytest.mark.parametrize("stored", [0, 600])
def test_a_large_goal_is_not_forked_and_says_why(tmp_path, stored):
    """Refused on the plan's size, whether or not any step is stored yet: its node table holds
    only its frontier from the start."""
    plan = chain(1_200)
    state = GoalState(
        spec=spec(tmp_path),
        plan_versions=[PlanVersion(version=1, plan=plan, reason="plan file", source="plan-file")],
        past=PastLog(plan_version=1, count=stored, counts={"succeeded": {"tool": stored}}) if stored else None,
    )
    point = fork_point(state, ForkPointInput(node="s700"))
    assert point.plan is None and "the goal's plan has 1200 steps" in point.refusal
    assert "1000 steps or more cannot be forked" in point.refusal


def test_a_goal_started_again_under_its_id_never_takes_the_risk_facts_of_the_chain_before():
    """A worker keeps a stored plan for its goal's next runs, with the risk facts built on it
    (plan_cache.py). `perdure start --replace` starts a new chain under the same goal id, whose
    tools may say another risk for the same step: that chain's plan is its own."""
    steps = [ToolStep(name=f"s{i}", tool="send_invoice", args={}) for i in range(3)]
    chunk = ArtifactRef(digest="sha256:" + "d" * 64, size=1, media_type="application/json")
    stored = StoredPlan(chunks=[chunk], steps=3)

    def tools(risk: str) -> dict[str, ToolSpec]:
        spec = ToolSpec(name="send_invoice", risk=risk, replay="keyed", description="", args_model=BaseModel)
        return {"send_invoice": spec}

    first = plan_cache.plan_of(("goal-x", "run-1"), stored, [steps])
    assert risk_order.risk_facts(first, tools("read")).risk == {}
    assert plan_cache.plan_of(("goal-x", "run-1"), stored, [steps]) is first  # the same chain's next run
    again = plan_cache.plan_of(("goal-x", "run-2"), stored, [steps])
    assert again is not first
    assert risk_order.risk_facts(again, tools("irreversible")).risk["s0"] == ("irreversible", ["send_invoice"])
