"""Long goals: continue-as-new carries the one state object (receipts, questions,
outputs) across runs, and a carried state is migrated or refused, never half-read.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import pytest_asyncio
from rich.console import Console
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowUpdateFailedError,
)
from temporalio.testing import WorkflowEnvironment

from perdure.starters.render import print_status
from perdure.workflows.goal.contracts import migrations
from perdure.workflows.goal.contracts.messages import Abort, Answer, Resume
from perdure.workflows.goal.contracts.migrations import StateFromNewerCode, StateRefused, load_state
from perdure.workflows.goal.contracts.plan import LlmStep, Plan
from perdure.workflows.goal.contracts.state import SCHEMA_VERSION, GoalInput, GoalState, PlanVersion
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, chain, openai_profile, spec
from tests.helpers import dev_server_options, new_goal_id, running_worker, stream_events, submit, wait_until


@pytest_asyncio.fixture(scope="module")
async def short_history_env(payload_store):
    """A dev server that suggests continue-as-new after 40 events (dynamic config)."""
    options = dev_server_options("--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=40")
    async with await WorkflowEnvironment.start_local(**options) as environment:
        yield environment


async def run_chain(environment, task_queue, store, workspace, server, goal_id):
    escalate = {"request_id": "wd-1", "kind": "escalate", "finding": "slow", "detail": "check me"}
    steer = {"request_id": "st-1", "kind": "steer", "text": "Keep it short."}
    handle = await environment.client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=spec(workspace, plan={"steps": chain(12)}, drift_every=0)),
        id=goal_id,
        task_queue=task_queue,
    )
    await handle.signal(GoalWorkflow.message_signal, steer)
    await handle.signal(GoalWorkflow.message_signal, escalate)
    async with running_worker(environment, task_queue, store, openai_profile(server)):
        snapshot = await wait_until(handle, lambda s: s.counts.get("succeeded", 0) == 12 and s.questions, 60)
        runs_before_answer = snapshot.runs
        receipt = await submit(handle, Answer(request_id="a-1", question_id="q1", choice="continue"))
        result = await handle.result()
        inbox = await handle.query(GoalWorkflow.inbox)
        console = Console(record=True, width=200)
        print_status(console, await handle.describe(), await handle.query(GoalWorkflow.progress))
    return result, inbox, runs_before_answer, receipt, console.export_text()


@pytest.mark.process
async def test_continue_as_new_keeps_receipts_questions_and_results(
    short_history_env, env, task_queue, store, workspace, scripted
):
    server = scripted(STEP_REPLY)
    goal_id = new_goal_id("can")
    chained, inbox, runs, receipt, status = await run_chain(
        short_history_env, task_queue, store, workspace, server, goal_id
    )
    plain, _, plain_runs, _, plain_status = await run_chain(
        env, task_queue + "-plain", store, workspace, server, new_goal_id("one")
    )

    assert runs >= 3 and plain_runs == 1  # the question was still open in a later run
    # `perdure status` shows where the goal is in its run chain.
    final_runs = int(re.search(r"· run (\d+) ·", status).group(1))
    assert final_runs >= runs and "· run 1 ·" in plain_status
    assert receipt.status == "applied"
    assert [(e.request_id, e.status) for e in inbox.entries] == [
        ("st-1", "applied"),
        ("wd-1", "applied"),
        ("a-1", "applied"),
    ]
    assert chained.outcome == plain.outcome == "succeeded"
    assert {k: v.digest for k, v in chained.outputs.items()} == {k: v.digest for k, v in plain.outputs.items()}
    assert chained.tokens == plain.tokens
    # Every model call was made once: 12 steps per goal, none repeated by a new run.
    assert len(server.requests()) == 24
    # The last run started from the state as JSON text, with the plan in it once.
    last = await short_history_env.client.get_workflow_handle(goal_id).fetch_history()
    started = last.events[0].workflow_execution_started_event_attributes
    carried = GoalInput.model_validate_json(started.input.payloads[0].data)
    assert isinstance(carried.state, str) and carried.spec.plan is None
    state = load_state(carried.state)
    assert state.spec.plan is None and [s.name for s in state.plan.steps] == [s["name"] for s in chain(12)]


def current_state(**overrides) -> dict:
    state = GoalState(spec=spec(Path("/tmp/ws"), premises={"scope": "all"}), premises={"scope": "all"})
    return {**state.model_dump(mode="json"), **overrides}


def older_state() -> dict:
    """A state of a synthetic schema v0.9, before the goal-level premises: they were only in
    the spec. Migrations restart at 1.0, so the tests register the step they load through."""
    data = {k: v for k, v in current_state().items() if k != "premises"}
    return {**data, "schema_version": "0.9"}


def premises_from_spec(data: dict) -> dict:
    # Defaulting the new field to {} would silently drop them: copied over.
    return {**data, "premises": dict(data["spec"].get("premises") or {}), "schema_version": SCHEMA_VERSION}


@pytest.mark.parametrize("as_text", [False, True], ids=["mapping", "text"])
def test_an_older_state_is_migrated(as_text, monkeypatch):
    monkeypatch.setitem(migrations.MIGRATIONS, "0.9", premises_from_spec)
    state = load_state(json.dumps(older_state()) if as_text else older_state())
    assert state.schema_version == SCHEMA_VERSION == "1.0"
    assert state.premises == {"scope": "all"}  # v0.9 kept them only in the spec


def test_an_older_state_without_a_migration_is_refused():
    with pytest.raises(StateRefused) as refused:
        load_state(json.dumps(older_state()))
    assert "no migration from schema v0.9 to v1.0" in str(refused.value)


def test_a_migration_that_does_not_move_the_state_on_is_refused_not_looped(monkeypatch):
    monkeypatch.setitem(migrations.MIGRATIONS, "0.9", lambda data: data)
    with pytest.raises(StateRefused) as refused:
        load_state(older_state())
    assert "did not move the state on" in str(refused.value)


@pytest.mark.parametrize("version", [3, 10])
def test_a_state_carried_by_code_before_1_0_is_refused_not_taken_for_newer_code(version):
    """Development versions counted schema versions up to 10; 1.0 restarts at "1.0" and
    reads none of them. An integer is refused with the reason, never waited on as newer."""
    with pytest.raises(StateRefused) as refused:
        load_state(json.dumps(current_state(schema_version=version)))
    assert f"schema v{version}, written by perdure before 1.0" in str(refused.value)


def test_a_plan_kept_by_a_new_version_is_carried_once():
    first, second = (Plan(steps=[LlmStep(name=n, prompt="p")]) for n in ("a", "b"))
    versions = [(first, "planner"), (first, "narrow"), (second, "queue"), (second.model_copy(deep=True), "rewind")]
    state = GoalState(
        spec=spec(Path("/tmp/ws")),
        plan_versions=[PlanVersion(version=i + 1, plan=p, reason="r", source=s) for i, (p, s) in enumerate(versions)],
    )
    carried = json.loads(state.model_dump_json())
    assert [v["plan"] is not None for v in carried["plan_versions"]] == [True, False, True, False]
    loaded = load_state(json.dumps(carried))
    assert loaded == state
    assert loaded.plan_versions[1].plan is loaded.plan_versions[0].plan  # shared, validated once


def test_a_current_state_round_trips_through_text():
    state = GoalState(spec=spec(Path("/tmp/ws"), premises={"scope": "all"}), runs=3)
    assert load_state(state.model_dump_json()) == state


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (["a list"], "is a list, not a mapping"),
        ("{not json", "is not JSON"),
        (json.dumps(current_state(mystery=1)), "mystery: Extra inputs"),
        ({"spec": {}}, 'has no schema_version of the form "MAJOR.MINOR"'),
        ({**current_state(), "schema_version": "one"}, 'has no schema_version of the form "MAJOR.MINOR"'),
        (current_state(mystery=1), "mystery: Extra inputs are not permitted"),
        (current_state(phase="dancing"), "phase: Input should be"),
        (
            {
                **current_state(),
                "plan_versions": [{"version": 1, "plan": None, "reason": "r", "source": "planner"}],
            },
            "plan v1 has no plan",
        ),
    ],
)
def test_a_state_that_cannot_be_read_is_refused(data, reason):
    with pytest.raises(StateRefused) as refused:
        load_state(data)
    assert reason in str(refused.value)


@pytest.mark.parametrize(
    "carried", [current_state(schema_version="99.0"), json.dumps(current_state(schema_version="99.0"))]
)
def test_a_state_from_newer_code_is_not_refused_but_left_for_a_newer_worker(carried):
    with pytest.raises(StateFromNewerCode) as newer:
        load_state(carried)
    assert not isinstance(newer.value, StateRefused)
    assert "schema v99.0, newer than this worker's" in str(newer.value)


async def test_a_goal_with_a_corrupt_carried_state_parks_and_says_why(env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    goal_spec = spec(workspace, plan={"steps": chain(1)})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=goal_spec, state=json.dumps(current_state(phase="dancing"))),
            id=new_goal_id("corrupt"),
            task_queue=task_queue,
        )
        snapshot = await wait_until(handle, lambda s: s.parked)
        assert "cannot resume from the carried state" in snapshot.pause_reason
        assert "phase: Input should be" in snapshot.pause_reason
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await submit(handle, Resume(request_id="r1"))
        assert "it can only be aborted" in refused.value.cause.message
        await submit(handle, Abort(request_id="x1"))
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        end = await asyncio.wait_for(the_end_event(env, handle.id), 15)
    assert "phase: Input should be" in str(failure.value.cause)
    assert server.requests() == []  # nothing ran on a state it could not read
    # Its event stream ends as every goal's does, so a page watching it closes with the reason.
    assert (end.outcome, "cannot resume" in (end.failure or "")) == ("failed", True)


async def the_end_event(env, goal_id: str):
    async for _, event in stream_events(env, goal_id, tokens=False):
        if event.type == "end":
            return event


async def test_a_run_carrying_a_state_from_newer_code_waits_for_a_newer_worker(
    env, task_queue, store, workspace, scripted
):
    """A rolling deploy: a newer worker continued the goal as new, an older one takes the
    run. It must not park for good (only abort would be left); its workflow task fails
    with the reason and is retried, for a worker with the newer code to take."""
    server = scripted(STEP_REPLY)
    goal_spec = spec(workspace, plan={"steps": chain(1)})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=goal_spec, state=json.dumps(current_state(schema_version="99.0"))),
            id=new_goal_id("newer"),
            task_queue=task_queue,
        )
        failures: list[str] = []
        for _ in range(100):
            history = await handle.fetch_history()
            failures = [
                e.workflow_task_failed_event_attributes.failure.message
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
            ]
            if failures:
                break
            await asyncio.sleep(0.1)
        assert failures and "schema v99.0, newer than this worker's v" in failures[0]
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        await handle.terminate("test over")
    assert server.requests() == []


def test_loading_leaves_the_collector_as_it_found_it():
    """Loading pauses Python's collector; a load, refused or not, must turn it back on."""
    import gc

    assert gc.isenabled()
    load_state(GoalState(spec=spec(Path("/tmp/ws"))).model_dump_json())
    assert gc.isenabled()
    with pytest.raises(StateRefused):
        load_state("{not json")
    assert gc.isenabled()
    gc.disable()
    try:
        load_state(GoalState(spec=spec(Path("/tmp/ws"))).model_dump_json())
        assert not gc.isenabled()  # someone else's choice is kept
    finally:
        gc.enable()
