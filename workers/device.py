"""The device daemon: `perdure device --name NAME --root DIR` (starters/cli/worker_commands.py).

A Temporal worker on the user's own machine, polling `perdure-device-NAME` with
outbound connections only, that runs the device activities of
activities/devices/device_tools.py inside DIR. It announces itself to the device registry
(an update-with-start on the registry workflow, which answers with this session's
generation), then serves the lease the registry schedules on its queue and the goals'
tool calls, until Ctrl-C, SIGTERM, or a call for a newer session of the same device
(another daemon took over: this one stops).

It keeps no goal state on disk: its scratch directory holds a call's blobs only while
the call runs, and may be deleted between runs. Its client keeps payloads inline (no
payload store: it shares no disk with the workers); payload keys, when set, still
encrypt them. It must not decide anything about goals: the registry and the goals do.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import platform
import re
import signal
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar, get_args

import structlog
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from perdure.activities.devices.device_tools import DeviceSessionState, DeviceToolActivities, clear_scratch
from perdure.activities.tools import sandbox
from perdure.activities.tools.user.tool_modules import load_toolbox
from perdure.activities.tools.user.toolbox import Toolbox
from perdure.runtime import settings
from perdure.workflows.devices.device_contracts import (
    DEVICE_NAME,
    DEVICE_REGISTRY_WORKFLOW,
    DEVICE_TOOLS,
    LEASE_S,
    ApprovalRule,
    DeviceAnnouncement,
    DeviceListing,
    DeviceRecord,
    DeviceRegistryInput,
    DeviceSession,
    RegistryQueries,
    RegistryUpdates,
    device_queue,
    registry_id,
)

log = structlog.get_logger(__name__)
T = TypeVar("T")

ANNOUNCE_TRY_S = 10.0
"""One announce attempt: long enough for a worker to take the registry's workflow task."""
ANNOUNCE_BACKOFF_MAX_S = 5.0
RECHECK_S = 2.0
"""How often the daemon looks whether it still holds a lease."""
REPLACED_LOOKUP_S = 3.0
"""How long a replaced daemon asks the registry who replaced it before it stops anyway."""
GRACEFUL_STOP = timedelta(seconds=660)
"""How long a stopping daemon lets its running calls finish: a command's longest timeout
(600 s) and a git call's. A second Ctrl-C stops at once."""
APPROVAL_RULES: tuple[str, ...] = get_args(ApprovalRule)
# Reached the server but could not finish: try again. Anything else is the user's to fix.
RETRIED_RPC = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED)


class DeviceConfigError(ValueError):
    """An option the daemon cannot start with; the message says which and what is allowed."""


class DeviceRefused(RuntimeError):
    """The registry refused the announce."""


@dataclass(frozen=True)
class DeviceConfig:
    """A daemon's options, checked."""

    name: str
    root: Path
    tools: frozenset[str]
    network: bool
    approval: dict[str, ApprovalRule]
    lease_s: float
    scratch: Path
    replace: bool = False  # take the name over from an online daemon working in another root
    user_tools: Toolbox = field(default_factory=Toolbox)
    """The user's own tools it offers (their names are in `tools` too)."""
    workspaces: dict[str, Path] = field(default_factory=dict)
    """A host's workspaces, name -> real path (workers/host.py); empty for a device, which has its root."""


def device_identity(name: str) -> str:
    """The worker identity of a device's daemon, which the server records on the lease it
    runs: `perdure devices` finds a device's lease (and its running calls) by it."""
    return f"{identity_prefix(name)}{platform.node()}"


def identity_prefix(name: str) -> str:
    return f"perdure-device {name}@"


