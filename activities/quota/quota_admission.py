"""A model call's admission by its resource's quota (the activity side of workflows/quota/quota_workflow.py).

Before a model activity sends a request whose profile draws on a declared quota
(config.toml `[quotas.NAME]`, the profile's `quota` or its own name), it reserves a
slot from that resource's QuotaWorkflow (an update, starting the workflow when there
is none). A slot due now (within `ADMIT_WITHIN`) is taken at once; a later one ends
the attempt with `QuotaWait`, non-retryable, carrying the slot's time and key: the
goal shows it, sleeps on a durable timer until it (a worker restart changes nothing:
the timer and the slot are both in history) and runs the call again with the key,
which gets the same slot back. Waiting in the workflow rather than in the activity
keeps the wait out of the call's attempts, its timeouts and its heartbeats. A call that
comes back too late for its slot (a loaded worker) takes the next free one and waits for
it here, up to `RETAKE_WITHIN`, so lateness costs one slot, never a second trip.

Needs a Temporal client (the worker's); in the SDK's ActivityEnvironment without one,
or for a profile without a quota, admission is a no-op.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from temporalio import activity
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from perdure.activities.models.profiles import ModelConfig, ModelProfile
from perdure.workflows.goal.contracts.goal_contracts import ModelContext
from perdure.workflows.quota.quota_workflow import (
    QUOTA_WAIT,
    QUOTA_WORKFLOW,
    RELEASE_SIGNAL,
    RESERVE_UPDATE,
    QuotaLimits,
    QuotaRequest,
    QuotaSlot,
    QuotaState,
    quota_workflow_id,
)

# A slot this close is waited for in the activity: a durable timer costs more than it, and
# the goal's call comes back this early (workflows/goal/model_calls.py SLOT_LEAD).
ADMIT_WITHIN = timedelta(seconds=3)
# How long after its slot a call may still be sent on it. Spaced slots leave the limit a
# margin (QuotaLimits.spacing, 3 %: 1.8 s of a 60 s window); a call this late stays inside it.
LATE = timedelta(seconds=0.25)
# A call that lost its slot (back too late) waits for its new one here, up to this long,
# instead of through the goal again: a second trip could come back late as well, and each
# lost slot lengthens everyone's line (the cascade a loaded test run showed).
RETAKE_WITHIN = timedelta(seconds=30)
RETAKES = 3
# An HTTP request waits this long for its host's slot, in its activity.
HOST_WAIT_WITHIN = timedelta(seconds=60)
# One reservation in flight per resource and worker process: the server holds few updates
# in flight per workflow (10 on the dev server) and refuses the rest, which a burst of
# goals starting at once would meet. A reservation takes milliseconds.
_asking: dict[tuple[int, str], asyncio.Lock] = {}


class QuotaWaitError(Exception):
    """The call's slot is later than ADMIT_WITHIN: the goal waits for it (see `application_error`)."""

    def __init__(self, slot: QuotaSlot, key: str) -> None:
        super().__init__(f"waiting for quota {slot.resource}")
        self.slot, self.key = slot, key

    def application_error(self, failed_attempts: list[dict[str, Any]]) -> ApplicationError:
        return ApplicationError(
            str(self),
            {
                "quota": self.slot.resource,
                "at": self.slot.at.isoformat(),
                "key": self.key,
                "ahead": self.slot.ahead,
                "failed_attempts": failed_attempts,
            },
            type=QUOTA_WAIT,
            non_retryable=True,
            # An expected outcome, not a failure: the worker logs no traceback for it.
            category=ApplicationErrorCategory.BENIGN,
        )


def estimated_tokens(profile: ModelProfile, prompt_chars: int) -> int:
    """What a call may use of a tokens-per-minute quota: its prompt (chars / 4) and its longest reply."""
    return prompt_chars // 4 + profile.max_output_tokens


@asynccontextmanager
async def admitted(
    config: ModelConfig,
    profile: ModelProfile,
    context: ModelContext,
    prompt_chars: int,
    on_wait: Callable[[str], None] | None = None,
) -> AsyncIterator[None]:
    """Enter once the model call may be sent, holding its slot (and its concurrency place,
    when the resource limits concurrency, released as the block ends however it ends); raise
    QuotaWaitError when its slot is later, which keeps slot and place for the key's return.
    `on_wait` is told what a call waiting for a concurrency place waits for."""
    resource = profile.quota or profile.name
    info = activity.info()
    # The goal's call coming back at its slot asks with the slot's key; a retry is a new request.
    key = context.quota_key if context.quota_key and info.attempt == 1 else None
    tokens = estimated_tokens(profile, prompt_chars)
    async with _admission(config.quotas.get(resource), resource, key, tokens, on_wait, in_activity=False):
        yield


