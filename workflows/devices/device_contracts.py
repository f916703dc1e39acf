"""Devices: the contracts between a goal, the device registry and a device daemon.

A device (`perdure device --name NAME --root DIR`) is a Temporal worker on the
user's own machine polling `perdure-device-NAME`: outbound connections only, no
goal state on disk. It runs the device tools (DEVICE_TOOLS, and the user's own tools it
loads that are declared for devices) inside its root with the same contracts, risk
classes and replay policies as the worker's. A host (`perdure worker --host NAME
--workspaces DIR…`, workers/host.py) is a device too: it announces the workspaces it holds
instead of one root, and runs the workspace calls of the goals bound to it
(workflows/shared/host_workspaces.py).

Presence is a lease held by an activity, not a timer loop: when a device
announces itself (an update on the registry workflow, which answers with the
session's generation), the registry schedules a `lease` activity on the
device's queue with a short heartbeat timeout. The daemon holds it and
heartbeats; heartbeats cost no history. When the process dies, the server times
the heartbeat out and the registry learns the device is offline without polling
anything; it tells every goal watching that device with a signal. A lease ends
after LEASE_TERM_S and is renewed (one activity per term), so the registry's
history grows by a few events an hour per device.

Fencing: every announce starts a new session with a higher generation. A goal
sends a call with the generation it dispatched to; the daemon answers with its
own. A result from an older generation than the newest the goal has heard of
is refused (the session was replaced, so nothing it did is trusted); a daemon
handed a call or a lease for a newer generation than its own knows it was
replaced and stops taking work.

Pure data, shared by workflows, activities, workers and starters.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from perdure.activities.tools.catalogue import DEVICE_TOOLS, TOOL_SPECS
from perdure.activities.tools.catalogue.command_tool import read_only_command
from perdure.workflows.shared.contracts import TASK_QUEUE, Fingerprint, WorkspaceFence
from perdure.workflows.shared.tool_specs import DEVICE_NAME, ApprovalRule, Compensation, RiskClass, ToolSpec

__all__ = ["DEVICE_NAME", "DEVICE_TOOLS", "ApprovalRule"]  # defined with the tool catalogue; part of these contracts

DEVICE_REGISTRY_WORKFLOW = "PerdureDeviceRegistry"
DEVICE_REGISTRY_ID = "perdure-devices"
"""The registry of the default task queue `perdure` (registry_id)."""

LEASE_S = 10.0
"""Default heartbeat timeout of a device's lease: how long a dead device looks online."""
LEASE_TERM_S = 3600.0
"""A lease activity ends (and is renewed) after this long."""
MAX_DEVICE_PAYLOAD = 1_000_000
"""Bytes of arguments or output a device call carries. Device calls travel inline in history
(a device shares no disk with the workers, so no payload store): under Temporal's 2 MB limit."""

DEFAULT_APPROVAL: ApprovalRule = "risk>=local-write"


def registry_id(task_queue: str = TASK_QUEUE) -> str:
    """The device registry of the workers polling `task_queue`: `perdure-devices` for the
    default queue. Each orchestrator queue has its own devices (and tests their own registry)."""
    return f"{task_queue}-devices"


def device_queue(name: str, task_queue: str = TASK_QUEUE) -> str:
    """Device NAME's task queue: `perdure-device-NAME` for the default orchestrator queue."""
    return f"{task_queue}-device-{name}"


class DeviceActivities:
    """Activity names a device daemon registers (stable: histories depend on them)."""

    RUN_TOOL = "perdure.device.run_tool"
    LEASE = "perdure.device.lease"


class RegistryUpdates:
    ANNOUNCE = "announce"


class RegistrySignals:
    WATCH = "watch"


class RegistryQueries:
    DEVICES = "devices"


DEVICE_PRESENCE_SIGNAL = "device_presence"
"""The registry's signal to a goal watching a device (not a user message: no inbox row)."""


