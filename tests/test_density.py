"""Cost density: branches, spend per unit of progress, and the verdict with its reason."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.rules.density import (
    BranchProgress,
    branch_progress,
    branch_roots,
    density_verdict,
    fair_share_limit,
    verdict_for_step,
)

NEEDS = {"a": [], "b": [], "c": ["a", "b"], "d": ["c"], "e": ["a"], "f": ["e"]}


def nodes(**spec: tuple[str, float]) -> dict[str, Node]:
    return {
        name: Node(
            name=name,
            kind="llm",
            needs=needs,
            status=spec.get(name, ("pending", 0.0))[0],
            cost_usd=spec.get(name, ("pending", 0.0))[1],
        )
        for name, needs in NEEDS.items()
    }


def test_branch_roots_are_the_source_ancestors():
    assert branch_roots(NEEDS) == {
        "a": ["a"],
        "b": ["b"],
        "c": ["a", "b"],
        "d": ["a", "b"],
        "e": ["a"],
        "f": ["a"],
    }


def test_branch_roots_reject_broken_graphs():
    with pytest.raises(ValueError, match="unknown step 'zz'"):
        branch_roots({"a": ["zz"]})
    with pytest.raises(ValueError, match="cycle"):
        branch_roots({"a": ["b"], "b": ["a"]})


def test_join_cost_and_progress_are_split_between_branches():
    progress = branch_progress(
        nodes(a=("succeeded", 1.0), b=("succeeded", 0.5), c=("succeeded", 2.0), e=("failed", 3.0))
    )
    assert progress == [
        BranchProgress(branch="a", cost_usd=5.0, progress=1.5),
        BranchProgress(branch="b", cost_usd=1.5, progress=1.5),
    ]


@pytest.mark.parametrize(
    ("cost", "progress", "expected"),
    [
        (0.0, 0.0, "ok"),
        (1.0, 1.0, "ok"),  # exactly at the limit is fine
        (4.0, 2.0, "no_successors"),
        (3.0, 1.0, "no_successors"),  # exactly at limit x stop_factor
        (3.1, 1.0, "stop_branch"),
        (0.9, 0.0, "ok"),  # no progress yet: credited one unit, not infinitely dense
        (5.0, 0.0, "stop_branch"),
    ],
)
def test_verdict_thresholds(cost, progress, expected):
    verdict = density_verdict(BranchProgress(branch="a", cost_usd=cost, progress=progress), limit=1.0)
    assert verdict.action == expected


def test_verdict_reason_has_the_numbers():
    verdict = density_verdict(BranchProgress(branch="search", cost_usd=0.8, progress=2), limit=0.1)
    assert verdict.action == "stop_branch"
    assert verdict.reason == (
        "branch 'search' spent $0.8000 for 2 finished node(s): $0.4000 per node, "
        "over 3x the $0.1000 limit: branch stopped, finished outputs kept"
    )
    slow = density_verdict(BranchProgress(branch="search", cost_usd=0.3, progress=2), limit=0.1)
    assert slow.action == "no_successors" and "no successor dispatched" in slow.reason


def test_step_takes_the_worst_of_its_branches():
    state = nodes(a=("succeeded", 0.1), b=("succeeded", 5.0))
    assert verdict_for_step("e", state, limit=1.0).action == "ok"
    worst = verdict_for_step("c", state, limit=1.0)
    assert worst.action == "stop_branch" and worst.branch == "b"


def test_fair_share_limit():
    assert fair_share_limit(10.0, 5) == 4.0
    with pytest.raises(ValueError):
        fair_share_limit(10.0, 0)
    with pytest.raises(ValueError):
        density_verdict(BranchProgress(branch="a"), limit=0)


@given(
    cost=st.floats(0, 100),
    progress=st.floats(0, 50),
    extra=st.floats(0, 100),
    limit=st.floats(0.01, 10),
)
def test_more_spend_for_the_same_progress_never_relaxes_the_verdict(cost, progress, extra, limit):
    order = {"ok": 0, "no_successors": 1, "stop_branch": 2}
    before = density_verdict(BranchProgress(branch="x", cost_usd=cost, progress=progress), limit)
    after = density_verdict(BranchProgress(branch="x", cost_usd=cost + extra, progress=progress), limit)
    assert order[after.action] >= order[before.action]


@given(st.data())
def test_every_step_has_a_source_root_and_costs_add_up(data):
    names = [f"s{i}" for i in range(data.draw(st.integers(1, 8)))]
    needs = {
        n: sorted(set(data.draw(st.lists(st.sampled_from(names[:i]), max_size=3)))) if i else []
        for i, n in enumerate(names)
    }
    costs = {n: data.draw(st.floats(0, 10)) for n in names}
    roots = branch_roots(needs)
    assert all(roots[n] and all(needs[r] == [] for r in roots[n]) for n in names)
    graph = {n: Node(name=n, kind="tool", needs=needs[n], status="succeeded", cost_usd=costs[n]) for n in names}
    progress = branch_progress(graph)
    assert sum(b.cost_usd for b in progress) == pytest.approx(sum(costs.values()))
    assert sum(b.progress for b in progress) == pytest.approx(len(names))
