"""`perdure profiles`, and the checks `perdure start` makes against a worker before a goal exists.

Owns asking a worker what it offers: the `PerdureCapabilities` workflow (workers/capabilities.py)
started on the goals' task queue and awaited for a few seconds. A task queue with no poller
is answered at once without starting anything. The answer is the worker's, so a profile in
the worker's config.toml counts and one in a file on the CLI's machine does not.

`perdure start` refuses an unknown `--profile` or tool with the names the worker knows, and a plan
step on a device that never announced itself with the devices there are; with no
worker answering it warns that the check could not be made and starts the goal anyway, because a
goal waits durably for a worker and starting one with no worker up is a normal thing to do.
Client-side only; holds no state.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import typer
from rich.markup import escape
from rich.table import Table
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowQueryFailedError, WorkflowQueryRejectedError
from temporalio.service import RPCError, RPCStatusCode

from runtime import settings
from runtime.connect import ServerUnavailable, connect
from starters.consoles import cli_console
from workers.capabilities import CapabilitiesInput, CapabilitiesResult, CapabilitiesWorkflow
from workflows.contracts import GoalSpec
from workflows.device_contracts import DeviceListing, RegistryQueries, registry_id
from workflows.mcp_tools import is_mcp_tool, server_of
from workflows.plan import check_plan, devices_named

# How long to wait for a worker's answer; a healthy worker answers in well under a second.
ANSWER_TIMEOUT_S = 10.0

console = cli_console()
err_console = cli_console(stderr=True)


class NoWorkerAnswered(RuntimeError):
    """No worker polls the task queue, or none answered in time; the message says which."""


async def has_pollers(client: Client, task_queue: str) -> bool:
    """Whether the server has seen a worker poll this task queue for workflow tasks lately."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    response = await client.workflow_service.describe_task_queue(request)
    return bool(response.pollers)


async def ask_worker(client: Client, timeout_s: float = ANSWER_TIMEOUT_S) -> CapabilitiesResult:
    """What a worker on the goals' task queue offers; `NoWorkerAnswered` when none does."""
    queue = settings.task_queue()
    if not await has_pollers(client, queue):
        raise NoWorkerAnswered(f"no worker polls task queue '{queue}'")
    handle = await client.start_workflow(
        CapabilitiesWorkflow.run,
        CapabilitiesInput(),
        id=f"perdure-capabilities-{uuid.uuid4().hex[:12]}",
        task_queue=queue,
        # The server drops the question by itself when no worker takes it.
        execution_timeout=timedelta(seconds=timeout_s),
    )
    try:
        return await asyncio.wait_for(handle.result(), timeout_s)
    except TimeoutError:
        raise NoWorkerAnswered(f"no worker on task queue '{queue}' answered within {timeout_s:g} s") from None


def known_profiles(offer: CapabilitiesResult) -> str:
    names = sorted({*(p.name for p in offer.profiles), "default"})
    return ", ".join(f"default (= {offer.default_profile})" if n == "default" else n for n in names)


def start_problems(spec: GoalSpec, offer: CapabilitiesResult) -> list[str]:
    """What in a goal the worker cannot run: an unknown profile, tools it does not have."""
    queue = settings.task_queue()
    problems = []
    if spec.model_profile != "default" and spec.model_profile not in {p.name for p in offer.profiles}:
        problems.append(
            f"unknown model profile '{spec.model_profile}'; the worker on task queue '{queue}' knows: "
            f"{known_profiles(offer)}"
        )
    # An MCP tool is checked by the goal, which lists its server's tools; here only that
    # the worker names its server (listing every server would outlast the answer's wait).
    unknown = [
        t
        for t in spec.allowed_tools
        if t not in offer.tools and not (is_mcp_tool(t) and server_of(t) in offer.mcp_servers)
    ]
    if unknown:
        problems.append(
            f"unknown tool{'s' if len(unknown) > 1 else ''} {', '.join(repr(t) for t in unknown)}; "
            f"the worker on task queue '{queue}' offers: {', '.join(offer.tools)}"
            + (f" and the tools of MCP servers {', '.join(offer.mcp_servers)}" if offer.mcp_servers else "")
        )
    return problems


def offline_warning(spec: GoalSpec, offer: CapabilitiesResult) -> str | None:
    """Said before a goal's text goes to a scripted profile (the offline stand-in): only its
    script's own entries plan; the offline policy refuses to, so nothing would be done."""
    name = offer.default_profile if spec.model_profile == "default" else spec.model_profile
    profile = next((p for p in offer.profiles if p.name == name), None)
    if spec.plan is not None or profile is None or profile.provider != "scripted":
        return None
    return (
        f"model profile '{name}' is perdure's offline stand-in on this worker: unless its script plans this goal, "
        "no model will run and nothing will be done toward it. Set a model key where the worker runs and restart "
        "it, or start the goal with a plan file (--plan)."
    )


async def check_start(client: Client, spec: GoalSpec) -> None:
    """Refuse (ValueError) a goal naming a profile or tool the worker lacks; warn when no worker answers."""
    for warning in await start_warnings(client, spec):
        err_console.print(f"[yellow]warning:[/yellow] {escape(warning)}")


async def start_warnings(client: Client, spec: GoalSpec) -> list[str]:
    """What could not be checked (no worker answered, the devices unread); ValueError when
    the goal names a profile, tool or device the worker lacks."""
    try:
        offer = await ask_worker(client)
    except NoWorkerAnswered as err:
        return [
            f"{err}, so the profile and the tools were not checked. "
            "The goal is stored and waits for a worker (`perdure worker`)."
        ]
    warnings = [offline] if (offline := offline_warning(spec, offer)) else []
    problems = start_problems(spec, offer)
    if spec.plan is not None and devices_named(spec.plan):
        try:
            devices = await known_devices(client)
        except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError, TimeoutError) as err:
            # The goal checks its plan's devices itself; this check only says it sooner.
            warnings.append(f"the devices were not checked: {err}")
        else:
            problems += check_plan(spec.plan, spec.allowed_tools, devices)
    if problems:
        raise ValueError("the goal was not started: " + "; ".join(problems))
    return warnings


async def known_devices(client: Client) -> dict[str, list[str]]:
    """Device name -> the tools it offers, for every device that announced itself to the
    registry of the goals' task queue (none while there is no registry)."""
    handle = client.get_workflow_handle(registry_id(settings.task_queue()))
    try:
        listing = await asyncio.wait_for(handle.query(RegistryQueries.DEVICES, result_type=DeviceListing), 10)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return {}
        raise
    return {record.presence.name: list(record.presence.tools) for record in listing.devices}


def profiles() -> None:
    """List the model profiles and tools a running worker offers (asked of the worker)."""

    async def _ask() -> CapabilitiesResult:
        return await ask_worker(await connect())

    try:
        offer = asyncio.run(_ask())
    except (ServerUnavailable, settings.TemporalConfigError) as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(2) from None
    except NoWorkerAnswered as err:
        err_console.print(
            f"[red]error:[/red] {escape(str(err))}. Profiles are what a worker knows (its config.toml and "
            "environment): start one with `perdure worker`, then ask again."
        )
        raise typer.Exit(1) from None
    except RPCError as err:
        err_console.print(f"[red]error from Temporal:[/red] {err.message}")
        raise typer.Exit(1) from None
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
    if offer.config_problem:
        console.print(f"[yellow]warning:[/yellow] {escape(offer.config_problem)} (the last good profiles are in use)")
