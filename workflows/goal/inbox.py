"""The goal's inbox: every user message, by signal or by update, gets an entry and
a receipt, or a refusal that says why.

Workflow code. The rules (what is well formed, what is refused at the door, what
must wait for its turn, what makes two sends the same message) are pure, in
workflows/goal/contracts/messages.py; this room records what they decide and settles entries as
the steering room applies them, in the order they were sent.

Handlers hand over raw arguments: a signal cannot be refused at the door (the
server stored it before any worker saw it), so whatever it carries, no argument,
several, a non-object, bytes that do not decode, is read here and refused with a
reason in `state.refused`, never raised into the workflow task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts.goal_contracts import Signals, Updates
from perdure.workflows.goal.contracts.messages import (
    LATER_KINDS,
    MAX_REFUSALS,
    InboxEntry,
    InboxView,
    Receipt,
    Refusal,
    UserMessage,
    bounded,
    content_digest,
    door_problem,
    find_entry,
    parse_arguments,
    receipt_of,
    request_id_of,
    turn_problem,
)
from perdure.workflows.shared.raw_values import decode_raw
from perdure.workflows.shared.statuses import ENDED_PHASES


class Inbox:
    def __init__(self, ctx: GoalContext, load_problem: str | None) -> None:
        self._ctx = ctx
        # The carried state could not be loaded: only an abort is admitted.
        self._load_problem = load_problem

    def on_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """Durable admission without a worker. Every signal reaches this one (dynamic)
        handler as raw payloads, so none can fail the workflow task."""
        if name != Signals.MESSAGE:
            known = f"a goal takes messages on the '{Signals.MESSAGE}' signal"
            self._refuse(None, f"unknown signal '{bounded(name)}'; {known}")
            return
        values, problem = decode_raw(args)
        if problem is None:
            message, problem = parse_arguments(values, f"'{Signals.MESSAGE}' signal")
        if problem is None:
            problem = self._door(message)
        if problem is not None:
            self._refuse(request_id_of(values[0]) if len(values) == 1 else None, problem)
            return
        if find_entry(self._ctx.state.inbox, message.request_id) is None:
            self._admit(message, "signal")

    def validate_update(self, args: Sequence[Any]) -> None:
        """What an update may be refused for at the door; the client sees the reason and
        nothing is recorded (a validator cannot change state). What depends on the messages
        before it is judged at its turn and comes back as a rejected receipt."""
        message, problem = parse_arguments(args, f"'{Updates.SUBMIT}' update")
        problem = problem or self._door(message)
        if problem:
            raise ValueError(problem)

    async def on_update(self, args: Sequence[Any]) -> Receipt:
        """Admission with a receipt. Waits until the message is applied or rejected at its
        turn, except steer and queue, which apply later by design (after planning, if a
        plan is being made)."""
        message, _ = parse_arguments(args, f"'{Updates.SUBMIT}' update")
        state = self._ctx.state
        entry = find_entry(state.inbox, message.request_id) or self._admit(message, "update")
        if entry.kind not in LATER_KINDS:
            await workflow.wait_condition(lambda: entry.status != "pending" or state.phase in ENDED_PHASES)
        return receipt_of(entry)

    def turn_problem(self, entry: InboxEntry) -> str | None:
        """Why an admitted message cannot apply now that its turn has come, or None."""
        return turn_problem(self._ctx.state, entry.message)

    def view(self) -> InboxView:
        state = self._ctx.state
        return InboxView(entries=[receipt_of(e) for e in state.inbox], refused=state.refused)

    def pending(self, kinds: tuple[str, ...]) -> list[InboxEntry]:
        return [e for e in self._ctx.state.inbox if e.status == "pending" and e.kind in kinds]

    def awaiting_receipt(self) -> bool:
        """Whether an update's handler waits for its message's turn (`on_update`): before a run
        ends, it must get its receipt in that run."""
        inbox = self._ctx.state.inbox
        return any(e.status == "pending" and e.via == "update" and e.kind not in LATER_KINDS for e in inbox)

    def settle(self, entry: InboxEntry, status: str, note: str, detail: dict[str, Any] | None = None) -> None:
        entry.status, entry.note, entry.settled_at = status, note, workflow.now()
        entry.detail.update(detail or {})
        if self._ctx.on_receipt is not None:
            self._ctx.on_receipt(entry)

    def close(self) -> None:
        """No message is silently dropped: what was never applied says why."""
        for entry in self._ctx.state.inbox:
            if entry.status == "pending":
                self.settle(entry, "rejected", f"the goal ended before this {entry.kind} could be applied")

    def _door(self, message: UserMessage) -> str | None:
        return door_problem(self._ctx.state, message, self._load_problem)

    def _admit(self, message: UserMessage, via: str) -> InboxEntry:
        entry = InboxEntry(
            request_id=message.request_id,
            kind=message.kind,
            digest=content_digest(message),
            message=message,
            via=via,
            received_at=workflow.now(),
        )
        self._ctx.state.inbox.append(entry)
        self._ctx.wake()
        return entry

    def _refuse(self, request_id: str | None, reason: str) -> None:
        workflow.logger.info("message refused", extra={"request_id": request_id, "reason": reason})
        refused = self._ctx.state.refused
        refused.append(Refusal(request_id=request_id, reason=bounded(reason), received_at=workflow.now()))
        del refused[:-MAX_REFUSALS]
