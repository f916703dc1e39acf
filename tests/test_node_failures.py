"""Whatever a node's work raises settles the node visibly: a local read that fails for
good (a workspace the worker does not have, a retryable error on every attempt) or a
bug in a runner ends the node failed with the message, the goal finishes, and
`perdure status` shows it; an SDK error about the workflow code itself fails the
workflow task instead (Temporal retries it), never a node.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from temporalio import activity, workflow
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer, Worker

from perdure.activities.goal.report import ReportActivities
from perdure.runtime.plugin import PerdurePlugin
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.nodes.llm import LlmNode
from perdure.workflows.shared.contracts import ToolInput, ToolResult
from tests.builders import STEP_REPLY, llm, openai_profile, spec
from tests.helpers import (
    local_activities,
    perdure_status,
    run_goal,
    running_worker,
    start,
    statuses,
    workflow_task_failures,
)

READ = {"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md"}}
# Needs the read: abandoned once it failed, so it never reaches a model.
USE = llm("use", ["read"])


@pytest.mark.slow
async def test_a_read_in_a_workspace_the_worker_lacks_fails_its_step_and_status_says_why(
    env, task_queue, store, tmp_path, scripted
):
    missing = tmp_path / "not-on-this-worker"
    goal_spec = spec(missing, plan={"steps": [READ, USE]}, allowed_tools=["read_file"], drift_every=0)
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle, result = await asyncio.wait_for(run_goal(env, task_queue, goal_spec), 30)
        snapshot = await handle.query(GoalWorkflow.progress)
        status = await perdure_status(env, handle.id)

    message = f"workspace '{missing}' does not exist (WorkspaceMissing)"
    assert result.outcome == "failed" and result.failed_steps == ["read", "use"]
    read, use = snapshot.nodes
    assert (read.status, read.error) == ("failed", message)
    assert (use.status, use.error) == ("abandoned", "needs 'read', which failed")
    [row] = [line for line in status.splitlines() if " read " in line]
    assert "failed" in row and message in row
    history = await handle.fetch_history()
    kinds = [kind for _, kind, _, _ in local_activities(history)]
    # It was a local read (the goal's memory then records the failure, also locally).
    assert kinds == [Activities.RUN_TOOL, Activities.MEMORY_RECORD]
    assert workflow_task_failures(history) == []
    await Replayer(workflows=[GoalWorkflow], plugins=[PerdurePlugin()]).replay_workflow(history)


@pytest.mark.slow
async def test_a_read_that_fails_on_every_attempt_fails_its_step_after_the_last(env, task_queue, store, workspace):
    attempts: list[int] = []

    # The tool activity is faked under its real name: a read whose disk errors on every
    # attempt, which a function says more plainly than a broken file system.
    @activity.defn(name=Activities.RUN_TOOL)
    async def run_tool(tool_input: ToolInput) -> ToolResult:
        attempts.append(activity.info().attempt)
        raise ApplicationError("disk read error", type="ReadFlaky")

    activities = [run_tool, ReportActivities(store).write_report]
    goal_spec = spec(workspace, plan={"steps": [READ, USE]}, allowed_tools=["read_file"], drift_every=0)
    async with Worker(env.client, task_queue=task_queue, workflows=[GoalWorkflow], activities=activities):
        handle, result = await asyncio.wait_for(run_goal(env, task_queue, goal_spec), 30)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert attempts == [1, 2, 3]  # the read's retry policy ran out
    assert result.outcome == "failed"  # no step succeeded
    assert [(n.name, n.status, n.error) for n in snapshot.nodes] == [
        ("read", "failed", "disk read error (ReadFlaky)"),
        ("use", "abandoned", "needs 'read', which failed"),
    ]
    assert workflow_task_failures(await handle.fetch_history()) == []


async def test_an_error_raised_by_a_node_runner_fails_that_node_with_the_message(
    env, task_queue, store, workspace, scripted, monkeypatch
):
    async def broken(self, step, node):
        if step.name == "broken":
            raise KeyError("no such input")
        return await original(self, step, node)

    original = LlmNode.run
    monkeypatch.setattr(LlmNode, "run", broken)
    steps = [llm("broken"), llm("after", ["broken"]), llm("independent")]
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(env, task_queue, workspace, steps)
        result = await asyncio.wait_for(handle.result(), 30)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert result.outcome == "partial"
    assert statuses(snapshot) == {"broken": "failed", "after": "abandoned", "independent": "succeeded"}
    assert snapshot.nodes[0].error == "KeyError: 'no such input'"


async def test_an_sdk_error_about_the_workflow_code_fails_the_workflow_task_not_the_node(
    env, task_queue, store, workspace, scripted, monkeypatch
):
    async def nondeterministic(self, step, node):
        raise workflow.NondeterminismError("the node's code did something it must not")

    monkeypatch.setattr(LlmNode, "run", nondeterministic)
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(env, task_queue, workspace, [llm("only")])
        failures = await workflow_task_failures_of(handle)
    await handle.terminate("test over")
    assert "the node's code did something it must not" in failures[0]


async def workflow_task_failures_of(handle: WorkflowHandle, timeout_s: float = 20) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        failures = workflow_task_failures(await handle.fetch_history())
        if failures:
            return failures
        await asyncio.sleep(0.2)
    raise AssertionError("no workflow task failed")
