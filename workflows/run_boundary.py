"""When a long-lived workflow (goal, router, quota service, device registry) ends its run
and continues as new, and on which worker version the next run starts. Workflow code.

Under Worker Deployments (workers/deployment.py) every run is pinned to the version that
started it. A run ends when its history grows long (the server's suggestion, or the
workflow's own event limit) and also as soon as the deployment's current version changes:
the next run starts on the current version (AUTO_UPGRADE), so a goal that lives for weeks
reaches new code at a run boundary instead of keeping an old worker busy. Unversioned
workers never see the version change, so for them only the history counts.
"""

from __future__ import annotations

from typing import Any, NoReturn

from temporalio import workflow


def continue_as_new_due(event_limit: int | None = None) -> bool:
    """The run should end at its next safe point: history long enough, or a new current version."""
    info = workflow.info()
    return (
        info.is_continue_as_new_suggested()
        or info.is_target_worker_deployment_version_changed()
        or (event_limit is not None and info.get_current_history_length() >= event_limit)
    )


def continue_on_current_version(arg: Any) -> NoReturn:
    """Continue as new with `arg`, the next run on the deployment's current version (its
    first task goes there; from then on it is pinned to that version in turn)."""
    workflow.continue_as_new(arg, initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE)
