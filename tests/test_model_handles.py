"""Long model calls by handle: an OpenAI background response or an Anthropic Message Batch is
created once, its id beaten before the first poll, polled until it ends and cancelled when
the activity is; a worker killed while it waits is followed by one that polls the same
call. Against the scripted server, which counts creates, polls and cancels."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from perdure.activities.models.model_activities import ModelActivities
from perdure.activities.models.profiles import ModelConfig, ModelProfile
from perdure.activities.models.providers import BATCH_HANDLE, RESPONSE_HANDLE
from perdure.workflows.goal.contracts.goal_contracts import AgentTurnInput, GenerateInput, ModelContext
from perdure.workflows.goal.contracts.messages import Abort
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import agent, anthropic_profile, llm, openai_profile, spec
from tests.helpers import goal_result, run_goal, running_worker, submit, wait_until

# Waits on purpose (replies slower than a timeout, background calls polled): not in test-fast.
pytestmark = pytest.mark.slow

USAGE = {"input_tokens": 120, "output_tokens": 80}


def background(profile: ModelProfile, **extra) -> ModelProfile:
    return profile.model_copy(update={"mode": "background", "poll_interval_s": 0.1, **extra})


def generate_input(profile: str = "test") -> GenerateInput:
    return GenerateInput(context=ModelContext(profile=profile, goal="g"), step="answer", prompt="Do answer.")


def recording_env(beats: list | None = None, **info) -> ActivityEnvironment:
    """An activity environment whose attempt has a real start-to-close (the default's is 1 s)."""
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(
        environment.info, **({"start_to_close_timeout": timedelta(minutes=5)} | info)
    )
    if beats is not None:
        environment.on_heartbeat = lambda *details: beats.append(details[0])
    return environment


@pytest.mark.parametrize("flavour", ["openai", "anthropic"])
async def test_a_background_call_is_created_once_and_polled_to_its_end(scripted, store, flavour):
    server = scripted(
        {"replies": [{"when": "PERDURE-STEP", "content": "long answer", "in_progress_polls": 3, "usage": USAGE}]}
    )
    make = openai_profile if flavour == "openai" else anthropic_profile
    acts = ModelActivities(ModelConfig(profiles={"test": background(make(server))}), store)
    beats: list = []

    result = await recording_env(beats).run(acts.generate, generate_input())

    assert store.get_text(result.output) == "long answer"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (120, 80)
    assert result.failed_attempts == []
    events = server.handle_events()
    assert [e["action"] for e in events].count("create") == 1
    assert [e["action"] for e in events].count("poll") >= 3
    assert len(server.requests()) == 1  # the create is the one model request
    handle = events[0]["handle"]
    # The handle was beaten with the first beat, before any poll.
    kind = RESPONSE_HANDLE if flavour == "openai" else BATCH_HANDLE
    assert (beats[0]["handle"], beats[0]["handle_kind"], beats[0]["handle_attempt"]) == (handle, kind, 1)
    assert beats[0]["for"] == "llm step answer"


async def test_agent_turn_tool_calls_come_back_from_a_background_response(scripted, store):
    server = scripted(
        {
            "replies": [
                {"when_last": "README CONTENT", "content": "It says hello.", "in_progress_polls": 1},
                {"when": "PERDURE-AGENT", "tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]},
            ]
        }
    )
    acts = ModelActivities(ModelConfig(profiles={"test": background(openai_profile(server))}), store)
    turn = AgentTurnInput(
        context=ModelContext(profile="test", goal="g"),
        step="explore",
        prompt="What does the README say?",
        tools=["read_file"],
        turn=1,
        max_turns=3,
    )

    first = await recording_env().run(acts.agent_turn, turn)

    assert [(c.tool, store.get_text(c.args)) for c in first.tool_calls] == [("read_file", '{"path": "README.md"}')]


async def test_a_short_call_stays_sync_below_the_threshold(scripted, store):
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "short"}]})
    profile = background(openai_profile(server), background_min_output_tokens=4096, max_output_tokens=512)
    acts = ModelActivities(ModelConfig(profiles={"test": profile}), store)

    await recording_env().run(acts.generate, generate_input())

    assert server.handle_events() == []
    assert server.requests()[0]["path"].endswith("/chat/completions")


async def test_an_attempt_that_finds_a_handle_polls_it_instead_of_sending_again(scripted, store):
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "once", "in_progress_polls": 2}]})
    profile = background(openai_profile(server))
    acts = ModelActivities(ModelConfig(profiles={"test": profile}), store)
    first_beats: list = []
    # Attempt 1 creates the response and is cancelled as it polls (as a lost worker would stop).
    first = asyncio.create_task(recording_env(first_beats).run(acts.generate, generate_input()))
    while not first_beats:
        await asyncio.sleep(0.01)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    server_handle = server.creates()[0]["handle"]
    # The test env's cancel also cancels at the provider; a dead worker would not have, so
    # the scripted response is told to run on.
    server._jobs[server_handle].cancelled = False  # noqa: SLF001

    result = await recording_env([], attempt=2, heartbeat_details=[first_beats[0]]).run(acts.generate, generate_input())

    assert store.get_text(result.output) == "once"
    assert len(server.creates()) == 1 and len(server.requests()) == 1
    assert result.failed_attempts == []  # attempt 1's call is the one that answered: paid once


