"""The goal loop's one durable timer: the moment its wait must end even if nothing wakes it
(a parked goal's wake or expiry, a park condition's next check, a device wait's limit).

The timer is kept for an absolute time and set again only when that time changes, not at
every pass of the loop. Two reasons, both about history:
- A wait that a message, a settled step or a presence signal ends before its time used to
  cancel its timer and start an equal one on the next pass: two events per wake-up.
- Temporal may hand the same history events to the workflow in one activation or in two
  (a query answered by a worker that had not cached the goal applies the events that
  arrived since the last workflow task; the task that follows brings the rest). A timer
  started at the first and cancelled at the second is a command the other grouping never
  makes, and a replay of that history then fails with a nondeterminism error. Keyed on
  its absolute time, the timer is the same command either way. So the deadline given must be
  a time taken from the goal's state, never `now` plus something: two activations of one
  history need not share `now` (a device wait's limit already past was once set again as
  "now + 1 s" at each of them, and a replay failed in test_hosts).

Workflow code.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow


class Alarm:
    def __init__(self) -> None:
        self._at: datetime | None = None
        self._summary: str | None = None
        # The time of the last timer that fired (None: none fired since it was set).
        self._rang: datetime | None = None

    def set(self, at: datetime | None, summary: str | None) -> None:
        """The loop's next deadline (None: none). An equal time keeps the running timer."""
        if at != self._at:
            self._at, self._summary = at, summary

    def rang(self, at: datetime | None) -> bool:
        """Whether the timer for `at` has fired (and the loop has not yet acted on it)."""
        return at is not None and self._rang == at

    def take(self, at: datetime | None) -> bool:
        """Whether the timer for `at` has fired; the loop acts on it once. A deadline still
        set after that (past, and nothing changed it) gets a timer of its own again, at
        least a second long, so a deadline no action clears is retried, never spun on."""
        if not self.rang(at):
            return False
        self._rang = None
        return True

    async def run(self) -> None:
        """Keep one timer for the deadline set last (a background task of the goal's run)."""
        while True:
            at = self._at
            if at is None:
                await workflow.wait_condition(lambda: self._at is not None)
                continue
            try:
                await workflow.wait_condition(
                    lambda at=at: self._at != at,
                    # A deadline already past waits a second, not zero: whether a zero-length
                    # timer is a command differs between Python versions of the SDK's loop.
                    timeout=max(at - workflow.now(), timedelta(seconds=1)),
                    timeout_summary=self._summary,
                )
            except TimeoutError:
                self._rang = at
                self._at = None
