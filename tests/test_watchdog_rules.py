"""The watchdog's rules without Temporal: findings, the nudge-then-escalate
order, incidents opening and resolving, and the invariants that must hold for
any goal and any history of runs (parked goals are never messaged; no request
id is ever sent twice; an escalation never precedes its nudge).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perdure.workflows.goal.contracts.messages import REQUEST_ID
from perdure.workflows.watchdog.watchdog_contracts import (
    GoalObservation,
    InterventionOutcome,
    PendingActivityView,
    WatchdogMemory,
    WatchdogRules,
)
from perdure.workflows.watchdog.watchdog_rules import (
    ambiguity,
    assess,
    episode_of,
    off_goal,
    parse_verdict,
    remember,
    request_id,
    verdict_step,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
RULES = WatchdogRules()


def goal(goal_id: str = "g1", **fields) -> GoalObservation:
    base = dict(
        goal_id=goal_id,
        started_at=T0,
        phase="running",
        running=["gate"],
        last_progress_at=T0,
        stall_after_s=600,
    )
    base.update(fields)
    return GoalObservation(**base)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(goals: list[GoalObservation], memory: WatchdogMemory, now: datetime, delivered: bool = True):
    """One watchdog run: the assessment, and the memory after it (all interventions delivered)."""
    assessment = assess(goals, memory, now, RULES)
    outcomes = [InterventionOutcome(request_id=i.request_id, sent=delivered) for i in assessment.interventions]
    return assessment, remember(memory, goals, assessment, outcomes, now, f"run-{now.isoformat()}")


def kinds(assessment, goal_id: str = "g1") -> list[str]:
    return [f.kind for f in assessment.findings if f.goal_id == goal_id]


def test_a_goal_making_progress_is_healthy():
    assessment, _ = run([goal(last_progress_at=at(500))], WatchdogMemory(), at(600))
    assert kinds(assessment) == ["healthy"] and assessment.interventions == []
    assert "last progress 100 s ago" in assessment.findings[0].detail


def test_a_stall_is_nudged_then_escalated_then_left_alone():
    stalled = goal()
    memory = WatchdogMemory()
    first, memory = run([stalled], memory, at(600))
    assert kinds(first) == ["stalled"]
    [nudge] = first.interventions
    assert (nudge.action, nudge.request_id) == ("nudge", f"wd-g1-stalled-nudge-{episode_of(T0)}")
    assert "No step of this goal has finished since 2025-03-01 12:00 UTC" in nudge.text
    # Escalation waits half the goal's stall threshold after the nudge.
    too_soon, memory = run([stalled], memory, at(899))
    assert too_soon.interventions == [] and kinds(too_soon) == ["stalled"]
    second, memory = run([stalled], memory, at(900))
    [escalation] = second.interventions
    assert escalation.action == "escalate" and escalation.request_id == nudge.request_id.replace("nudge", "escalate")
    for later in (901, 5000, 86400):
        quiet, memory = run([stalled], memory, at(later))
        assert quiet.interventions == []


def test_a_nudge_that_could_not_be_delivered_is_sent_again_under_the_same_id():
    stalled = goal()
    first, memory = run([stalled], WatchdogMemory(), at(600), delivered=False)
    again, _ = run([stalled], memory, at(660))
    assert [i.request_id for i in again.interventions] == [i.request_id for i in first.interventions]
    assert again.interventions[0].text == first.interventions[0].text  # same message, not a conflicting one


def test_new_progress_is_a_new_stall_episode():
    _, memory = run([goal()], WatchdogMemory(), at(600))
    later = goal(last_progress_at=at(1000))
    assert kinds(run([later], memory, at(1200))[0]) == ["healthy"]
    fresh, _ = run([later], memory, at(1600))
    [nudge] = fresh.interventions
    assert nudge.action == "nudge" and nudge.episode == episode_of(at(1000))


def test_parked_goals_are_never_messaged_and_expiry_is_only_recorded():
    parked = goal(parked=True, phase="parked", park_expires_at=at(3600), budget={"wall_seconds": 3.0})
    before, memory = run([parked], WatchdogMemory(), at(3000))
    assert kinds(before) == ["parked", "over_budget"] and before.interventions == []
    after, _ = run([parked], memory, at(7200))
    assert kinds(after) == ["parked_past_expiry", "over_budget"] and after.interventions == []


def test_a_goal_waiting_for_a_person_is_not_stalled_and_old_questions_are_reported():
    waiting = goal(phase="awaiting_human", open_questions=["q1: Confirm payment"], oldest_question_at=at(100))
    soon, _ = run([waiting], WatchdogMemory(), at(3600))
    assert kinds(soon) == ["healthy"] and soon.interventions == []
    late, _ = run([waiting], WatchdogMemory(), at(100 + RULES.unanswered_after_s))
    assert kinds(late) == ["needs_human"] and late.interventions == []
    assert "q1: Confirm payment" in late.findings[0].detail and "6.0 h" in late.findings[0].detail


def test_a_goal_whose_only_work_is_a_wait_step_waiting_for_its_time_is_not_stalled():
    waiting = goal(running=[], waiting_on_timers=["check-at-nine"])
    assessment, _ = run([waiting], WatchdogMemory(), at(7_200))
    assert kinds(assessment) == ["healthy"] and assessment.interventions == []
    busy = goal(running=["gate"], waiting_on_timers=["check-at-nine"])  # a running step stalls as before
    assert kinds(run([busy], WatchdogMemory(), at(7_200))[0]) == ["stalled"]


def test_a_goal_whose_running_steps_only_wait_for_a_quota_slot_is_not_stalled():
    waiting = goal(running=["summarise"], waiting_for_quota=["summarise"])
    assert kinds(run([waiting], WatchdogMemory(), at(7_200))[0]) == ["healthy"]
    other = goal(running=["summarise", "gate"], waiting_for_quota=["summarise"])  # gate itself may be stuck
    assert kinds(run([other], WatchdogMemory(), at(7_200))[0]) == ["stalled"]


def test_the_stall_clock_restarts_when_a_wait_ends():
    waiting = goal(parked=True, phase="parked")
    _, memory = run([waiting], WatchdogMemory(), at(5000))
    resumed = goal()  # last progress long ago, but it was parked until now
    first, memory = run([resumed], memory, at(5060))
    assert kinds(first) == ["healthy"]
    assert memory.goals["g1"].wait_ended_at == at(5060)
    stalled, _ = run([resumed], memory, at(5060 + 600))
    [nudge] = stalled.interventions
    assert nudge.episode == episode_of(at(5060))


def test_looping_escalates_once_and_mutes_the_stall_nudge():
    looping = goal(looping_nodes={"hunt": 3}, running=["hunt"])
    first, memory = run([looping], WatchdogMemory(), at(900))
    assert kinds(first) == ["looping", "stalled"]
    [escalation] = first.interventions
    assert escalation.action == "escalate" and escalation.finding == "looping" and escalation.episode == "hunt.r3"
    assert run([looping], memory, at(2000))[0].interventions == []
    below = goal(looping_nodes={"hunt": 2}, last_progress_at=at(800))
    assert kinds(run([below], WatchdogMemory(), at(900))[0]) == ["healthy"]


def test_over_budget_escalates_once_per_dimension():
    spent = goal(last_progress_at=at(100), budget={"cost_usd": 1.02, "tokens": 0.4})
    first, memory = run([spent], WatchdogMemory(), at(200))
    assert kinds(first) == ["over_budget"]
    [escalation] = first.interventions
    assert escalation.episode == "cost_usd" and escalation.text == (
        "This goal has used up its cost_usd budget and is still running."
    )
    assert run([spent], memory, at(300))[0].interventions == []
    ending = goal(phase="reporting", budget={"cost_usd": 1.5})
    assert run([ending], WatchdogMemory(), at(300))[0].interventions == []


def test_a_failed_step_is_a_finding_with_its_error_and_no_message_to_the_goal():
    failed = [f"read-{i}: workspace '/w' does not exist (WorkspaceMissing)" for i in range(5)]
    broken = goal(last_progress_at=at(100), failed_steps=failed, failed_count=7)
    assessment, _ = run([broken], WatchdogMemory(), at(200))
    [finding] = assessment.findings
    assert finding.kind == "step_failed" and finding.episode == "read-0"
    assert finding.detail.startswith("7 step(s) failed: read-0: workspace '/w' does not exist (WorkspaceMissing); ")
    assert finding.detail.count("WorkspaceMissing") == 3 and assessment.interventions == []
    ended = goal(phase="reporting", failed_steps=failed[:1])
    assert kinds(run([ended], WatchdogMemory(), at(200))[0]) == ["healthy"]


def failing_activity(attempt: int = 4) -> PendingActivityView:
    return PendingActivityView(
        activity_type="perdure.model.generate", state="scheduled", attempt=attempt, last_failure="HTTP 500"
    )


def test_a_failing_activity_is_one_incident_until_it_clears():
    failing = goal(last_progress_at=at(0), pending=[failing_activity(), failing_activity(5)])
    first, memory = run([failing], WatchdogMemory(), at(700))
    [incident] = first.incidents
    assert incident.id == "g1/failing/perdure.model.generate" and incident.opened_at == at(700)
    assert kinds(first) == ["failing", "stalled"]
    assert first.interventions == []  # the model cannot fix a failing API: no nudge
    second, memory = run([failing], memory, at(760))
    assert [(i.id, i.checks, i.resolved_at) for i in second.incidents] == [(incident.id, 2, None)]
    cleared, memory = run([goal(last_progress_at=at(790))], memory, at(820))
    [resolved] = cleared.incidents
    assert resolved.resolved_at == at(820) and resolved.resolution == "cleared: no longer seen"
    assert memory.open_incidents() == [] and memory.incidents[0].id == incident.id
    after, memory = run([goal(last_progress_at=at(790))], memory, at(880))
    assert after.incidents == [] and len(memory.incidents) == 1  # resolved once, kept as history
    below = goal(last_progress_at=at(800), pending=[failing_activity(attempt=2)])
    assert run([below], WatchdogMemory(), at(900))[0].incidents == []


def test_an_incident_stays_open_while_the_server_cannot_describe_the_goal():
    _, memory = run([goal(pending=[failing_activity()])], WatchdogMemory(), at(10))
    unknown, memory = run([goal(pending_known=False)], memory, at(70))
    assert [(i.id, i.resolved_at) for i in unknown.incidents] == [("g1/failing/perdure.model.generate", None)]
    cleared, _ = run([goal()], memory, at(130))
    assert cleared.incidents[0].resolved_at == at(130)


def test_incidents_of_a_goal_that_ended_are_resolved():
    _, memory = run([goal(pending=[failing_activity()])], WatchdogMemory(), at(10))
    gone, memory = run([], memory, at(70))
    assert gone.incidents[0].resolution == "the goal is no longer running"
    assert memory.goals == {}


def test_what_was_sent_to_a_goal_no_longer_listed_is_kept_a_while():
    _, memory = run([goal()], WatchdogMemory(), at(600))
    assert list(memory.sent) == [f"wd-g1-stalled-nudge-{episode_of(T0)}"]
    _, memory = run([], memory, at(700))
    again, kept = run([goal()], memory, at(760))  # listed again: not nudged twice
    assert again.interventions == [] and list(kept.sent) == list(memory.sent)
    _, memory = run([], memory, at(600 + 8 * 86400))
    assert memory.sent == {}


def test_an_activity_no_worker_starts_is_unreachable():
    never = PendingActivityView(
        activity_type="perdure.tool.run", state="scheduled", attempt=1, task_queue="device-laptop", scheduled_at=at(0)
    )
    early, _ = run([goal(last_progress_at=at(0), pending=[never])], WatchdogMemory(), at(299))
    assert early.incidents == []
    late, _ = run([goal(last_progress_at=at(0), pending=[never])], WatchdogMemory(), at(300))
    [incident] = late.incidents
    assert incident.id == "g1/unreachable/perdure.tool.run on device-laptop"
    assert "scheduled 5 min ago on device-laptop and no worker has started it" in incident.detail


def test_an_unresponsive_goal_is_an_incident_and_nothing_else():
    silent = GoalObservation(goal_id="g1", started_at=T0, query_error="no worker answered within 10 s")
    assessment, _ = run([silent], WatchdogMemory(), at(86400))
    assert kinds(assessment) == ["unresponsive"] and assessment.interventions == []
    assert assessment.incidents[0].id == "g1/unresponsive/progress query"


def test_request_ids_stay_within_the_inbox_rules():
    episode = episode_of(datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC))
    assert episode == "20250102T030405.678Z"
    assert request_id("goal-a", "stalled", "nudge", episode) == "wd-goal-a-stalled-nudge-20250102T030405.678Z"
    long_id = request_id("g/" + "x" * 300, "looping", "escalate", "n" * 80 + ".r3")
    assert re.match(REQUEST_ID, long_id) and len(long_id) <= 128
    assert long_id == request_id("g/" + "x" * 300, "looping", "escalate", "n" * 80 + ".r3")
    assert long_id != request_id("g/" + "x" * 300, "looping", "escalate", "m" * 80 + ".r3")


# --- properties -------------------------------------------------------------------------

moments = st.integers(min_value=0, max_value=10 * 86400).map(lambda s: at(s))
pending_activities = st.builds(
    PendingActivityView,
    activity_type=st.sampled_from(["perdure.model.generate", "perdure.tool.run"]),
    state=st.sampled_from(["scheduled", "started"]),
    attempt=st.integers(min_value=1, max_value=8),
    task_queue=st.sampled_from([None, "perdure", "device-x"]),
    scheduled_at=st.none() | moments,
    last_failure=st.none() | st.just("HTTP 500"),
)


# Strategies built once: hypothesis caches them, and building them per draw is slow.
phases = st.sampled_from(["planning", "running", "awaiting_human", "parked", "reporting"])
question_lists = st.lists(st.sampled_from(["q1: a", "q2: b"]), max_size=2, unique=True)
running_lists = st.lists(st.sampled_from(["a", "b", "hunt"]), max_size=3, unique=True)
rung_maps = st.dictionaries(st.sampled_from(["a", "hunt"]), st.integers(1, 4), max_size=2)
budget_maps = st.dictionaries(st.sampled_from(["tokens", "cost_usd"]), st.floats(0, 2), max_size=2)
thresholds = st.sampled_from([1.0, 60.0, 1800.0])
maybe_moments = st.none() | moments
pending_lists = st.lists(pending_activities, max_size=3)
silent = st.integers(min_value=0, max_value=9).map(lambda n: n == 0)


@st.composite
def observations(draw, goal_id: str) -> GoalObservation:
    if draw(silent):
        return GoalObservation(goal_id=goal_id, started_at=T0, query_error="no worker answered within 10 s")
    parked = draw(st.booleans())
    questions = draw(question_lists)
    return GoalObservation(
        goal_id=goal_id,
        started_at=T0,
        phase=draw(phases),
        parked=parked,
        running=draw(running_lists),
        last_progress_at=draw(maybe_moments),
        stall_after_s=draw(thresholds),
        looping_nodes=draw(rung_maps),
        park_expires_at=draw(moments) if parked else None,
        open_questions=questions,
        oldest_question_at=draw(moments) if questions else None,
        budget=draw(budget_maps),
        pending=draw(pending_lists),
    )


# Runs over one or two goals, at increasing times, each run's messages delivered or not.
histories = st.lists(
    st.tuples(observations("g1"), st.none() | observations("g2"), st.integers(1, 12 * 3600), st.booleans()),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(histories)
@pytest.mark.slow
def test_runs_never_message_parked_goals_never_repeat_and_escalate_only_after_a_nudge(history):
    memory = WatchdogMemory()
    now = T0
    sent: dict[str, datetime] = {}
    for first, second, step, delivered in history:
        goals = [first] + ([second] if second else [])
        now += timedelta(seconds=step)
        assessment, memory = run(goals, memory, now, delivered=delivered)
        for item in assessment.interventions:
            observed = next(g for g in goals if g.goal_id == item.goal_id)
            assert not observed.parked, "a parked goal was messaged"
            assert observed.phase not in ("reporting", "finished", "failed")
            assert re.match(REQUEST_ID, item.request_id)
            assert item.request_id not in sent, "an intervention was sent twice"
            if item.finding == "stalled" and item.action == "escalate":
                nudge = item.request_id.replace("-escalate-", "-nudge-")
                assert nudge in sent and sent[nudge] < now, "escalated before nudging"
            if delivered:
                sent[item.request_id] = now
        ids = [i.request_id for i in assessment.interventions]
        assert len(ids) == len(set(ids))


@settings(max_examples=50, deadline=None)
@given(st.lists(observations("g1"), min_size=1, max_size=1), moments)
def test_assessment_is_deterministic(goals, now):
    assert assess(goals, WatchdogMemory(), now, RULES) == assess(goals, WatchdogMemory(), now, RULES)


# --- when the model is asked, and what its verdicts do ---------------------------------


def kinds_of(findings) -> list[str]:
    return [f.kind for f in findings]


def test_a_step_running_past_half_its_stall_threshold_is_ambiguous_before_it_is_a_stall():
    """A long agent step: the rules cannot tell productive from stuck, so the model is asked
    at half the threshold; before that, and once it is a stall, the rules decide alone."""
    long_step = goal(running=["review"], stall_after_s=600)
    healthy = assess([long_step], WatchdogMemory(), at(200), RULES).findings
    assert ambiguity(long_step, healthy, at(200)) is None
    later = assess([long_step], WatchdogMemory(), at(320), RULES).findings
    assert kinds_of(later) == ["healthy"]
    assert ambiguity(long_step, later, at(320)) == "step(s) review running for 5 min with nothing settled"
    stalled = assess([long_step], WatchdogMemory(), at(700), RULES).findings
    assert "stalled" in kinds_of(stalled) and ambiguity(long_step, stalled, at(700)) is None


def test_conclusions_sharing_no_term_with_the_goal_are_ambiguous_for_drift():
    text = "Migrate the billing service from MySQL to PostgreSQL"
    drifted = goal(
        goal_text=text,
        conclusions=["s1: the logo colours are fine", "s2: fonts load fast", "s3: favicon added"],
    )
    on_topic = goal(
        goal_text=text,
        conclusions=["s1: the logo colours are fine", "s2: the billing schema has 14 tables", "s3: favicon added"],
    )
    few = goal(goal_text=text, conclusions=["s1: fonts load fast"])
    assert off_goal(drifted, []) == "its last 3 conclusions share no term with the goal"
    assert off_goal(on_topic, []) is None and off_goal(few, []) is None
    # A goal the rules already flag, or one waiting for a person, is not asked about.
    assert off_goal(drifted.model_copy(update={"open_questions": ["q1: approve?"]}), []) is None


def test_a_drifting_verdict_nudges_and_a_stuck_on_person_verdict_escalates_once_per_episode():
    memory = WatchdogMemory()
    drifting = parse_verdict(
        "g1", "p1.i3", '{"verdict": "drifting", "reason": "styling, not billing", "confidence": 0.8}', 40, at(0)
    )
    finding, nudge = verdict_step("g1", drifting, memory)
    assert finding.kind == "drifting" and "model: drifting (80%): styling, not billing" == finding.detail
    assert nudge is not None and nudge.action == "nudge" and "Change approach" in nudge.text
    stuck = parse_verdict(
        "g1", "p1.i3", '{"verdict": "stuck_on_person", "reason": "waits for a key", "confidence": 0.7}', 40, at(0)
    )
    finding, escalation = verdict_step("g1", stuck, memory)
    assert finding.kind == "stuck_on_person" and escalation is not None and escalation.action == "escalate"
    memory.sent[escalation.request_id] = at(0)
    assert verdict_step("g1", stuck, memory)[1] is None
