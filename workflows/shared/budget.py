"""Budget gates: whether the next node may run, and how, given what the goal has used.

Owns the gate rules (soft gate, hard gate with a wrap-up whitelist, the
estimate check, the in-flight emergency check) and the human-readable reasons
the workflow records with each decision. The workflow calls `gate` before every
dispatch and `emergency_check` whenever usage changes while nodes run; the
prompt never sees a budget.

Pure: runs inside the workflow sandbox, so no I/O, clocks or randomness. Time
used is passed in (the workflow computes it from `workflow.now()`): wall time is
the goal's active time, calendar time counts everything up to a deadline. It
does not cancel, compact or record anything itself; it only decides.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from perdure.workflows.goal.contracts.goal_contracts import Budget
from perdure.workflows.goal.rules.estimates import KindEstimate, describe_basis
from perdure.workflows.shared.durations import duration_text

GateAction = Literal["dispatch", "degraded", "skip", "wrap_up_only", "emergency_stop"]
Dimension = Literal["tokens", "cost_usd", "wall_seconds", "calendar_seconds"]

# Fixed order: ties between dimensions resolve to the earlier one, so reasons are stable.
DIMENSIONS: tuple[Dimension, ...] = ("tokens", "cost_usd", "wall_seconds", "calendar_seconds")
DEFAULT_SOFT_FRACTION = 0.7

# How severe each action is; as usage grows the action for a node never gets less severe.
ACTION_SEVERITY: dict[str, int] = {
    "dispatch": 0,
    "degraded": 1,
    "skip": 2,
    "wrap_up_only": 3,
    "emergency_stop": 4,
}


class BudgetUse(BaseModel):
    """What the goal has used so far, in the budgeted dimensions."""

    tokens: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0)
    wall_seconds: float = Field(default=0.0, ge=0, description="Active time.")
    calendar_seconds: float = Field(default=0.0, ge=0, description="Everything since the goal started.")
    deadline_seconds: float | None = Field(
        default=None, description="From the goal's start to its deadline: the calendar limit, if it has one."
    )


class GateDecision(BaseModel):
    """The gate's verdict for one node (or for the goal, in an emergency), with its reason.

    dispatch: run normally. degraded: run with compacted context and low-value
    tools dropped, and record that it did. skip: do not start this node, its
    estimate would overrun the remaining budget. wrap_up_only: a budget is
    spent; only wrap-up nodes run. emergency_stop: a budget went past 100%
    while nodes ran; freeze, cancel in-flight work, emit the best result.
    """

    action: GateAction
    reason: str
    dimension: Dimension | None = None
    fraction_used: dict[str, float] = Field(default_factory=dict)


def _limits(budget: Budget, used: BudgetUse) -> dict[Dimension, float]:
    limits: dict[Dimension, float | None] = {
        "tokens": budget.max_tokens,
        "cost_usd": budget.max_cost_usd,
        "wall_seconds": budget.max_wall_seconds,
        # A deadline already past at the start leaves no time at all (a tiny limit, not zero).
        "calendar_seconds": None if used.deadline_seconds is None else max(used.deadline_seconds, 1e-3),
    }
    return {d: float(limit) for d, limit in limits.items() if limit is not None}


def _used(used: BudgetUse, dimension: Dimension) -> float:
    return float(getattr(used, dimension))


def _estimated(estimate: KindEstimate, dimension: Dimension) -> float:
    if dimension in ("wall_seconds", "calendar_seconds"):
        return estimate.seconds_p80
    return {"tokens": estimate.tokens_p80, "cost_usd": estimate.cost_p80}[dimension]


def budget_fractions(budget: Budget, used: BudgetUse) -> dict[str, float]:
    """Fraction used of each limited dimension (1.0 = all of it; may exceed 1). Unlimited ones are absent."""
    return {d: _used(used, d) / limit for d, limit in _limits(budget, used).items()}


def format_amount(dimension: Dimension, value: float) -> str:
    """An amount in its dimension's unit, as a person would write it: '6,000 tokens', '$1.25', '12 min'."""
    if dimension == "tokens":
        return f"{round(value):,} tokens"
    if dimension == "cost_usd":
        if abs(value) >= 100:
            return f"${value:,.0f}"
        if abs(value) >= 1:
            return f"${value:,.2f}"
        return f"${value:.4f}"
    return duration_text(value)


