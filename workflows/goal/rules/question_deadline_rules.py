"""Question deadlines as rules: which rule sets a question's deadline, reminder and outcome
on expiry (its step's, then its plan's, then its goal's, field by field; then the tool's own
outcome and the safe default for its kind), when each is due, which option an expiry picks,
and how they read in status, the gate log and the report. Pure.

The workflow side (workflows/goal/question_deadlines.py) stamps each open question once,
waits for the earliest reminder or deadline on a durable timer, and acts on what these
rules say is due.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from perdure.workflows.goal.contracts.deadline_contracts import (
    ASSUMED,
    DEFAULT_DEADLINE,
    REMIND_FRACTION,
    QuestionDeadline,
)
from perdure.workflows.goal.contracts.goal_contracts import QuestionView
from perdure.workflows.goal.contracts.state import GoalState, Question
from perdure.workflows.goal.rules.timing import parse_duration
from perdure.workflows.shared.durations import duration_text
from perdure.workflows.shared.tool_specs import ExpiryOutcome, ToolSpec

# A confirmation of a write is denied when nobody answers: the effect is never made unasked
# (an approvals-ahead card, which confirms such calls early, refuses them all).
DENIED_BY_DEFAULT = ("confirm_effect", "confirm_device_call", "approvals_ahead")
# The option `deny` picks, by the question's kind: the one that refuses what was proposed.
DENY_CHOICE = {
    "confirm_effect": "reject",
    "confirm_device_call": "reject",
    "uncertain_effect": "fail",
    "stalled": "abandon",
    "device_offline": "skip",
    "narrow_confirm": "redo",
    "escalation": "park",
    "park_expired": "extend",
}
# For a kind not listed: the first of these its card offers.
REFUSING_OPTIONS = ("reject", "refuse", "deny", "fail", "abandon", "skip")


def rules_for(state: GoalState, question: Question) -> list[QuestionDeadline]:
    """The rules that apply, most specific first: its step's, its plan's, its goal's."""
    found: list[QuestionDeadline] = []
    plan = state.plan
    if plan is not None:
        # An approvals-ahead card is about several steps: the first of them with a rule of its own.
        for name in question.nodes[:1] or [entry.step for entry in question.ahead]:
            try:
                step_rule = plan.step(name).question_deadline
            except KeyError:
                step_rule = None
            if step_rule is not None:
                found.append(step_rule)
                break
        if plan.question_deadline is not None:
            found.append(plan.question_deadline)
    if state.spec.question_deadline is not None:
        found.append(state.spec.question_deadline)
    return found


def deny_choice(question: Question) -> str | None:
    """The option `deny` picks on this card, or None when it offers no refusal."""
    options = [o.id for o in question.options]
    choice = DENY_CHOICE.get(question.topic)
    if choice in options:
        return choice
    return next((o for o in REFUSING_OPTIONS if o in options), None)


def fits(outcome: ExpiryOutcome | None, question: Question, tool: ToolSpec | None) -> bool:
    """Whether `outcome` can decide this question: deny needs a refusing option, an assumption
    a question whether a call happened, about a tool that declares it safe."""
    if outcome in ("park", "abort"):
        return True
    if outcome == "deny":
        return deny_choice(question) is not None
    if outcome in ASSUMED:
        return question.topic == "uncertain_effect" and tool is not None and tool.expiry_problem(outcome) is None
    return False


def default_outcome(question: Question) -> ExpiryOutcome:
    return "deny" if question.topic in DENIED_BY_DEFAULT else "park"


