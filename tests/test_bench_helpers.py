"""The arithmetic and history reading behind `make bench` figures (bench/). The
benchmarks themselves are not run by `make test`."""

from __future__ import annotations

import dataclasses
import random
from statistics import median

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from bench.common import max_payload_bytes, next_run_id, slope_ms
from bench.max_goals import Level, cycle_steps, sample, task_times
from bench.run import judge
from bench.scale import predict
from perdure.workflows.goal.contracts.plan import Plan


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
    assert "met" in judge("recovery_s", 2.5) and "MISSED" in judge("recovery_s", 2.6)
    assert "met" in judge("fanout_ratio", 0.8) and "MISSED" in judge("fanout_ratio", 0.79)
    assert judge("events_per_node", 3.0) == ""


def task_event(event_id: int, kind: EventType, at: float, scheduled: int | None = None) -> HistoryEvent:
    event = HistoryEvent(event_id=event_id, event_type=kind)
    event.event_time.FromNanoseconds(int(at * 1e9))
    if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
        event.workflow_task_completed_event_attributes.scheduled_event_id = scheduled
    elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
        event.workflow_task_timed_out_event_attributes.scheduled_event_id = scheduled
    return event


def test_task_times_count_only_tasks_scheduled_in_the_window_and_timeouts_as_failures():
    scheduled, completed, timed_out = (
        EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
    )
    history = WorkflowHistory(
        "g",
        [
            task_event(2, scheduled, 99.0),  # before the window: left out
            task_event(4, completed, 100.5, scheduled=2),
            task_event(10, scheduled, 101.0),
            task_event(12, completed, 101.25, scheduled=10),
            task_event(20, scheduled, 105.0),
            task_event(22, timed_out, 109.0, scheduled=20),
            task_event(23, scheduled, 109.0),
            task_event(25, completed, 109.5, scheduled=23),
            task_event(30, scheduled, 110.0),  # at the window's end: left out
            task_event(32, completed, 110.1, scheduled=30),
        ],
    )
    assert task_times(history, since=100.0, until=110.0) == ([0.25, 0.5], 1)


def test_a_level_passes_only_with_its_p95_under_a_second_and_no_task_lost():
    level = Level(goals=500, tasks=99, p95_s=0.4, max_s=2.0, failed=0, rss_mb=300.0, ramp_s=5.0)
    assert level.passed
    assert not dataclasses.replace(level, p95_s=1.0).passed
    assert not dataclasses.replace(level, failed=1).passed
    assert not dataclasses.replace(level, tasks=0).passed


def test_the_sample_spreads_over_every_level_of_goals():
    assert sample(list(range(1000)), 4) == [0, 250, 500, 750]
    assert sample(list(range(3)), 4) == [0, 1, 2]


def test_each_goal_is_a_chain_of_a_wait_then_a_read_its_plan_accepts():
    steps = cycle_steps(first_wait_s=7, period_s=30, cycles=3)
    assert [s["name"] for s in steps] == ["wait-000", "read-000", "wait-001", "read-001", "wait-002", "read-002"]
    assert [s.get("after") for s in steps[::2]] == ["7s", "30s", "30s"]
    assert all(s["needs"] == [prev["name"]] for prev, s in zip(steps, steps[1:], strict=False))
    Plan(steps=steps)


def test_the_overhead_difference_comes_with_an_interval_that_covers_it_and_narrows_with_more_turns():
    from bench.agent_turn import difference_interval

    rng = random.Random(7)
    goal = [1.003 + rng.expovariate(1 / 0.02) for _ in range(40)]
    raw = [1.000 + rng.expovariate(1 / 0.02) for _ in range(40)]
    low, high = difference_interval(goal, raw)
    assert low < median(goal) - median(raw) < high
    many_low, many_high = difference_interval(goal * 10, raw * 10)
    assert many_high - many_low < high - low
    # The same turns give the same interval (a fixed seed): the printed figure can be checked.
    assert difference_interval(goal, raw) == (low, high)


def test_max_goals_tries_3000_goals_on_a_worker_whose_cache_holds_them_all():
    from bench import max_goals

    assert max(int(n) for n in max_goals.LEVELS.split(",")) == 3000
    assert max_goals.worker_env([1000, 2000, 3000]) == {"PERDURE_WORKFLOW_CACHE": "3000"}
    assert max_goals.worker_env([100, 1000]) == {}  # the default cache (1,000 runs) holds them
    # Starting 1,000 goals took 100-250 s under load: their first tasks get more than the 300 s of a few.
    assert max_goals.ramp_limit_s(1000) > max_goals.ramp_limit_s(100) >= 300