def device_tools(text: str | None) -> tuple[frozenset[str], Toolbox]:
    """`--tools a,b,mypkg.tools`: built-in device tools by name, and modules of the user's own
    tools (each declared `devices=True`), whose tools it offers; None: the built-in device tools.
    DeviceConfigError for a name that is neither; ToolLoadError for a module that cannot be loaded."""
    if text is None:
        return frozenset(DEVICE_TOOLS), Toolbox()
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise DeviceConfigError(f"--tools names no tool; a device can offer: {', '.join(DEVICE_TOOLS)}")
    modules = [item for item in items if item not in DEVICE_TOOLS]
    for item in modules:
        if "." not in item and importlib.util.find_spec(item) is None:
            raise DeviceConfigError(
                f"unknown device tool {item}; a device can offer: {', '.join(DEVICE_TOOLS)}, and your own tools "
                "by their module (e.g. mypkg.tools)"
            )
    # A ToolLoadError goes up as it is: the command refuses it as `perdure worker` does (exit 2).
    loaded = load_toolbox(modules, with_entry_points=False) if modules else Toolbox()
    # A module may hold tools for the workers only: the device offers those declared for devices.
    toolbox = Toolbox([d for d in loaded.declarations.values() if d.devices], loaded.sources)
    if modules and not toolbox.declarations:
        raise DeviceConfigError(
            f"{', '.join(modules)} declares no tool for devices: declare one with @perdure.tool(devices=True)"
        )
    return frozenset(item for item in items if item in DEVICE_TOOLS) | set(toolbox.declarations), toolbox


def parse_approval(items: list[str], own: Iterable[str] = ()) -> dict[str, ApprovalRule]:
    """`--approve TOOL=RULE` (repeatable): TOOL a device tool, one of `own` (the user's tools
    the device offers) or `*`, RULE one of APPROVAL_RULES (`risk >= local-write` may be
    written with spaces)."""
    own = set(own)
    rules: dict[str, ApprovalRule] = {}
    for item in items:
        tool, sep, rule = item.partition("=")
        tool, rule = tool.strip(), re.sub(r"\s+", "", rule)
        if not sep or not tool:
            raise DeviceConfigError(f"--approve '{item}' is not TOOL=RULE (e.g. run_command=always)")
        if tool != "*" and tool not in DEVICE_TOOLS and tool not in own:
            offered = ", ".join([*DEVICE_TOOLS, *sorted(own)])
            raise DeviceConfigError(f"--approve '{item}': {tool} is not a device tool; give one of {offered}, or *")
        if rule not in APPROVAL_RULES:
            raise DeviceConfigError(f"--approve '{item}': the rule must be one of {', '.join(APPROVAL_RULES)}")
        rules[tool] = rule  # type: ignore[assignment]  # checked against ApprovalRule just above
    return rules


def device_config(
    *,
    name: str,
    root: Path | str,
    tools: frozenset[str] | None = None,
    network: bool = False,
    approval: dict[str, ApprovalRule] | None = None,
    lease_s: float = LEASE_S,
    scratch: Path | str | None = None,
    replace: bool = False,
    user_tools: Toolbox | None = None,
) -> DeviceConfig:
    """The options checked: a valid name, an existing root (made absolute), known tools (the
    built-in device tools, and `user_tools` declared for devices, with --network when they
    reach the network)."""
    if not re.fullmatch(DEVICE_NAME, name):
        raise DeviceConfigError(
            f"device name '{name}' is not allowed: lower-case letters, digits and '-', starting with a "
            "letter or digit, at most 48 characters"
        )
    where = Path(root).expanduser()
    if not where.exists():
        raise DeviceConfigError(f"--root {where} does not exist")
    if not where.is_dir():
        raise DeviceConfigError(f"--root {where} is not a directory")
    real_root = where.resolve()
    own = user_tools or Toolbox()
    offered = (frozenset(DEVICE_TOOLS) if tools is None else tools) | set(own.declarations)
    unknown = sorted(offered - set(DEVICE_TOOLS) - set(own.declarations))
    if unknown or not offered:
        raise DeviceConfigError(
            f"a device offers some of {', '.join(DEVICE_TOOLS)}; got {', '.join(unknown) or 'none'}"
        )
    for declared in own.declarations.values():
        if not declared.devices:
            raise DeviceConfigError(
                f"tool {declared.name} ({declared.module}) is not declared for devices: @perdure.tool(devices=True)"
            )
        if declared.network and not network:
            raise DeviceConfigError(f"tool {declared.name} reaches the network: start the device with --network")
    if not 1 <= lease_s <= 600:
        raise DeviceConfigError(f"--lease-s {lease_s:g} is out of range: give 1 to 600 seconds")
    rules = approval or {}
    bad = sorted(
        k
        for k, v in rules.items()
        if (k != "*" and k not in DEVICE_TOOLS and k not in own.declarations) or v not in APPROVAL_RULES
    )
    if bad:
        raise DeviceConfigError(f"approval rules for {', '.join(bad)} cannot be used")
    place = (
        Path(scratch).expanduser().resolve()
        if scratch is not None
        else settings.perdure_home().resolve() / "devices" / name / "scratch"
    )
    if place == real_root:
        raise DeviceConfigError("--scratch must not be the root itself (commands must not see it)")
    try:
        place.mkdir(parents=True, exist_ok=True)
        probe = place / ".perdure-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise DeviceConfigError(
            f"cannot use {place} as the scratch directory ({err.strerror or err}); give a writable one with --scratch"
        ) from None
    return DeviceConfig(
        name=name,
        root=real_root,
        tools=offered,
        network=network,
        approval=rules,
        lease_s=lease_s,
        scratch=place,
        replace=replace,
        user_tools=own,
    )


