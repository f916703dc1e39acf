"""Budget gates: every action, the numbers in the reasons, the wrap-up whitelist, monotonicity."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.workflows.goal.contracts.goal_contracts import Budget
from perdure.workflows.goal.contracts.state import KindStats
from perdure.workflows.goal.rules.estimates import KindEstimate, estimate_kind
from perdure.workflows.shared.budget import ACTION_SEVERITY, BudgetUse, budget_fractions, emergency_check, gate

SMALL = KindEstimate(
    tokens_p50=100,
    tokens_p80=200,
    cost_p50=0.001,
    cost_p80=0.002,
    seconds_p50=1,
    seconds_p80=2,
    samples=10,
    from_defaults=False,
)
TWELVE_AGENTS = estimate_kind(
    KindStats(runs=12, tokens=[6_000] * 12, costs_usd=[0.05] * 12, seconds=[60.0] * 12), "agent"
)


def test_no_limits_dispatches_whatever_was_used():
    decision = gate(
        Budget(), BudgetUse(tokens=10**9, cost_usd=1e6, wall_seconds=1e7), SMALL, node_kind="agent", wrap_up=False
    )
    assert decision.action == "dispatch" and decision.fraction_used == {}
    assert emergency_check(Budget(), BudgetUse(tokens=10**9)) is None


def test_within_budget_dispatches():
    decision = gate(Budget(max_tokens=50_000), BudgetUse(tokens=1_000), SMALL, node_kind="llm", wrap_up=False)
    assert decision.action == "dispatch"
    assert decision.fraction_used == {"tokens": pytest.approx(0.02)}
    assert "2%" in decision.reason


def test_soft_gate_degrades_and_says_why():
    decision = gate(Budget(max_cost_usd=10.0), BudgetUse(cost_usd=7.5), SMALL, node_kind="llm", wrap_up=False)
    assert decision.action == "degraded" and decision.dimension == "cost_usd"
    assert "75%" in decision.reason and "$7.50 of $10.00" in decision.reason and "70% soft gate" in decision.reason
    custom = gate(
        Budget(max_cost_usd=10.0), BudgetUse(cost_usd=7.5), SMALL, node_kind="llm", wrap_up=False, soft_fraction=0.8
    )
    assert custom.action == "dispatch"


def test_hard_gate_lets_only_wrap_up_run():
    budget, used = Budget(max_tokens=50_000, max_wall_seconds=3600), BudgetUse(tokens=50_000, wall_seconds=100)
    held = gate(budget, used, SMALL, node_kind="agent", wrap_up=False)
    assert held.action == "wrap_up_only" and held.dimension == "tokens"
    assert "tokens at 100% (50,000 tokens of 50,000 tokens)" in held.reason and "agent node not started" in held.reason
    report = gate(budget, used, SMALL, node_kind="report", wrap_up=True)
    assert report.action == "degraded" and "past the hard gate" in report.reason
    # Below the soft gate a wrap-up node dispatches normally, and its estimate is never checked.
    huge = SMALL.model_copy(update={"tokens_p80": 10**9})
    assert gate(budget, BudgetUse(tokens=10), huge, node_kind="report", wrap_up=True).action == "dispatch"


def test_estimate_that_would_overrun_is_skipped_with_numbers():
    decision = gate(
        Budget(max_tokens=50_000), BudgetUse(tokens=47_900), TWELVE_AGENTS, node_kind="agent", wrap_up=False
    )
    assert decision.action == "skip" and decision.dimension == "tokens"
    assert (
        "estimated 6,000 tokens (P80 of 12 agent nodes) would exceed the remaining 2,100 of 50,000 tokens"
        in decision.reason
    )


def test_skip_names_every_overrun_and_the_worst_decides():
    budget = Budget(max_tokens=50_000, max_cost_usd=1.0, max_wall_seconds=600)
    used = BudgetUse(tokens=46_000, cost_usd=0.5, wall_seconds=590)
    decision = gate(budget, used, TWELVE_AGENTS, node_kind="agent", wrap_up=False)
    # tokens would reach 104%, wall time 108%: wall time decides, both are named, cost (55%) is not.
    assert decision.action == "skip" and decision.dimension == "wall_seconds"
    assert "the remaining 4,000 of 50,000 tokens" in decision.reason
    expected = "estimated 60 s (P80 of 12 agent nodes) would exceed the remaining 10 s of the 10 min active wall time"
    assert expected + " budget" in decision.reason
    assert "cost" not in decision.reason


def test_default_estimate_is_named_as_such():
    decision = gate(
        Budget(max_tokens=10_000),
        BudgetUse(tokens=5_000),
        estimate_kind(None, "agent"),
        node_kind="agent",
        wrap_up=False,
    )
    assert decision.action == "skip" and "default for agent nodes, no history yet" in decision.reason


def test_emergency_only_strictly_past_the_limit():
    budget = Budget(max_cost_usd=2.0)
    assert emergency_check(budget, BudgetUse(cost_usd=2.0)) is None
    stop = emergency_check(budget, BudgetUse(cost_usd=2.5))
    assert stop is not None and stop.action == "emergency_stop" and stop.dimension == "cost_usd"
    assert "125%" in stop.reason and "$2.50 of $2.00" in stop.reason
    # A wrap-up node may be given head-room.
    assert emergency_check(budget, BudgetUse(cost_usd=2.5), ceiling=1.5) is None


def test_fractions_cover_only_limited_dimensions():
    fractions = budget_fractions(
        Budget(max_tokens=1_000, max_wall_seconds=100), BudgetUse(tokens=500, wall_seconds=150)
    )
    assert fractions == {"tokens": 0.5, "wall_seconds": 1.5}


def test_bad_soft_fraction_is_rejected():
    with pytest.raises(ValueError):
        gate(Budget(max_tokens=10), BudgetUse(), SMALL, node_kind="llm", wrap_up=False, soft_fraction=0)


budgets = st.builds(
    Budget,
    max_tokens=st.none() | st.integers(1, 10**6),
    max_cost_usd=st.none() | st.floats(0.01, 100),
    max_wall_seconds=st.none() | st.integers(1, 10**5),
)
estimates = st.builds(
    lambda t, c, s: KindEstimate(
        tokens_p50=t // 2,
        tokens_p80=t,
        cost_p50=c / 2,
        cost_p80=c,
        seconds_p50=s / 2,
        seconds_p80=s,
        samples=5,
        from_defaults=False,
    ),
    st.integers(0, 10**5),
    st.floats(0, 10),
    st.floats(0, 10**4),
)
steps = st.lists(st.tuples(st.integers(0, 10**5), st.floats(0, 10), st.floats(0, 10**4)), min_size=1, max_size=20)


@given(budget=budgets, estimate=estimates, increments=steps, soft=st.floats(0.05, 1.0))
def test_action_never_relaxes_as_usage_grows(budget, estimate, increments, soft):
    used = BudgetUse()
    worst = 0
    for tokens, cost, seconds in increments:
        used = BudgetUse(
            tokens=used.tokens + tokens, cost_usd=used.cost_usd + cost, wall_seconds=used.wall_seconds + seconds
        )
        severity = ACTION_SEVERITY[
            gate(budget, used, estimate, node_kind="agent", wrap_up=False, soft_fraction=soft).action
        ]
        assert severity >= worst
        worst = severity
        stop = emergency_check(budget, used)
        # Once past the limit, the emergency check keeps firing and the gate holds everything but wrap-up.
        if stop is not None:
            assert worst == ACTION_SEVERITY["wrap_up_only"]


@given(
    budget=budgets,
    estimate=estimates,
    used=st.builds(BudgetUse, tokens=st.integers(0, 10**7), cost_usd=st.floats(0, 1e3), wall_seconds=st.floats(0, 1e6)),
)
def test_wrap_up_is_never_held_back_and_no_limits_never_blocks(budget, estimate, used):
    assert gate(budget, used, estimate, node_kind="report", wrap_up=True).action in ("dispatch", "degraded")
    assert gate(Budget(), used, estimate, node_kind="agent", wrap_up=False).action == "dispatch"