@pytest.mark.parametrize("flavour", ["openai", "anthropic"])
async def test_cancelling_the_activity_cancels_the_background_call(scripted, store, flavour):
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "never", "in_progress_s": 60}]})
    make = openai_profile if flavour == "openai" else anthropic_profile
    acts = ModelActivities(ModelConfig(profiles={"test": background(make(server))}), store)
    environment = recording_env()
    task = asyncio.create_task(environment.run(acts.generate, generate_input()))
    deadline = time.monotonic() + 10
    while not any(e["action"] == "poll" for e in server.handle_events()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)

    environment.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert [e["action"] for e in server.handle_events() if e["action"] == "cancel"] == ["cancel"]


async def test_a_failed_background_response_is_charged_and_retried(scripted, store):
    server = scripted(
        {"replies": [{"when": "PERDURE-STEP", "content": "x", "background_status": "failed", "usage": USAGE}]}
    )
    acts = ModelActivities(ModelConfig(profiles={"test": background(openai_profile(server))}), store)
    beats: list = []

    with pytest.raises(ApplicationError) as caught:
        await recording_env(beats).run(acts.generate, generate_input())

    assert (caught.value.type, caught.value.non_retryable) == ("ModelRetryable", False)
    (record,) = caught.value.details[0]["failed_attempts"]
    assert (record["known"], record["input_tokens"], record["output_tokens"]) == (True, 120, 80)
    assert beats[-1]["handle"] is None  # ended: the next attempt creates a new one


# --- goals -----------------------------------------------------------------------------


async def test_a_goal_whose_call_outlasts_the_client_timeout_polls_it_and_pays_once(
    env, task_queue, store, workspace, scripted
):
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "slow", "in_progress_s": 3, "usage": USAGE}]})
    profile = background(openai_profile(server), timeout_s=1.0, poll_interval_s=0.3)
    async with running_worker(env, task_queue, store, profile):
        _, result = await run_goal(env, task_queue, spec(workspace, plan=Plan.model_validate({"steps": [llm("a")]})))

    assert result.outcome == "succeeded", result.excerpt
    assert store.get_text(result.outputs["a"]) == "slow"
    assert len(server.creates()) == 1
    assert result.tokens == 200  # charged once


async def test_an_abort_while_a_background_call_is_in_flight_cancels_it(env, task_queue, store, workspace, scripted):
    server = scripted({"replies": [{"when": "AGENT-LONG", "content": "never", "in_progress_s": 120}]})
    plan = Plan.model_validate({"steps": [agent("long", "AGENT-LONG: think for a long time.", ["read_file"])]})
    async with running_worker(env, task_queue, store, background(openai_profile(server))):
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan=plan)),
            id=f"abort-bg-{task_queue}",
            task_queue=task_queue,
        )
        await wait_until(handle, lambda s: any(n.status == "running" for n in s.nodes))
        deadline = time.monotonic() + 20
        while not any(e["action"] == "poll" for e in server.handle_events()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await submit(handle, Abort(request_id="ab-1", reason="not needed any more"))
        result = await asyncio.wait_for(goal_result(handle), 60)
        while not any(e["action"] == "cancel" for e in server.handle_events()) and time.monotonic() < deadline + 20:
            await asyncio.sleep(0.05)

    assert result.outcome != "succeeded"
    assert len(server.creates()) == 1
    assert [e["action"] for e in server.handle_events()].count("cancel") == 1


@pytest.mark.process
async def test_a_worker_killed_while_it_polls_is_followed_by_one_polling_the_same_response(
    crash_rig, scripted, tmp_path
):
    model = scripted(
        {"replies": [{"when": "SLOWTHINK", "content": "thought it through", "in_progress_s": 5, "usage": USAGE}]}
    )
    rig = crash_rig(model=model)
    rig.config.write_text(rig.config.read_text() + 'mode = "background"\npoll_interval_s = 0.2\n')
    workspace = tmp_path / "ws"
    workspace.mkdir()
    plan = Plan.model_validate({"steps": [llm("think", prompt="SLOWTHINK: weigh the options.")]})
    # Killed 1.5 s into the call: the response was created and is being polled.
    worker = rig.start_worker(fault="model_call:1+1.5")
    handle = await rig.start_goal(spec(workspace, goal="Think", plan=plan))
    await rig.wait_killed(worker)
    assert len(model.creates()) == 1 and any(e["action"] == "poll" for e in model.handle_events())

    await rig.after_kill(handle)
    rig.start_worker()
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.excerpt
    assert rig.store.get_text(result.outputs["think"]) == "thought it through"
    assert len(model.creates()) == 1 and len(model.requests()) == 1
    polled = {e["handle"] for e in model.handle_events() if e["action"] == "poll"}
    assert polled == {model.creates()[0]["handle"]}
    assert result.tokens == 200  # paid once, nothing estimated for the killed attempt


def test_a_config_file_sets_background_mode_and_its_threshold(tmp_path):
    from perdure.activities.models.profiles import ModelConfigInvalid, load_model_config

    path = tmp_path / "config.toml"
    path.write_text(
        '[profiles.thinker]\nprovider = "openai"\nmodel = "o3"\nmode = "background"\n'
        "background_min_output_tokens = 8000\npoll_interval_s = 5\n"
    )
    thinker = load_model_config(path).resolve("thinker")
    assert (thinker.mode, thinker.background_min_output_tokens, thinker.poll_interval_s) == ("background", 8000, 5)
    assert thinker.background_for(16000) and not thinker.background_for(2048)
    assert load_model_config(path).resolve("openai").mode == "sync"

    path.write_text('[profiles.thinker]\nprovider = "openai"\nmodel = "o3"\nmode = "later"\n')
    with pytest.raises(ModelConfigInvalid, match="thinker"):
        load_model_config(path)