def _label(dimension: Dimension) -> str:
    labels = {"tokens": "tokens", "cost_usd": "cost", "wall_seconds": "active wall time"}
    return labels.get(dimension, "calendar time (to the deadline)")


def _worst(fractions: dict[str, float]) -> Dimension:
    # max() keeps the first of equal values, and DIMENSIONS order is the dict order.
    return max(fractions, key=lambda d: fractions[d])  # type: ignore[return-value]


def _spent_text(dimension: Dimension, used: float, limit: float) -> str:
    return (
        f"{_label(dimension)} at {used / limit:.0%} "
        f"({format_amount(dimension, used)} of {format_amount(dimension, limit)})"
    )


def gate(
    budget: Budget,
    used: BudgetUse,
    estimate: KindEstimate,
    *,
    node_kind: str,
    wrap_up: bool,
    soft_fraction: float = DEFAULT_SOFT_FRACTION,
) -> GateDecision:
    """Decide how (and whether) to dispatch one node. Rules, first match wins:

    1. no limits: dispatch.
    2. a wrap-up node (report, unfinished list, notify) is never held back: it
       runs degraded once any dimension reaches `soft_fraction`, including past
       100%, and dispatches normally below it. Its estimate is not checked.
    3. any dimension at or past 100%: wrap_up_only (the node is not started).
    4. the node's P80 estimate would take any dimension past 100%: skip.
    5. any dimension at or past `soft_fraction`: degraded.
    6. otherwise dispatch.
    `dimension` names the dimension that decided (the most used one on ties of rule).
    """
    if not 0.0 < soft_fraction <= 1.0:
        raise ValueError(f"soft_fraction must be within (0, 1], got {soft_fraction}")
    limits = _limits(budget, used)
    fractions = budget_fractions(budget, used)
    if not limits:
        return GateDecision(action="dispatch", reason="no budget limits set", fraction_used=fractions)

    worst = _worst(fractions)
    worst_text = _spent_text(worst, _used(used, worst), limits[worst])

    if wrap_up:
        if fractions[worst] >= soft_fraction:
            past = "past the hard gate" if fractions[worst] >= 1.0 else f"past the {soft_fraction:.0%} soft gate"
            return GateDecision(
                action="degraded",
                reason=f"wrap-up {node_kind} node runs degraded {past}: {worst_text}",
                dimension=worst,
                fraction_used=fractions,
            )
        return GateDecision(
            action="dispatch", reason=f"wrap-up {node_kind} node within budget", fraction_used=fractions
        )

    if fractions[worst] >= 1.0:
        return GateDecision(
            action="wrap_up_only",
            reason=f"{worst_text}: only wrap-up nodes run; {node_kind} node not started",
            dimension=worst,
            fraction_used=fractions,
        )

    overruns: list[tuple[float, Dimension]] = []
    for d, limit in limits.items():
        after = _used(used, d) + _estimated(estimate, d)
        if after > limit:
            overruns.append((after / limit, d))
    if overruns:
        # The worst projected overrun decides; ties keep DIMENSIONS order.
        _, decisive = max(overruns, key=lambda item: item[0])
        basis = describe_basis(estimate, node_kind)
        parts = []
        for _, d in sorted(overruns, key=lambda item: DIMENSIONS.index(item[1])):
            remaining = limits[d] - _used(used, d)
            if d == "tokens":
                left = f"the remaining {remaining:,.0f} of {limits[d]:,.0f} tokens"
            else:
                whole = format_amount(d, limits[d])
                left = f"the remaining {format_amount(d, remaining)} of the {whole} {_label(d)} budget"
            parts.append(f"estimated {format_amount(d, _estimated(estimate, d))} ({basis}) would exceed {left}")
        return GateDecision(
            action="skip",
            reason=f"{node_kind} node not started: " + "; ".join(parts),
            dimension=decisive,
            fraction_used=fractions,
        )

    if fractions[worst] >= soft_fraction:
        return GateDecision(
            action="degraded",
            reason=f"{worst_text}, past the {soft_fraction:.0%} soft gate: {node_kind} node runs degraded "
            "(compacted context, low-value tools dropped)",
            dimension=worst,
            fraction_used=fractions,
        )
    return GateDecision(action="dispatch", reason=f"{worst_text}: within budget", fraction_used=fractions)