def stamp(state: GoalState, question: Question, tools: Mapping[str, ToolSpec]) -> bool:
    """Set the question's deadline, reminder and outcome from the rules that apply, counted from
    when it was asked; False when no rule applies (a goal started without deadlines)."""
    rules = rules_for(state, question)
    if not rules:
        return False
    after = next((d for r in rules if (d := r.duration()) is not None), parse_duration(DEFAULT_DEADLINE))
    lead = next((d for r in rules if (d := r.reminder_lead()) is not None and d < after), after * REMIND_FRACTION)
    tool = tools.get(question.tool) if question.tool else None
    wanted = [r.on_expiry for r in rules] + [tool.on_expiry if tool else None]
    question.on_expiry = next((o for o in wanted if o is not None and fits(o, question, tool)), None) or (
        default_outcome(question)
    )
    question.deadline_at = question.asked_at + after
    question.remind_at = question.deadline_at - lead
    return True


def pending(questions: Iterable[Question]) -> list[Question]:
    """Open questions whose deadline has not yet decided anything."""
    return [q for q in questions if q.status == "open" and q.deadline_at is not None and q.expired_at is None]


def due(question: Question, now: datetime) -> str | None:
    """'expire', 'remind' or None. A reminder whose deadline has passed too is not sent."""
    if question.deadline_at is not None and now >= question.deadline_at:
        return "expire"
    if question.remind_at is not None and question.reminded_at is None and now >= question.remind_at:
        return "remind"
    return None


def next_time(questions: Iterable[Question]) -> datetime | None:
    """The earliest reminder or deadline still to come."""
    times = []
    for q in pending(questions):
        times.append(q.deadline_at)
        if q.reminded_at is None and q.remind_at is not None:
            times.append(q.remind_at)
    return min(times, default=None)


def choice_on_expiry(question: Question) -> str | None:
    """The option the expiry picks (deny, happened, not_happened); None for park and abort."""
    if question.on_expiry == "deny":
        return deny_choice(question)
    if question.on_expiry in ASSUMED:
        return question.on_expiry
    return None


def _at(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def deadline_line(question: Question | QuestionView, now: datetime | None = None) -> str:
    """How status shows a question's deadline: when, what it decides, whether reminded (a
    question of the state, or as the progress query shows it)."""
    if question.deadline_at is None:
        return "no deadline"
    if question.expired_at is not None:
        return f"expired {_at(question.expired_at)}; on expiry: {question.on_expiry}"
    left = f" (in {duration_text((question.deadline_at - now).total_seconds(), days=True)})" if now else ""
    line = f"deadline {_at(question.deadline_at)}{left}; on expiry: {question.on_expiry}"
    if question.reminded_at is not None:
        return f"{line}; reminded {_at(question.reminded_at)}"
    if question.remind_at is not None:
        return f"{line}; reminder at {_at(question.remind_at)}"
    return line


def reminder_text(question: Question, now: datetime) -> str:
    """The gate log's line when a reminder goes out."""
    assert question.deadline_at is not None
    left = duration_text(max((question.deadline_at - now).total_seconds(), 0), days=True)
    return (
        f"reminder: {question.id} ({question.title}) is unanswered; it expires at {_at(question.deadline_at)} "
        f"(in {left}), then: {question.on_expiry}"
    )


def expiry_text(question: Question, what: str) -> str:
    """The gate log's line when a deadline passes; `what` says what it did."""
    assert question.deadline_at is not None
    return f"expired: {question.id} ({question.title}) unanswered by {_at(question.deadline_at)}: {what}"


def expired_answer_text(question: Question) -> str:
    """What an expired question records instead of a person's note."""
    assert question.deadline_at is not None
    return f"expired unanswered at {_at(question.deadline_at)}; on expiry: {question.on_expiry}"


def report_note(question: Question) -> str:
    """The report's line for a question: who decided it, and how."""
    if question.status == "expired":
        return f"question {question.id} ({question.title}): expired ({question.on_expiry}), nobody answered"
    if question.expired_at is not None:
        # Its deadline parked the goal; the question stayed open for a person.
        said = question.answer or "unanswered"
        return f"question {question.id} ({question.title}): expired (park), then {said}"
    return f"question {question.id} ({question.title}): {question.answer or 'unanswered'}"