class DeviceAnnouncement(BaseModel):
    """What a device says about itself when it starts."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=DEVICE_NAME)
    session: str = Field(min_length=1, max_length=64, description="Random id of this daemon process.")
    root: str = Field(min_length=1, description="Absolute path of the directory the device works in.")
    os: str = ""
    version: str = ""
    tools: list[str] = Field(
        description="Tools this device offers: some of DEVICE_TOOLS, and the user's own tools it loads."
    )
    network: bool = Field(default=False, description="Commands may use the network on this device.")
    approval: dict[str, ApprovalRule] = Field(
        default_factory=dict, description="Tool (or '*') -> when a call needs a person's approval."
    )
    lease_s: float = Field(default=LEASE_S, ge=1, le=600)
    # Left out of the payload when empty or false: a registry of an older worker forbids unknown fields.
    workspaces: dict[str, str] = Field(
        default_factory=dict,
        exclude_if=lambda workspaces: not workspaces,
        description="A host (`perdure worker --host`): the workspaces it holds, name -> absolute path there.",
    )
    replace: bool = Field(
        default=False,
        exclude_if=lambda replace: not replace,
        description="Take the name over from an online daemon working in another root (`--replace`).",
    )


class DeviceSession(BaseModel):
    """The registry's answer to an announce: the session's generation, the fencing token."""

    name: str
    session: str
    generation: int = Field(ge=1)


class LeaseInput(BaseModel):
    name: str
    session: str
    generation: int
    term_s: float = LEASE_TERM_S


class LeaseResult(BaseModel):
    ended: Literal["term", "stale", "stopped"] = Field(
        description="term: held for its term (renew it); stale: a lease for an older session (drop it); "
        "stopped: the daemon was stopped by its owner (offline now, not one lease later)."
    )


class RunningCall(BaseModel):
    """A call a device is running, as its lease heartbeat reports it."""

    goal_id: str
    node_key: str
    tool: str
    started_at: datetime


class DevicePresence(BaseModel):
    """One device as the registry knows it; what a goal keeps per device it uses."""

    name: str
    known: bool = Field(default=True, description="False: no device of this name ever announced itself.")
    online: bool = False
    generation: int = 0
    seq: int = Field(default=0, description="Change counter: a goal keeps the presence with the highest.")
    root: str = ""
    os: str = ""
    version: str = ""
    tools: list[str] = Field(default_factory=list)
    network: bool = False
    approval: dict[str, ApprovalRule] = Field(default_factory=dict)
    lease_s: float = LEASE_S
    since: datetime | None = Field(default=None, description="When it came online, or went offline.")
    workspaces: dict[str, str] = Field(
        default_factory=dict,
        exclude_if=lambda workspaces: not workspaces,
        description="A host's workspaces (name -> path there); empty for a device (shared/host_workspaces.py).",
    )


class DeviceRecord(BaseModel):
    presence: DevicePresence
    session: str = ""
    lease_s: float = LEASE_S
    last_seen: datetime | None = None
    watchers: list[str] = Field(default_factory=list, description="Goals watching this device.")


class DeviceListing(BaseModel):
    devices: list[DeviceRecord] = Field(default_factory=list)


class WatchDevices(BaseModel):
    """A goal asks to be told about these devices (now, and whenever they change)."""

    goal_id: str
    names: list[str]


class DeviceRegistryState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    devices: dict[str, DeviceRecord] = Field(default_factory=dict)


class DeviceRegistryInput(BaseModel):
    state: DeviceRegistryState | None = None


class DeviceToolInput(BaseModel):
    """One tool call sent to a device: the arguments already resolved on a worker
    (templates filled in, a model's JSON read), so the device needs no artifact store."""

    goal_id: str
    node_key: str
    call_id: str | None = None
    tool: str
    args: dict
    root: str = Field(description="The device root the goal dispatched to (the device refuses another).")
    generation: int = Field(description="The device session the goal dispatched to.")
    network: bool = False
    confirmed: bool = False
    resolution: Literal["happened", "not_happened"] | None = None
    # A host's call only (a host keeps the workspace's versions and fences; a device keeps
    # nothing between calls): left out of the payload when unset, as a device's calls are.
    fence: WorkspaceFence | None = Field(default=None, exclude_if=lambda fence: fence is None)
    based_on: dict[str, str | None] | None = Field(default=None, exclude_if=lambda based_on: based_on is None)


class DeviceToolResult(BaseModel):
    """A device call's outcome, its output inline (capped at MAX_DEVICE_PAYLOAD)."""

    tool: str
    ok: bool
    generation: int = Field(description="The session that ran the call: checked by the goal on completion.")
    output: str | None = None
    error: str | None = None
    uncertain: bool = False
    effect_key: str | None = None
    receipt: dict | None = None
    compensation: Compensation | None = None
    cost_usd: float = Field(
        default=0.0, ge=0, exclude_if=lambda cost: not cost, description="What it reported it cost."
    )
    fingerprints: list[Fingerprint] = Field(
        default_factory=list,
        exclude_if=lambda prints: not prints,
        description="A host's call: the workspace files it read or wrote (what a later write is based on).",
    )


class ResolvedCall(BaseModel):
    """A device call's arguments as a worker resolved them, or why they cannot be used."""

    args: dict | None = None
    error: str | None = None


class DeviceOutput(BaseModel):
    """A device call's outcome, handed to a worker to keep its output in the artifact store
    (it returns the goal's ToolResult, with a reference and a preview)."""

    call_id: str | None = None
    risk: RiskClass | None = None
    result: DeviceToolResult


class DeviceListingResult(BaseModel):
    """What a worker found in the registry for a plan check: `error` when it could not ask."""

    devices: list[DevicePresence] = Field(default_factory=list)
    error: str | None = None

    def offered(self) -> dict[str, list[str]] | None:
        """Device name -> the tools it offers; None when the registry could not be asked."""
        return None if self.error else {d.name: list(d.tools) for d in self.devices}

    def hosts(self) -> dict[str, dict[str, str]]:
        """Host name -> the workspaces it offers (name -> path), of the hosts among the devices."""
        return {d.name: dict(d.workspaces) for d in self.devices if d.workspaces}


def call_risk(tool: str, args: dict | None, tools: Mapping[str, ToolSpec] = TOOL_SPECS) -> RiskClass | None:
    """A call's risk for the approval policy: a run_command the read-only allowlist
    vouches for is a read; every other call has its tool's risk (`tools`: the goal's table,
    with its user tools)."""
    spec = tools.get(tool)
    if spec is None:
        return None
    if tool == "run_command" and args and isinstance(args.get("command"), str) and read_only_command(args["command"]):
        return "read"
    return spec.risk


RISK_ORDER: dict[str, int] = {"read": 0, "local-write": 1, "remote-write": 2, "irreversible": 3}


def needs_approval(
    tool: str,
    args: dict | None,
    device_rules: dict[str, ApprovalRule],
    goal_rules: dict[str, ApprovalRule],
    tools: Mapping[str, ToolSpec] = TOOL_SPECS,
) -> bool:
    """Whether a device call waits for a person. The device's own rule for the tool (or its
    '*') decides when it has one: it is the owner's machine. Else the goal's, else the
    default: calls of risk local-write or more."""
    rule = (
        device_rules.get(tool)
        or device_rules.get("*")
        or goal_rules.get(tool)
        or goal_rules.get("*")
        or DEFAULT_APPROVAL
    )
    if rule == "always":
        return True
    if rule == "never":
        return False
    return RISK_ORDER.get(call_risk(tool, args, tools) or "irreversible", 3) >= RISK_ORDER["local-write"]
