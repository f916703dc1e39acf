"""Workers and devices: run an orchestrator worker (`worker`) or a device daemon
(`device`), list the devices (`devices`) and what the workers offer (`profiles`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from temporalio.service import RPCError

from perdure.runtime import settings
from perdure.runtime.connect import ServerUnavailable, connect
from perdure.starters.cli.terminal import UserError, console, err_console, fail, refuse, run
from perdure.starters.client import PerdureClient
from perdure.starters.client.client_errors import NoWorkerAnswered, OffersUnreadable
from perdure.workflows.devices.device_contracts import LEASE_S
from perdure.workflows.offers.worker_offers import PublishedOffer

app = typer.Typer()


@app.command()
def worker(
    build_id: Annotated[
        str | None,
        typer.Option("--build-id", help="This worker's version (default: a digest of perdure's own code)."),
    ] = None,
    no_promote: Annotated[
        bool,
        typer.Option("--no-promote", help="Do not make a new version current; `perdure deploy promote` does it."),
    ] = False,
    unversioned: Annotated[
        bool, typer.Option("--unversioned", help="Run outside Worker Deployments (goals are not pinned).")
    ] = False,
    tools: Annotated[
        list[str] | None,
        typer.Option(
            "--tools",
            metavar="MODULE",
            help="A Python module of your own tools (@perdure.tool) to load; repeatable. config.toml's "
            "tool_modules and the perdure.tools entry points of installed packages are loaded too.",
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            metavar="NAME",
            help="Also be host NAME: hold the --workspaces and run the workspace steps of the goals started "
            "with --workspace NAME:WORKSPACE (config.toml: [host] name).",
        ),
    ] = None,
    workspaces: Annotated[
        list[str] | None,
        typer.Option(
            "--workspaces",
            metavar="DIR",
            help="A workspace this host holds: DIR (named by its directory's name) or NAME=DIR; repeatable or "
            "comma-separated (config.toml: [host] workspaces).",
        ),
    ] = None,
    host_lease_s: Annotated[
        float | None,
        typer.Option(
            "--host-lease-s",
            help=f"Seconds without a heartbeat before the host counts as offline (default {LEASE_S:g}; "
            "config.toml: [host] lease_s).",
        ),
    ] = None,
) -> None:
    """Run an orchestrator worker (goal workflows, model and tool activities).

    It is a version of the Worker Deployment PERDURE_DEPLOYMENT (default
    "perdure"): goals stay on the version that started them and move to the
    current one at their next run boundary. A build that was never current
    becomes current once it polls.

    It reads PERDURE_TEMPORAL (server address; else TEMPORAL_ADDRESS or a
    Temporal profile), PERDURE_NAMESPACE, PERDURE_TASK_QUEUE, PERDURE_DEPLOYMENT,
    PERDURE_WORKFLOW_CACHE (goal runs kept in memory, default 1000),
    PERDURE_CONFIG (model profiles, default PERDURE_HOME/config.toml),
    PERDURE_HOME (its state, default ~/.perdure), PERDURE_ARTIFACT_STORE (default
    PERDURE_HOME/artifacts; s3://bucket/prefix with the AWS_* variables: AWS_ENDPOINT_URL,
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION), PERDURE_UI, PERDURE_PAYLOAD_KEYS
    or PERDURE_PAYLOAD_KEY_FILE (payload encryption), the model providers' keys
    the profiles name (e.g. OPENAI_API_KEY, ANTHROPIC_API_KEY) and the
    OpenTelemetry OTEL_* variables (traces and metrics; README, Observability).

    With --host it is also a host: it polls perdure-device-NAME too, announces the
    workspaces it holds, and goes offline like a device when it dies."""
    from perdure.activities.artifacts import checked_stores
    from perdure.activities.mcp.mcp_calls import McpServers
    from perdure.activities.mcp.mcp_config import load_mcp_servers
    from perdure.activities.tools.user.tool_modules import ToolLoadError, configured_modules, load_toolbox
    from perdure.workers.deployment import worker_version
    from perdure.workers.host import HostConfigError, beside_the_host, host_config, host_settings
    from perdure.workers.orchestrator import configure_logging, run_orchestrator

    if unversioned and (build_id is not None or no_promote):
        refuse(UserError("--unversioned takes no --build-id or --no-promote"))
    try:
        version = None if unversioned else worker_version(build_id)
    except ValueError as err:
        refuse(err)
    try:
        # Before anything connects: a tool that cannot be used is one line, and no worker starts.
        toolbox = load_toolbox([*configured_modules(), *(tools or [])])
    except ToolLoadError as err:
        refuse(err)
    try:
        hosting = host_settings(host, workspaces, host_lease_s)
        host_device = host_config(hosting, toolbox) if hosting is not None else None
    except HostConfigError as err:
        refuse(err)
    configure_logging()

    async def _worker() -> None:
        # config.toml's MCP servers are checked before anything connects: a table that
        # cannot be used is one line, and no worker starts.
        servers = McpServers(load_mcp_servers())
        # So are the artifact and payload stores: a bad setting, a missing bucket, refused credentials
        # or an endpoint that does not answer is one line (ObjectStoreUnavailable), and no worker starts.
        store = await asyncio.to_thread(checked_stores)
        client = await connect(worker=True)
        orchestrating = run_orchestrator(
            client, version=version, promote=not no_promote, mcp_servers=servers, user_tools=toolbox, store=store
        )
        if host_device is None:
            await orchestrating
        else:
            await beside_the_host(orchestrating, host_device)

    try:
        run(_worker)
    except KeyboardInterrupt:
        pass


@app.command()
def device(
    name: Annotated[str, typer.Option("--name", help="The device's name (lower-case letters, digits, '-').")],
    root: Annotated[Path, typer.Option("--root", help="The directory its tools work in; nothing outside it.")],
    tools: Annotated[
        str | None,
        typer.Option(
            "--tools",
            help="Tools it offers, comma-separated: device tools by name, and modules of your own tools "
            "declared devices=True (default: all device tools).",
        ),
    ] = None,
    network: Annotated[bool, typer.Option("--network", help="Let its shell commands use the network.")] = False,
    approve: Annotated[
        list[str] | None,
        typer.Option(
            "--approve",
            help="TOOL=RULE, when a call needs a person's approval: always, never or risk>=local-write "
            "(the default); TOOL may be *; repeatable.",
        ),
    ] = None,
    lease_s: Annotated[
        float, typer.Option("--lease-s", help="Seconds without a heartbeat before it counts as offline.")
    ] = LEASE_S,
    scratch: Annotated[
        Path | None,
        typer.Option("--scratch", help="Scratch directory (default PERDURE_HOME/devices/NAME/scratch)."),
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Take the name over from a daemon online with another root.")
    ] = False,
) -> None:
    """Run a device daemon: this machine runs goals' file, command and git steps inside --root.

    It connects out to Temporal as `perdure worker` does (PERDURE_TEMPORAL, a Temporal
    profile, PERDURE_NAMESPACE, PERDURE_TASK_QUEUE of the workers), keeps no goal state,
    and runs until Ctrl-C."""
    from perdure.activities.tools.user.tool_modules import ToolLoadError
    from perdure.workers.device import DeviceConfigError, device_config, device_tools, parse_approval, run_device
    from perdure.workers.orchestrator import configure_logging

    try:
        names, own = device_tools(tools)
        config = device_config(
            name=name,
            root=root,
            tools=names,
            user_tools=own,
            network=network,
            approval=parse_approval(approve or [], own.declarations),
            lease_s=lease_s,
            scratch=scratch,
            replace=replace,
        )
    except ToolLoadError as err:
        refuse(err)  # as `perdure worker` refuses the same module: exit 2
    except DeviceConfigError as err:
        fail(err)
    configure_logging()

    def online(config: Any, session: Any) -> None:
        console.print(
            f"device [bold]{config.name}[/bold] online · session {session.generation} · root {escape(str(config.root))}"
            f" · tools {', '.join(sorted(config.tools))}" + (" · network" if config.network else "")
        )

    async def _device() -> None:
        client = await connect(payload_store=False, worker=True)
        await run_device(
            client,
            name=config.name,
            root=config.root,
            tools=config.tools,
            network=config.network,
            approval=config.approval,
            lease_s=config.lease_s,
            scratch=config.scratch,
            replace=config.replace,
            task_queue=settings.task_queue(),
            on_online=online,
            user_tools=config.user_tools,
        )

    try:
        asyncio.run(_device())
    except KeyboardInterrupt:
        pass  # Ctrl-C before the daemon was online: nothing to stop
    except (settings.TemporalConfigError, DeviceConfigError, RuntimeError, ValueError, RPCError) as err:
        # RuntimeError: the server unreachable (ServerUnavailable), the registry refusing (DeviceRefused);
        # ValueError: payload keys or payload store settings that cannot be used.
        fail(err)


@app.command()
def devices(
    as_json: Annotated[bool, typer.Option("--json", help="Print the listing as JSON.")] = False,
) -> None:
    """List the devices: online or offline, since when, last seen, tools, running steps."""
    from perdure.starters import device_listing as listing

    async def _devices() -> None:
        view = await listing.device_views(await connect())
        if as_json:
            print(listing.devices_json(view))
        else:
            listing.print_devices(console, view)

    try:
        asyncio.run(_devices())
    except (ServerUnavailable, settings.TemporalConfigError, listing.RegistryUnanswered, ValueError, RPCError) as err:
        fail(err)


def _published(what: str) -> list[PublishedOffer]:
    """The offers of the workers on the task queue, newest first; the command ends when there is none."""

    async def _ask() -> list[PublishedOffer]:
        return await (await PerdureClient.connect()).offers()

    try:
        return asyncio.run(_ask())
    except (ServerUnavailable, settings.TemporalConfigError) as err:
        fail(err, 2)
    except NoWorkerAnswered as err:
        err_console.print(
            f"[red]error:[/red] {escape(str(err))}. {what} what a worker knows (its config.toml and "
            "environment): start one with `perdure worker`, then ask again."
        )
        raise typer.Exit(1) from None
    except (OffersUnreadable, RPCError) as err:
        fail(err)


def _say_published(live: list[PublishedOffer]) -> None:
    newest = live[0]
    console.print(f"as published by worker {newest.worker} at {newest.published_at:%Y-%m-%d %H:%M:%S} UTC")
    for other in live[1:]:
        if other.offer != newest.offer:
            said = f"worker {other.worker} offers something else; a goal may run on either"
            console.print(f"[yellow]warning:[/yellow] {escape(said)}")


@app.command()
def profiles() -> None:
    """List the model profiles and tools the workers on the task queue offer (as they published them)."""
    live = _published("Profiles are")
    offer = live[0].offer
    table = Table(title=f"model profiles of the worker on task queue '{settings.task_queue()}'")
    for column in ("profile", "provider", "model", "priced"):
        table.add_column(column)
    for p in offer.profiles:
        name = f"{p.name} (default)" if p.name == offer.default_profile else p.name
        table.add_row(name, p.provider, p.model, "yes" if p.priced else "free")
    console.print(table)
    console.print(f"default means: {offer.default_profile}")
    console.print(f"tools: {', '.join(offer.tools)}")
    if offer.mcp_servers:
        console.print(f"MCP servers (tools mcp__SERVER__TOOL): {', '.join(offer.mcp_servers)}")
    _say_published(live)
    if offer.config_problem:
        console.print(f"[yellow]warning:[/yellow] {escape(offer.config_problem)} (the last good profiles are in use)")


@app.command()
def tools(
    as_json: Annotated[bool, typer.Option("--json", help="Print the tools as JSON.")] = False,
) -> None:
    """List the tools the workers on the task queue offer, yours included, with risk and replay policy."""
    from perdure.starters.tool_listing import offered_tools, print_tools

    live = _published("Tools are")
    rows = offered_tools(live[0].offer)
    if as_json:
        print(json.dumps([row.model_dump(mode="json") for row in rows], indent=1))
        return
    print_tools(console, rows, live[0].offer.mcp_servers, settings.task_queue())
    _say_published(live)
