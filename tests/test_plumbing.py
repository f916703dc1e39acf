"""perdure's own workflows (the watchdog's scheduled runs, the offers workflow) stay out of the
Temporal UI's default workflow list, which shows the user's goals; a query naming their
division lists them. On the session's dev server (Temporal 1.32): the default list is what the
server answers a query that does not name `TemporalNamespaceDivision`, as the UI's list does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta

import pytest
from temporalio.client import ScheduleActionStartWorkflow

from perdure.starters.client.start_checks import published_offers
from perdure.workers import plumbing, watchdog_schedule
from perdure.workflows.goal.contracts.goal_contracts import GOAL_WORKFLOW
from perdure.workflows.offers.worker_offers import WORKER_OFFERS_WORKFLOW
from perdure.workflows.watchdog.watchdog_contracts import WATCHDOG_WORKFLOW
from tests.builders import gate
from tests.helpers import running_worker, start

pytestmark = pytest.mark.slow  # waits for the schedule to fire


async def listed(env, query: str) -> list[tuple[str, str]]:
    return sorted([(wf.workflow_type or "", wf.id) async for wf in env.client.list_workflows(query)])


async def test_the_default_list_shows_the_goals_and_not_perdures_own_workflows(env, task_queue, store, workspace):
    sid = watchdog_schedule.schedule_id(task_queue)
    handles = []
    try:
        await watchdog_schedule.ensure_watchdog_schedule(env.client, timedelta(seconds=1), task_queue)
        async with running_worker(env, task_queue, store):
            handles = [await start(env, task_queue, workspace, [gate()]) for _ in range(2)]
            ours = f"{plumbing.PLUMBING_QUERY} AND TaskQueue = '{task_queue}'"
            deadline = time.monotonic() + 30
            while True:
                types = [t for t, _ in await listed(env, ours)]
                if types.count(WATCHDOG_WORKFLOW) >= 2 and WORKER_OFFERS_WORKFLOW in types:
                    break
                assert time.monotonic() < deadline, f"perdure's own workflows never ran: {types}"
                await asyncio.sleep(0.3)
            # The offers workflow works on an unversioned worker too (it takes its offer).
            assert [o.worker for o in await published_offers(env.client, task_queue)] == [env.client.identity]
            shown = await listed(env, f"TaskQueue = '{task_queue}'")
            assert shown == sorted((GOAL_WORKFLOW, h.id) for h in handles)
            count = await env.client.count_workflows(f"TaskQueue = '{task_queue}'")
            assert count.count == len(handles)
    finally:
        await env.client.get_schedule_handle(sid).delete()
        for handle in handles:
            await handle.terminate("test over")


async def test_a_schedule_made_before_is_updated_to_start_its_runs_hidden(env, task_queue):
    """An existing installation's schedule (its runs listed) is brought up to date by the next worker start."""
    sid = watchdog_schedule.schedule_id(task_queue)
    desired = watchdog_schedule.desired_schedule(task_queue, timedelta(hours=1))
    assert isinstance(desired.action, ScheduleActionStartWorkflow)
    before = dataclasses.replace(desired, action=dataclasses.replace(desired.action, typed_search_attributes=None))
    await env.client.create_schedule(sid, before)
    try:
        ensured = await watchdog_schedule.ensure_watchdog_schedule(env.client, timedelta(hours=1), task_queue)
        assert ensured.outcome == "updated" and "hidden from the default workflow list" in ensured.changes
        action = (await env.client.get_schedule_handle(sid).describe()).schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert action.typed_search_attributes.get(plumbing.DIVISION) == plumbing.PLUMBING
        again = await watchdog_schedule.ensure_watchdog_schedule(env.client, timedelta(hours=1), task_queue)
        assert again.outcome == "unchanged"
    finally:
        await env.client.get_schedule_handle(sid).delete()
