"""Per-kind estimates of what one node costs (tokens, USD, seconds), from the ledger.

Owns the quantile rule, the defaults used before a kind has any history, and how
those defaults blend with the first few samples. The budget gate and the ETA
read these estimates; this module decides nothing itself.

Runs inside the workflow sandbox: no I/O, clocks, randomness or env vars; prices
arrive as arguments (the workflow passes the model profile's blended price when
it knows it). Same input, same output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from perdure.workflows.goal.contracts.state import KindStats, Node
from perdure.workflows.quota.quota_workflow import waited_seconds

# Samples a dimension needs before its estimate is pure data. Below this the
# observed quantile is blended linearly with the default (weight n / 3), so one
# unusually cheap first node cannot make the gate wave through an expensive one.
BLEND_SAMPLES = 3

# Conservative blended price when the workflow does not know the profile's:
# about a mid-range model with half the tokens billed at the output price.
DEFAULT_PRICE_PER_1K_TOKENS_USD = 0.01


class KindDefaults(BaseModel):
    """What a node of one kind is assumed to take before any has run."""

    model_config = ConfigDict(frozen=True)

    tokens_p50: int
    tokens_p80: int
    seconds_p50: float
    seconds_p80: float


KIND_DEFAULTS: dict[str, KindDefaults] = {
    # One model call: prompt with inputs plus an answer.
    "llm": KindDefaults(tokens_p50=1_500, tokens_p80=3_000, seconds_p50=20, seconds_p80=60),
    # Several turns, each resending a growing transcript.
    "agent": KindDefaults(tokens_p50=6_000, tokens_p80=15_000, seconds_p50=120, seconds_p80=360),
    # No model, a few seconds of work.
    "tool": KindDefaults(tokens_p50=0, tokens_p80=0, seconds_p50=5, seconds_p80=30),
    # A goal of its own: many steps, some of them agents.
    "subgoal": KindDefaults(tokens_p50=30_000, tokens_p80=90_000, seconds_p50=900, seconds_p80=3_600),
    # A wait step spends nothing; its time is the plan's, not an estimate's.
    "wait": KindDefaults(tokens_p50=0, tokens_p80=0, seconds_p50=0, seconds_p80=0),
}
# An unknown kind is assumed to be as heavy as an agent: over-estimating only delays it.
FALLBACK_DEFAULTS = KIND_DEFAULTS["agent"]


class KindEstimate(BaseModel):
    """Median and P80 of one node of a kind. `samples` is the fewest of the three dimensions."""

    tokens_p50: int
    tokens_p80: int
    cost_p50: float
    cost_p80: float
    seconds_p50: float
    seconds_p80: float
    samples: int
    from_defaults: bool


def own_seconds(node: Node) -> float | None:
    """A settled node's duration as a sample of its kind: the time its model calls waited
    for quota (workflows/quota/quota_workflow.py) is the resource's, not the node's, so it is left out."""
    if not (node.started_at and node.finished_at):
        return None
    return max(0.0, (node.finished_at - node.started_at).total_seconds() - waited_seconds(node.placements))


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: the smallest observed value with at least q of the values at or below it.

    Always returns one of `values` (no interpolation), so "P80" is a node that
    really happened. Raises ValueError on an empty sequence or q outside [0, 1].
    """
    if not values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    ordered = sorted(values)
    # The epsilon keeps 0.28 * 25 (= 7.000000000000001 in floats) at rank 7, not 8.
    rank = math.ceil(q * len(ordered) - 1e-9)
    return ordered[min(max(rank, 1), len(ordered)) - 1]


def _blend(values: Sequence[float], q: float, default: float) -> float:
    if not values:
        return default
    weight = min(1.0, len(values) / BLEND_SAMPLES)
    return weight * quantile(values, q) + (1.0 - weight) * default


def estimate_kind(stats: KindStats | None, kind: str, *, price_per_1k_tokens_usd: float | None = None) -> KindEstimate:
    """Estimate one node of `kind` from its ledger stats, or from defaults before any data.

    Each dimension uses its own samples: the nearest-rank P50 and P80, blended
    with the default while there are fewer than BLEND_SAMPLES of them. Default
    cost is default tokens times `price_per_1k_tokens_usd` (the profile's price
    if the caller knows it, else DEFAULT_PRICE_PER_1K_TOKENS_USD); observed
    cost, once there is some, is used as is.
    """
    defaults = KIND_DEFAULTS.get(kind, FALLBACK_DEFAULTS)
    price = DEFAULT_PRICE_PER_1K_TOKENS_USD if price_per_1k_tokens_usd is None else price_per_1k_tokens_usd
    if price < 0:
        raise ValueError(f"price per 1k tokens must not be negative, got {price}")
    stats = stats or KindStats()
    cost_default_p50 = defaults.tokens_p50 / 1000 * price
    cost_default_p80 = defaults.tokens_p80 / 1000 * price
    samples = min(len(stats.tokens), len(stats.costs_usd), len(stats.seconds))
    return KindEstimate(
        tokens_p50=math.ceil(_blend(stats.tokens, 0.5, defaults.tokens_p50)),
        tokens_p80=math.ceil(_blend(stats.tokens, 0.8, defaults.tokens_p80)),
        cost_p50=_blend(stats.costs_usd, 0.5, cost_default_p50),
        cost_p80=_blend(stats.costs_usd, 0.8, cost_default_p80),
        seconds_p50=_blend(stats.seconds, 0.5, defaults.seconds_p50),
        seconds_p80=_blend(stats.seconds, 0.8, defaults.seconds_p80),
        samples=samples,
        from_defaults=samples < BLEND_SAMPLES,
    )


def describe_basis(estimate: KindEstimate, kind: str) -> str:
    """Where an estimate comes from, for reasons and tooltips: 'P80 of 12 agent nodes'."""
    if estimate.samples == 0:
        return f"default for {kind} nodes, no history yet"
    noun = "node" if estimate.samples == 1 else "nodes"
    if estimate.from_defaults:
        return f"P80 of {estimate.samples} {kind} {noun} blended with defaults"
    return f"P80 of {estimate.samples} {kind} {noun}"