def perdure_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("perdure")
    except PackageNotFoundError:
        return ""


async def announce(client: Client, announcement: DeviceAnnouncement, task_queue: str) -> DeviceSession:
    """Announce the device to the registry (starting the registry if there is none), until
    a worker has answered. Every try carries the same update id, so a try whose answer was
    lost and the next one are one announce, one generation."""
    delay_s = 0.5
    said_waiting = False
    while True:
        start = WithStartWorkflowOperation(
            DEVICE_REGISTRY_WORKFLOW,
            DeviceRegistryInput(),
            id=registry_id(task_queue),
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        try:
            return await asyncio.wait_for(
                client.execute_update_with_start_workflow(
                    RegistryUpdates.ANNOUNCE,
                    announcement,
                    start_workflow_operation=start,
                    id=f"announce-{announcement.session}",
                    result_type=DeviceSession,
                    rpc_timeout=timedelta(seconds=ANNOUNCE_TRY_S),
                ),
                # The SDK's own retries of the first RPC are within rpc_timeout; then it polls for the outcome.
                timeout=ANNOUNCE_TRY_S + 2,
            )
        except (WorkflowUpdateRPCTimeoutOrCancelledError, TimeoutError):
            why = "no worker answered"
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            raise DeviceRefused(
                f"the device registry refused device {announcement.name}: {cause.message if cause else err}"
            ) from None
        except RPCError as err:
            if err.status not in RETRIED_RPC:
                raise
            why = err.message
        _retrieve_start_outcome(start)
        if not said_waiting:
            log.warning(
                f"waiting for a perdure worker to register device {announcement.name}",
                task_queue=task_queue,
                reason=why,
            )
            said_waiting = True
        await asyncio.sleep(delay_s)
        delay_s = min(delay_s * 2, ANNOUNCE_BACKOFF_MAX_S)


def _retrieve_start_outcome(start: WithStartWorkflowOperation) -> None:
    """A failed try leaves its error in the operation's handle future too, which nobody awaits:
    asyncio would log it as an error ("Future exception was never retrieved") once collected."""
    handle = start._workflow_handle  # the SDK offers only `await workflow_handle()`, which may never end
    if handle.done() and not handle.cancelled():
        handle.exception()


async def run_device(
    client: Client,
    *,
    name: str,
    root: Path | str,
    tools: frozenset[str] | None = None,
    network: bool = False,
    approval: dict[str, ApprovalRule] | None = None,
    lease_s: float = LEASE_S,
    scratch: Path | str | None = None,
    replace: bool = False,
    task_queue: str | None = None,
    on_online: Callable[[DeviceConfig, DeviceSession], None] | None = None,
    state: DeviceSessionState | None = None,
    user_tools: Toolbox | None = None,
) -> None:
    """Run the daemon until SIGINT/SIGTERM, until a newer session of the device takes over,
    or until the task running it is cancelled. `client` must keep payloads inline
    (`perdure.runtime.connect.connect(payload_store=False)`)."""
    config = device_config(
        name=name,
        root=root,
        tools=tools,
        network=network,
        approval=approval,
        lease_s=lease_s,
        scratch=scratch,
        replace=replace,
        user_tools=user_tools,
    )
    state = state or DeviceSessionState(name=config.name)
    # From the start: a Ctrl-C while the daemon waits for a worker stops it as cleanly.
    stop, restore_signals = _stop_on_signals(state)
    try:
        await serve_device(client, config, task_queue or settings.task_queue(), stop, on_online, state)
    finally:
        restore_signals()


async def serve_device(
    client: Client,
    config: DeviceConfig,
    queue: str,
    stop: asyncio.Event,
    on_online: Callable[[DeviceConfig, DeviceSession], None] | None = None,
    state: DeviceSessionState | None = None,
) -> None:
    """Announce the device (or host) and serve its queue until `stop` is set, or a newer
    session of it takes over. The caller decides what stops it: a daemon's signals
    (run_device), or the worker process a host runs in (workers/host.py)."""
    state = state or DeviceSessionState(name=config.name)
    clear_scratch(config.scratch)
    if "run_command" in config.tools:
        warn, sandboxing = await sandbox.describe_at_start()
        (log.warning if warn else log.info)(sandboxing)
    first = _announcement(config, state, replace=config.replace)
    session = await _unless_stopped(announce(client, first, queue), stop)
    if session is None:
        log.info(f"{_kind(config)} {config.name} stopped before a worker registered it")
        return
    await _serve(client, config, state, session, queue, stop, on_online)


def _kind(config: DeviceConfig) -> str:
    return "host" if config.workspaces else "device"


async def _serve(
    client: Client,
    config: DeviceConfig,
    state: DeviceSessionState,
    session: DeviceSession,
    queue: str,
    stop: asyncio.Event,
    on_online: Callable[[DeviceConfig, DeviceSession], None] | None,
) -> None:
    """Poll the device's queue until told to stop, then let the running calls finish."""
    state.generation = session.generation
    state.lease_seen = time.monotonic()
    acts = DeviceToolActivities(
        config.root,
        config.tools,
        config.network,
        state,
        config.scratch,
        config.user_tools.implementations(),
        workspaces=config.workspaces,
    )
    own_queue = device_queue(config.name, queue)
    worker = Worker(
        client,
        task_queue=own_queue,
        activities=[acts.run_tool, acts.lease],
        identity=device_identity(config.name),
        graceful_shutdown_timeout=GRACEFUL_STOP,
    )
    # At once: the registry gives the lease it scheduled lease_s to be picked up.
    running = asyncio.create_task(worker.run())
    log.info(f"{_kind(config)} polling", device=config.name, task_queue=own_queue, generation=state.generation)
    if on_online is not None:
        on_online(config, session)
    side = [
        asyncio.create_task(stop.wait()),
        asyncio.create_task(state.superseded.wait()),
        asyncio.create_task(_keep_announced(client, config, state, queue)),
    ]
    try:
        await asyncio.wait([running, *side], return_when=asyncio.FIRST_COMPLETED)
        for task in side:
            if task.done():
                task.result()  # a failed re-announce: say why
    finally:
        for task in side:
            task.cancel()
        if not running.done():
            if state.superseded.is_set():
                log.warning(await _replaced_text(client, config.name, queue))
            else:
                log.info(f"{_kind(config)} {config.name} stopping", running_calls=len(state.running))
            state.stopping.set()
            await worker.shutdown()
        await running  # the worker failed by itself: this says why


async def _unless_stopped(work: Coroutine[Any, Any, T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None when `stop` is set first (`work` is then cancelled)."""
    task = asyncio.create_task(work)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if task.cancelled() else task.result()


async def _replaced_text(client: Client, name: str, queue: str) -> str:
    """The line a replaced daemon stops with: which session took over, working where."""
    try:
        record = await asyncio.wait_for(_registry_record(client, name, queue), REPLACED_LOOKUP_S)
    except (RegistryUnanswered, RPCError, TimeoutError):
        record = None
    newer = f" (session {record.presence.generation}, root {record.presence.root})" if record is not None else ""
    return f"device {name} was replaced by a newer daemon{newer}; this one stops"


def _announcement(config: DeviceConfig, state: DeviceSessionState, replace: bool = False) -> DeviceAnnouncement:
    """Only the first announce of a daemon may take the name over (`--replace`); announcing
    again after a lapse never takes it back from a daemon that replaced this one."""
    return DeviceAnnouncement(
        name=config.name,
        session=state.session,
        root=str(config.root),
        os=platform.platform(),
        version=perdure_version(),
        tools=[tool for tool in DEVICE_TOOLS if tool in config.tools] + sorted(config.user_tools.declarations),
        network=config.network,
        approval=config.approval,
        lease_s=config.lease_s,
        workspaces={name: str(path) for name, path in config.workspaces.items()},
        replace=replace,
    )


async def _keep_announced(client: Client, config: DeviceConfig, state: DeviceSessionState, queue: str) -> None:
    """Announce again when this session has held no lease for a while: the machine slept or
    lost the server for longer than the lease, the registry marked it offline and waits for
    an announce. The registry is asked first, so a daemon that another daemon of the same
    name replaced stops instead of taking the device back."""
    lapse_s = 2 * config.lease_s + RECHECK_S
    while not state.stopping.is_set():
        await asyncio.sleep(RECHECK_S)
        if state.leases or time.monotonic() - state.lease_seen < lapse_s:
            continue
        try:
            record = await _registry_record(client, config.name, queue)
        except RegistryUnanswered:
            continue  # an announce now would wait for the same worker; look again later
        if record is not None and record.presence.generation > state.generation:
            state.superseded.set()
            return
        if record is not None and record.presence.online and record.session == state.session:
            state.lease_seen = time.monotonic()  # the registry holds us online: a lease is on its way
            continue
        log.warning(f"device {config.name} held no lease for {lapse_s:g} s; announcing it again")
        state.session = uuid.uuid4().hex
        # Until the answer comes, a lease or call of the new session may already arrive: it
        # is this daemon's, not a replacement's (activities/devices/device_tools.py).
        state.announcing = True
        try:
            session = await announce(client, _announcement(config, state), queue)
        finally:
            state.announcing = False
        state.generation = max(state.generation, session.generation)
        state.lease_seen = time.monotonic()
        log.info("device announced again", device=config.name, generation=state.generation)


class RegistryUnanswered(Exception):
    """No worker answered the registry's query (or the server did not)."""


async def _registry_record(client: Client, name: str, queue: str) -> DeviceRecord | None:
    """This device as the registry knows it; None when the registry does not know it."""
    handle = client.get_workflow_handle(registry_id(queue))
    try:
        listing = await handle.query(
            RegistryQueries.DEVICES, result_type=DeviceListing, rpc_timeout=timedelta(seconds=ANNOUNCE_TRY_S)
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None  # no registry at all any more: the announce starts one
        raise RegistryUnanswered(err.message) from None
    except WorkflowQueryFailedError as err:
        raise RegistryUnanswered(str(err)) from None
    return next((record for record in listing.devices if record.presence.name == name), None)


def _stop_on_signals(state: DeviceSessionState) -> tuple[asyncio.Event, Callable[[], None]]:
    """An event set by the first SIGINT or SIGTERM (a second one ends the process at once: its
    running calls are then lost as if the machine had died, and their goals handle that), and
    what puts the previous handlers back."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            log.warning(f"device {state.name} stopped at once", running_calls=len(state.running))
            os._exit(130)
        if state.running:
            log.warning(
                "letting the running calls finish; Ctrl-C again to stop at once", running_calls=len(state.running)
            )
        stop.set()

    installed: list[signal.Signals] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, on_signal)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (a test runs the daemon in a task): its caller stops it

    def restore() -> None:
        for signum in installed:
            loop.remove_signal_handler(signum)

    return stop, restore
