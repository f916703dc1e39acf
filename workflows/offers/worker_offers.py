"""What the workers of a task queue offer, kept where a client reads it without a worker:
the `PerdureWorkerOffers` workflow (one per task queue, `perdure-workers` for the default
queue) and the models of an offer.

Why a long-lived workflow's memo: `perdure start` and `perdure profiles` must learn what a
worker offers (its model profiles, tools, MCP servers and payload keys) without starting a
workflow per question and without waiting for a worker, which may have just been killed.
Each worker signals its offer when it starts and again whenever it changes (its config.toml
reloaded); this workflow keeps the newest offer per worker and writes them into its memo,
which DescribeWorkflowExecution returns with no worker running. Which offers count is the
client's decision: those of the workers the task queue lists as polling
(starters/client/start_checks.py). The workflow is started hidden from the Temporal UI's default
list (workers/plumbing.py).

Workflow code. Continues as new with its state; never reads a clock or the disk.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field
from temporalio import workflow
from temporalio.common import VersioningBehavior

from perdure.workflows.shared.contracts import TASK_QUEUE
from perdure.workflows.shared.run_boundary import continue_as_new_due, continue_on_current_version
from perdure.workflows.shared.user_tools import UserTool

WORKER_OFFERS_WORKFLOW = "PerdureWorkerOffers"
OFFER_SIGNAL = "offer"
OFFERS_MEMO = "perdure_offers"
"""Memo key: the offers as a list of PublishedOffer, newest first."""

MAX_WORKERS = 16
"""Offers kept: a worker that stopped long ago is dropped as newer ones arrive."""
CONTINUE_AS_NEW_AFTER_EVENTS = 2_000
"""An offer costs about five events; workers start and change their config rarely."""


def worker_offers_id(task_queue: str = TASK_QUEUE) -> str:
    """The offers workflow of the workers polling `task_queue`: `perdure-workers` for the default queue."""
    return f"{task_queue}-workers"


class ProfileOffer(BaseModel):
    name: str
    provider: str
    model: str
    priced: bool = Field(description="Whether the profile has a non-zero price per token.")


class CapabilitiesResult(BaseModel):
    """What one worker offers. Names only: never a key, nor the variable that holds one."""

    profiles: list[ProfileOffer]
    default_profile: str = Field(description="The profile `default` means on this worker.")
    tools: list[str]
    user_tools: list[UserTool] = Field(
        default_factory=list,
        description="The user's own tools it loads (their names are in `tools` too), declared as data: "
        "risk, replay, schema (workflows/shared/user_tools.py).",
    )
    mcp_servers: list[str] = Field(
        default_factory=list, description="The MCP servers its config.toml names: their tools are mcp__SERVER__TOOL."
    )
    config_problem: str | None = Field(default=None, description="Why the worker's config file is not in use.")
    payload_keys: list[str] | None = Field(
        default=None,
        description="The ids of the payload keys the worker decrypts with (runtime/codec.py), the newest last; "
        "[] when it has none; None from a worker that does not say.",
    )


class OfferAnnouncement(BaseModel):
    """A worker's offer, as it signals it."""

    model_config = ConfigDict(extra="forbid")

    worker: str = Field(description="The worker's identity, as the task queue lists its pollers (pid@host).")
    offer: CapabilitiesResult


class PublishedOffer(BaseModel):
    worker: str
    published_at: datetime = Field(description="When this workflow took the offer (server time).")
    offer: CapabilitiesResult


class WorkerOffersState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    offers: list[PublishedOffer] = Field(default_factory=list, description="Newest first, one per worker.")


class WorkerOffersInput(BaseModel):
    state: WorkerOffersState | None = None


def take_offer(state: WorkerOffersState, announcement: OfferAnnouncement, now: datetime) -> None:
    """Keep `announcement` as its worker's offer, newest first, at most MAX_WORKERS."""
    others = [o for o in state.offers if o.worker != announcement.worker]
    fresh = PublishedOffer(worker=announcement.worker, published_at=now, offer=announcement.offer)
    state.offers = [fresh, *others][:MAX_WORKERS]


def offers_memo(state: WorkerOffersState) -> dict[str, list[dict]]:
    return {OFFERS_MEMO: [o.model_dump(mode="json") for o in state.offers]}


class _WorkerOffers:
    """The workflow's body; the two classes below differ only in their versioning behavior."""

    @workflow.init
    def __init__(self, input: WorkerOffersInput) -> None:
        self._state = input.state or WorkerOffersState()

    async def _run(self) -> None:
        await workflow.wait_condition(lambda: continue_as_new_due(CONTINUE_AS_NEW_AFTER_EVENTS))
        await workflow.wait_condition(workflow.all_handlers_finished)
        # The next run's memo is given here: a client reading between the runs sees the offers.
        continue_on_current_version(WorkerOffersInput(state=self._state), memo=offers_memo(self._state))

    @workflow.signal(name=OFFER_SIGNAL)
    def offer(self, announcement: OfferAnnouncement) -> None:
        """A worker's offer (an argument that is not an OfferAnnouncement is dropped by the SDK)."""
        take_offer(self._state, announcement, workflow.now())
        workflow.upsert_memo(offers_memo(self._state))


@workflow.defn(name=WORKER_OFFERS_WORKFLOW)
class WorkerOffersWorkflow(_WorkerOffers):
    """As unversioned workers run it (the server refuses a versioning behavior from them)."""

    @workflow.run
    async def run(self, input: WorkerOffersInput) -> None:
        del input
        await self._run()


@workflow.defn(name=WORKER_OFFERS_WORKFLOW, versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class VersionedWorkerOffersWorkflow(_WorkerOffers):
    """As Worker Deployment versions run it (workers/orchestrator.py registers this one for
    them): always on the current version. Pinned, like every other workflow of theirs, a run
    would take no new build's offer once the old build's workers stopped."""

    @workflow.run
    async def run(self, input: WorkerOffersInput) -> None:
        del input
        await self._run()
