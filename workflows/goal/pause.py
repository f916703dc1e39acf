"""The goal's pause state: parked (with a wake time and an expiry that re-asks the
user), running, or aborting; and what an agent does while the goal is parked.

Workflow code. Who asks for a pause (a user's message, an answer, the budget's
emergency stop, a state that cannot load) is decided elsewhere; this room owns
how the pause state changes and when a parked goal's timer fires.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from perdure.workflows.goal import park_conditions
from perdure.workflows.goal.context import GoalContext, NodeWaiting
from perdure.workflows.goal.contracts.decision_contracts import RULE
from perdure.workflows.goal.contracts.messages import Resume
from perdure.workflows.goal.contracts.state import Node, ParkCondition
from perdure.workflows.goal.rules import questions, timing
from perdure.workflows.goal.verify_due import note_wait_ended
from perdure.workflows.shared.contracts import ToolInput, ToolResult


class Pause:
    def __init__(self, ctx: GoalContext) -> None:
        self._ctx = ctx
        # What the goal's budget says as it resumes (Spend.judge_at_resume), set by the workflow.
        self.on_resume: Callable[[], None] | None = None
        # How a park's file or command check runs (ToolRunner.check), set by the workflow.
        self.run_check: Callable[[ToolInput, str], Awaitable[ToolResult]] | None = None

    def park(
        self, reason: str, until: datetime | None, expiry: timedelta, condition: ParkCondition | None = None
    ) -> None:
        now = workflow.now()
        pause = self._ctx.state.pause
        if pause.mode != "parked" or pause.parked_since is None:
            pause.parked_since = now  # parking again while parked keeps when the wait began
        pause.mode = "parked"
        pause.reason = reason
        pause.parked_at = now
        pause.wake_at = until
        pause.expires_at = now + expiry
        pause.expiry_asked = False
        pause.condition = condition
        if condition is not None:
            park_conditions.first_check(condition)

    def extend(self) -> None:
        """Keep waiting as long again as the park was set for."""
        pause = self._ctx.state.pause
        extension = (pause.expires_at or workflow.now()) - (pause.parked_at or workflow.now())
        pause.parked_at, pause.expires_at, pause.expiry_asked = workflow.now(), workflow.now() + extension, False

    def resume(self, why: str) -> None:
        state = self._ctx.state
        pause = state.pause
        note_wait_ended(state, pause.parked_since or pause.parked_at, "resumed")
        pause.mode, pause.reason, pause.wake_at, pause.expires_at = "running", None, None, None
        pause.parked_since, pause.condition = None, None
        # A wait that ends is a fresh start for anyone judging progress by time.
        state.last_progress_at = workflow.now()
        for question in state.open_questions():
            if question.topic == "park_expired":
                question.status, question.answer, question.answered_at = "answered", "resume", workflow.now()
        workflow.logger.info("resumed", extra={"why": why})
        if self.on_resume is not None:
            self.on_resume()

    def abort(
        self, reason: str, rollback: bool, emergency: bool = False, by: str | None = None, at: datetime | None = None
    ) -> None:
        """Stop the goal. `emergency`: a budget ran out while work ran (not a person's
        abort), so the plan's wrap-up steps still run before the report. `by` and `at`: who
        asked and when (the status says so until the abort is achieved); a second abort
        keeps the first one's, and its reason; a rollback once asked stays asked (a plain abort
        sent again, say a retried command, must not cancel the undo of a payment)."""
        state = self._ctx.state
        if state.pause.abort_requested_at is None:
            state.pause.abort_requested_at = at or workflow.now()
            state.pause.abort_by = by or ("the budget (emergency stop)" if emergency else "the goal")
            state.abort_reason = reason
        state.pause.mode = "aborting"
        state.pause.rollback = state.pause.rollback or rollback
        state.pause.emergency = emergency

    def abort_achieved(self) -> None:
        """Nothing the abort waited for still runs and every undo has settled."""
        pause = self._ctx.state.pause
        if pause.abort_achieved_at is None:
            pause.abort_achieved_at = workflow.now()

    def deadline(self) -> datetime | None:
        """A parked goal's next deadline (wake, expiry or the condition's next check), as a
        time: the loop's alarm is keyed on it (workflows/goal/alarm.py)."""
        pause = self._ctx.state.pause
        if pause.mode != "parked":
            return None
        check_at = pause.condition.next_check_at if pause.condition is not None else None
        deadlines = [d for d in (pause.wake_at, None if pause.expiry_asked else pause.expires_at, check_at) if d]
        return min(deadlines, default=None)

    def condition_held(self, who: str = RULE) -> None:
        """The park's condition holds: the goal resumes by itself and says why (`who`: the
        sender of the signal it waited for)."""
        condition = self._ctx.state.pause.condition
        assert condition is not None
        why = f"park ended: {condition.held_text()}"
        self._ctx.log_gate(why, kind=None)
        self._ctx.decide("park", why, who)
        parked_since = self._ctx.state.pause.parked_since or self._ctx.state.pause.parked_at
        self.resume(why)
        # Children were parked until this parent resumes them (Steering._pass_on).
        request_id = f"parent.park-ended-{parked_since:%Y%m%dT%H%M%S%f}" if parked_since else "parent.park-ended"
        self._ctx.tell_children(lambda _child: Resume(request_id=request_id))

    async def _check_condition(self) -> None:
        pause = self._ctx.state.pause
        condition = pause.condition
        if condition is None or condition.next_check_at is None or workflow.now() < condition.next_check_at:
            return
        if self.run_check is None:
            return
        check = park_conditions.check_input(self._ctx.state, self._ctx.goal_id, condition)
        try:
            result = await self.run_check(check, park_conditions.summary(condition))
        except ActivityError as err:
            # The check itself failed (its workspace gone, out of attempts): not yet, and
            # the goal says why in status; it must not fail the goal.
            result = ToolResult(
                call_id=check.call_id, tool=check.tool, ok=False, error=f"the check failed: {err.cause or err}"
            )
        if pause.mode != "parked" or pause.condition is not condition:
            return  # resumed, re-parked or aborted while the check ran
        if result.ok:
            self.condition_held()
        else:
            park_conditions.after_miss(condition, result.error or "did not hold")

    async def on_deadline(self) -> None:
        await self._check_condition()
        state, pause = self._ctx.state, self._ctx.state.pause
        if pause.mode != "parked":
            return
        now = workflow.now()
        if pause.wake_at and now >= pause.wake_at:
            self._note_timer("park wake time", pause.wake_at, "woke")
            self.resume("woke at the time set when parking")
            return
        if pause.expires_at and now >= pause.expires_at and not pause.expiry_asked:
            self._note_timer("park expiry", pause.expires_at, "asked")
            pause.expiry_asked = True
            expiry = pause.expires_at - (pause.parked_at or pause.expires_at)
            state.questions.append(questions.park_expired(state, now, expiry))

    def _note_timer(self, what: str, planned: datetime, verb: str) -> None:
        """How late the goal acted on a park deadline (an outage delays it): kept, and said."""
        entry = timing.judge(what, planned, workflow.now())
        timing.record(self._ctx.state.timers, entry)
        self._ctx.log_gate(f"{what}: {entry.text(verb)}", kind="park")

    async def hold_while_parked(self, node: Node) -> None:
        """An agent does not start a new turn while the goal is parked (and is not judged
        meanwhile): its task ends here, the wait is state (the park crosses continue-as-new),
        and the scheduler runs it again on resume."""
        if self._ctx.state.pause.mode != "parked":
            return
        self._ctx.set_status(node, "parked")
        self._ctx.wake()
        raise NodeWaiting("parked: waiting for the goal to resume")
