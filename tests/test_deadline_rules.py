"""Which rule sets a question's deadline, reminder and outcome on expiry (workflows/goal/rules/
deadlines.py): the step's, then the plan's, then the goal's, field by field; an outcome that
cannot decide the card is passed over for the next; pure, no server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.workflows.goal.contracts.state import GoalState, PlanVersion
from perdure.workflows.goal.rules import question_deadline_rules as deadlines
from perdure.workflows.goal.rules import questions
from tests.builders import spec

ASKED = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
PAY = {"amount_cents": 100, "currency": "EUR", "recipient": "ACME"}


def state_with(step_rule=None, plan_rule=None, goal_rule=None, tool="make_payment") -> GoalState:
    args = PAY if tool == "make_payment" else {"url": "http://x/hook", "payload": {}}
    step = {"name": "pay", "kind": "tool", "tool": tool, "args": args}
    if step_rule is not None:
        step["question_deadline"] = step_rule
    plan = {"steps": [step], **({"question_deadline": plan_rule} if plan_rule else {})}
    goal = spec("/tmp/w", plan=plan, allowed_tools=[tool], question_deadline=goal_rule)
    state = GoalState(spec=goal)
    state.plan_versions.append(PlanVersion(version=1, plan=goal.plan, reason="plan file", source="plan-file"))
    return state


def confirm(state: GoalState):
    return questions.confirm_effect(state, ASKED, "pay", "make_payment", "pay 1 EUR", "invoice", effect_key="fx-1")


def uncertain(state: GoalState, tool: str):
    return questions.uncertain_effect(state, ASKED, "pay", tool, "fx-1", "no answer")


def test_a_goal_without_any_rule_stamps_nothing():
    state = state_with()
    card = confirm(state)
    assert deadlines.stamp(state, card, TOOL_SPECS) is False and card.deadline_at is None


def test_the_most_specific_rule_wins_field_by_field():
    state = state_with(
        step_rule={"remind_before": "5m"}, plan_rule={"after": "2h"}, goal_rule={"after": "48h", "on_expiry": "abort"}
    )
    card = confirm(state)
    assert deadlines.stamp(state, card, TOOL_SPECS)
    assert card.deadline_at == ASKED + timedelta(hours=2)  # the plan's, over the goal's
    assert card.remind_at == card.deadline_at - timedelta(minutes=5)  # the step's
    assert card.on_expiry == "abort"  # only the goal names one


def test_defaults_48h_a_quarter_before_and_the_safe_outcome_per_kind():
    state = state_with(goal_rule={})
    card = confirm(state)
    deadlines.stamp(state, card, TOOL_SPECS)
    assert (card.deadline_at - ASKED, card.deadline_at - card.remind_at) == (timedelta(hours=48), timedelta(hours=12))
    assert card.on_expiry == "deny" and deadlines.choice_on_expiry(card) == "reject"
    other = uncertain(state, "make_payment")
    deadlines.stamp(state, other, TOOL_SPECS)
    assert other.on_expiry == "park" and deadlines.choice_on_expiry(other) is None


def test_an_assumption_decides_only_a_question_whether_a_declaring_tools_call_happened():
    state = state_with(step_rule={"on_expiry": "happened"}, goal_rule={"on_expiry": "park"}, tool="notify_webhook")
    asked = uncertain(state, "notify_webhook")
    deadlines.stamp(state, asked, TOOL_SPECS)
    assert asked.on_expiry == "happened" and deadlines.choice_on_expiry(asked) == "happened"
    # A confirmation of the same step cannot "happen": the next rule's outcome decides it.
    card = confirm(state)
    deadlines.stamp(state, card, TOOL_SPECS)
    assert card.on_expiry == "park"


def test_a_reminder_longer_than_the_deadline_falls_back_to_a_quarter_of_it():
    state = state_with(step_rule={"after": "10m"}, goal_rule={"remind_before": "1h"})
    card = confirm(state)
    deadlines.stamp(state, card, TOOL_SPECS)
    assert card.deadline_at - card.remind_at == timedelta(minutes=2, seconds=30)


def test_due_and_next_time():
    state = state_with(step_rule={"after": "10m", "remind_before": "2m"})
    card = confirm(state)
    deadlines.stamp(state, card, TOOL_SPECS)
    assert deadlines.next_time([card]) == ASKED + timedelta(minutes=8)
    assert deadlines.due(card, ASKED + timedelta(minutes=7)) is None
    assert deadlines.due(card, ASKED + timedelta(minutes=8)) == "remind"
    card.reminded_at = ASKED + timedelta(minutes=8)
    assert deadlines.next_time([card]) == ASKED + timedelta(minutes=10)
    # A worker back only after the deadline: no reminder, the expiry.
    late = confirm(state)
    deadlines.stamp(state, late, TOOL_SPECS)
    assert deadlines.due(late, ASKED + timedelta(hours=1)) == "expire"
