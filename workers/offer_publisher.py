"""A worker publishes what it offers while it runs: a worker plugin that signals the offers
workflow of its task queue (workflows/offers/worker_offers.py) when the worker starts and again
whenever the offer changes (a config.toml reloaded), so `perdure start` and `perdure
profiles` read it from the server with no worker answering them.

Signal-with-start: the first worker creates the offers workflow (hidden from the UI's default
list, workers/plumbing.py), later ones signal it. A publish that fails (the server away) is
tried again at the next check; it never stops the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog
from temporalio.client import Client
from temporalio.plugin import SimplePlugin
from temporalio.service import RPCError

from perdure.workers import plumbing
from perdure.workers.worker_capabilities import CapabilitiesActivities
from perdure.workflows.offers.worker_offers import (
    OFFER_SIGNAL,
    OfferAnnouncement,
    WorkerOffersInput,
    WorkerOffersWorkflow,
    worker_offers_id,
)

log = structlog.get_logger(__name__)

# How often the offer is computed again to see whether it changed: a stat of config.toml.
CHECK_EVERY_S = 0.5


def offer_publisher(client: Client, task_queue: str, identity: str, offers: CapabilitiesActivities) -> SimplePlugin:
    """A plugin for `Worker(plugins=[...])`: publishes `offers` under `identity` (the worker's,
    as the task queue lists its pollers) for as long as the worker runs."""

    @contextlib.asynccontextmanager
    async def publishing() -> AsyncIterator[None]:
        task = asyncio.create_task(publish_while_running(client, task_queue, identity, offers))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return SimplePlugin("perdure.offers", run_context=publishing)


async def publish_while_running(client: Client, task_queue: str, identity: str, offers: CapabilitiesActivities) -> None:
    published = None
    division = True
    said = None  # the last failure logged: a server away for a minute is said once, not 120 times
    while True:
        problem = None
        try:
            offer = offers.offer()
            if offer != published:
                await publish(client, task_queue, OfferAnnouncement(worker=identity, offer=offer), hidden=division)
                published = offer
                log.info("worker offer published", profiles=len(offer.profiles), tools=len(offer.tools))
        except RPCError as err:
            if division and plumbing.division_refused(err):
                log.warning("offers workflow listed in the UI: the server refuses its division", error=err.message)
                division = False
                continue
            problem = err.message
        except Exception as err:  # noqa: BLE001 - publishing is advice for the CLI: it never stops the worker
            problem = f"{type(err).__name__}: {err}"
        if problem is not None and problem != said:
            log.warning("worker offer not published; trying again", error=problem)
        said = problem
        await asyncio.sleep(CHECK_EVERY_S)


async def publish(client: Client, task_queue: str, announcement: OfferAnnouncement, hidden: bool = True) -> None:
    await client.start_workflow(
        WorkerOffersWorkflow.run,
        WorkerOffersInput(),
        id=worker_offers_id(task_queue),
        task_queue=task_queue,
        start_signal=OFFER_SIGNAL,
        start_signal_args=[announcement],
        search_attributes=plumbing.hidden() if hidden else None,
        static_summary=f"perdure · what the workers on {task_queue} offer (model profiles, tools)",
    )
