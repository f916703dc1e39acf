"""The checks a start makes against the workers before a goal exists, and what the workers
offer (`perdure profiles` prints it).

Owns reading what the workers of the goals' task queue offer: each worker publishes its
offer while it runs (workers/offer_publisher.py) into the memo of the offers workflow
(workflows/offers/worker_offers.py), and this module reads that memo and the task queue's pollers
from the server. Nothing is started and no worker has to answer, so a worker that was just
killed, or stopped a moment ago, costs the check nothing: its offer is still there, and
offers count only for workers the task queue lists as polling. The offer is the worker's,
so a profile in the worker's config.toml counts and one in a file on the CLI's machine does not.

`perdure start` refuses an unknown `--profile` or tool with the names the worker knows, payload
keys the worker cannot decrypt with, a plan step on a device that never announced itself
with the devices there are, and a workspace on a host (`HOST:NAME`) that no host offers, with
the hosts there are and their workspaces. Whatever else happens (no worker polls, none has
published, the offers cannot be decrypted here, the server is slow), it warns that the check
could not be made and starts the goal anyway: a goal waits durably for a worker, and starting one with no worker
up is a normal thing to do. A check never loses a start. Client-side only; holds no state.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from perdure.runtime import settings
from perdure.runtime.codec import KEY_ID_METADATA, is_encrypted, keyring_of
from perdure.starters.client.client_errors import NotOffered, NoWorkerAnswered, OffersUnreadable
from perdure.workflows.devices.device_contracts import DeviceListing, DeviceRecord, RegistryQueries, registry_id
from perdure.workflows.goal.contracts.goal_contracts import GoalSpec
from perdure.workflows.goal.contracts.plan import check_plan, devices_named
from perdure.workflows.offers.worker_offers import OFFERS_MEMO, CapabilitiesResult, PublishedOffer, worker_offers_id
from perdure.workflows.shared.host_workspaces import host_workspace, workspace_problem
from perdure.workflows.shared.mcp_tools import is_mcp_tool, server_of

# Each call to the server: a healthy one answers in milliseconds.
RPC_TIMEOUT = timedelta(seconds=5)
# A worker that polls but has not published yet has just started: it publishes within a second.
PUBLISH_WAIT_S = 3.0
# The devices are asked of the registry workflow by a query, which a worker must answer.
DEVICES_TIMEOUT_S = 5.0


async def poller_identities(client: Client, task_queue: str) -> set[str]:
    """The workers the server has seen poll this task queue for workflow tasks lately (a worker
    killed a moment ago is still among them for a few minutes)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    response = await client.workflow_service.describe_task_queue(request, timeout=RPC_TIMEOUT)
    return {poller.identity for poller in response.pollers}


async def has_pollers(client: Client, task_queue: str) -> bool:
    """Whether the server has seen a worker poll this task queue for workflow tasks lately."""
    return bool(await poller_identities(client, task_queue))


async def published_offers(client: Client, task_queue: str) -> list[PublishedOffer]:
    """Every offer published on `task_queue`, newest first: read from the server, no worker asked."""
    handle = client.get_workflow_handle(worker_offers_id(task_queue))
    try:
        desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return []
        raise
    raw = desc.raw_description.workflow_execution_info.memo.fields.get(OFFERS_MEMO)
    if raw is None:
        return []
    try:
        return await desc.memo_value(OFFERS_MEMO, type_hint=list[PublishedOffer])
    except Exception as err:  # noqa: BLE001 - a codec or converter error: say what it was
        if is_encrypted(raw):
            key = raw.metadata.get(KEY_ID_METADATA, b"").decode(errors="replace")
            raise OffersUnreadable(
                f"the workers' offers are encrypted with payload key '{key}', which this CLI cannot decrypt"
            ) from None
        raise OffersUnreadable(f"the workers' offers cannot be read here ({type(err).__name__}: {err})") from None


async def live_offers(client: Client) -> list[PublishedOffer]:
    """The offers of the workers polling the goals' task queue, newest first; `NoWorkerAnswered`
    when none polls or none of those has published (after waiting a moment for one just started)."""
    queue = settings.task_queue()
    pollers = await poller_identities(client, queue)
    if not pollers:
        raise NoWorkerAnswered(f"no worker polls task queue '{queue}'")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PUBLISH_WAIT_S
    while True:
        live = [o for o in await published_offers(client, queue) if o.worker in pollers]
        if live:
            return live
        if loop.time() >= deadline:
            raise NoWorkerAnswered(
                f"no worker polling task queue '{queue}' has published what it offers (an older perdure worker?)"
            )
        await asyncio.sleep(0.25)


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


