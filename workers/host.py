"""A host: the part of `perdure worker --host NAME --workspaces DIR…` that holds workspaces.

A host is a device (workers/device.py) that runs inside a worker process instead of as a
daemon of its own: it announces itself to the device registry with the workspaces it
holds (name -> path on this machine), holds its lease, and serves the workspace steps of
the goals bound to it (`--workspace HOST:NAME`) on the device queue `perdure-device-NAME`,
while the process's orchestrator serves the `perdure` queue like any worker's. So a host
that dies is offline like a device (its goals wait, say so, and a card offers another host
that holds the same workspace after a while), and its calls follow the device rules: one
attempt, a lost one re-run when replay-safe, sessions fencing stale results. Unlike a
device it asks no one before a write (it is one of the workers' machines: the goal's own
effect rules apply), its commands get the network when the goal allows it, and it offers
the user's tools declared `workspace=True` from the modules the worker loads.

Owns the host's settings (command line, or config.toml's `[host]` table) and their checks;
it must not decide anything about goals.
"""

from __future__ import annotations

import asyncio
import re
import tomllib
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from perdure.activities.tools.user.toolbox import Toolbox
from perdure.runtime import settings
from perdure.runtime.connect import connect
from perdure.workers.device import DeviceConfig, DeviceSession, serve_device
from perdure.workflows.devices.device_contracts import DEVICE_NAME, DEVICE_TOOLS, LEASE_S
from perdure.workflows.shared.host_workspaces import WORKSPACE_NAME

log = structlog.get_logger(__name__)

CONFIG_TABLE = "host"


class HostConfigError(ValueError):
    """A host setting the worker cannot start with; the message says which and what is allowed."""


@dataclass(frozen=True)
class HostSettings:
    name: str
    workspaces: dict[str, Path]
    """Name -> real path, in the order given."""
    lease_s: float = LEASE_S


def parse_workspaces(items: Iterable[str]) -> dict[str, Path]:
    """`--workspaces DIR` (repeatable, or comma-separated): each `DIR` (named by its own
    directory name) or `NAME=DIR`; every one an existing directory outside PERDURE_HOME (which
    commands never see), names and paths each given once."""
    found: dict[str, Path] = {}
    home = settings.perdure_home().expanduser().resolve()
    for item in (part.strip() for text in items for part in text.split(",")):
        if not item:
            continue
        name, sep, where = item.partition("=")
        path = Path(where if sep else item).expanduser()
        if not path.is_dir():
            what = "is not a directory" if path.exists() else "does not exist"
            raise HostConfigError(f"--workspaces {item}: {path} {what}")
        real = path.resolve()
        name = name.strip() if sep else real.name
        if not re.fullmatch(WORKSPACE_NAME, name):
            raise HostConfigError(
                f"--workspaces {item}: workspace name '{name}' is not allowed: letters, digits, '.', '_' and '-', "
                "starting with a letter or digit, at most 64 characters (name it with NAME=DIR)"
            )
        if name in found:
            raise HostConfigError(f"--workspaces: two workspaces are named '{name}'; name one with NAME=DIR")
        if real in found.values():
            raise HostConfigError(f"--workspaces: {real} is given twice")
        if real == home or home in real.parents:
            raise HostConfigError(
                f"--workspaces {item}: {real} lies in PERDURE_HOME ({home}), which commands never see"
            )
        found[name] = real
    if not found:
        raise HostConfigError("--host needs --workspaces DIR: the directories this host holds")
    return found


