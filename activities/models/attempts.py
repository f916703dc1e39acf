"""One attempt of a model activity: what it is for, how long it has waited, the handle of
a background call, and what the attempts before it cost, as heartbeat details.

Owns the heartbeat details of model activities (what a person sees in the UI, and what
the next attempt reads back), and the record of this attempt once it fails: as reported
when a reply or an error carried usage, zero when the provider never accepted the
request, unknown (estimated by the workflow) when it may have billed work nobody saw.
It must not retry or decide anything: the workflow charges the records
(workflows/goal/model_calls.py) and Temporal's retry policy owns the retries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from perdure.activities.models.timeouts import attempt_deadline
from perdure.workflows.goal.contracts.goal_contracts import Usage
from perdure.workflows.shared.retries import ModelAttempt, failed_attempts_in, unaccounted_attempts, with_attempts

R = TypeVar("R", bound=BaseModel)


class ModelError(ApplicationError):
    """A failed provider call and what it is known to have cost: `usage` as the provider
    reported it (a reply that was then rejected, an error body with usage), or, with
    `billed_unknown`, work the provider may have done and billed that nobody saw."""

    def __init__(self, message: str, *, usage: Usage | None = None, billed_unknown: bool = False, **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.usage = usage
        self.billed_unknown = billed_unknown


class Handle(BaseModel):
    """A call the provider runs on its own, to be polled: an OpenAI background response or an Anthropic batch."""

    kind: str
    id: str
    attempt: int


class ModelAttemptState:
    """This attempt, read from and written to the activity's heartbeat details."""

    def __init__(self, purpose: str, profile: str, turn: int | None = None) -> None:
        info = activity.info() if activity.in_activity() else None
        self.purpose = purpose
        self.profile = profile
        self.turn = turn
        self.attempt = info.attempt if info else 1
        self.started = time.monotonic()
        self.deadline = attempt_deadline()
        self.status = "starting"
        self.usage: Usage | None = None  # this attempt's, once a reply arrived
        # Where a streamed reply's text goes as it arrives (activities/models/live_text.py).
        self.on_text: Callable[[str], None] | None = None
        previous = info.heartbeat_details if info else ()
        last = previous[0] if previous and isinstance(previous[0], dict) else {}
        self.handle = self._handle(last)
        self.failed: list[ModelAttempt] = sorted(
            failed_attempts_in(last) + unaccounted_attempts(last, self.attempt - 1, handle_pays=self.handle is None),
            key=lambda r: r.attempt,
        )
        # An attempt after the last one in the retry policy fails for good.
        policy = info.retry_policy if info else None
        self.last_attempt = bool(policy and policy.maximum_attempts and self.attempt >= policy.maximum_attempts)

    @staticmethod
    def _handle(details: dict) -> Handle | None:
        if not details.get("handle"):
            return None
        try:
            return Handle(kind=details["handle_kind"], id=details["handle"], attempt=details["handle_attempt"])
        except (KeyError, ValueError):
            return None

    def what(self) -> str:
        """The call in words, for messages: 'agent step survey (turn 3)'."""
        return f"{self.purpose} (turn {self.turn})" if self.turn is not None else self.purpose

    def set_status(self, status: str) -> None:
        """What the attempt waits for now (its heartbeat says it)."""
        self.status = status

    def details(self, own: ModelAttempt | None = None) -> dict[str, Any]:
        """What a person needs to see, and what the next attempt needs to resume."""
        failed = [*self.failed, own] if own else self.failed
        return {
            "doing": f"waiting for model profile {self.profile}",
            "for": self.purpose,
            "turn": self.turn,
            "attempt": self.attempt,
            "for_s": round(time.monotonic() - self.started),
            "status": self.status,
            "handle": self.handle.id if self.handle else None,
            "handle_kind": self.handle.kind if self.handle else None,
            "handle_attempt": self.handle.attempt if self.handle else None,
            "failed_attempts": [r.model_dump() for r in failed],
        }

    def live(self, text: str) -> None:
        """Text of the reply being streamed, for showing only (the result is the reply itself)."""
        if text and self.on_text is not None:
            self.on_text(text)

    def beat(self) -> None:
        if activity.in_activity():
            activity.heartbeat(self.details())

    def record_handle(self, kind: str, handle_id: str) -> None:
        """The provider accepted a background call: beat its id now, before the first
        poll, so a worker killed while waiting is followed by one that polls the same call."""
        self.handle = Handle(kind=kind, id=handle_id, attempt=self.attempt)
        self.status = "submitted"
        self.beat()

    def handle_done(self) -> None:
        """The handle's call ended (its result or failure is in hand): nothing to resume."""
        self.handle = None

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def result(self, value: R) -> R:
        """The activity's result with the failed attempts before this one."""
        carrier = with_attempts(type(value))
        return cast(R, carrier.model_validate({**value.model_dump(), "failed_attempts": self.failed}))

    def failure(self, err: BaseException) -> BaseException:
        """The error this attempt leaves with: its own record beaten (the next attempt reads
        it) and every record so far in the details (the workflow reads them if it is the last)."""
        if isinstance(err, ApplicationError) and err.type == "ModelStillRunning":
            own = None  # the handle goes on; the next attempt polls it
        else:
            own = self._record(err)
        details = self.details(own)
        if activity.in_activity():
            activity.heartbeat(details)
        if not isinstance(err, ApplicationError):
            return err
        return ApplicationError(
            err.message,
            {"failed_attempts": details["failed_attempts"]},
            type=err.type,
            non_retryable=err.non_retryable,
            next_retry_delay=err.next_retry_delay,
        )

    def _record(self, err: BaseException) -> ModelAttempt:
        outcome = f"{getattr(err, 'type', None) or type(err).__name__}: {getattr(err, 'message', None) or err}"[:300]
        usage = err.usage if isinstance(err, ModelError) and err.usage is not None else self.usage
        if usage is not None:
            return ModelAttempt(
                attempt=self.attempt,
                outcome=outcome,
                known=True,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cost_usd=usage.cost_usd,
            )
        if isinstance(err, ModelError) and err.billed_unknown:
            return ModelAttempt(attempt=self.attempt, outcome=outcome)
        # Refused or never reached (4xx, 429, 5xx without usage, no connection): nothing billed.
        return ModelAttempt(attempt=self.attempt, outcome=outcome, known=True)