def key_problem(offer: PublishedOffer, sends_with_key: str | None) -> str | None:
    """Why the worker could not decrypt a goal this client encrypts with `sends_with_key`, if it could not."""
    keys = offer.offer.payload_keys
    if sends_with_key is None or keys is None or sends_with_key in keys:
        return None
    has = f"only payload keys {', '.join(keys)}" if keys else "no payload keys"
    return (
        f"worker {offer.worker} on task queue '{settings.task_queue()}' could not decrypt the goal: this CLI "
        f"encrypts with payload key '{sends_with_key}' and the worker has {has}; give every worker and the CLI "
        "the same PERDURE_PAYLOAD_KEYS"
    )


NOT_CHECKED = "The goal is stored and waits for a worker (`perdure worker`)."


async def start_warnings(client: Client, spec: GoalSpec) -> list[str]:
    """What could not be checked (no worker's offer, the devices unread); NotOffered when
    the goal names a profile, tool or device the workers lack. Never raises anything else:
    the check is advice, and the start must not be lost to it."""
    try:
        live = await live_offers(client)
    except NoWorkerAnswered as err:
        return [f"{err}, so the profile and the tools were not checked. {NOT_CHECKED}"]
    except Exception as err:  # noqa: BLE001 - the server slow or away, offers unreadable: warn and start
        reason = err.message if isinstance(err, RPCError) else str(err) or type(err).__name__
        return [f"the profile and the tools were not checked ({reason}). {NOT_CHECKED}"]
    keyring = keyring_of(client.data_converter)
    # A worker that cannot decrypt the goal would fail it on its first task: one is enough to refuse.
    problems = [p for p in (key_problem(o, keyring.newest if keyring else None) for o in live) if p]
    found = {o.worker: start_problems(spec, o.offer) for o in live}
    # Judged by the newest offer, as the refusals below are worded.
    warnings = [offline] if (offline := offline_warning(spec, live[0].offer)) else []
    if all(found.values()):
        problems += found[live[0].worker]  # the newest offer's words
    else:
        # Some workers can run it: it may still land on one that cannot.
        warnings += [f"worker {worker}: {'; '.join(said)}" for worker, said in found.items() if said]
    if spec.plan is not None and devices_named(spec.plan):
        try:
            devices = await known_devices(client)
        except Exception as err:  # noqa: BLE001 - the goal checks its plan's devices itself; this only says it sooner
            warnings.append(f"the devices were not checked: {err or type(err).__name__}")
        else:
            problems += check_plan(spec.plan, spec.allowed_tools, devices)
    if (on_host := host_workspace(spec.workspace)) is not None:
        try:
            hosts = await known_hosts(client)
        except Exception as err:  # noqa: BLE001 - the goal fails a step whose host never announced itself anyway
            warnings.append(f"the workspace's host was not checked: {err or type(err).__name__}")
        else:
            if (problem := workspace_problem(on_host, hosts)) is not None:
                problems.append(f"workspace {on_host}: {problem}")
    if problems:
        raise NotOffered("the goal was not started: " + "; ".join(problems))
    return warnings


async def known_devices(client: Client) -> dict[str, list[str]]:
    """Device name -> the tools it offers, for every device that announced itself to the
    registry of the goals' task queue (none while there is no registry)."""
    return {record.presence.name: list(record.presence.tools) for record in await _registry_records(client)}


async def known_hosts(client: Client) -> dict[str, dict[str, str]]:
    """Host name -> its workspaces (name -> path there), for every host that announced itself,
    online or not (a goal on an offline host waits for it)."""
    return {
        r.presence.name: dict(r.presence.workspaces) for r in await _registry_records(client) if r.presence.workspaces
    }


async def _registry_records(client: Client) -> list[DeviceRecord]:
    handle = client.get_workflow_handle(registry_id(settings.task_queue()))
    try:
        query = handle.query(RegistryQueries.DEVICES, result_type=DeviceListing)
        listing = await asyncio.wait_for(query, DEVICES_TIMEOUT_S)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return []
        raise
    return listing.devices
