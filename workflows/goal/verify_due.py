"""When the goal's finished steps are to be checked again (workflows/goal/verification.py
checks them): a wait that ends after at least the goal's `verify_after_s`. Kept apart so
the rooms that end waits (the pause, the start of a continued run) can say so without
importing the verifier. Workflow code."""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow

from workflows.durations import duration_text
from workflows.state import GoalState


def note_wait_ended(state: GoalState, since: datetime | None, what: str) -> None:
    """A wait that began at `since` ends now; `what` says which ("resumed", ...)."""
    if since is None or state.verify_due:
        return
    waited = (workflow.now() - since).total_seconds()
    if waited >= state.spec.verify_after_s:
        state.verify_due = f"{what} after {duration_text(waited, days=True)}"
