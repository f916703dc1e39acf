"""The parts of a goal's spend in words, for the report, `perdure status` and `perdure
result`: its own model calls, a line per kind (planning, repair, re-planning, drift check,
verification) with calls, tokens and cost, and what paid tools reported. Both are in the
goal's totals, and the budget gates counted them like any other spend
(workflows/goal/spend.py books them). Pure.
"""

from __future__ import annotations

from perdure.workflows.goal.contracts.goal_contracts import OWN_CALL_KINDS, OwnCalls


def own_call_lines(own_calls: dict[str, OwnCalls]) -> list[str]:
    """'drift check: 3 calls, 4,512 tokens, $0.0135', a line per kind, in OWN_CALL_KINDS order."""
    order = {kind: i for i, kind in enumerate(OWN_CALL_KINDS)}
    kinds = sorted(own_calls, key=lambda kind: (order.get(kind, len(order)), kind))
    return [describe(kind, own_calls[kind]) for kind in kinds]


def describe(kind: str, spent: OwnCalls) -> str:
    calls = "1 call" if spent.calls == 1 else f"{spent.calls} calls"
    return f"{kind}: {calls}, {spent.tokens:,} tokens, ${spent.cost_usd:.4f}"


def tool_spend(usd: float) -> str:
    """' (paid tools $1.2000)' after a total that holds what paid tools reported; '' when none did."""
    return f" (paid tools ${usd:.4f})" if usd > 0 else ""
