"""The device registry: one long-lived workflow per namespace that knows which
devices exist, which are online, and which goals wait on them.

Why a workflow, and a lease held by an activity: presence must be known without
polling each device, survive any worker's death, and reach goals that wait
(possibly for days) without a polling loop in them. A device announces itself
with an update (its answer is the session's generation, the fencing token);
the registry then schedules a `lease` activity on the device's own queue with a
heartbeat timeout of the device's lease. Holding it costs no history (heartbeats
are not events); when the daemon dies the server times the heartbeat out and the
activity fails, which is the moment the device goes offline. A lease is renewed
once per term, so an online device costs a few events an hour. Goals watch the
devices their plan names (a signal); every change of presence is signalled to
each watcher, which keeps the newest by `seq`.

Workflow code. Continues as new with its state; the leases of online devices are
scheduled again by the new run (the daemon sees its old lease cancelled, which
is not an error).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError

with workflow.unsafe.imports_passed_through():
    # Deterministic, no module state: passed through so the sandbox does not re-import pydantic per run.
    from pydantic import ValidationError

    from perdure.activities.tools.catalogue import TOOL_SPECS
    from perdure.workflows.devices.device_contracts import (
        DEVICE_PRESENCE_SIGNAL,
        DEVICE_REGISTRY_WORKFLOW,
        DEVICE_TOOLS,
        DeviceActivities,
        DeviceAnnouncement,
        DeviceListing,
        DevicePresence,
        DeviceRecord,
        DeviceRegistryInput,
        DeviceRegistryState,
        DeviceSession,
        LeaseInput,
        LeaseResult,
        RegistryQueries,
        RegistrySignals,
        RegistryUpdates,
        WatchDevices,
        device_queue,
    )
    from perdure.workflows.shared.run_boundary import continue_as_new_due, continue_on_current_version
    from perdure.workflows.shared.user_tools import is_user_tool_name

# Continue as new well before Temporal's warning at 10,240 events.
CONTINUE_AS_NEW_AFTER_EVENTS = 5_000
# A lease picked up by a daemon of an older session is handed out again after this.
SUPERSEDED_RETRY = timedelta(seconds=1)
MAX_WATCHED_PER_GOAL = 64


@workflow.defn(name=DEVICE_REGISTRY_WORKFLOW)
class DeviceRegistryWorkflow:
    @workflow.init
    def __init__(self, input: DeviceRegistryInput) -> None:
        self._state = input.state or DeviceRegistryState()
        # Device -> the task holding its lease in this run.
        self._leases: dict[str, asyncio.Task] = {}
        # Presence signals on their way to goals: continue-as-new waits for them.
        self._sending = 0

    @workflow.run
    async def run(self, input: DeviceRegistryInput) -> None:
        del input
        for name, record in self._state.devices.items():
            if record.presence.online:
                self._hold_lease(name)
        await workflow.wait_condition(self._continue_as_new_due)
        await workflow.wait_condition(lambda: workflow.all_handlers_finished() and not self._sending)
        for task in self._leases.values():
            task.cancel()
        continue_on_current_version(DeviceRegistryInput(state=self._state))

    def _continue_as_new_due(self) -> bool:
        return continue_as_new_due(CONTINUE_AS_NEW_AFTER_EVENTS)

    # --- the Temporal surface ----------------------------------------------------------

    @workflow.update(name=RegistryUpdates.ANNOUNCE)
    async def announce(self, announcement: DeviceAnnouncement) -> DeviceSession:
        """A device starts: a new session with the next generation, online now."""
        record = self._state.devices.get(announcement.name)
        generation = (record.presence.generation if record else 0) + 1
        presence = DevicePresence(
            name=announcement.name,
            online=True,
            generation=generation,
            seq=(record.presence.seq if record else 0) + 1,
            root=announcement.root,
            os=announcement.os,
            version=announcement.version,
            tools=list(announcement.tools),
            network=announcement.network,
            approval=dict(announcement.approval),
            lease_s=announcement.lease_s,
            since=workflow.now(),
            workspaces=dict(announcement.workspaces),
        )
        watchers = record.watchers if record else []
        self._state.devices[announcement.name] = DeviceRecord(
            presence=presence,
            session=announcement.session,
            lease_s=announcement.lease_s,
            last_seen=workflow.now(),
            watchers=watchers,
        )
        old = self._leases.pop(announcement.name, None)
        if old is not None:
            old.cancel()  # the old session's lease: its daemon is gone or being replaced
        self._hold_lease(announcement.name)
        self._notify(announcement.name)
        return DeviceSession(name=announcement.name, session=announcement.session, generation=generation)

    @announce.validator
    def _validate_announce(self, announcement: DeviceAnnouncement) -> None:
        # A name only a user's own tool can have is one the daemon loaded (declared for devices).
        unknown = sorted(t for t in set(announcement.tools) - set(DEVICE_TOOLS) if not is_user_tool_name(t, TOOL_SPECS))
        if unknown:
            raise ApplicationError(
                f"device {announcement.name} offers tools a device cannot run: {', '.join(unknown)} "
                f"(device tools: {', '.join(DEVICE_TOOLS)}, and your own tools declared for devices)",
                type="BadAnnouncement",
            )
        # A second daemon of the name working elsewhere would take the device over silently,
        # and the goals' later steps would run in its directory. (A rejected update leaves no
        # history, and validators do not run on replay: no patch needed.)
        record = self._state.devices.get(announcement.name)
        if (
            record is not None
            and record.presence.online
            and record.session != announcement.session
            and record.presence.root != announcement.root
            and not announcement.replace
        ):
            since = f", since {record.presence.since:%Y-%m-%d %H:%M:%S} UTC" if record.presence.since else ""
            raise ApplicationError(
                f"device {announcement.name} is online with root {record.presence.root} (session "
                f"{record.presence.generation}{since}), not {announcement.root}: stop that daemon, give this one "
                "another --name, or start it with --replace to take the name over",
                type="DeviceNameTaken",
            )

    @workflow.signal(dynamic=True)
    def any_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """`watch`: a goal asks to hear about devices; it is told their presence now and on
        every change. Dynamic, with raw arguments: a malformed or unknown signal is dropped
        with a log line, never a workflow task that fails from then on."""
        if name != RegistrySignals.WATCH:
            workflow.logger.warning("signal refused: the device registry takes only `watch`", extra={"name": name})
            return
        request = self._decode_watch(args)
        if request is None:
            return
        for name in request.names[:MAX_WATCHED_PER_GOAL]:
            record = self._state.devices.get(name)
            if record is None:
                self._signal(request.goal_id, DevicePresence(name=name, known=False))
                continue
            if request.goal_id not in record.watchers:
                record.watchers.append(request.goal_id)
            self._signal(request.goal_id, record.presence)

    @workflow.query(name=RegistryQueries.DEVICES)
    def devices(self) -> DeviceListing:
        return DeviceListing(devices=[self._state.devices[name] for name in sorted(self._state.devices)])

    def _decode_watch(self, args: Sequence[RawValue]) -> WatchDevices | None:
        if len(args) != 1:
            workflow.logger.warning("watch signal refused: it takes one argument", extra={"got": len(args)})
            return None
        try:
            return workflow.payload_converter().from_payload(args[0].payload, WatchDevices)
        except (ValidationError, ValueError, TypeError) as err:
            workflow.logger.warning("watch signal refused: not a WatchDevices", extra={"error": str(err)[:300]})
            return None

    # --- leases ------------------------------------------------------------------------

    def _hold_lease(self, name: str) -> None:
        record = self._state.devices[name]
        held = self._leases.get(name)
        if held is not None and not held.done():
            # An announce handled in a run's first activation already holds it (updates
            # run before the run method, which holds the leases of the online devices).
            return
        self._leases[name] = asyncio.create_task(self._lease(name, record.presence.generation))

    async def _lease(self, name: str, generation: int) -> None:
        """Hold the device's lease for as long as its session lives: renewed each term; a
        heartbeat that times out (the daemon died) or a lease never picked up (it died
        right after announcing) marks the device offline."""
        while self._current(name, generation):
            record = self._state.devices[name]
            lease = timedelta(seconds=record.lease_s)
            try:
                result = await workflow.execute_activity(
                    DeviceActivities.LEASE,
                    LeaseInput(name=name, session=record.session, generation=generation),
                    result_type=LeaseResult,
                    task_queue=device_queue(name, workflow.info().task_queue),
                    schedule_to_start_timeout=lease,
                    heartbeat_timeout=lease,
                    start_to_close_timeout=timedelta(hours=2),
                    retry_policy=RetryPolicy(maximum_attempts=1),
                    summary=f"lease · {name} · session {generation}",
                )
            except ActivityError as err:
                if isinstance(err.cause, CancelledError):
                    return
                if isinstance(err.cause, ApplicationError) and err.cause.type == "DeviceSuperseded":
                    # Picked up by a daemon of an older session, which now stops: hand it out again.
                    await workflow.sleep(SUPERSEDED_RETRY)
                    continue
                if self._current(name, generation):
                    # Last heard of when its heartbeats stopped, one lease before the lapse.
                    record.last_seen = max(record.last_seen or workflow.now(), workflow.now() - lease)
                    self._went_offline(name, f"lease lapsed: {_failure(err)}")
                return
            except asyncio.CancelledError:
                return
            if result.ended == "stale":
                return
            if not self._current(name, generation):
                return
            record.last_seen = workflow.now()
            if result.ended == "stopped":
                self._went_offline(name, "stopped by its owner")
                return

    def _current(self, name: str, generation: int) -> bool:
        record = self._state.devices.get(name)
        return record is not None and record.presence.generation == generation and record.presence.online

    def _went_offline(self, name: str, why: str) -> None:
        record = self._state.devices[name]
        workflow.logger.info("device offline", extra={"device": name, "why": why})
        record.presence = record.presence.model_copy(
            update={"online": False, "seq": record.presence.seq + 1, "since": workflow.now()}
        )
        self._leases.pop(name, None)
        self._notify(name)

    # --- telling goals -----------------------------------------------------------------

    def _notify(self, name: str) -> None:
        record = self._state.devices[name]
        for goal_id in list(record.watchers):
            self._signal(goal_id, record.presence)

    def _signal(self, goal_id: str, presence: DevicePresence) -> None:
        asyncio.create_task(self._send(goal_id, presence))

    async def _send(self, goal_id: str, presence: DevicePresence) -> None:
        self._sending += 1
        try:
            await workflow.get_external_workflow_handle(goal_id).signal(DEVICE_PRESENCE_SIGNAL, presence)
        except (ApplicationError, FailureError) as err:
            # The goal has ended (or never existed): stop telling it.
            record = self._state.devices.get(presence.name)
            if record is not None and goal_id in record.watchers:
                record.watchers.remove(goal_id)
            workflow.logger.info("watcher dropped", extra={"goal": goal_id, "error": str(err)[:200]})
        finally:
            self._sending -= 1


def _failure(err: ActivityError) -> str:
    cause = err.cause
    return str(cause or err)
