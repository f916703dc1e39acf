"""Steering verbs: what each admitted message does when the loop reaches its safe
point (park, resume, abort, rewind, narrow, answer or approve, escalate), and
what an answer to each kind of question means.

Workflow code. A new verb: its message type in workflows/goal/contracts/messages.py (with what
its turn must find in `turn_problem`), a method here returning an `Applied`, and
one entry in `Steering.verbs`. Steer and queue are not verbs: the model calls and
the planner apply them at their own boundaries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow

from perdure.workflows.goal import park_conditions
from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts import messages
from perdure.workflows.goal.contracts.decision_contracts import sender
from perdure.workflows.goal.contracts.messages import LATER_KINDS, PARENT_STOP, InboxEntry, chosen_option
from perdure.workflows.goal.contracts.state import PlanDiff, Question, RejectedPath
from perdure.workflows.goal.inbox import Inbox
from perdure.workflows.goal.pause import Pause
from perdure.workflows.goal.rules import approvals_ahead, questions
from perdure.workflows.goal.rules.invalidation import held_by, invalidate_by_premise, invalidate_from
from perdure.workflows.goal.scheduler import Scheduler


@dataclass(frozen=True)
class Applied:
    """What applying a message did, for its receipt: a note and, for verbs that
    change the graph, which steps are void, kept and to be confirmed."""

    note: str
    void: list[str] | None = None
    kept: list[str] | None = None
    to_confirm: list[str] | None = None

    def detail(self) -> dict[str, list[str]]:
        fields = {"void": self.void, "kept": self.kept, "to_confirm": self.to_confirm}
        return {name: value for name, value in fields.items() if value is not None}


class Steering:
    def __init__(self, ctx: GoalContext, inbox: Inbox, pause: Pause, scheduler: Scheduler) -> None:
        self._ctx = ctx
        self._inbox = inbox
        self._pause = pause
        self._scheduler = scheduler
        self._passed_on: set[str] = set()
        self.verbs: dict[str, Callable[[InboxEntry], Applied]] = {
            "park": self._park,
            "resume": self._resume,
            "signal": self._signal,
            "abort": self._abort,
            "rewind": self._rewind,
            "narrow": self._narrow,
            "answer": self._answer,
            "approve": self._answer,
            "escalate": self._escalate,
        }

    async def apply_pending(self, only: tuple[str, ...] | None = None) -> None:
        """Apply every pending message, in the order they were sent: each is judged on
        the state the ones before it left, and one that cannot apply then is settled
        "rejected" with the reason (its receipt), not skipped or refused. `only`: these
        kinds, the others wait (a goal whose plan is not loaded yet)."""
        for entry in list(self._ctx.state.inbox):
            if only is not None and entry.kind not in only:
                continue
            if entry.kind == "steer" and entry.status == "pending":
                self._pass_on(entry)
            if entry.status != "pending" or entry.kind in LATER_KINDS:
                continue
            # A large goal's stored steps are judged too (past.py): brought back first.
            if self._judges_settled_work(entry) and not await self._ctx.restore_past():
                self._inbox.settle(entry, "rejected", f"not applied: {self._ctx.state.pause.reason}")
                continue
            problem = self._inbox.turn_problem(entry)
            if problem:
                self._inbox.settle(entry, "rejected", problem)
                continue
            applied = self.verbs[entry.kind](entry)
            self._inbox.settle(entry, "applied", applied.note, applied.detail())
            if entry.kind in ("park", "resume"):
                self._pass_on(entry)

    def _judges_settled_work(self, entry: InboxEntry) -> bool:
        """A rewind, a narrow, or an answer that redoes work: each may void settled steps."""
        if entry.kind in ("rewind", "narrow"):
            return True
        if entry.kind in ("answer", "approve"):
            asked = next((q for q in self._ctx.state.questions if q.id == entry.message.question_id), None)
            return asked is not None and asked.topic == "narrow_confirm"
        return False

    def _pass_on(self, entry: InboxEntry) -> None:
        """Subgoals hear what the message says for them: a park, a resume and a steer reach
        every child running now (an abort stops them through the scheduler). Each child
        dedupes it by its request id."""
        if not self._ctx.children() or entry.request_id in self._passed_on:
            return
        self._passed_on.add(entry.request_id)
        update: dict = {"request_id": f"parent.{entry.request_id}"[:128]}
        if entry.kind == "park" and park_conditions.condition_of(entry.message) is not None:
            # The parent checks its condition (a signal reaches only the parent): a child
            # parks until the parent resumes it (Pause.condition_held).
            update |= {"until_file": None, "until_command": None, "until_signal": None}
            update["reason"] = f"{entry.message.reason} (until the parent goal resumes)"[: messages.MAX_TEXT]
        message = entry.message.model_copy(update=update)
        self._ctx.tell_children(lambda _child: message)

    def _park(self, entry: InboxEntry) -> Applied:
        message = entry.message
        condition = park_conditions.condition_of(message)
        self._pause.park(message.reason, message.until, timedelta(hours=message.expiry_hours), condition)
        until = f" ({condition.describe().split(';')[0]})" if condition else ""
        woken = f" (wakes at {message.until.isoformat()})" if message.until else ""
        self._ctx.decide("park", f"parked: {message.reason}{until}{woken}", who_sent(entry))
        return Applied(f"parked: {message.reason}{until}")

    def _signal(self, entry: InboxEntry) -> Applied:
        # turn_problem let through only the signal the park waits for.
        self._pause.condition_held(who_sent(entry))
        return Applied(f"signal {entry.message.name}: the park ended")

    def _resume(self, entry: InboxEntry) -> Applied:
        self._pause.resume("resumed by the user")
        self._ctx.decide("park", "resumed", who_sent(entry))
        return Applied("resumed")

    def _abort(self, entry: InboxEntry) -> Applied:
        message = entry.message
        self._pause.abort(message.reason, message.rollback, by=_requester(entry), at=entry.received_at)
        rollback = "; its effects are rolled back" if message.rollback else ""
        self._ctx.decide("abort", f"abort requested: {message.reason}{rollback}", who_sent(entry))
        return Applied(f"aborting: {message.reason}")

    def _rewind(self, entry: InboxEntry) -> Applied:
        state, node, why = self._ctx.state, entry.message.node, entry.message.why
        target = state.nodes[node]
        state.rejected_paths.append(RejectedPath(node=node, why=why, output_preview=target.preview, at=workflow.now()))
        invalidation = invalidate_from(self._ctx.plan(), self._statuses(), node)
        self._scheduler.void(invalidation.void)
        self._scheduler.record_plan_version(
            "rewind",
            f"rewind of '{node}': {why}",
            PlanDiff(invalidated=invalidation.void, kept=invalidation.kept),
            who=who_sent(entry),
            about=[node],
        )
        note = f"rewound '{node}': {len(invalidation.void)} step(s) void, {len(invalidation.kept)} kept"
        return Applied(note, void=invalidation.void, kept=invalidation.kept)

    def _narrow(self, entry: InboxEntry) -> Applied:
        state, changes, why = self._ctx.state, entry.message.premises, entry.message.why
        plan = self._ctx.plan()
        invalidation = invalidate_by_premise(plan, self._statuses(), changes)
        state.premises = {**state.premises, **changes}
        self._scheduler.void(invalidation.void)
        if invalidation.to_confirm:
            hold = held_by(plan, invalidation.to_confirm)
            state.questions.append(
                questions.narrow_confirm(state, workflow.now(), invalidation.to_confirm, hold, changes)
            )
        change = ", ".join(f"{k}={v}" for k, v in sorted(changes.items()))
        self._scheduler.record_plan_version(
            "narrow",
            f"narrowed {change}" + (f": {why}" if why else ""),
            PlanDiff(invalidated=invalidation.void, kept=invalidation.kept, to_confirm=invalidation.to_confirm),
            who=who_sent(entry),
        )
        note = (
            f"narrowed {change}: {len(invalidation.void)} void, {len(invalidation.kept)} kept, "
            f"{len(invalidation.to_confirm)} to confirm"
        )
        return Applied(note, void=invalidation.void, kept=invalidation.kept, to_confirm=invalidation.to_confirm)

    def _answer(self, entry: InboxEntry) -> Applied:
        """Record the answer; a question the goal itself asked also acts on it here (a
        question asked by a node is acted on by that node, which waits for it)."""
        message = entry.message
        state = self._ctx.state
        question = next(q for q in state.questions if q.id == message.question_id)
        choice = chosen_option(message)
        question.status, question.answer, question.answer_text = "answered", choice, message.text
        question.answered_at = state.last_progress_at = workflow.now()
        steps = getattr(message, "steps", [])
        said = (f" {', '.join(steps)}" if steps else "") + (f": {message.text}" if message.text else "")
        self._ctx.decide(
            "answer", f"{question.id} ({question.title}): {choice}{said}", who_sent(entry), question.about()
        )
        self.act_on(question, choice, steps)
        return Applied(f"{question.id} answered: {choice}")

    def act_on(self, question: Question, choice: str, steps: list[str] | None = None) -> None:
        """What a choice on a question the goal itself asked does, whoever made it: a person's
        answer, or its deadline (workflows/goal/question_deadlines.py); `steps`: those an
        approvals-ahead card's answer names."""
        if question.topic == "park_expired":
            if choice == "resume":
                self._pause.resume("the user answered the expiry question")
            elif choice == "extend":
                self._pause.extend()
            elif choice == "abort":
                self._pause.abort(
                    "the user chose to stop after the park expired", rollback=False, by=f"answer to {question.id}"
                )
        elif question.topic == "narrow_confirm" and choice == "redo":
            self._scheduler.void(question.nodes)
        elif question.topic == "escalation" and choice == "park":
            self._pause.park("parked after a watchdog escalation", None, timedelta(hours=48))
        elif question.topic == "approvals_ahead":
            approvals_ahead.decide(question, choice, steps or [])
        elif question.topic == "escalation" and choice == "abort":
            self._pause.abort("stopped after a watchdog escalation", rollback=False, by=f"answer to {question.id}")

    def _escalate(self, entry: InboxEntry) -> Applied:
        message = entry.message
        question = questions.escalation(self._ctx.state, workflow.now(), message.finding, message.detail)
        self._ctx.state.questions.append(question)
        return Applied(f"asked as {question.id}")

    def _statuses(self) -> dict[str, str]:
        return {name: node.status for name, node in self._ctx.state.nodes.items()}


def _requester(entry: InboxEntry) -> str:
    """Who sent an abort, as far as the goal can tell: its parent goal, or the sender the
    message names and its id."""
    if entry.request_id == PARENT_STOP:
        return "the parent goal"
    by = entry.message.by
    return f"{by} (message {entry.request_id})" if by else f"message {entry.request_id}"


def who_sent(entry: InboxEntry) -> str:
    return sender(entry.message.by)
