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

from datetime import timedelta
from typing import Any, NoReturn

from temporalio import workflow

# A goal's workflow task timeout: how long the server waits for a workflow task before
# it gives the task to another worker. A worker SIGKILLed in the middle of a task (a
# read segment runs as local activities inside one) is noticed only then, so it is most
# of how long such a goal waits to be taken over. It need not cover long work: while
# local activities run, the SDK ends the task at 80 % of the timeout and goes on in a
# new one (a workflow task heartbeat), and the SDK fails any activation that runs more
# than 2 s without yielding. What it must cover is a worker taking the goal over: that
# worker fetches the run's history and replays all of it inside ONE task (its first
# goal task also imports the workflow code), and a task that outlasts the timeout is
# timed out and replayed again. A replay costs a little per step the goal holds (its
# state: a 10,000-step goal's loads in ~0.25 s) and ~0.25-0.4 ms per step settled in the
# run (a 10,000-step run of ~160 events replayed in 1.8-2.1 s on a quiet 2-core machine;
# 2.5-4x that with three CPU-bound processes beside the workers, where goals of 100 or
# 500 reads killed near their end were taken over in one task of 0.35 / 0.66 s, and one
# of 1,000 reads needed several 2 s attempts). Hence 2 s up to 666 steps, 3 ms per step
# above, at most 60 s; and a run ends once it has settled as many steps as its timeout
# was sized for (`steps_per_run`), so steps that settle again (retries, voids, re-plans)
# cannot grow a run past what its timeout covers.
TASK_TIMEOUT_FLOOR = timedelta(seconds=2)
TASK_TIMEOUT_PER_STEP = timedelta(milliseconds=3)
TASK_TIMEOUT_CEILING = timedelta(seconds=60)


def goal_task_timeout(steps: int) -> timedelta:
    """The workflow task timeout of a goal run whose plan has `steps` steps (0: not planned yet)."""
    return min(TASK_TIMEOUT_CEILING, max(TASK_TIMEOUT_FLOOR, steps * TASK_TIMEOUT_PER_STEP))


def steps_per_run(task_timeout: timedelta) -> int:
    """Steps a goal run may settle before it continues as new: as many as `task_timeout` is
    sized for (666 at 2 s, 10,000 at 30 s). Events do not bound them: a chain of reads run
    ahead in one local activity settles hundreds of steps per event."""
    return int(task_timeout / TASK_TIMEOUT_PER_STEP)


def continue_as_new_due(event_limit: int | None = None) -> bool:
    """The run should end at its next safe point: history long enough, or a new current version."""
    info = workflow.info()
    return (
        info.is_continue_as_new_suggested()
        or info.is_target_worker_deployment_version_changed()
        or (event_limit is not None and info.get_current_history_length() >= event_limit)
    )


def continue_on_current_version(
    arg: Any, task_timeout: timedelta | None = None, memo: dict[str, Any] | None = None
) -> NoReturn:
    """Continue as new with `arg`, the next run on the deployment's current version (its
    first task goes there; from then on it is pinned to that version in turn), with
    `task_timeout` and `memo` when given (else this run's)."""
    workflow.continue_as_new(
        arg,
        task_timeout=task_timeout,
        memo=memo,
        initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE,
    )
