"""The quota service's concurrency places (workflows/quota/quota_workflow.py), asked as activities ask it:
by update-with-start, keyed by the caller, released by signal."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from perdure.runtime.plugin import PerdurePlugin
from perdure.workflows.quota.quota_workflow import (
    QUOTA_WORKFLOW,
    RELEASE_SIGNAL,
    RESERVE_UPDATE,
    QuotaLimits,
    QuotaRequest,
    QuotaSlot,
    QuotaState,
    QuotaWorkflow,
)

ONE_PLACE = QuotaLimits(concurrency=1, hold_s=3)


async def ask(
    client: Client, workflow_id: str, task_queue: str, key: str, limits: QuotaLimits, tokens: int = 0
) -> QuotaSlot:
    start = WithStartWorkflowOperation(
        QUOTA_WORKFLOW,
        QuotaState(resource="r"),
        id=workflow_id,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    request = QuotaRequest(key=key, limits=limits, tokens=tokens)
    return await client.execute_update_with_start_workflow(
        RESERVE_UPDATE, request, start_workflow_operation=start, result_type=QuotaSlot
    )


def service(env, sandboxed: bool = True) -> tuple[Worker, str, str]:
    task_queue = f"tq-qs-{uuid.uuid4().hex[:8]}"
    client = Client(**{**env.client.config(), "plugins": [PerdurePlugin()]})
    runner = {} if sandboxed else {"workflow_runner": UnsandboxedWorkflowRunner()}
    worker = Worker(client, task_queue=task_queue, workflows=[QuotaWorkflow], **runner)
    return worker, f"quota-{task_queue}", task_queue


async def test_a_place_goes_to_the_first_caller_waiting_when_the_holder_releases_it(env) -> None:
    worker, wid, tq = service(env)
    async with worker:
        first = await ask(env.client, wid, tq, "a", ONE_PLACE)
        second = await ask(env.client, wid, tq, "b", ONE_PLACE)
        third = await ask(env.client, wid, tq, "c", ONE_PLACE)
        assert not first.queued
        assert (second.queued, second.ahead, second.in_flight) == (True, 0, 1)
        assert (third.queued, third.ahead) == (True, 1)
        # Asking again with the held key gets the same slot, not a second place.
        assert (await ask(env.client, wid, tq, "a", ONE_PLACE)).at == first.at

        await env.client.get_workflow_handle(wid).signal(RELEASE_SIGNAL, "a")
        # c asks before b comes back: the freed place is still b's, who waited longer.
        assert (await ask(env.client, wid, tq, "c", ONE_PLACE)).queued
        assert not (await ask(env.client, wid, tq, "b", ONE_PLACE)).queued


@pytest.mark.slow
async def test_a_place_whose_release_never_comes_lapses_after_hold_s(env) -> None:
    """The holder's worker died mid-call: its place is free again once hold_s has passed."""
    worker, wid, tq = service(env)
    async with worker:
        assert not (await ask(env.client, wid, tq, "dead", ONE_PLACE)).queued
        assert (await ask(env.client, wid, tq, "next", ONE_PLACE)).queued
        await asyncio.sleep(ONE_PLACE.hold_s + 0.5)
        assert not (await ask(env.client, wid, tq, "next", ONE_PLACE)).queued


@pytest.mark.slow
async def test_a_caller_that_stopped_asking_loses_its_place_in_the_line(env, monkeypatch) -> None:
    from perdure.workflows.quota import quota_workflow as quota

    # Unsandboxed, so the shortened time reaches the workflow code (the sandbox imports its own copy).
    monkeypatch.setattr(quota, "WAITING_FORGOTTEN", quota.timedelta(seconds=1))
    worker, wid, tq = service(env, sandboxed=False)
    async with worker:
        await ask(env.client, wid, tq, "holder", ONE_PLACE)
        assert (await ask(env.client, wid, tq, "gone", ONE_PLACE)).ahead == 0
        await asyncio.sleep(1.5)
        assert (await ask(env.client, wid, tq, "later", ONE_PLACE)).ahead == 0


async def test_a_tokens_per_minute_quota_spaces_calls_by_the_tokens_they_may_use(env) -> None:
    """6,000 tokens a minute: a call of 1,000 estimated tokens holds the line for 10 s (times
    the spacing margin), whatever the requests-per-minute allow."""
    limits = QuotaLimits(tokens_per_minute=6_000, spacing=1.0)
    worker, wid, tq = service(env)
    async with worker:
        first = await ask(env.client, wid, tq, "a", limits, tokens=1_000)
        second = await ask(env.client, wid, tq, "b", limits, tokens=250)
        third = await ask(env.client, wid, tq, "c", limits, tokens=0)
    assert (second.at - first.at).total_seconds() == pytest.approx(10, abs=0.5)
    assert (third.at - second.at).total_seconds() == pytest.approx(2.5, abs=0.5)
