"""ETA: coarse ranges with an honest confidence, never a falsely precise number."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from perdure.workflows.goal.contracts.state import KindStats
from perdure.workflows.goal.rules.eta import coarse_range_text, estimate_eta

UNIT = r"(?:min|h|day|days)"
COARSE = re.compile(
    rf"^(?:under a minute|under \d+ {UNIT}|about \d+ {UNIT}|about \d+(?: {UNIT})?–\d+ {UNIT})"
    r" \((?:low|medium|high) confidence\)$"
)


def durations(values: list[float]) -> KindStats:
    return KindStats(runs=len(values), seconds=values, tokens=[0] * len(values), costs_usd=[0.0] * len(values))


def minute_values_are_coarse(text: str) -> bool:
    # Minutes appear as 1-5 or in steps of 5; never 7 min, never 417 s.
    numbers = re.findall(r"(\d+)(?:–\d+)? min", text) + re.findall(r"(?<=–)(\d+) min", text)
    for number in numbers:
        if int(number) > 5 and int(number) % 5:
            return False
    return "s)" not in text and " s " not in text


def test_nothing_remaining_is_none():
    assert estimate_eta({}, {}, running=0, parallelism=4) is None
    assert estimate_eta({"agent": 0, "tool": 0}, {}, running=0, parallelism=4) is None


def test_no_data_is_low_confidence_and_wide():
    eta = estimate_eta({"agent": 3}, {}, running=0, parallelism=1)
    assert eta is not None and eta.confidence == "low"
    assert eta.high_seconds >= 4 * eta.low_seconds
    assert "(low confidence)" in eta.text and "defaults" in eta.basis
    assert COARSE.match(eta.text), eta.text


def test_few_samples_are_low_confidence():
    eta = estimate_eta({"llm": 2}, {"llm": durations([10.0, 12.0])}, running=0, parallelism=2)
    assert eta is not None and eta.confidence == "low"


def test_lots_of_tight_data_is_high_confidence_and_narrow():
    tight = durations([300.0 + i for i in range(20)])
    eta = estimate_eta({"agent": 4}, {"agent": tight}, running=1, parallelism=1)
    assert eta is not None and eta.confidence == "high"
    # Four sequential 5-minute nodes: about 20 minutes, no widening.
    assert 1200 <= eta.low_seconds <= eta.high_seconds <= 1300
    assert eta.text == "about 20–25 min (high confidence)"


def test_medium_when_some_data_or_a_wide_spread():
    few = estimate_eta({"llm": 2}, {"llm": durations([30.0] * 5)}, running=0, parallelism=1)
    spread = estimate_eta({"llm": 2}, {"llm": durations([10.0] * 6 + [300.0] * 6)}, running=0, parallelism=1)
    assert few is not None and few.confidence == "medium"
    assert spread is not None and spread.confidence == "medium"


def test_one_kind_without_data_makes_it_low():
    eta = estimate_eta({"agent": 1, "tool": 5}, {"agent": durations([60.0] * 30)}, running=0, parallelism=2)
    assert eta is not None and eta.confidence == "low"


def test_parallelism_shortens_the_low_end_not_below_one_node():
    stats = {"llm": durations([60.0] * 20)}
    serial = estimate_eta({"llm": 10}, stats, running=0, parallelism=1)
    wide = estimate_eta({"llm": 10}, stats, running=10, parallelism=10)
    assert serial is not None and wide is not None
    assert wide.low_seconds == 60.0 and wide.high_seconds == 60.0 and wide.text == "about 1 min (high confidence)"
    assert serial.low_seconds == 600.0


def test_texts_for_each_scale():
    assert coarse_range_text(5, 40, "high") == "under a minute (high confidence)"
    assert coarse_range_text(20, 250, "medium") == "under 5 min (medium confidence)"
    assert coarse_range_text(300, 417, "medium") == "about 5–10 min (medium confidence)"
    assert coarse_range_text(2700, 7000, "low") == "about 45 min–2 h (low confidence)"
    assert coarse_range_text(3 * 3600, 20 * 3600, "low") == "about 3–20 h (low confidence)"
    assert coarse_range_text(3 * 86400, 5.5 * 86400, "low") == "about 3–6 days (low confidence)"
    assert coarse_range_text(50 * 3600, 70 * 3600, "low") == "about 2–3 days (low confidence)"


@given(low=st.floats(0, 10**7), high=st.floats(0, 10**7), confidence=st.sampled_from(["low", "medium", "high"]))
def test_text_is_always_coarse(low, high, confidence):
    low, high = sorted([low, high])
    text = coarse_range_text(low, high, confidence)
    assert COARSE.match(text), text
    assert minute_values_are_coarse(text), text


kinds = st.sampled_from(["llm", "agent", "tool"])


@given(
    remaining=st.dictionaries(kinds, st.integers(0, 50), max_size=3),
    samples=st.dictionaries(kinds, st.lists(st.floats(0, 10**4), max_size=25), max_size=3),
    running=st.integers(0, 8),
    parallelism=st.integers(0, 8),
)
def test_eta_is_a_sane_range_or_none(remaining, samples, running, parallelism):
    eta = estimate_eta(remaining, {k: durations(v) for k, v in samples.items()}, running, parallelism)
    if not any(remaining.values()):
        assert eta is None
        return
    assert eta is not None
    assert 0 <= eta.low_seconds <= eta.high_seconds
    assert COARSE.match(eta.text), eta.text
    assert eta.text.endswith(f"({eta.confidence} confidence)")
