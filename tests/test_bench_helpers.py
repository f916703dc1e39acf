"""The arithmetic and history reading behind `make bench` figures (bench/). The
benchmarks themselves are not run by `make test`."""

from __future__ import annotations

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from bench.common import max_payload_bytes, next_run_id, slope_ms
from bench.run import judge
from bench.scale import predict


def test_slope_cancels_the_fixed_cost():
    # 0.2 s fixed + 30 ms per step
    assert slope_ms((10, 0.5), (50, 1.7)) == pytest.approx(30.0)
    with pytest.raises(ValueError):
        slope_ms((50, 1.0), (50, 1.2))


def test_predict_follows_quadratic_growth_and_never_predicts_below_linear():
    def t(n: float) -> float:
        return 0.01 * n + 1e-5 * n * n

    assert predict([(1000, t(1000)), (2000, t(2000))], 10_000) == pytest.approx(t(10_000))
    # Sub-linear measurements (noise) still predict at least linear growth.
    assert predict([(1000, 10.0), (2000, 12.0)], 10_000) == pytest.approx(60.0)


def test_largest_payload_is_found_in_nested_and_repeated_fields_and_maps():
    start = HistoryEvent(event_id=1, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED)
    start.workflow_execution_started_event_attributes.input.payloads.append(Payload(data=b"x" * 10))
    upsert = HistoryEvent(event_id=2, event_type=EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES)
    fields = upsert.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    fields["PerdureGoalStatus"].CopyFrom(Payload(data=b"y" * 500))
    history = WorkflowHistory("wf", [start, upsert])
    assert max_payload_bytes(history) == Payload(data=b"y" * 500).ByteSize()


def test_next_run_id_only_after_continue_as_new():
    done = HistoryEvent(event_id=9, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)
    assert next_run_id(WorkflowHistory("wf", [done])) is None
    moved = HistoryEvent(event_id=9, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW)
    moved.workflow_execution_continued_as_new_event_attributes.new_execution_run_id = "run-2"
    assert next_run_id(WorkflowHistory("wf", [moved])) == "run-2"


def test_targets_are_judged_in_their_direction():
    assert "met" in judge("recovery_s", 4.9) and "MISSED" in judge("recovery_s", 5.1)
    assert "met" in judge("fanout_ratio", 0.8) and "MISSED" in judge("fanout_ratio", 0.79)
    assert judge("events_per_node", 3.0) == ""