@asynccontextmanager
async def host_admitted(quotas: dict[str, QuotaLimits], url: str) -> AsyncIterator[None]:
    """An HTTP request to a host with a declared quota (`[quotas."HOST"]`), admitted the same
    way, waiting for its slot in the activity (a read has no goal-side wait): a slot further
    than HOST_WAIT_WITHIN away is refused with QuotaTooFar, which the tool reports."""
    host = urlsplit(url).hostname or ""
    async with _admission(quotas.get(host), host, None, 0, None, in_activity=True):
        yield


class QuotaTooFar(Exception):
    """A request's slot is further away than its activity may wait."""


@asynccontextmanager
async def _admission(
    limits: QuotaLimits | None,
    resource: str,
    key: str | None,
    tokens: int,
    on_wait: Callable[[str], None] | None,
    in_activity: bool,
) -> AsyncIterator[None]:
    try:
        client = activity.client() if limits is not None else None
    except RuntimeError:
        client = None
    if limits is None or client is None:
        yield
        return
    info = activity.info()
    key = key or f"{info.workflow_id}/{info.activity_id}/{info.attempt}"
    ask = _Asker(client, resource, limits, tokens, info.task_queue)
    for _ in range(RETAKES + 1):
        slot = await ask(key)
        while slot.queued:
            if on_wait is not None:
                on_wait(f"waiting for quota {resource} ({slot.in_flight} calls in flight, {slot.ahead} ahead)")
            await asyncio.sleep(max((slot.at - datetime.now(UTC)).total_seconds(), 0.0))
            slot = await ask(key)
        wait = (slot.at - datetime.now(UTC)).total_seconds()
        # A slot already past (the service's first start, a goal's timer that fired late on a
        # busy worker) is stale: sent now, it would crowd the calls a minute behind it. Take
        # the next one instead, under a key of its own (the service frees the old key's place).
        if wait > -LATE.total_seconds():
            break
        key += "/late"
    if in_activity:
        if wait > HOST_WAIT_WITHIN.total_seconds():
            if limits.concurrency:
                await ask.release(key)  # nothing goes to the goal to come back for it
            raise QuotaTooFar(
                f"quota {resource}: the next slot is {wait:.0f} s away (at {slot.at:%H:%M:%S} UTC), longer than "
                f"a read waits ({HOST_WAIT_WITHIN.total_seconds():.0f} s); try again later"
            )
    elif wait > (RETAKE_WITHIN if key.endswith("/late") else ADMIT_WITHIN).total_seconds():
        raise QuotaWaitError(slot, key)
    try:
        if wait > 0:
            await asyncio.sleep(wait)
        yield
    finally:
        if limits.concurrency:
            await ask.release(key)


class _Asker:
    """Reservations of one call at one resource's QuotaWorkflow (started when there is none)."""

    def __init__(self, client: Client, resource: str, limits: QuotaLimits, tokens: int, task_queue: str) -> None:
        self.client, self.resource, self.limits, self.tokens = client, resource, limits, tokens
        self.task_queue = task_queue
        self.workflow_id = quota_workflow_id(resource, task_queue)

    async def __call__(self, key: str) -> QuotaSlot:
        request = QuotaRequest(key=key, limits=self.limits, tokens=self.tokens)
        # One operation per update: the SDK refuses to reuse one.
        start = WithStartWorkflowOperation(
            QUOTA_WORKFLOW,
            QuotaState(resource=self.resource),
            id=self.workflow_id,
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        async with _asking.setdefault((id(asyncio.get_running_loop()), self.resource), asyncio.Lock()):
            request.asked_at = datetime.now(UTC)
            return await self.client.execute_update_with_start_workflow(
                RESERVE_UPDATE, request, start_workflow_operation=start, result_type=QuotaSlot
            )

    async def release(self, key: str) -> None:
        """Free the call's concurrency place; if the service cannot be told, the lease lapses."""
        try:
            await self.client.get_workflow_handle(self.workflow_id).signal(RELEASE_SIGNAL, key)
        except Exception as err:  # noqa: BLE001 - the place lapses after hold_s instead
            activity.logger.warning("quota place not released", extra={"quota": self.resource, "error": str(err)[:200]})
