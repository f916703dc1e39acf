"""Budgets, stalls and drift enforced by the workflow, seen from outside: what the
scripted model server received, what the history dispatched, what the report says.
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.api.enums.v1 import EventType

from perdure.workflows.goal.contracts.goal_contracts import Activities, Budget
from perdure.workflows.goal.contracts.messages import Abort, Answer, Park, Resume
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, agent, gate, llm, openai_profile
from tests.helpers import (
    calls_for,
    goal_result,
    running_worker,
    scheduled_activities,
    start,
    statuses,
    submit,
    wait_until,
)

USAGE = {"input_tokens": 500, "output_tokens": 500}


def step_reply(usage: dict = USAGE) -> dict:
    return {**STEP_REPLY["replies"][0], "usage": usage}


@pytest.mark.slow
async def test_hard_gate_stops_dispatch_and_the_report_lists_what_did_not_run(
    env, task_queue, store, workspace, scripted
):
    server = scripted({"replies": [step_reply()]})
    steps = [llm(f"n{i:02d}") for i in range(24)]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps, budget=Budget(max_tokens=18_000), drift_every=0)
        result = await handle.result()
        snapshot = await handle.query(GoalWorkflow.progress)
        history = await handle.fetch_history()

    done = [n for n in snapshot.nodes if n.status == "succeeded"]
    skipped = [n for n in snapshot.nodes if n.status == "abandoned"]
    assert len(done) == 18 and len(skipped) == 6
    assert result.tokens == 18_000 and result.outcome == "partial"
    for node in skipped:
        assert node.error.startswith("not started: tokens at 100% (18,000 tokens of 18,000 tokens)"), node.error
    generated = [a for a in scheduled_activities(history) if a[1] == Activities.GENERATE]
    assert len(generated) == 18 == len(server.requests())
    assert scheduled_activities(history)[-1][2] == "report · partial"
    report = store.get_text(result.report)
    unfinished = report.split("## Unfinished work", 1)[1].split("##", 1)[0]
    assert unfinished.count("not started: tokens at 100%") == 6


async def test_soft_gate_degrades_what_the_model_is_sent(env, task_queue, store, workspace, scripted):
    agent_reply = {"when": "PERDURE-AGENT", "content": "agent done", "usage": USAGE}
    server = scripted({"replies": [step_reply(), agent_reply]})
    (workspace / "notes.txt").write_text("x" * 20_000)
    steps = [
        llm("a"),
        llm("b", ["a"]),
        llm("c", ["b"]),
        agent("d", "Finish.", ["read_file", "list_dir"], ["c"]),
    ]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(
            env, task_queue, workspace, steps, budget=Budget(max_tokens=20_000), soft_gate=0.08, drift_every=0
        )
        result = await handle.result()
        snapshot = await handle.query(GoalWorkflow.progress)

    assert result.outcome == "succeeded"
    sent = {name: calls_for(server, name)[0] for name in "abcd"}
    marker = "[degraded: the goal's budget is running low]"
    assert [marker in sent[n]["last_message"] for n in "abcd"] == [False, False, True, True]
    assert sent["d"]["tools"] == ["read_file"]  # list_dir is low-value: dropped when degraded
    assert any(entry.startswith("c: runs degraded (tokens at 10%") for entry in snapshot.gate_log), snapshot.gate_log


async def test_emergency_stop_cancels_in_flight_work(env, task_queue, store, workspace, scripted):
    server = scripted({"replies": [step_reply({"input_tokens": 4_500, "output_tokens": 4_500})]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(
            env, task_queue, workspace, [gate(), llm("big")], budget=Budget(max_tokens=4_000), drift_every=0
        )
        result = await goal_result(handle)
        history = await handle.fetch_history()
    (workspace / "GO").touch()

    assert result.outcome == "aborted"
    assert result.failure.startswith("aborted: emergency stop: tokens at 225% (9,000 tokens of 4,000 tokens)")
    assert "gate: aborted: emergency stop" in result.unfinished[0]
    cancelled = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED]
    assert len(cancelled) == 1


@pytest.mark.slow
async def test_stall_ladder_reminds_then_switches_then_asks_a_person(env, task_queue, store, workspace, scripted):
    (workspace / "same.txt").write_text("the same answer every time")
    loop = {"name": "read_file", "arguments": {"path": "same.txt"}}
    server = scripted({"replies": [{"when": "PERDURE-AGENT", "tool_calls": [loop]}]})
    hunt = agent("hunt", "Find it.", ["read_file"], max_turns=20)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [hunt], drift_every=0)
        snapshot = await wait_until(handle, lambda s: s.questions)
        turns_when_asked = len(server.requests())
        await asyncio.sleep(1)
        assert len(server.requests()) == turns_when_asked  # the node waits for the person
        assert statuses(snapshot)["hunt"] == "blocked" and snapshot.phase == "awaiting_human"
        assert snapshot.questions[0].title == "Step 'hunt' is going in circles"
        await submit(handle, Answer(request_id="x1", question_id="q1", choice="abandon"))
        result = await goal_result(handle)

    notes = [
        (i, r["last_message"]) for i, r in enumerate(server.requests()) if "Note from the runtime" in r["last_message"]
    ]
    assert len(notes) == 2
    (remind_at, remind), (switch_at, switch) = notes
    assert "already tried" in remind and "read_file" in remind
    assert "Stop using read_file the same way" in switch and "different source" in switch
    assert remind_at < switch_at < turns_when_asked
    assert result.outcome == "failed" and "abandoned" in result.unfinished[0]  # its only step
    assert "step 'hunt' was rejected: abandoned after repeated steps" in store.get_text(result.report)


@pytest.mark.slow
async def test_a_parked_agent_is_never_judged_stalled(env, task_queue, store, workspace, scripted):
    (workspace / "same.txt").write_text("the same answer every time")
    loop = {"name": "read_file", "arguments": {"path": "same.txt"}}
    # Slow enough turns that the park usually lands before the ladder's first rung; the
    # reads themselves take milliseconds (local activities), so the agent may still get there.
    server = scripted({"replies": [{"when": "PERDURE-AGENT", "tool_calls": [loop], "delay_s": 0.3}]})
    hunt = agent("hunt", "Find it.", ["read_file"], max_turns=20)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [hunt], drift_every=0)
        await wait_until(handle, lambda s: len(server.requests()) >= 1)
        await submit(handle, Park(request_id="k1", reason="lunch"))
        snapshot = await wait_until(handle, lambda s: statuses(s)["hunt"] == "parked")
        calls = len(server.requests())
        await asyncio.sleep(1.5)
        parked = await handle.query(GoalWorkflow.progress)
        # Nothing happened while parked: no model call, no stall judgement, no question.
        assert len(server.requests()) == calls
        assert parked.questions == snapshot.questions == []
        assert [e for e in parked.gate_log if "stalled" in e] == [e for e in snapshot.gate_log if "stalled" in e]
        assert snapshot.phase == "parked"
        await submit(handle, Resume(request_id="k2"))
        await wait_until(handle, lambda s: len(server.requests()) > calls)
        await submit(handle, Abort(request_id="k3"))
        result = await goal_result(handle)
    assert result.outcome == "aborted"


@pytest.mark.slow
async def test_drift_check_at_its_cadence_and_a_no_replans(env, task_queue, store, workspace, scripted):
    revised = {"steps": [llm("one"), llm("two"), llm("three"), llm("verify", ["one", "two", "three"])]}
    server = scripted(
        {
            "replies": [
                {"when": "PERDURE-DRIFT", "times": 1, "json": {"on_track": False, "reason": "nothing verifies it"}},
                {"when": "PERDURE-DRIFT", "json": {"on_track": True, "reason": "fine"}},
                {"when": "Revise the current plan", "json": revised},
                step_reply(),
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(
            env, task_queue, workspace, [llm("one"), llm("two", ["one"]), llm("three", ["two"])], drift_every=2
        )
        result = await handle.result()
        snapshot = await handle.query(GoalWorkflow.progress)

    drift_calls = [r for r in server.requests() if r["matched"] in (0, 1)]
    assert len(drift_calls) == 2  # after 2 and after 4 finished nodes
    assert snapshot.plan_version == 2 and result.outcome == "succeeded"
    assert len(calls_for(server, "verify")) == 1 and len(calls_for(server, "one")) == 1
    assert "plan v2 (drift): drift check: nothing verifies it" in store.get_text(result.report)
