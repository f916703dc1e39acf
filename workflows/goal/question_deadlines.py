"""Question deadlines in the goal: every open question is stamped once with its deadline,
reminder and outcome on expiry (workflows/goal/rules/question_deadline_rules.py); one durable timer (`clock`,
beside the budget's) waits for the earliest of them and wakes the loop, which acts at its safe
point. They hold across worker loss and continue-as-new: they are state, counted from
`asked_at`, and a new run sets its timer from them.

At the reminder: the gate log and the event stream say so, status and the page show it, and
the goal's owner's router (if there is one) holds it in its inbox. At the deadline, what the
question declared, recorded as an expiry, never as a person's answer: deny (the refusing
option, acted on as an answer would be), park (the goal parks, the question stays open for a
person), abort, or an assumption its tool declares safe (happened / not_happened).

Workflow code. What an answer does to a question the goal itself asked is the steering's
(`Steering.act_on`); a question a step asked is acted on by that step when it runs again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

from temporalio import workflow

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts.decision_contracts import EXPIRED
from perdure.workflows.goal.contracts.state import Question
from perdure.workflows.goal.pause import Pause
from perdure.workflows.goal.rules import question_deadline_rules as deadlines
from perdure.workflows.router.router_contracts import QuestionReminder, RouterHandlers, router_id
from perdure.workflows.shared.search_attributes import OWNER

# A park that a question's deadline started asks again after this long, as a user's park does.
PARK_EXPIRY = timedelta(hours=48)


class QuestionDeadlines:
    def __init__(self, ctx: GoalContext, pause: Pause, act_on: Callable[[Question, str], None]) -> None:
        self._ctx = ctx
        self._pause = pause
        # Steering.act_on: what a choice on a question the goal itself asked does.
        self._act_on = act_on

    def _stamp(self) -> list[Question]:
        """Stamp every open question not stamped yet; the ones whose deadline is still to act."""
        state, tools = self._ctx.state, self._ctx.tools()
        for question in state.open_questions():
            if question.deadline_at is None:
                deadlines.stamp(state, question, tools)
        return deadlines.pending(state.questions)

    def _next(self) -> datetime | None:
        return deadlines.next_time(self._ctx.state.questions)

    async def clock(self) -> None:
        """One durable timer for the earliest reminder or deadline, set again only when that
        changes (a question stamped, answered, reminded or expired), not at every pass of the
        loop: a goal waiting days for a person while its other work runs adds two events per
        reminder or deadline, not per settled step. When it fires the loop is woken, and acts
        at its safe point (`on_time`)."""
        state = self._ctx.state
        while state.pause.mode != "aborting":
            at = self._next()
            try:
                await workflow.wait_condition(
                    lambda at=at: self._next() != at or state.pause.mode == "aborting",
                    timeout=None if at is None else max(at - workflow.now(), timedelta(seconds=1)),
                    timeout_summary="a question's reminder or deadline" if at is not None else None,
                )
            except TimeoutError:
                self._ctx.wake()
                # Until the loop has acted on it (the next time is then another).
                await workflow.wait_condition(lambda at=at: self._next() != at or state.pause.mode == "aborting")

    def on_time(self) -> None:
        """Stamp the questions asked since, send the reminders and act on the deadlines that are
        due (each loop pass, after the messages that came first: an answer sent before the
        deadline wins)."""
        now = workflow.now()
        for question in self._stamp():
            due = deadlines.due(question, now)
            if due == "remind":
                self._remind(question)
            elif due == "expire":
                self._expire(question)

    def _remind(self, question: Question) -> None:
        question.reminded_at = workflow.now()
        self._ctx.log_gate(deadlines.reminder_text(question, question.reminded_at), kind=None)  # no decision
        self._ctx.wake()  # published with the next pass: status, the page, the event stream
        owner = workflow.info().typed_search_attributes.get(OWNER)
        if owner:
            asyncio.create_task(self._tell_router(owner, question))

    async def _tell_router(self, owner: str, question: Question) -> None:
        """The reminder to the owner's router, which holds it in the user's inbox; a user
        with no router yet has none to tell (the goal's own status says it all the same)."""
        assert question.deadline_at is not None and question.on_expiry is not None
        reminder = QuestionReminder(
            goal_id=self._ctx.goal_id,
            question_id=question.id,
            title=question.title,
            options=[o.id for o in question.options],
            deadline_at=question.deadline_at,
            on_expiry=question.on_expiry,
            at=workflow.now(),
        )
        try:
            await workflow.get_external_workflow_handle(router_id(owner)).signal(
                RouterHandlers.QUESTION_REMINDER, reminder.model_dump(mode="json")
            )
        except Exception as err:  # noqa: BLE001 - e.g. no router: the goal's own status still shows it
            self._ctx.log_gate(f"reminder of {question.id} not sent to {router_id(owner)}: {str(err)[:200]}", kind=None)

    def _expire(self, question: Question) -> None:
        state, now = self._ctx.state, workflow.now()
        question.expired_at = now
        outcome = question.on_expiry
        if outcome == "park":
            # The question stays open: a person answers it, and resumes the goal, when they can.
            if state.pause.mode == "parked":
                what = "the goal stays parked; the question stays open"
            else:
                reason = f"question {question.id} expired unanswered: {question.title}"
                self._pause.park(reason, None, PARK_EXPIRY)
                what = "the goal parks; the question stays open (answer it, then resume)"
            self._record(question, what)
            self._ctx.wake()
            return
        question.status, question.answered_at = "expired", now
        question.answer_text = deadlines.expired_answer_text(question)
        if outcome == "abort":
            self._record(question, "the goal aborts")
            reason = f"question {question.id} expired unanswered ({question.title})"
            self._pause.abort(reason, rollback=False, by=f"the deadline of {question.id}")
            self._ctx.wake()
            return
        choice = deadlines.choice_on_expiry(question) or ""
        question.answer = choice
        self._record(question, f"{outcome} ({choice})")
        self._act_on(question, choice)
        self._ctx.wake()  # a step waiting on it runs again and acts on the choice

    def _record(self, question: Question, what: str) -> None:
        """The expiry in the gate log and the decision log, decided by no person."""
        said = deadlines.expiry_text(question, what)
        self._ctx.log_gate(said, kind=None)  # recorded as the expiry it is, next
        self._ctx.decide("expiry", said, EXPIRED, question.about())
