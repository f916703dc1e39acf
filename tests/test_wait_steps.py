"""Wait steps and the park deadline say how late they were (issue 22, section 3): a plan's
`wait` step is a durable timer whose output (what a later step's model reads, what the
report lists) gives the planned time, when the goal acted, how late and whether exact; a
park's wake time says the same in the gate log. Long waits run on the time-skipping
server; lateness from an outage is made by stopping the worker across the planned time
on a real dev server."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from perdure.activities.models.profiles import ModelConfig
from perdure.workers.orchestrator import build_worker
from perdure.workflows.goal.contracts.goal_contracts import GoalResult
from perdure.workflows.goal.contracts.messages import Answer, Park
from perdure.workflows.goal.contracts.plan import parse_plan
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.rules.timing import TimerEvents, judge, late_cause, lateness_text
from tests.builders import gate, llm, openai_profile, spec
from tests.helpers import local_activities, perdure_status, submit, wait_until

STEP_REPLY = {"policy": "offline", "replies": [{"when": "step: ", "content": "done"}]}
LATE = re.compile(r"checked at (?:\d{4}-\d{2}-\d{2} )?[0-9:]+ UTC, ((?:\d+ (?:d|h|min|s) ?)+) late, late")
UNIT_S = {"d": 86_400, "h": 3_600, "min": 60, "s": 1}


def wait(name: str, needs: list[str] | None = None, **when) -> dict:
    return {"name": name, "kind": "wait", "needs": needs or [], **when}


def node(snapshot, name: str):
    return next(n for n in snapshot.nodes if n.name == name)


def seconds_late(preview: str) -> int:
    found = LATE.search(preview)
    assert found, preview
    return sum(int(n) * UNIT_S[unit] for n, unit in re.findall(r"(\d+) (d|h|min|s)", found.group(1)))


async def start_goal(env, task_queue, workspace, steps, goal_id, **overrides):
    goal = spec(workspace, plan={"steps": steps}, drift_every=0, **overrides)
    return await env.client.start_workflow(GoalWorkflow.run, GoalInput(spec=goal), id=goal_id, task_queue=task_queue)


def worker(env, task_queue, store, server):
    return build_worker(
        env.client,
        task_queue=task_queue,
        store=store,
        model_config=ModelConfig(profiles={"test": openai_profile(server)}),
    )


# --- plans -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (wait("w"), "needs exactly one of `until` (a time) or `after` (a duration)"),
        (wait("w", until="2026-12-02T09:00:00Z", after="2h"), "needs exactly one of"),
        (wait("w", until="2026-12-02T09:00:00"), "has no timezone: write it as e.g. 2026-12-02T09:00:00Z"),
        (wait("w", after="2 hours"), "'2 hours' is not a duration (a number and a unit, or several: 90s, 15m"),
        (wait("w", after="0s"), "'0s' is not a positive duration"),
        (wait("w", after="2h", until=None, every="1h"), "every: Extra inputs are not permitted"),
    ],
)
def test_a_wait_step_without_one_clear_time_is_refused_with_the_reason(step, message):
    plan, reason = parse_plan({"steps": [step]}, [])
    assert plan is None and reason is not None and message in reason, reason


def test_a_wait_step_takes_a_time_with_its_zone_or_a_duration():
    plan, reason = parse_plan(
        {"steps": [wait("nine", until="2026-12-02T09:00Z"), wait("later", after="1h30m"), wait("day", after="1d")]},
        [],
    )
    assert reason is None and plan is not None
    nine, later, day = plan.steps
    assert nine.until == datetime(2026, 12, 2, 9, tzinfo=UTC)
    assert (later.delay(), day.delay()) == (timedelta(minutes=90), timedelta(days=1))


def test_lateness_under_the_threshold_is_exact_and_a_park_is_late_whatever_the_gap():
    planned = datetime(2026, 12, 2, 9, tzinfo=UTC)
    assert judge("w", planned, planned + timedelta(seconds=4)).text() == (
        "checked at 09:00:04 UTC, 4 s late, exact; planned 2026-12-02 09:00:00 UTC"
    )
    outage = judge("w", planned, planned + timedelta(hours=2, minutes=10))
    assert (outage.timing, outage.late_s) == ("late", 7800.0)
    assert "2 h 10 min late, late (no worker ran the goal then, or the server was down)" in outage.text()
    assert judge("w", planned, planned + timedelta(seconds=1), parked=True).timing == "late"
    assert lateness_text(0.4) == "on time" and lateness_text(90_000) == "1 d 1 h late"


def test_a_late_timers_history_says_whether_the_server_or_the_worker_was_missing():
    planned = datetime(2026, 12, 2, 9, tzinfo=UTC)
    server_down = TimerEvents(
        fired_at=planned + timedelta(minutes=3), taken_at=planned + timedelta(minutes=3, seconds=1)
    )
    assert late_cause(planned, server_down) == (
        "the server fired the timer at 09:03:00 UTC, 3 min late: it was down or behind"
    )
    no_worker = TimerEvents(fired_at=planned + timedelta(seconds=1), taken_at=planned + timedelta(minutes=2))
    assert late_cause(planned, no_worker) == "the timer fired on time; no worker took the goal until 09:02:00 UTC"
    # Neither gap is large (the lateness was elsewhere), or no such timer: history does not tell.
    assert late_cause(planned, TimerEvents(fired_at=planned, taken_at=planned + timedelta(seconds=1))) is None
    assert late_cause(planned, TimerEvents()) is None
    told = judge("w", planned, planned + timedelta(minutes=2), cause=late_cause(planned, no_worker))
    assert "2 min late, late (the timer fired on time; no worker took the goal until 09:02:00 UTC)" in told.text()
    # A cause never makes an exact timer late, nor a parked one anything but parked.
    assert judge("w", planned, planned + timedelta(seconds=1), cause="x").cause is None
    assert judge("w", planned, planned + timedelta(hours=1), parked=True, cause="x").cause == "the goal was parked"


# --- time-skipped ----------------------------------------------------------------------


@pytest.mark.slow
async def test_a_two_hour_wait_fires_exact_and_the_next_step_and_the_report_read_how_late(
    ts_env, task_queue, store, workspace, scripted
):
    server = scripted(STEP_REPLY)
    steps = [wait("two-hours", after="2h"), llm("after-the-wait", ["two-hours"])]
    handle = await start_goal(ts_env, task_queue, workspace, steps, f"wait-2h-{task_queue}")
    async with worker(ts_env, task_queue, store, server):
        result: GoalResult = await asyncio.wait_for(handle.result(), 120)
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt
    said = node(snapshot, "two-hours").preview
    assert re.fullmatch(r"checked at [0-9:]+ UTC, (on time|[0-4] s late), exact; planned .+ UTC", said), said
    assert snapshot.last_progress_at - snapshot.started_at >= timedelta(hours=2)
    # The model of the step after it is shown the wait's own sentence as its input.
    asked = [r["last_message"] for r in server.requests() if r["last_message"].startswith("step: after-the-wait")]
    assert len(asked) == 1 and f"wait step 'two-hours': {said}" in asked[0], asked
    report = store.get_text(result.report)
    assert f"## Timers\n\n- wait step 'two-hours': {said}" in report, report


@pytest.mark.slow
async def test_a_wait_crossing_continue_as_new_keeps_its_planned_time(ts_env, task_queue, store, workspace, scripted):
    """The hour's wait starts with the goal; half an hour in, a chain of steps fills the run's
    event budget, so the goal continues as new while the wait is on: the new run waits for
    the same planned time (one hour after the start), not an hour after it began."""
    server = scripted(STEP_REPLY)
    chain = [llm(f"s{i}", [f"s{i - 1}"] if i else ["half-hour"]) for i in range(8)]
    steps = [wait("hour", after="1h"), wait("half-hour", after="30m"), *chain]
    handle = await start_goal(
        ts_env, task_queue, workspace, steps, f"wait-can-{task_queue}", continue_as_new_after_events=60
    )
    async with worker(ts_env, task_queue, store, server):
        result: GoalResult = await asyncio.wait_for(handle.result(), 120)
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt
    assert snapshot.runs >= 2, snapshot.gate_log
    said = node(snapshot, "hour").preview
    planned = datetime.strptime(said.rpartition("planned ")[2], "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC)
    assert abs(planned - (snapshot.started_at + timedelta(hours=1))) < timedelta(seconds=5), (said, snapshot.started_at)
    assert said.split(";")[0].endswith("exact"), said


@pytest.mark.slow
async def test_a_wait_whose_time_passes_while_parked_fires_on_resume_marked_late(
    ts_env, task_queue, store, workspace, scripted
):
    server = scripted(STEP_REPLY)
    # The gate keeps the goal busy (an activity running) until it is parked: an idle goal's
    # time jumps straight to the wait's, which the server now fires within 10 ms.
    handle = await start_goal(
        ts_env,
        task_queue,
        workspace,
        [wait("ten-minutes", after="10m"), gate()],
        f"wait-park-{task_queue}",
        allowed_tools=["run_command"],
    )
    async with worker(ts_env, task_queue, store, server):
        await wait_until(handle, lambda s: node(s, "ten-minutes").preview.startswith("waiting until"))
        await submit(handle, Park(request_id="park-1", reason="away", expiry_hours=1))
        (workspace / "GO").touch()
        # Parked and idle: time skips past the wait's time to the park's expiry, which asks.
        asked = await wait_until(handle, lambda s: any(q.topic == "park_expired" for q in s.questions), 60)
        assert node(asked, "ten-minutes").status == "parked"
        question = next(q for q in asked.questions if q.topic == "park_expired")
        await submit(handle, Answer(request_id="back", question_id=question.id, choice="resume"))
        result: GoalResult = await asyncio.wait_for(handle.result(), 60)
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt
    said = node(snapshot, "ten-minutes").preview
    assert ", late (the goal was parked)" in said and seconds_late(said) >= 49 * 60, said
    assert any(e.startswith("park expiry: asked at ") for e in snapshot.gate_log), snapshot.gate_log


# --- a real server, the worker stopped across the planned time --------------------------


@pytest.mark.slow
async def test_waits_missed_in_an_outage_fire_once_each_in_order_saying_how_late(
    env, task_queue, store, workspace, scripted
):
    server = scripted(STEP_REPLY)
    steps = [wait("first", after="3s"), wait("second", after="5s"), llm("then", ["first", "second"])]
    handle = await start_goal(env, task_queue, workspace, steps, f"wait-outage-{task_queue}")
    async with worker(env, task_queue, store, server):
        await wait_until(handle, lambda s: all(node(s, n).preview.startswith("waiting") for n in ("first", "second")))
    # No worker from here: both timers fire on the server with nobody to act on them.
    stopped = time.monotonic()
    await asyncio.sleep(12)
    async with worker(env, task_queue, store, server):
        back = time.monotonic()
        result: GoalResult = await asyncio.wait_for(handle.result(), 60)
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt
    first, second = (node(snapshot, n).preview for n in ("first", "second"))
    outage = back - stopped
    print(f"\noutage {outage:.1f} s: first: {first}; second: {second}")
    # Each says it was late by about the time it spent with no worker (its time came within
    # the outage's first 5 s), the earlier one by 2 s more.
    assert outage - 5 - 2 <= seconds_late(second) <= outage + 2, (second, outage)
    assert seconds_late(first) - seconds_late(second) in (1, 2, 3), (first, second)
    # Read off the goal's history: the server fired both on time; no worker took them.
    assert all("(the timer fired on time; no worker took the goal until " in p for p in (first, second))
    history = await handle.fetch_history()
    kept = [summary for _, _, summary, _ in local_activities(history) if summary.startswith("keep output · wait")]
    assert kept == ["keep output · wait first", "keep output · wait second"], kept


@pytest.mark.slow
async def test_a_park_wake_time_missed_in_an_outage_says_how_late_it_woke(env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    handle = await start_goal(env, task_queue, workspace, [wait("hold", after="1h")], f"park-late-{task_queue}")
    async with worker(env, task_queue, store, server):
        await wait_until(handle, lambda s: node(s, "hold").preview.startswith("waiting until"))
        wake = datetime.now(UTC) + timedelta(seconds=3)
        await submit(handle, Park(request_id="park-1", reason="until soon", until=wake))
        await wait_until(handle, lambda s: s.parked)
    stopped = time.monotonic()
    await asyncio.sleep(12)
    async with worker(env, task_queue, store, server):
        back = time.monotonic()
        woke = await wait_until(handle, lambda s: not s.parked, timeout_s=30)
        status = await perdure_status(env, handle.id)
        await handle.terminate("the test has what it needs")
    entry = next(e for e in woke.gate_log if e.startswith("park wake time: "))
    print(f"\noutage {back - stopped:.1f} s: {entry}")
    late = re.search(r"woke at [0-9:]+ UTC, (\d+) s late, late \(no worker", entry)
    assert late, entry
    assert (back - stopped) - 3 - 2 <= int(late.group(1)) <= (back - stopped) + 2, (entry, back - stopped)
    # The wait it held goes on for its own hour; `perdure status` says so, and how late the park woke.
    assert node(woke, "hold").preview.startswith("waiting until"), node(woke, "hold").preview
    row = next(line for line in status.splitlines() if "hold" in line)
    cells = [cell.strip() for cell in row.split("│")]
    assert cells[1:4] == ["hold", "wait", "waiting"] and cells[6].startswith("waiting until"), status
    assert f"gate {entry}" in " ".join(status.split()), status