def own_call_gate(
    budget: Budget, used: BudgetUse, estimate: KindEstimate, *, what: str, soft_fraction: float = DEFAULT_SOFT_FRACTION
) -> str | None:
    """Why one of the goal's own optional model calls (a drift check) is not sent, or None
    when it may be. It is judged as a step is, by its estimate against what is spent and
    held (`used`), and held back from the soft gate on too: it only advises, and what is
    left of the budget goes to the work."""
    decision = gate(budget, used, estimate, node_kind=what, wrap_up=False, soft_fraction=soft_fraction)
    if decision.action == "dispatch":
        return None
    dimension = decision.dimension or "tokens"
    limit = _limits(budget, used)[dimension]
    spent = _spent_text(dimension, _used(used, dimension), limit)
    if decision.action == "skip":
        needs = format_amount(dimension, _estimated(estimate, dimension))
        return f"{what} not sent: its estimate of {needs} would take {spent} past the limit"
    if decision.action == "degraded":
        return f"{what} not sent: {spent}, past the {soft_fraction:.0%} soft gate (the rest goes to the work)"
    return f"{what} not sent: {spent}"


def emergency_check(
    budget: Budget, used: BudgetUse, *, ceiling: float = 1.0, at_limit: bool = False
) -> GateDecision | None:
    """While nodes run: an emergency_stop decision if any dimension is past `ceiling` (1.0 = 100%), else None.

    "Past" is strict: usage exactly at the limit is not an emergency (the next
    dispatch meets the hard gate instead), unless `at_limit`: the clock that fires
    the moment a time budget runs out, with work still in flight. Wrap-up nodes
    run past 100% by design, so while only they run the caller skips this check.
    """
    limits = _limits(budget, used)
    if not limits:
        return None
    fractions = budget_fractions(budget, used)
    over = {d: f for d, f in fractions.items() if f > ceiling or (at_limit and f >= ceiling)}
    if not over:
        return None
    worst = _worst(over)
    return GateDecision(
        action="emergency_stop",
        reason=f"{_spent_text(worst, _used(used, worst), limits[worst])} while nodes ran: "
        "freeze, cancel in-flight work, emit the best result and the unfinished list",
        dimension=worst,
        fraction_used=fractions,
    )


def child_budget(budget: Budget, share: float) -> Budget:
    """The share of this goal's token and cost limits; the calendar deadline as is. Active
    time is the child's own (it is not taken from this goal's clock)."""
    return Budget(
        max_tokens=max(1, int(budget.max_tokens * share)) if budget.max_tokens else None,
        max_cost_usd=budget.max_cost_usd * share if budget.max_cost_usd else None,
        max_wall_seconds=budget.max_wall_seconds,
        deadline=budget.deadline,
    )


def subgoal_grant(limits: Budget, share: float, held: BudgetUse) -> Budget:
    """The budget a subgoal starts with: its share of this goal's token and cost limits, and
    no more than what this goal has not spent or held for other work in flight (`held`), so
    children started side by side can never take the parent past its budget together."""
    whole = child_budget(limits, share)
    tokens = cost = None
    if whole.max_tokens and limits.max_tokens:
        tokens = max(1, min(whole.max_tokens, limits.max_tokens - held.tokens))
    if whole.max_cost_usd and limits.max_cost_usd:
        cost = min(whole.max_cost_usd, limits.max_cost_usd - held.cost_usd)
        cost = cost if cost > 0 else 1e-9
    return whole.model_copy(update={"max_tokens": tokens, "max_cost_usd": cost})


def grant_estimate(grant: Budget, estimate: KindEstimate) -> KindEstimate:
    """A subgoal's expected spend, for the gates: all of its grant (the parent learns what the
    child did spend only when it settles), or the kind's estimate where the goal sets no limit."""
    return estimate.model_copy(
        update={
            "tokens_p50": grant.max_tokens or estimate.tokens_p50,
            "tokens_p80": grant.max_tokens or estimate.tokens_p80,
            "cost_p50": grant.max_cost_usd or estimate.cost_p50,
            "cost_p80": grant.max_cost_usd or estimate.cost_p80,
        }
    )
