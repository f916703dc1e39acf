"""The rules of workflows/goal/lost_workers.py that need no worker: which activity failures
are a dead worker's, which tool calls may run again as a new activity, and what a model
call scheduled again is allowed. The goal's behaviour with real workers killed is tests/test_worker_loss.py's."""

from __future__ import annotations

import asyncio

import pytest
from temporalio import activity
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, TimeoutError, TimeoutType
from temporalio.worker import Worker

from perdure.activities.goal.report import ReportActivities
from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.workflows.goal.contracts.goal_contracts import Activities, Budget, GenerateInput, GenerateResult
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.lost_workers import last_attempt_lost
from perdure.workflows.goal.model_calls import model_options
from perdure.workflows.goal.rules.estimates import KIND_DEFAULTS
from perdure.workflows.goal.tool_runner import runs_again_harmlessly
from perdure.workflows.shared.contracts import ToolInput
from perdure.workflows.shared.retries import MODEL_OPTIONS, MODEL_RETRY
from tests.builders import llm, spec
from tests.helpers import run_goal


def failed(cause: BaseException, retry_state: RetryState = RetryState.MAXIMUM_ATTEMPTS_REACHED) -> ActivityError:
    error = ActivityError(
        "activity failed",
        scheduled_event_id=5,
        started_event_id=6,
        identity="w",
        activity_type="perdure.tool.run",
        activity_id="1",
        retry_state=retry_state,
    )
    error.__cause__ = cause
    return error


def timeout(kind: TimeoutType) -> TimeoutError:
    return TimeoutError("timed out", type=kind, last_heartbeat_details=[])


def test_only_a_last_attempt_that_timed_out_is_a_lost_worker():
    assert last_attempt_lost(failed(timeout(TimeoutType.HEARTBEAT)))
    assert last_attempt_lost(failed(timeout(TimeoutType.START_TO_CLOSE)))
    # The call's own failure, and a timeout that is not the attempt's.
    assert not last_attempt_lost(failed(ApplicationError("HTTP 503", type="EffectNotConfirmed")))
    assert not last_attempt_lost(failed(timeout(TimeoutType.SCHEDULE_TO_CLOSE)))
    # A non-retryable error or a cancellation did not run out of attempts.
    assert not last_attempt_lost(failed(timeout(TimeoutType.HEARTBEAT), RetryState.NON_RETRYABLE_FAILURE))
    assert not last_attempt_lost(failed(timeout(TimeoutType.HEARTBEAT), RetryState.CANCEL_REQUESTED))


def call(tool: str, **args) -> tuple[ToolInput, object]:
    return ToolInput(goal_id="g", node_key="k", tool=tool, workspace="/w", args=args), TOOL_SPECS.get(tool)


def test_a_call_runs_again_as_a_new_activity_only_when_that_is_harmless():
    assert runs_again_harmlessly(*call("send_email", to="a@example.com", subject="s", body="b"))  # keyed
    assert runs_again_harmlessly(*call("git_commit", message="m", paths=["a"]))  # check: looked up first
    assert runs_again_harmlessly(*call("http_get", url="https://example.com"))  # safe
    assert runs_again_harmlessly(*call("run_command", command="ls"))  # a read-only command
    # A new first attempt of a `once` tool would send it again; so would a command that writes.
    assert not runs_again_harmlessly(*call("notify_webhook", url="https://example.com/hook", payload={}))
    assert not runs_again_harmlessly(*call("run_command", command="make deploy"))
    assert not runs_again_harmlessly(*call("no_such_tool"))


def test_a_model_call_scheduled_again_keeps_the_attempts_its_own_failures_left():
    assert model_options(0)["retry_policy"].maximum_attempts == MODEL_RETRY.maximum_attempts
    assert model_options(2)["retry_policy"].maximum_attempts == MODEL_RETRY.maximum_attempts - 2
    assert model_options(99)["retry_policy"].maximum_attempts == 1
    # Everything else as every model call has it.
    assert model_options(2)["retry_policy"].non_retryable_error_types == MODEL_RETRY.non_retryable_error_types
    assert {k: v for k, v in model_options(2).items() if k != "retry_policy"} == {
        k: v for k, v in MODEL_OPTIONS.items() if k != "retry_policy"
    }


@pytest.mark.slow
async def test_a_call_whose_lost_attempts_the_budget_cannot_take_is_not_scheduled_again(
    env, task_queue, store, workspace
):
    """A model call whose every attempt times out (a worker that never answers, here one
    whose activity hangs without a heartbeat) is charged each lost attempt at its kind's P80;
    once one more attempt would not fit the budget, the step fails, and the gate log says why."""
    attempts: list[int] = []

    @activity.defn(name=Activities.GENERATE)
    async def generate(payload: GenerateInput) -> GenerateResult:
        attempts.append(activity.info().attempt)
        await asyncio.sleep(60)  # no heartbeat: the server judges the worker dead
        raise AssertionError("never reached")

    activities = [generate, ReportActivities(store).write_report]
    p80 = KIND_DEFAULTS["llm"].tokens_p80
    maximum = MODEL_RETRY.maximum_attempts
    # Room for the step and its first activity's lost attempts, not for one more.
    limit = Budget(max_tokens=maximum * p80 + p80 // 2)
    goal_spec = spec(workspace, plan={"steps": [llm("summary")]}, budget=limit, drift_every=0)
    async with Worker(env.client, task_queue=task_queue, workflows=[GoalWorkflow], activities=activities):
        handle, result = await asyncio.wait_for(run_goal(env, task_queue, goal_spec), 90)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert attempts == list(range(1, maximum + 1))  # one activity: not scheduled again
    assert result.outcome != "succeeded" and result.failed_steps == ["summary"]
    assert (result.lost_attempts, result.lost_by_step) == (maximum, {"summary": maximum})
    assert snapshot.failed_attempts == maximum and snapshot.tokens == maximum * p80  # each charged at the P80
    [entry] = [e for e in snapshot.gate_log if "lost to worker deaths" in e]
    assert f"{maximum} attempt(s) lost to worker deaths; not again: the budget cannot take one more attempt" in entry
