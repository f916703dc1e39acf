"""One method per steering verb (`steer`, `queue`, `answer`, `approve`, `park`, `resume`,
`narrow`, `rewind`, `abort`, `escalate`): each builds its message from
workflows/goal/contracts/messages.py, so a bad field is refused here (InvalidRequest)
before anything is sent, and sends it through the client's one `send`.

A mixin of `Client` (perdure_client.py), apart only to keep that module short: it holds no
state and decides nothing the goal decides (whether a message applies is the goal's turn).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from perdure.starters.client import message_delivery
from perdure.starters.client.client_errors import InvalidRequest
from perdure.starters.client.message_delivery import Delivery
from perdure.workflows.goal.contracts import messages
from perdure.workflows.goal.contracts.plan import describe_validation_error

# The prefix of the request ids the library makes (the CLI's are cli-..., the MCP server's mcp-...).
REQUEST_ID_PREFIX = "py"


def steering_message(kind: type[BaseModel], request_id: str | None, **fields: Any) -> BaseModel:
    """The message, under `request_id` or a new one; InvalidRequest says which field is wrong."""
    rid = request_id or message_delivery.new_request_id(REQUEST_ID_PREFIX)
    try:
        return kind(request_id=rid, **fields)
    except ValidationError as err:
        raise InvalidRequest(f"{kind.__name__.lower()}: {describe_validation_error(err)}") from None


class SteeringVerbs(ABC):
    """The verbs a person (or a program) steers a goal with. Each takes the goal's id and an
    optional `request_id` (made when not given; a retry with the same id is the same
    message, counted once) and returns the `Delivery`: the goal's receipt when a worker
    judged the message at once, else `receipt` None (the server stored it; the goal judges
    it in the order it was sent). A receipt with status "rejected" was admitted but could
    not apply at its turn; its `note` says why. GoalNotFound, GoalEnded and MessageRejected
    say why a message was not taken; InvalidRequest that it was never sent."""

    @abstractmethod
    async def send(self, goal_id: str, message: BaseModel) -> Delivery:
        """Deliver one message to the goal (the Client's, perdure_client.py)."""

    async def _verb(self, goal_id: str, kind: type[BaseModel], request_id: str | None, **fields: Any) -> Delivery:
        return await self.send(goal_id, steering_message(kind, request_id, **fields))

    async def steer(self, goal_id: str, text: str, *, request_id: str | None = None) -> Delivery:
        """Guidance, applied at the next model turn and kept for the rest of the goal."""
        return await self._verb(goal_id, messages.Steer, request_id, text=text)

    async def queue(self, goal_id: str, text: str, *, request_id: str | None = None) -> Delivery:
        """Follow-up work, planned when the current work is done."""
        return await self._verb(goal_id, messages.Queue, request_id, text=text)

    async def answer(
        self,
        goal_id: str,
        question_id: str,
        choice: str,
        *,
        text: str | None = None,
        steps: Sequence[str] = (),
        request_id: str | None = None,
    ) -> Delivery:
        """Answer an open question with one of its option ids (see `questions`), and a note.
        `steps`: the step names an approvals-ahead card's `approve_some` / `refuse_some` pick
        (the question's `ahead` lists them); the goal refuses steps the card does not list."""
        return await self._verb(
            goal_id, messages.Answer, request_id, question_id=question_id, choice=choice, text=text, steps=list(steps)
        )

    async def approve(
        self,
        goal_id: str,
        question_id: str,
        *,
        approved: bool = True,
        text: str | None = None,
        request_id: str | None = None,
    ) -> Delivery:
        """Approve (or, with `approved=False`, reject) what a confirmation question proposes,
        such as an irreversible call."""
        return await self._verb(
            goal_id, messages.Approve, request_id, question_id=question_id, approved=approved, text=text
        )

    async def park(
        self,
        goal_id: str,
        reason: str,
        *,
        until: datetime | None = None,
        expiry_hours: float = 48,
        until_file: str | None = None,
        until_command: str | None = None,
        until_signal: str | None = None,
        poll_first_s: float = 2,
        poll_max_s: float = 300,
        request_id: str | None = None,
    ) -> Delivery:
        """Pause dispatching until `resume` (or `until`, a timezone-aware time, or one
        condition: a workspace file exists, a command exits 0, a named signal arrives,
        checked every `poll_first_s` doubling to `poll_max_s`); the goal asks again after
        `expiry_hours`."""
        return await self._verb(
            goal_id,
            messages.Park,
            request_id,
            reason=reason,
            until=until,
            expiry_hours=expiry_hours,
            until_file=until_file,
            until_command=until_command,
            until_signal=until_signal,
            poll_first_s=poll_first_s,
            poll_max_s=poll_max_s,
        )

    async def signal(self, goal_id: str, name: str, *, request_id: str | None = None) -> Delivery:
        """Send a named signal: it ends a park that waits for it (`park(until_signal=NAME)`)."""
        return await self._verb(goal_id, messages.Signal, request_id, name=name)

    async def resume(self, goal_id: str, *, request_id: str | None = None) -> Delivery:
        """Resume a parked goal."""
        return await self._verb(goal_id, messages.Resume, request_id)

    async def narrow(
        self, goal_id: str, premises: Mapping[str, str], *, why: str | None = None, request_id: str | None = None
    ) -> Delivery:
        """Change premises (key -> new value): the work they invalidate is voided, the rest kept."""
        return await self._verb(goal_id, messages.Narrow, request_id, premises=dict(premises), why=why)

    async def rewind(self, goal_id: str, node: str, why: str, *, request_id: str | None = None) -> Delivery:
        """Void a step and what depends on it; `why` (what was wrong) is shown to the model."""
        return await self._verb(goal_id, messages.Rewind, request_id, node=node, why=why)

    async def abort(
        self,
        goal_id: str,
        reason: str = "aborted by the user",
        *,
        rollback: bool = False,
        request_id: str | None = None,
    ) -> Delivery:
        """Stop dispatching and finish with the report and the unfinished list; with
        `rollback`, the registered compensations run first, newest first."""
        return await self._verb(goal_id, messages.Abort, request_id, reason=reason, rollback=rollback)

    async def escalate(self, goal_id: str, finding: str, detail: str, *, request_id: str | None = None) -> Delivery:
        """Ask a person to look (what the watchdog sends): asked as a question on the goal."""
        return await self._verb(goal_id, messages.Escalate, request_id, finding=finding, detail=detail)
