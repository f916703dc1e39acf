"""A goal's runs are bounded by what a worker taking it over must replay inside one
workflow task (workflows/shared/run_boundary.py): a run ends once more steps settled in it than
its task timeout is sized for (or than `continue_as_new_after_nodes`), and a run whose
plan outgrew its workflow task timeout ends so the next one starts with a longer timeout."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowHandle

from perdure.workflows.goal.contracts.goal_contracts import GoalSpec
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared.run_boundary import (
    TASK_TIMEOUT_CEILING,
    TASK_TIMEOUT_FLOOR,
    goal_task_timeout,
    steps_per_run,
)
from tests.builders import spec
from tests.helpers import local_activities, new_goal_id, run_goal, run_ids, running_worker


def read_chain(workspace: Path, count: int) -> list[dict]:
    (workspace / "page.md").write_text("a page\n")
    steps = []
    for i in range(count):
        step = {"name": f"r{i:04d}", "kind": "tool", "tool": "read_file", "args": {"path": "page.md"}}
        if i:
            step["needs"] = [f"r{i - 1:04d}"]
        steps.append(step)
    return steps


async def task_timeouts(handle: WorkflowHandle) -> list[timedelta]:
    """Each run's workflow task timeout, first run first."""
    timeouts = []
    for run_id in await run_ids(handle):
        history = await handle._client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        timeouts.append(started.workflow_task_timeout.ToTimedelta())
    return timeouts


def test_a_goal_task_timeout_is_two_seconds_for_small_plans_and_grows_with_large_ones():
    assert goal_task_timeout(0) == goal_task_timeout(666) == TASK_TIMEOUT_FLOOR == timedelta(seconds=2)
    assert goal_task_timeout(1_000) == timedelta(seconds=3)
    assert goal_task_timeout(10_000) == timedelta(seconds=30)
    assert goal_task_timeout(1_000_000) == TASK_TIMEOUT_CEILING
    steps = [{"name": f"s{i}", "kind": "tool", "tool": "read_file", "args": {"path": "x"}} for i in range(1_000)]
    assert GoalSpec(goal="read", workspace="/w", plan={"steps": steps}).task_timeout() == timedelta(seconds=3)
    assert GoalSpec(goal="plan it", workspace="/w").task_timeout() == TASK_TIMEOUT_FLOOR


def test_a_run_settles_as_many_steps_as_its_task_timeout_is_sized_for():
    assert steps_per_run(TASK_TIMEOUT_FLOOR) == 666
    assert steps_per_run(goal_task_timeout(10_000)) == 10_000  # a plan settled once ends in its run
    assert steps_per_run(timedelta(seconds=10)) == 3_333  # the server's default task timeout


@pytest.mark.slow
async def test_a_run_continues_as_new_once_continue_as_new_after_nodes_steps_settled_in_it(
    env, task_queue, store, workspace
):
    """25 reads of one chain read ahead in one batch would settle in one run (one event per
    batch); with at most 10 steps per run (11 settle before the run ends) they take three runs."""
    goal = spec(workspace, plan={"steps": read_chain(workspace, 25)}, drift_every=0, continue_as_new_after_nodes=10)
    async with running_worker(env, task_queue, store):
        handle, result = await run_goal(env, task_queue, goal, as_started=True)
    assert result.outcome == "succeeded", result.excerpt
    assert len(result.outputs) == 25
    timeouts = await task_timeouts(handle)
    assert len(timeouts) >= 3, timeouts
    assert set(timeouts) == {timedelta(seconds=2)}


@pytest.mark.slow
async def test_a_run_whose_plan_outgrew_its_task_timeout_continues_as_new_with_a_longer_one(
    env, task_queue, store, workspace
):
    """A plan of 700 steps needs 2.1 s; a run started with 2 s (as a goal is before its
    planner answers) ends before its first step, and the next run has the longer timeout."""
    goal = spec(workspace, plan={"steps": read_chain(workspace, 700)}, drift_every=0)
    async with running_worker(env, task_queue, store):
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=goal),
            id=new_goal_id(),
            task_queue=task_queue,
            task_timeout=timedelta(seconds=2),
        )
        result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt
    timeouts = await task_timeouts(handle)
    assert timeouts == [timedelta(seconds=2), timedelta(milliseconds=2_100)], timeouts
    first = await env.client.get_workflow_handle(handle.id, run_id=(await run_ids(handle))[0]).fetch_history()
    assert local_activities(first) == []  # no step ran in the run whose timeout was too short
