"""When the goal's finished steps are to be checked again (workflows/goal/verification.py
checks them): a wait that ends after at least the goal's `verify_after_s`, or a worker of
code this goal has not run on taking it (its build id, workers/code_version.py: what the
new code reads from the world may differ from what the old code read). Kept apart so the
rooms that end waits (the pause, the start of a continued run) can say so without
importing the verifier. Workflow code."""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow

from perdure.workflows.goal.contracts.state import GoalState
from perdure.workflows.shared.durations import duration_text

# Build ids a goal remembers: a rolling deploy that flips between two versions checks once
# per version, not on every flip.
CODE_VERSIONS_KEPT = 8


def note_wait_ended(state: GoalState, since: datetime | None, what: str) -> None:
    """A wait that began at `since` ends now; `what` says which ("resumed", ...)."""
    if since is None:
        return
    waited = (workflow.now() - since).total_seconds()
    if waited >= state.spec.verify_after_s:
        _make_due(state, f"{what} after {duration_text(waited, days=True)}")


def note_code_version(state: GoalState) -> None:
    """The worker that runs this workflow task has the build id Temporal recorded for it
    (deterministic on replay); one this goal has not run on before makes the check due."""
    version = workflow.info().get_current_deployment_version()
    build = version.build_id if version else ""
    if not build or build in state.code_versions:
        return
    earlier = bool(state.code_versions)
    state.code_versions = [*state.code_versions, build][-CODE_VERSIONS_KEPT:]
    if earlier:
        _make_due(state, f"a worker of another code version ({build}) took the goal")


def _make_due(state: GoalState, why: str) -> None:
    # Two reasons before one check (a long park ending on a new worker): both are said.
    state.verify_due = f"{state.verify_due}; {why}" if state.verify_due else why
