"""The goal's inbox: every user message, by signal or by update, gets an entry and
a receipt, or a refusal that says why.

Workflow code. The rules (what is well formed, what the goal can take now, what
makes two sends the same message) are pure, in workflows/messages.py; this room
records what they decide and settles entries as the steering room applies them.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

from workflows.goal.context import GoalContext
from workflows.messages import (
    InboxEntry,
    InboxView,
    Receipt,
    Refusal,
    UserMessage,
    admission_problem,
    content_digest,
    find_entry,
    parse_message,
    receipt_of,
)
from workflows.statuses import ENDED_PHASES

# Applied at the next model-turn boundary or when the goal would be idle, not at the loop's safe point.
LATER_KINDS = ("steer", "queue")


class Inbox:
    def __init__(self, ctx: GoalContext, load_problem: str | None) -> None:
        self._ctx = ctx
        # The carried state could not be loaded: only an abort is admitted.
        self._load_problem = load_problem

    def on_signal(self, raw: Any) -> None:
        """Durable admission without a worker: the server stores the signal; the
        payload is checked here, since a signal cannot be refused at the door."""
        message, problem = parse_message(raw)
        request_id = raw.get("request_id") if isinstance(raw, dict) else None
        if message is None:
            self._refuse(request_id if isinstance(request_id, str) else None, problem or "malformed message")
            return
        problem = self._problem(message)
        if problem:
            self._refuse(message.request_id, problem)
            return
        if find_entry(self._ctx.state.inbox, message.request_id) is None:
            self._admit(message, "signal")

    def validate_update(self, raw: Any) -> None:
        message, problem = parse_message(raw)
        problem = problem or self._problem(message)
        if problem:
            raise ValueError(problem)

    async def on_update(self, raw: Any) -> Receipt:
        """Admission with a receipt. Waits until the message is applied, except steer and
        queue, which apply later by design (after planning, if a plan is being made)."""
        message, _ = parse_message(raw)
        state = self._ctx.state
        entry = find_entry(state.inbox, message.request_id) or self._admit(message, "update")
        if entry.kind not in LATER_KINDS:
            await workflow.wait_condition(lambda: entry.status != "pending" or state.phase in ENDED_PHASES)
        return receipt_of(entry)

    def view(self) -> InboxView:
        state = self._ctx.state
        return InboxView(entries=[receipt_of(e) for e in state.inbox], refused=state.refused)

    def pending(self, kinds: tuple[str, ...]) -> list[InboxEntry]:
        return [e for e in self._ctx.state.inbox if e.status == "pending" and e.kind in kinds]

    def settle(self, entry: InboxEntry, status: str, note: str, detail: dict[str, Any] | None = None) -> None:
        entry.status, entry.note, entry.settled_at = status, note, workflow.now()
        entry.detail.update(detail or {})

    def close(self) -> None:
        """No message is silently dropped: what was never applied says why."""
        for entry in self._ctx.state.inbox:
            if entry.status == "pending":
                self.settle(entry, "rejected", f"the goal ended before this {entry.kind} could be applied")

    def _problem(self, message: UserMessage) -> str | None:
        return admission_problem(self._ctx.state, message, self._load_problem)

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
        self._ctx.state.refused.append(Refusal(request_id=request_id, reason=reason, received_at=workflow.now()))
