"""`perdure devices`: every device the registry knows (hosts too: `perdure worker --host`, shown
with the workspaces they hold), online or not, and what runs on it.

Owns asking for the listing and printing it. The registry's query says who the devices
are (root, tools, session, since when online or offline); what an online device runs
now and when it last beat come from the registry workflow's pending lease activities
(the lease's heartbeat details are its running calls, its last heartbeat time the
device's last sign of life), which cost the registry no history. Client-side only.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, Field, ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.converter import DataConverter
from temporalio.service import RPCError, RPCStatusCode

from perdure.runtime import settings
from perdure.starters.render import printable, say
from perdure.workers.device import identity_prefix
from perdure.workflows.devices.device_contracts import (
    DeviceActivities,
    DeviceListing,
    DeviceRecord,
    RegistryQueries,
    RunningCall,
    registry_id,
)
from perdure.workflows.shared.durations import duration_text

QUERY_TIMEOUT_S = 5.0
NO_DEVICE = "no device has announced itself yet (start one with `perdure device --name NAME --root DIR`)"


class RegistryUnanswered(RuntimeError):
    """The registry exists but no worker answered its query."""


class DeviceView(BaseModel):
    """One device as `perdure devices` shows it (and `--json` prints it)."""

    name: str
    online: bool
    since: datetime | None = None
    last_seen: datetime | None = None
    generation: int
    root: str
    os: str = ""
    version: str = ""
    tools: list[str] = Field(default_factory=list)
    network: bool = False
    approval: dict[str, str] = Field(default_factory=dict)
    running: list[RunningCall] = Field(default_factory=list)
    watchers: list[str] = Field(default_factory=list)
    workspaces: dict[str, str] = Field(
        default_factory=dict, description="A host (`perdure worker --host`): its workspaces, name -> path."
    )


class DevicesView(BaseModel):
    devices: list[DeviceView] = Field(default_factory=list)


async def device_views(client: Client, task_queue: str | None = None) -> DevicesView | None:
    """Every device of the workers on `task_queue` (default: the configured one), or None
    when no device has ever announced itself to them (no registry)."""
    handle = client.get_workflow_handle(registry_id(task_queue or settings.task_queue()))
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    try:
        listing = await handle.query(
            RegistryQueries.DEVICES, result_type=DeviceListing, rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S)
        )
    except (RPCError, WorkflowQueryFailedError) as err:
        message = err.message if isinstance(err, RPCError) else str(err)
        raise RegistryUnanswered(
            f"no worker answered the device registry's query ({message}); the registry runs on the perdure "
            "workers: start one with `perdure worker`"
        ) from None
    # Started leases only: one still waiting for its device has no heartbeat, nor a device's identity.
    started = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
    pending = desc.raw_description.pending_activities
    leases = [p for p in pending if p.activity_type.name == DeviceActivities.LEASE and p.state == started]
    views = [await _view(record, leases, client.data_converter) for record in listing.devices]
    return DevicesView(devices=sorted(views, key=lambda view: view.name))


async def _view(record: DeviceRecord, leases: list[PendingActivityInfo], converter: DataConverter) -> DeviceView:
    presence = record.presence
    last_seen = record.last_seen
    running: list[RunningCall] = []
    lease = next((p for p in leases if p.last_worker_identity.startswith(identity_prefix(presence.name))), None)
    if presence.online and lease is not None:
        if lease.HasField("last_heartbeat_time"):
            last_seen = lease.last_heartbeat_time.ToDatetime(tzinfo=UTC)
        elif lease.HasField("last_started_time"):
            last_seen = lease.last_started_time.ToDatetime(tzinfo=UTC)
        running = await _running_calls(lease, converter)
    return DeviceView(
        name=presence.name,
        online=presence.online,
        since=presence.since,
        last_seen=last_seen,
        generation=presence.generation,
        root=presence.root,
        os=presence.os,
        version=presence.version,
        tools=presence.tools,
        network=presence.network,
        approval=dict(presence.approval),
        running=running,
        watchers=record.watchers,
        workspaces=dict(presence.workspaces),
    )


async def _running_calls(lease: PendingActivityInfo, converter: DataConverter) -> list[RunningCall]:
    """The calls a lease's last heartbeat named; none when it cannot be read here (no keys)."""
    if not lease.HasField("heartbeat_details") or not lease.heartbeat_details.payloads:
        return []
    try:
        [details] = await converter.decode([lease.heartbeat_details.payloads[0]])
    except Exception:  # a payload this client has no key for
        return []
    try:
        return [RunningCall.model_validate(call) for call in details or []]
    except (ValidationError, TypeError):
        return []


def _when(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return ""
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} ({duration_text(max(0.0, (now - moment).total_seconds()))} ago)"


def _running_text(calls: list[RunningCall], now: datetime) -> str:
    return "\n".join(
        f"{call.goal_id} · {call.node_key.removeprefix('node:')[:12]} · {call.tool} · "
        f"{duration_text(max(0.0, (now - call.started_at).total_seconds()))}"
        for call in calls
    )


def print_devices(console: Console, view: DevicesView | None, now: datetime | None = None) -> None:
    if view is None or not view.devices:
        say(console, NO_DEVICE)
        return
    now = now or datetime.now(UTC)
    table = Table("device", "status", "since", "last seen", "session", "root", "tools", "running")
    for device in view.devices:
        status = Text("online", style="green") if device.online else Text("offline", style="yellow")
        tools = ", ".join(device.tools) + (" · network" if device.network else "")
        table.add_row(
            Text(device.name),
            status,
            _when(device.since, now),
            _when(device.last_seen, now),
            str(device.generation),
            Text(printable(_where(device))),
            Text(tools),
            Text(printable(_running_text(device.running, now)) or "—"),
        )
    say(console, table)
    say(console, "[dim]times in UTC[/dim]")


def _where(device: DeviceView) -> str:
    """A device's root, or a host's workspaces (`host: repo=/srv/repo, docs=/srv/docs`)."""
    if not device.workspaces:
        return device.root
    return "host: " + ", ".join(f"{name}={path}" for name, path in device.workspaces.items())


def devices_json(view: DevicesView | None) -> str:
    return json.dumps((view or DevicesView()).model_dump(mode="json"), indent=2)