def host_settings(
    name: str | None, workspaces: Sequence[str] | None, lease_s: float | None, config: Path | None = None
) -> HostSettings | None:
    """The host this worker runs, from the command line, else config.toml's `[host]` table
    (`name`, `workspaces`, `lease_s`); None when neither names one."""
    table = _config_table(config or settings.config_path())
    name = name or table.get("name")
    if workspaces is None:
        workspaces = table.get("workspaces")
        if isinstance(workspaces, str):
            workspaces = [workspaces]
    if lease_s is None:
        lease_s = table.get("lease_s", LEASE_S)
    if name is None:
        if workspaces:
            raise HostConfigError("--workspaces needs --host NAME: the name goals reach this host by")
        return None
    if not isinstance(name, str) or not re.fullmatch(DEVICE_NAME, name):
        raise HostConfigError(
            f"host name '{name}' is not allowed: lower-case letters, digits and '-', starting with a letter or "
            "digit, at most 48 characters"
        )
    if not isinstance(workspaces, list) or not all(isinstance(w, str) for w in workspaces):
        raise HostConfigError("--host needs --workspaces DIR: the directories this host holds")
    if isinstance(lease_s, bool) or not isinstance(lease_s, int | float) or not 1 <= lease_s <= 600:
        raise HostConfigError(f"host lease {lease_s!r} is out of range: give 1 to 600 seconds")
    return HostSettings(name=name, workspaces=parse_workspaces(workspaces), lease_s=float(lease_s))


def _config_table(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise HostConfigError(f"cannot read [{CONFIG_TABLE}] from {path}: {err}") from None
    table = data.get(CONFIG_TABLE, {})
    if not isinstance(table, dict):
        raise HostConfigError(f"{path}: [{CONFIG_TABLE}] must be a table (name, workspaces, lease_s)")
    unknown = sorted(set(table) - {"name", "workspaces", "lease_s"})
    if unknown:
        raise HostConfigError(
            f"{path}: [{CONFIG_TABLE}] has unknown keys {', '.join(unknown)} (known: name, workspaces, lease_s)"
        )
    return table


def host_config(host: HostSettings, toolbox: Toolbox | None = None) -> DeviceConfig:
    """The host as the device it is: every device tool and the user's tools declared
    `workspace=True`, no approval asked (the goal's effect rules apply, as on any worker), the
    network as each goal allows, its scratch (and the workspace versions' fences and locks)
    in PERDURE_HOME/hosts/NAME."""
    toolbox = toolbox or Toolbox()
    own = Toolbox([d for d in toolbox.declarations.values() if d.workspace], toolbox.sources)
    scratch = settings.perdure_home().expanduser().resolve() / "hosts" / host.name
    try:
        scratch.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise HostConfigError(f"cannot use {scratch} for the host's scratch ({err.strerror or err})") from None
    return DeviceConfig(
        name=host.name,
        root=next(iter(host.workspaces.values())),
        tools=frozenset(DEVICE_TOOLS) | set(own.declarations),
        network=True,
        approval={"*": "never"},
        lease_s=host.lease_s,
        scratch=scratch,
        user_tools=own,
        workspaces=dict(host.workspaces),
    )


async def run_host(config: DeviceConfig, task_queue: str, stop: asyncio.Event) -> None:
    """Serve the host until `stop` is set (the worker stops) or a newer session of the same
    name takes over. Its own client keeps payloads inline, as a device's does: the workers
    it talks to may share no disk with it."""
    client = await connect(payload_store=False, worker=True)

    def online(config: DeviceConfig, session: DeviceSession) -> None:
        held = ", ".join(f"{name} ({path})" for name, path in config.workspaces.items())
        log.info(f"host {config.name} online · session {session.generation} · workspaces {held}")

    await serve_device(client, config, task_queue, stop, on_online=online)


async def beside_the_host(orchestrating: Coroutine[Any, Any, None], config: DeviceConfig) -> None:
    """Run the worker's orchestrator and its host together: the host stops (letting its
    running calls finish) when the orchestrator stops, and a host that cannot serve (its name
    taken by a host with other workspaces, the registry refusing it) stops the worker, saying why."""
    stop = asyncio.Event()
    worker = asyncio.create_task(orchestrating)
    hosting = asyncio.create_task(run_host(config, settings.task_queue(), stop))
    try:
        await asyncio.wait([worker, hosting], return_when=asyncio.FIRST_COMPLETED)
        if hosting.done() and not worker.done():
            hosting.result()  # the host failed: its error ends the worker
            log.warning(f"host {config.name} stopped; the worker goes on without it")
        await worker
    finally:
        stop.set()
        if not worker.done():
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        await asyncio.gather(hosting, return_exceptions=True)
