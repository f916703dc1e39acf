"""perdure's own metrics: their names, kinds, units and labels, and one small wrapper that
records them through a Temporal `MetricMeter`.

The meter is the SDK's: `workflow.metric_meter()` in workflow code (it records nothing
while a workflow replays history, so a goal replayed on another worker counts nothing
twice) or `activity.metric_meter()` in activities. Both export through the runtime the
worker's client was made with (runtime/telemetry.py), next to Temporal's own
`temporal_*` metrics; without one they are no-ops. Recording adds no command and no
event, so workflow code may record anywhere.

Pure and deterministic: it reads no clock and no environment, and holds no state but
the instruments it has made. docs/guide/observability.md lists `CATALOGUE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from temporalio.common import MetricMeter

Kind = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Kind
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    # Gauges and histograms of fractional values (seconds, dollars) record floats.
    floats: bool = False


GOALS_STARTED = Metric("perdure_goals_started", "counter", "{goal}", "Goals started (not their later runs).")
GOALS_ENDED = Metric("perdure_goals_ended", "counter", "{goal}", "Goals ended, by outcome.", ("outcome",))
NODES_SETTLED = Metric(
    "perdure_nodes_settled",
    "counter",
    "{node}",
    "Task-graph nodes settled, by kind and outcome (a node settled again, e.g. voided once done, counts again).",
    ("kind", "outcome"),
)
GATE_DECISIONS = Metric(
    "perdure_budget_gate_decisions",
    "counter",
    "{decision}",
    "Budget gate decisions other than a plain dispatch: degraded, skip, wrap_up_only, emergency_stop, density.",
    ("decision",),
)
STALL_RUNGS = Metric(
    "perdure_stall_rungs",
    "counter",
    "{rung}",
    "Stall-ladder rungs fired in agent nodes: remind, switch_tool, ask_human, abandon.",
    ("rung",),
)
MODEL_TOKENS = Metric(
    "perdure_model_tokens",
    "counter",
    "{token}",
    "Tokens of model calls as the provider reported them (or estimated), by profile and type (input, output).",
    ("profile", "token_type"),
)
MODEL_COST = Metric(
    "perdure_model_call_cost_usd",
    "histogram",
    "USD",
    "The priced cost of each model call, by profile (_sum is the total, _count the calls).",
    ("profile",),
    floats=True,
)
WATCHDOG_FINDINGS = Metric(
    "perdure_watchdog_findings",
    "counter",
    "{finding}",
    "Findings of the watchdog's scans other than healthy, by kind (a goal stuck for ten scans counts ten).",
    ("finding",),
)
GOALS_OPEN = Metric(
    "perdure_goals_open", "gauge", "{goal}", "Open goals at the watchdog's last scan, by phase.", ("phase",)
)
QUESTIONS_WAITING = Metric(
    "perdure_questions_waiting", "gauge", "{question}", "Open questions to people at the watchdog's last scan."
)
OLDEST_QUESTION_AGE = Metric(
    "perdure_question_oldest_age_seconds",
    "gauge",
    "s",
    "How long the oldest open question has waited, at the watchdog's last scan (0: none).",
    floats=True,
)

CATALOGUE = (
    GOALS_STARTED,
    GOALS_ENDED,
    NODES_SETTLED,
    GATE_DECISIONS,
    STALL_RUNGS,
    MODEL_TOKENS,
    MODEL_COST,
    WATCHDOG_FINDINGS,
    GOALS_OPEN,
    QUESTIONS_WAITING,
    OLDEST_QUESTION_AGE,
)
# Per-call costs are cents or dollars, not the milliseconds Temporal's default buckets fit.
HISTOGRAM_BUCKETS = {MODEL_COST.name: [0.0001, 0.001, 0.01, 0.1, 1.0, 10.0]}


class PerdureMeter:
    """Records catalogue metrics on one Temporal meter, making each instrument once."""

    def __init__(self, meter: MetricMeter) -> None:
        self._meter = meter
        self._made: dict[str, object] = {}
        # (metric, labels) -> its labelled instrument: a node settling is counted without
        # building its attribute set again.
        self._labelled_made: dict[tuple[str, tuple[tuple[str, str], ...]], object] = {}

    def add(self, metric: Metric, value: int, **labels: str) -> None:
        assert metric.kind == "counter", metric.name
        self._labelled(metric, labels).add(value)

    def record(self, metric: Metric, value: float, **labels: str) -> None:
        assert metric.kind == "histogram", metric.name
        self._labelled(metric, labels).record(value)

    def set(self, metric: Metric, value: float, **labels: str) -> None:
        assert metric.kind == "gauge", metric.name
        self._labelled(metric, labels).set(value)

    def _labelled(self, metric: Metric, labels: dict[str, str]):  # noqa: ANN202 - a Temporal metric instrument
        key = (metric.name, tuple(sorted(labels.items())))
        labelled = self._labelled_made.get(key)
        if labelled is None:
            labelled = self._labelled_made[key] = self._make(metric, labels)
        return labelled

    def _make(self, metric: Metric, labels: dict[str, str]):  # noqa: ANN202 - a Temporal metric instrument
        assert set(labels) == set(metric.labels), (metric.name, sorted(labels))
        instrument = self._made.get(metric.name)
        if instrument is None:
            make = {
                ("counter", False): self._meter.create_counter,
                ("histogram", False): self._meter.create_histogram,
                ("histogram", True): self._meter.create_histogram_float,
                ("gauge", False): self._meter.create_gauge,
                ("gauge", True): self._meter.create_gauge_float,
            }[(metric.kind, metric.floats)]
            instrument = self._made[metric.name] = make(metric.name, metric.description, metric.unit)
        return instrument.with_additional_attributes(labels) if labels else instrument
