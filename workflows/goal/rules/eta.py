"""Time-to-finish for the progress query: a coarse range with a confidence label.

Owns how the remaining nodes turn into a range of seconds (P50 work spread over
the allowed parallelism for the low end, P80 work over the parallelism seen now
for the high end), how confident that range is, and how it is put into words.
The text is deliberately coarse ("about 5–10 min (medium confidence)"): it never
shows a falsely precise number such as "417 s".

Pure: no clocks (the workflow adds the range to `workflow.now()` if it wants a
time of day), no I/O, no randomness. Same input, same output.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel

from perdure.workflows.goal.contracts.state import KindStats
from perdure.workflows.goal.rules.estimates import BLEND_SAMPLES, estimate_kind, quantile
from perdure.workflows.shared.durations import duration_text

Confidence = Literal["low", "medium", "high"]

# High confidence: at least this many duration samples for every remaining kind...
HIGH_CONFIDENCE_SAMPLES = 10
# ...and a tight spread: P80 at most twice P50, or within a few seconds of it
# (a 0.1 s tool call that sometimes takes 0.4 s is not "uncertain").
HIGH_CONFIDENCE_SPREAD = 2.0
NEGLIGIBLE_SPREAD_SECONDS = 5.0
# Low confidence widens the range: half the low end, twice the high end.
LOW_CONFIDENCE_WIDEN = 2.0


class Eta(BaseModel):
    low_seconds: float
    high_seconds: float
    confidence: Confidence
    text: str
    basis: str


def _confidence(remaining: Mapping[str, int], stats_by_kind: Mapping[str, KindStats]) -> Confidence:
    level: Confidence = "high"
    for kind in sorted(remaining):
        seconds = stats_by_kind[kind].seconds if kind in stats_by_kind else []
        if len(seconds) < BLEND_SAMPLES:
            return "low"
        if len(seconds) < HIGH_CONFIDENCE_SAMPLES:
            level = "medium"
            continue
        p50, p80 = quantile(seconds, 0.5), quantile(seconds, 0.8)
        if p80 - p50 > NEGLIGIBLE_SPREAD_SECONDS and p80 > HIGH_CONFIDENCE_SPREAD * p50:
            level = "medium"
    return level


_MINUTE, _HOUR, _DAY = 60.0, 3600.0, 86400.0


def _nice_floor(seconds: float) -> tuple[int, str] | None:
    """Round down to a coarse human value; None when under a minute."""
    if seconds < _MINUTE:
        return None
    if seconds < _HOUR:
        minutes = seconds / _MINUTE
        return (math.floor(minutes), "min") if minutes <= 5 else (5 * math.floor(minutes / 5), "min")
    if seconds < 48 * _HOUR:
        return math.floor(seconds / _HOUR), "h"
    return math.floor(seconds / _DAY), "days"


def _nice_ceil(seconds: float) -> tuple[int, str]:
    """Round up to a coarse human value: 1–5 min, then 5-minute steps, whole hours, whole days."""
    minutes = seconds / _MINUTE
    if minutes <= 5:
        return max(1, math.ceil(minutes)), "min"
    if minutes < 60:
        step = 5 * math.ceil(minutes / 5)
        if step < 60:
            return step, "min"
    hours = seconds / _HOUR
    if hours < 48:
        return max(1, math.ceil(hours)), "h"
    return math.ceil(seconds / _DAY), "days"


def _say(value: int, unit: str) -> str:
    if unit == "days" and value == 1:
        return "1 day"
    return f"{value} {unit}"


def coarse_range_text(low_seconds: float, high_seconds: float, confidence: Confidence) -> str:
    """'under a minute', 'under 5 min', 'about 10 min', 'about 5–10 min', 'about 45 min–2 h', with the confidence."""
    suffix = f" ({confidence} confidence)"
    if high_seconds < _MINUTE:
        return "under a minute" + suffix
    hi = _nice_ceil(high_seconds)
    lo = _nice_floor(min(low_seconds, high_seconds))
    if lo is None or lo[0] == 0:
        return f"under {_say(*hi)}" + suffix
    if lo == hi:
        return f"about {_say(*hi)}" + suffix
    if lo[1] == hi[1]:
        return f"about {lo[0]}–{_say(*hi)}" + suffix
    return f"about {_say(*lo)}–{_say(*hi)}" + suffix


def estimate_eta(
    remaining_by_kind: dict[str, int],
    stats_by_kind: dict[str, KindStats],
    running: int,
    parallelism: int,
) -> Eta | None:
    """Range of seconds until the remaining nodes finish; None when nothing remains.

    `remaining_by_kind` counts nodes not finished yet, the `running` ones
    included. Low end: the P50 work spread over `parallelism` lanes, but never
    less than the longest single P50. High end: the P80 work spread over as
    many lanes as are busy now (at least one), never less than the longest
    single P80. Confidence: low if any remaining kind has fewer than 3 duration
    samples (defaults are in play), then the range is widened 2x each way; high
    if every remaining kind has at least 10 samples and a tight spread; else medium.
    """
    remaining = {kind: count for kind, count in sorted(remaining_by_kind.items()) if count > 0}
    if not remaining:
        return None
    estimates = {kind: estimate_kind(stats_by_kind.get(kind), kind) for kind in remaining}
    work_p50 = sum(count * estimates[kind].seconds_p50 for kind, count in remaining.items())
    work_p80 = sum(count * estimates[kind].seconds_p80 for kind, count in remaining.items())
    longest_p50 = max(estimates[kind].seconds_p50 for kind in remaining)
    longest_p80 = max(estimates[kind].seconds_p80 for kind in remaining)
    lanes = max(1, parallelism)
    busy_lanes = max(1, min(lanes, running))
    low = max(work_p50 / lanes, longest_p50)
    high = max(work_p80 / busy_lanes, longest_p80, low)

    confidence = _confidence(remaining, stats_by_kind)
    if confidence == "low":
        low, high = low / LOW_CONFIDENCE_WIDEN, high * LOW_CONFIDENCE_WIDEN

    parts = []
    for kind, count in remaining.items():
        samples = len(stats_by_kind[kind].seconds) if kind in stats_by_kind else 0
        source = "defaults" if samples == 0 else f"{samples} sample{'s' if samples != 1 else ''}"
        parts.append(
            f"{count} {kind} at P50 {duration_text(estimates[kind].seconds_p50)} / "
            f"P80 {duration_text(estimates[kind].seconds_p80)} ({source})"
        )
    basis = "; ".join(parts) + f"; up to {lanes} in parallel, {running} running"
    return Eta(
        low_seconds=low,
        high_seconds=high,
        confidence=confidence,
        text=coarse_range_text(low, high, confidence),
        basis=basis,
    )
