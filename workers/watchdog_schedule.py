"""The watchdog's Temporal Schedule: created or brought up to date by every
worker at start, never duplicated.

One schedule per watched task queue (`perdure-watchdog` for the default queue,
`perdure-watchdog-<queue>` for others), firing `WatchdogWorkflow` every
interval with overlap SKIP: a run still going when the next is due makes that
one skip, so runs never pile up. Its runs are started out of the UI's default
workflow list (workers/plumbing.py); a schedule made before that is updated.
The schedule id is the lock: `create` fails for the second of two workers
starting together, which then compares and updates instead. A paused schedule
stays paused through updates.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleDescription,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.service import RPCError

from perdure.workers import plumbing
from perdure.workflows.shared.contracts import TASK_QUEUE
from perdure.workflows.watchdog.watchdog_contracts import WATCHDOG_ID, WATCHDOG_WORKFLOW, WatchdogInput
from perdure.workflows.watchdog.watchdog_workflow import WatchdogWorkflow

DEFAULT_INTERVAL_S = 60.0
INTERVAL_ENV = "PERDURE_WATCHDOG_INTERVAL_S"
# A run that cannot finish (no worker for an hour, say) must not hold the
# schedule's single slot forever: after this, the next due run starts.
RUN_TIMEOUT = timedelta(minutes=10)


def interval_from_env() -> timedelta | None:
    """The configured interval; None when the watchdog is switched off (0 or 'off')."""
    raw = os.environ.get(INTERVAL_ENV, "").strip().lower()
    if not raw:
        return timedelta(seconds=DEFAULT_INTERVAL_S)
    if raw in ("0", "off", "false", "no"):
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV} must be a number of seconds or 'off', not {raw!r}") from None
    if seconds < 1:
        raise ValueError(f"{INTERVAL_ENV} must be at least 1 second (or 0 / 'off' to disable), not {raw!r}")
    return timedelta(seconds=seconds)


def schedule_id(task_queue: str) -> str:
    return WATCHDOG_ID if task_queue == TASK_QUEUE else f"{WATCHDOG_ID}-{task_queue}"


def desired_schedule(
    task_queue: str, interval: timedelta, watchdog_input: WatchdogInput | None = None, hidden: bool = True
) -> Schedule:
    """`hidden`: its runs out of the UI's default workflow list (workers/plumbing.py)."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            WatchdogWorkflow.run,
            watchdog_input or WatchdogInput(task_queue=task_queue),
            id=schedule_id(task_queue),
            task_queue=task_queue,
            execution_timeout=RUN_TIMEOUT,
            static_summary=f"perdure watchdog · judges the open goals on {task_queue}",
            typed_search_attributes=plumbing.hidden() if hidden else None,
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=interval)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        state=ScheduleState(note="created by a perdure worker"),
    )


@dataclass
class EnsureResult:
    schedule_id: str
    outcome: Literal["created", "updated", "unchanged"]
    changes: list[str] = dataclasses.field(default_factory=list)


async def ensure_watchdog_schedule(
    client: Client,
    interval: timedelta,
    task_queue: str,
    watchdog_input: WatchdogInput | None = None,
) -> EnsureResult:
    """Create the schedule if missing; update it if its interval, queue, input or division
    differ; otherwise leave it alone. Safe to call from any number of workers."""
    sid = schedule_id(task_queue)
    try:
        return await _ensure(client, sid, desired_schedule(task_queue, interval, watchdog_input))
    except RPCError as err:
        if not plumbing.division_refused(err):
            raise
    # A server that does not let a client set the division: the runs are listed, as before.
    return await _ensure(client, sid, desired_schedule(task_queue, interval, watchdog_input, hidden=False))


async def _ensure(client: Client, sid: str, desired: Schedule) -> EnsureResult:
    try:
        await client.create_schedule(sid, desired)
        return EnsureResult(sid, "created")
    except ScheduleAlreadyRunningError:
        pass
    handle = client.get_schedule_handle(sid)
    changes = await differences(client, await handle.describe(), desired)
    if not changes:
        return EnsureResult(sid, "unchanged")

    def keep_state(current: ScheduleUpdateInput) -> ScheduleUpdate:
        # Paused (and its note) is the operator's choice; an update must not undo it.
        return ScheduleUpdate(schedule=dataclasses.replace(desired, state=current.description.schedule.state))

    await handle.update(keep_state)
    return EnsureResult(sid, "updated", changes)


async def differences(client: Client, current: ScheduleDescription, desired: Schedule) -> list[str]:
    """What would change, in words; empty when the schedule is as desired."""
    changes = []
    have, want = current.schedule, desired
    intervals = [i.every for i in have.spec.intervals]
    wanted_intervals = [i.every for i in want.spec.intervals]
    if intervals != wanted_intervals or have.spec.cron_expressions or have.spec.calendars:
        changes.append(f"interval {intervals} -> {wanted_intervals}")
    if have.policy.overlap != want.policy.overlap:
        changes.append(f"overlap {have.policy.overlap} -> {want.policy.overlap}")
    action, wanted = have.action, want.action
    assert isinstance(wanted, ScheduleActionStartWorkflow)
    if not isinstance(action, ScheduleActionStartWorkflow) or action.workflow != WATCHDOG_WORKFLOW:
        return [*changes, "action"]
    if action.task_queue != wanted.task_queue:
        changes.append(f"task queue {action.task_queue} -> {wanted.task_queue}")
    if action.id != wanted.id or action.execution_timeout != wanted.execution_timeout:
        changes.append("run id or timeout")
    if _division(action) != _division(wanted):
        changes.append("hidden from the default workflow list" if _division(wanted) else "listed in the UI")
    try:
        args = await client.data_converter.decode(list(action.args), [WatchdogInput])
    except Exception:  # an input written by an older version: replace it
        args = []
    if list(args) != list(wanted.args):
        changes.append("watchdog input")
    return changes


def _division(action: ScheduleActionStartWorkflow) -> str | None:
    attributes = action.typed_search_attributes
    return attributes.get(plumbing.DIVISION) if attributes is not None else None
