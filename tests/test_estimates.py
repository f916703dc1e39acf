"""Per-kind estimates: nearest-rank quantiles, defaults before data, data taking over as it arrives."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.workflows.goal.contracts.state import KindStats
from perdure.workflows.goal.rules.estimates import (
    BLEND_SAMPLES,
    DEFAULT_PRICE_PER_1K_TOKENS_USD,
    KIND_DEFAULTS,
    describe_basis,
    estimate_kind,
    quantile,
)

floats = st.floats(min_value=0, max_value=1e6, allow_nan=False)


def stats(*, tokens=(), costs=(), seconds=()) -> KindStats:
    return KindStats(runs=len(tokens), tokens=list(tokens), costs_usd=list(costs), seconds=list(seconds))


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        (list(range(1, 11)), 0.5, 5),
        (list(range(1, 11)), 0.8, 8),
        (list(range(1, 11)), 0.7, 7),
        (list(range(1, 26)), 0.28, 7),  # 0.28 * 25 is 7.000000000000001 in floats
        (list(range(1, 11)), 0.0, 1),
        (list(range(1, 11)), 1.0, 10),
        ([10, 1, 7, 3], 0.5, 3),
        ([10, 1, 7, 3], 0.8, 10),
        ([42], 0.8, 42),
        ([2.5, 0.5], 0.5, 0.5),
    ],
)
def test_quantile_is_nearest_rank(values, q, expected):
    assert quantile(values, q) == expected


def test_quantile_rejects_nonsense():
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile([1.0], 1.5)


@given(values=st.lists(floats, min_size=1, max_size=50), q1=st.floats(0, 1), q2=st.floats(0, 1))
def test_quantile_is_an_observed_value_and_monotone_in_q(values, q1, q2):
    lo, hi = sorted([q1, q2])
    assert quantile(values, lo) in values
    assert quantile(values, lo) <= quantile(values, hi)
    assert quantile(list(reversed(values)), lo) == quantile(values, lo)


def test_no_data_gives_the_kind_defaults():
    for kind, defaults in KIND_DEFAULTS.items():
        est = estimate_kind(None, kind)
        assert est.samples == 0 and est.from_defaults
        assert (est.tokens_p50, est.tokens_p80) == (defaults.tokens_p50, defaults.tokens_p80)
        assert (est.seconds_p50, est.seconds_p80) == (defaults.seconds_p50, defaults.seconds_p80)
        assert est.cost_p80 == pytest.approx(defaults.tokens_p80 / 1000 * DEFAULT_PRICE_PER_1K_TOKENS_USD)
        assert estimate_kind(KindStats(), kind) == est
    assert estimate_kind(None, "tool").tokens_p80 == 0
    assert estimate_kind(None, "agent").tokens_p50 > estimate_kind(None, "llm").tokens_p50


def test_default_cost_uses_the_price_the_workflow_passes():
    assert estimate_kind(None, "llm", price_per_1k_tokens_usd=0.002).cost_p50 == pytest.approx(1.5 * 0.002)
    # A free (scripted) profile: defaults must not invent a cost.
    assert estimate_kind(None, "agent", price_per_1k_tokens_usd=0.0).cost_p80 == 0.0
    with pytest.raises(ValueError):
        estimate_kind(None, "llm", price_per_1k_tokens_usd=-1)


def test_unknown_kind_is_assumed_as_heavy_as_an_agent():
    assert estimate_kind(None, "something-new").tokens_p80 == KIND_DEFAULTS["agent"].tokens_p80


def test_estimates_follow_data_as_it_arrives():
    default = estimate_kind(None, "llm")
    one = estimate_kind(stats(tokens=[300], costs=[0.001], seconds=[2.0]), "llm")
    # One sample: a third data, two thirds default.
    assert one.tokens_p50 == pytest.approx((300 + 2 * 1500) / 3, abs=1)
    assert one.from_defaults and one.samples == 1
    assert one.tokens_p50 < default.tokens_p50 and one.seconds_p80 < default.seconds_p80

    full = stats(tokens=[300, 400, 500], costs=[0.001, 0.002, 0.003], seconds=[2.0, 3.0, 4.0])
    est = estimate_kind(full, "llm")
    assert not est.from_defaults and est.samples == BLEND_SAMPLES
    assert (est.tokens_p50, est.tokens_p80) == (400, 500)
    assert (est.cost_p50, est.cost_p80) == (0.002, 0.003)
    assert (est.seconds_p50, est.seconds_p80) == (3.0, 4.0)

    more = stats(tokens=[300, 400, 500] + [10_000] * 10, costs=[0.001] * 13, seconds=[3.0] * 13)
    assert estimate_kind(more, "llm").tokens_p50 == 10_000


def test_samples_is_the_thinnest_dimension():
    # A node without timestamps adds tokens and cost but no duration.
    est = estimate_kind(stats(tokens=[1, 2, 3, 4], costs=[0.1] * 4, seconds=[1.0]), "tool")
    assert est.samples == 1 and est.from_defaults


@given(
    tokens=st.lists(st.integers(0, 10**6), max_size=20),
    costs=st.lists(floats, max_size=20),
    seconds=st.lists(floats, max_size=20),
    kind=st.sampled_from(["llm", "agent", "tool", "other"]),
)
def test_p80_never_below_p50(tokens, costs, seconds, kind):
    est = estimate_kind(stats(tokens=tokens, costs=costs, seconds=seconds), kind)
    assert est.tokens_p80 >= est.tokens_p50 >= 0
    assert est.cost_p80 >= est.cost_p50 >= 0
    assert est.seconds_p80 >= est.seconds_p50 >= 0


def test_basis_says_where_the_numbers_come_from():
    assert describe_basis(estimate_kind(None, "agent"), "agent") == "default for agent nodes, no history yet"
    one = estimate_kind(stats(tokens=[1], costs=[0.0], seconds=[1.0]), "agent")
    assert describe_basis(one, "agent") == "P80 of 1 agent node blended with defaults"
    twelve = estimate_kind(stats(tokens=[1] * 12, costs=[0.0] * 12, seconds=[1.0] * 12), "agent")
    assert describe_basis(twelve, "agent") == "P80 of 12 agent nodes"
