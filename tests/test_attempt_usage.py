"""Every attempt of a model call reaches the ledger, and the client waits as long as the
attempt does: goals on a real dev server against the scripted model server (which
counts the requests), the activities under ActivityEnvironment, and the workflow-side
reading of a failure's records."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, TimeoutError, TimeoutType
from temporalio.testing import ActivityEnvironment

from perdure.activities.models.model_activities import ModelActivities
from perdure.activities.models.profiles import ModelConfig
from perdure.workflows.goal.contracts.goal_contracts import GenerateInput, ModelContext
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.model_calls import attempts_of_failure, usage_of
from perdure.workflows.goal.rules.estimates import estimate_kind
from tests.builders import llm, openai_profile, spec
from tests.helpers import calls_for, perdure_status, run_goal, running_worker

# Waits on purpose (replies slower than a timeout, background calls polled): not in test-fast.
pytestmark = pytest.mark.slow

REPLY_TOKENS = {"input_tokens": 40, "output_tokens": 10}


def one_llm_step(workspace, **overrides):
    return spec(workspace, plan=Plan.model_validate({"steps": [llm("answer")]}), **overrides)


async def test_a_reply_slower_than_the_profiles_timeout_is_waited_for_and_sent_once(
    env, task_queue, store, workspace, scripted
):
    """timeout_s bounds only how long the provider may take to accept the request; the
    wait for the reply is the activity's attempt. Before, the client gave up at timeout_s
    and every retry sent (and paid for) the call again."""
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "slow answer", "delay_s": 2.5}]})
    profile = openai_profile(server).model_copy(update={"timeout_s": 1.0})
    async with running_worker(env, task_queue, store, profile):
        _, result = await run_goal(env, task_queue, one_llm_step(workspace))

    assert result.outcome == "succeeded", result.excerpt
    assert store.get_text(result.outputs["answer"]) == "slow answer"
    assert len(calls_for(server, "answer")) == 1


async def test_usage_in_a_failed_attempts_error_body_is_charged(env, task_queue, store, workspace, scripted):
    billed = {"prompt_tokens": 300, "completion_tokens": 200}
    server = scripted(
        {
            "replies": [
                {
                    "when": "PERDURE-STEP",
                    "times": 1,
                    "status": 500,
                    "body": {"error": {"message": "overloaded mid-reply", "type": "server_error"}, "usage": billed},
                },
                {"when": "PERDURE-STEP", "content": "second time lucky", "usage": REPLY_TOKENS},
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(env, task_queue, one_llm_step(workspace))
        snapshot = await handle.query(GoalWorkflow.progress)
        status = await perdure_status(env, handle.id)

    assert result.outcome == "succeeded", result.excerpt
    assert len(calls_for(server, "answer")) == 2
    assert snapshot.failed_attempts == 1 and snapshot.estimated_cost_usd == 0
    assert "1 failed model attempt(s) charged" in status and "estimated" not in status
    assert result.tokens == 300 + 200 + 40 + 10
    # openai_profile prices 1 USD / 2 USD per million input / output tokens
    assert result.cost_usd == pytest.approx((300 + 40) * 1e-6 + (200 + 10) * 2e-6)


async def test_a_failed_attempt_that_got_no_usage_costs_nothing(env, task_queue, store, workspace, scripted):
    """A refused request (429) is not billed: it is a failed attempt, charged zero, not an estimate."""
    server = scripted(
        {
            "replies": [
                {"when": "PERDURE-STEP", "times": 1, "status": 429},
                {"when": "PERDURE-STEP", "content": "answer", "usage": REPLY_TOKENS},
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        _, result = await run_goal(env, task_queue, one_llm_step(workspace))

    assert result.outcome == "succeeded", result.excerpt
    assert len(calls_for(server, "answer")) == 2
    assert result.tokens == 50


async def test_a_rejected_plan_and_its_repair_are_both_charged(env, task_queue, store, workspace, scripted):
    good = {"steps": [llm("answer")]}
    server = scripted(
        {
            "replies": [
                {
                    "when_last": "Your plan was rejected",
                    "json": good,
                    "usage": {"input_tokens": 70, "output_tokens": 30},
                },
                {
                    "when": "PERDURE-PLANNER",
                    "content": "a plan in prose",
                    "usage": {"input_tokens": 60, "output_tokens": 5},
                },
                {"when": "PERDURE-STEP", "content": "answer", "usage": REPLY_TOKENS},
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        _, result = await run_goal(env, task_queue, spec(workspace))

    assert result.outcome == "succeeded", result.excerpt
    planner = [r for r in server.requests() if r["json_mode"]]
    assert len(planner) == 2
    assert result.tokens == (60 + 5) + (70 + 30) + 50


# --- one attempt, under ActivityEnvironment ------------------------------------------


def activity_env(*, attempt: int = 1, start_to_close_s: float = 300, heartbeat_details=()) -> ActivityEnvironment:
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(
        environment.info,
        attempt=attempt,
        start_to_close_timeout=timedelta(seconds=start_to_close_s),
        heartbeat_details=list(heartbeat_details),
    )
    return environment


def generate_input() -> GenerateInput:
    return GenerateInput(context=ModelContext(profile="test", goal="g"), step="answer", prompt="Do answer.")


async def test_no_reply_within_the_attempt_is_not_retried_and_its_cost_is_unknown(scripted, store):
    """The client waits the attempt's start-to-close less the margin (here 6 s - 5 s); a
    reply that takes longer ends the call for good: the provider has the request, and a
    re-send would pay for it again."""
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "too late", "delay_s": 3}]})
    acts = ModelActivities(ModelConfig(profiles={"test": openai_profile(server)}), store)
    beats: list = []
    environment = activity_env(start_to_close_s=6)
    environment.on_heartbeat = lambda *details: beats.append(details)

    with pytest.raises(ApplicationError) as caught:
        await environment.run(acts.generate, generate_input())

    assert (caught.value.type, caught.value.non_retryable) == ("ModelReplyTimedOut", True)
    assert 'mode = "background"' in caught.value.message
    (record,) = caught.value.details[0]["failed_attempts"]
    assert (record["attempt"], record["known"]) == (1, False)
    assert beats[-1][0]["failed_attempts"] == [record]  # the next attempt would read it back
    assert len(server.requests()) == 1


async def test_an_attempt_after_one_that_died_reports_it_as_unknown(scripted, store):
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "answer", "usage": REPLY_TOKENS}]})
    acts = ModelActivities(ModelConfig(profiles={"test": openai_profile(server)}), store)
    # Attempt 1 failed with a 503 (recorded, nothing billed); attempt 2 died mid-call.
    refused = {"attempt": 1, "outcome": "ModelRetryable: HTTP 503", "known": True}
    died = {"attempt": 2, "status": "waiting for the reply", "failed_attempts": [refused]}

    result = await activity_env(attempt=3, heartbeat_details=[died]).run(acts.generate, generate_input())

    assert [(r.attempt, r.known) for r in result.failed_attempts] == [(1, True), (2, False)]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (40, 10)


async def test_heartbeats_say_what_the_call_is_for_and_how_long_it_waited(scripted, store):
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "answer", "delay_s": 1.0}]})
    acts = ModelActivities(ModelConfig(profiles={"test": openai_profile(server)}), store)
    beats: list = []
    environment = activity_env()
    environment.info = dataclasses.replace(environment.info, heartbeat_timeout=timedelta(seconds=0.6))
    environment.on_heartbeat = lambda *details: beats.append(details[0])

    await environment.run(acts.generate, generate_input())

    assert beats, "no heartbeat while the call waited"
    assert beats[-1]["for"] == "llm step answer" and beats[-1]["attempt"] == 1
    assert beats[-1]["doing"] == "waiting for model profile test" and beats[-1]["for_s"] >= 0
    assert beats[-1]["handle"] is None and beats[-1]["failed_attempts"] == []


# --- the workflow's reading of a failure -----------------------------------------------


def activity_error(cause: BaseException) -> ActivityError:
    error = ActivityError(
        "activity failed",
        scheduled_event_id=5,
        started_event_id=6,
        identity="w",
        activity_type="generate",
        activity_id="1",
        retry_state=RetryState.MAXIMUM_ATTEMPTS_REACHED,
    )
    error.__cause__ = cause
    return error


def test_a_last_attempt_that_died_is_charged_at_the_estimate_with_the_earlier_records():
    earlier = {"attempt": 1, "outcome": "HTTP 500", "known": True, "input_tokens": 7, "output_tokens": 3}
    timeout = TimeoutError(
        "heartbeat timeout",
        type=TimeoutType.HEARTBEAT,
        last_heartbeat_details=[{"attempt": 2, "failed_attempts": [earlier]}],
    )

    records = attempts_of_failure(activity_error(timeout))

    assert [(r.attempt, r.known) for r in records] == [(1, True), (2, False)]
    assert usage_of(records[0]).tokens == 10 and usage_of(records[1]) is None  # None: the P80, estimated
    assert estimate_kind(None, "llm").tokens_p80 > 0


def test_attempts_that_died_before_their_first_beat_are_counted_lost_up_to_the_policys_maximum():
    """An activity out of attempts made its policy's maximum: those after the last beat died
    before beating (a worker killed within a second of the attempt's start)."""
    earlier = {"attempt": 1, "outcome": "HTTP 500", "known": True}
    timeout = TimeoutError(
        "heartbeat timeout",
        type=TimeoutType.HEARTBEAT,
        last_heartbeat_details=[{"attempt": 2, "failed_attempts": [earlier]}],
    )

    records = attempts_of_failure(activity_error(timeout), attempts=6)

    assert [(r.attempt, r.lost) for r in records] == [(1, False)] + [(n, True) for n in range(2, 7)]
    # Goals recorded before counted up to the last beat's attempt.
    assert [r.attempt for r in attempts_of_failure(activity_error(timeout))] == [1, 2]


def test_a_lost_background_call_is_charged_once_however_many_attempts_polled_it():
    polled = {"attempt": 4, "handle": "resp_1", "handle_kind": "openai-response", "handle_attempt": 2}
    timeout = TimeoutError("heartbeat timeout", type=TimeoutType.HEARTBEAT, last_heartbeat_details=[polled])

    records = attempts_of_failure(activity_error(timeout))

    # attempt 1 left no record (died), attempt 2 created the call, 3 and 4 only polled it
    assert [(r.attempt, r.known) for r in records] == [(1, False), (2, False)]
    assert "resp_1" in records[1].outcome


def test_a_final_application_error_carries_every_attempts_record():
    records = [
        {"attempt": 1, "outcome": "HTTP 429", "known": True},
        {"attempt": 2, "outcome": "reply timed out", "known": False},
    ]
    final = ApplicationError("no reply", {"failed_attempts": records}, type="ModelReplyTimedOut", non_retryable=True)

    assert [(r.attempt, r.known) for r in attempts_of_failure(activity_error(final))] == [(1, True), (2, False)]


@pytest.mark.process
async def test_an_attempt_killed_mid_call_is_charged_at_the_kinds_estimate(crash_rig, scripted, tmp_path):
    """The killed attempt's request reached the provider, which bills it, but nobody saw
    its usage: it is charged at the llm kind's P80 (marked estimated in the ledger), then
    the retry's reported usage."""
    model = scripted(
        {
            "replies": [
                {"when": "MIDFLIGHT", "times": 1, "content": "never delivered", "delay_s": 30},
                {"when": "MIDFLIGHT", "content": "delivered", "usage": REPLY_TOKENS},
            ]
        }
    )
    rig = crash_rig(model=model)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    plan = Plan.model_validate({"steps": [llm("announce", prompt="MIDFLIGHT: announce it.")]})
    worker = rig.start_worker(fault="model_call:1+1.0")
    handle = await rig.start_goal(spec(workspace, goal="Announce", plan=plan))
    await rig.wait_killed(worker)
    await rig.after_kill(handle)
    rig.start_worker()
    result = await rig.result(handle)
    snapshot = await handle.query(GoalWorkflow.progress)

    assert result.outcome == "succeeded", result.excerpt
    assert len([r for r in model.requests() if "MIDFLIGHT" in r["last_message"]]) == 2
    estimate = estimate_kind(None, "llm")
    assert snapshot.failed_attempts == 1 and snapshot.estimated_cost_usd == pytest.approx(estimate.cost_p80)
    assert result.tokens == estimate.tokens_p80 + 50
    assert result.cost_usd == pytest.approx(estimate.cost_p80 + 40 * 1e-6 + 10 * 2e-6)
