"""The rules of workflows/goal/lost_workers.py that need no worker: which activity failures
are a dead worker's, which tool calls may run again as a new activity, and what a model
call scheduled again is allowed. The goal's behaviour is tests/test_worker_loss.py's."""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, RetryState, TimeoutError, TimeoutType

from workflows.contracts import ToolInput
from workflows.goal.lost_workers import last_attempt_lost
from workflows.goal.model_calls import model_options
from workflows.goal.tool_runner import runs_again_harmlessly
from workflows.retries import MODEL_OPTIONS, MODEL_RETRY
from workflows.tool_specs import TOOL_SPECS


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
