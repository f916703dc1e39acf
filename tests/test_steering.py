"""Steering a running goal on a real server: durable admission, narrow,
rewind, park, abort, and clear refusals. Model calls go over HTTP to a
scripted server whose request log is the ledger the assertions read.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError

from perdure.workflows.goal.contracts.messages import Abort, Answer, Narrow, Park, Queue, Rewind, Steer
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared import search_attributes as sa
from tests.builders import STEP_REPLY, agent, gate, llm, openai_profile, tool_then_answer
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


async def test_steer_sent_without_a_worker_is_applied_once_when_one_starts(env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    handle = await start(env, task_queue, workspace, [llm("first"), llm("second", ["first"])])
    steer = {"request_id": "r1", "kind": "steer", "text": "Prefer plain words over jargon."}
    await handle.signal(GoalWorkflow.message_signal, steer)
    await handle.signal(GoalWorkflow.message_signal, steer)  # a client retry
    await handle.signal(GoalWorkflow.message_signal, {**steer, "text": "Something else entirely."})
    await handle.signal(GoalWorkflow.message_signal, {"request_id": "r2", "kind": "steer", "text": ""})

    async with running_worker(env, task_queue, store, openai_profile(server)):
        result = await handle.result()
        inbox = await handle.query(GoalWorkflow.inbox)

    assert result.outcome == "succeeded"
    assert [(e.request_id, e.status) for e in inbox.entries] == [("r1", "applied")]
    assert inbox.entries[0].note.startswith("applied at llm · first")
    reasons = [r.reason for r in inbox.refused]
    assert any("'r1' was already used for a different steer message" in r for r in reasons)
    assert any(r.startswith("malformed message: steer.text: String should have at least 1 character") for r in reasons)
    # Every model call after admission carries the guidance, exactly once.
    for request in server.requests():
        assert request["last_message"].count("Prefer plain words over jargon.") == 1
    assert "Something else entirely" not in str(server.requests())


async def test_malformed_messages_are_refused_and_impossible_ones_rejected_in_their_turn(
    env, task_queue, store, workspace, scripted
):
    """At the door only what no order of messages could fix (malformed, an id reused for
    other content); what the goal's state decides comes back as a rejected receipt."""
    server = scripted(STEP_REPLY)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [llm("first"), gate()], premises={"scope": "all"})
        await wait_until(handle, lambda s: statuses(s)["gate"] == "running")

        async def refused(payload) -> str:
            with pytest.raises(WorkflowUpdateFailedError) as err:
                await handle.execute_update(GoalWorkflow.submit, payload)
            return err.value.cause.message

        async def rejected(message) -> str:
            receipt = await submit(handle, message)
            assert receipt.status == "rejected", receipt
            return receipt.note

        assert "unknown step 'nope'" in await rejected(Rewind(request_id="u1", node="nope", why="x"))
        assert await refused({"request_id": "u2", "kind": "steer", "text": ""}) == (
            "malformed message: steer.text: String should have at least 1 character"
        )
        assert "unknown premise key(s): colour (this goal's premises: scope=all)" in await rejected(
            Narrow(request_id="u3", premises={"colour": "red"})
        )
        assert "at most 8000 characters" in await refused({"request_id": "u4", "kind": "steer", "text": "x" * 9000})
        assert "no question 'q9'" in await rejected(Answer(request_id="u5", question_id="q9", choice="a"))
        assert "Input tag 'reboot' found using 'kind' does not match" in await refused(
            {"request_id": "u6", "kind": "reboot"}
        )
        receipt = await submit(handle, Steer(request_id="u7", text="be brief"))
        assert receipt.status == "pending"
        assert "'u7' was already used for a different steer message" in await refused(
            Steer(request_id="u7", text="be long").model_dump()
        )
        assert (await submit(handle, Steer(request_id="u7", text="be brief"))).request_id == "u7"  # a retry

        (workspace / "GO").touch()
        result = await handle.result()
        inbox = await handle.query(GoalWorkflow.inbox)
    assert result.outcome == "succeeded"
    # Refused updates leave nothing behind; each rejected one keeps its row and reason, and
    # the steer came too late for a model turn: its receipt says so instead of vanishing.
    assert [(e.request_id, e.status) for e in inbox.entries] == [
        ("u1", "rejected"),
        ("u3", "rejected"),
        ("u5", "rejected"),
        ("u7", "rejected"),
    ]
    assert "the goal ended before this steer could be applied" in inbox.entries[-1].note


@pytest.mark.slow
async def test_narrow_keeps_what_holds_and_reruns_only_void_work(env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    keep = [llm(f"keep{i}", premises={"scope": ["all_modules", "module_a"]}) for i in range(4)]
    void = [llm(f"void{i}", premises={"scope": ["all_modules"]}) for i in range(4)]
    plain = [llm(f"plain{i}") for i in range(4)]
    dozen = keep + void + plain
    final = llm("final", [s["name"] for s in dozen] + ["gate"])
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [*dozen, gate(), final], premises={"scope": "all_modules"})
        await wait_until(handle, lambda s: s.counts.get("succeeded", 0) == 12)
        receipt = await submit(handle, Narrow(request_id="n1", premises={"scope": "module_a"}, why="only module A"))
        (workspace / "GO").touch()
        result = await handle.result()
        snapshot = await handle.query(GoalWorkflow.progress)

    assert receipt.status == "applied"
    assert receipt.detail["void"] == ["void0", "void1", "void2", "void3"]
    assert receipt.detail["kept"] == [s["name"] for s in keep + plain] + ["gate"]  # gate is running
    assert receipt.detail["to_confirm"] == []
    assert result.outcome == "succeeded" and snapshot.plan_version == 2
    for step in keep + plain:
        assert len(calls_for(server, step["name"])) == 1, step["name"]
    for step in void:
        first, again = calls_for(server, step["name"])
        assert "scope = all_modules" in first["last_message"] and "scope = module_a" in again["last_message"]
    assert len(calls_for(server, "final")) == 1


@pytest.mark.slow
async def test_rewind_shows_the_rejected_path_to_the_model(env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    steps = [llm("outline"), llm("draft", ["outline"]), gate(), llm("publish", ["draft", "gate"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps)
        await wait_until(handle, lambda s: statuses(s)["draft"] == "succeeded")
        receipt = await submit(handle, Rewind(request_id="w1", node="outline", why="it outlined the wrong chapter"))
        (workspace / "GO").touch()
        result = await handle.result()

    assert receipt.status == "applied" and receipt.detail["void"] == ["outline", "draft"]
    assert result.outcome == "succeeded"
    first, second = calls_for(server, "outline")
    assert "Rejected paths" not in first["last_message"]
    assert "step 'outline' was rejected: it outlined the wrong chapter" in second["last_message"]
    assert len(calls_for(server, "draft")) == 2 and len(calls_for(server, "publish")) == 1
    assert "rewind of 'outline'" in store.get_text(result.report)


async def test_abort_stops_dispatch_and_lists_unfinished_work(env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    steps = [llm("early"), gate(), llm("late", ["gate"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps)
        await wait_until(handle, lambda s: statuses(s) == {"early": "succeeded", "gate": "running", "late": "pending"})
        receipt = await submit(handle, Abort(request_id="a1", reason="the user changed plans"))
        result = await goal_result(handle)
        history = await handle.fetch_history()
    (workspace / "GO").touch()  # let the orphaned shell loop end

    assert receipt.status == "applied"
    assert result.outcome == "aborted" and result.failure == "aborted: the user changed plans"
    assert result.unfinished == ["gate: aborted: the user changed plans", "late: pending"]
    accepted = next(
        e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    )
    after = [summary for event_id, _, summary in scheduled_activities(history) if event_id > accepted]
    assert after == ["report · aborted"]
    assert calls_for(server, "late") == []


@pytest.mark.slow
async def test_park_expiry_becomes_one_question(ts_env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    handle = await start(ts_env, task_queue, workspace, [llm("only")])
    park = Park(request_id="p1", reason="waiting for the CI run")
    await handle.signal(GoalWorkflow.message_signal, park.model_dump(mode="json"))
    async with running_worker(ts_env, task_queue, store, openai_profile(server)):
        snapshot = await wait_until(handle, lambda s: s.questions)
        assert snapshot.parked and snapshot.phase == "parked"
        assert [q.title for q in snapshot.questions] == ["Still parked: waiting for the CI run"]
        assert [o["id"] for o in snapshot.questions[0].options] == ["resume", "extend", "abort"]
        assert server.requests() == []  # nothing ran while parked
        desc = await handle.describe()
        assert desc.typed_search_attributes.get(sa.NEEDS_HUMAN) is True
        assert desc.typed_search_attributes.get(sa.PARKED) is True
        await asyncio.sleep(1)  # more (skipped) time does not ask again
        assert len((await handle.query(GoalWorkflow.progress)).questions) == 1
        receipt = await submit(handle, Answer(request_id="p2", question_id="q1", choice="resume"))
        result = await handle.result()
        history = await handle.fetch_history()

    assert receipt.status == "applied" and result.outcome == "succeeded"
    timers = [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]
    assert timers == [timedelta(hours=48)]
    assert len(calls_for(server, "only")) == 1


async def test_steer_reaches_a_running_agent_at_its_next_turn(env, task_queue, store, workspace, scripted):
    wait_for_go = {"command": "while [ ! -f GO ]; do sleep 0.05; done; echo opened"}
    answer = "finished after the gate"
    server = scripted(tool_then_answer("run_command", wait_for_go, when="[exit code 0]", answer=answer))
    worker = agent("worker", "Wait for the gate.", ["run_command"])
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [worker])
        await wait_until(handle, lambda s: s.tool_calls == 0 and len(server.requests()) == 1)
        receipt = await submit(handle, Steer(request_id="s1", text="Mention the gate in the answer."))
        assert receipt.status == "pending"  # applied at the next model-turn boundary, not now
        (workspace / "GO").touch()
        result = await handle.result()
        inbox = await handle.query(GoalWorkflow.inbox)

    assert result.outcome == "succeeded"
    first, second = server.requests()
    assert "Mention the gate" not in first["last_message"]
    assert (
        second["last_message"] == "New guidance from the user (applies from now on):\n- Mention the gate in the answer."
    )
    assert inbox.entries[0].status == "applied" and "agent turn 2/8 · worker" in inbox.entries[0].note


@pytest.mark.slow
async def test_queued_work_is_planned_when_the_goal_would_be_idle(env, task_queue, store, workspace, scripted):
    revised = {
        "steps": [
            llm("first"),
            gate(),
            llm("extra", ["first"]),
        ]
    }
    server = scripted({"replies": [{"when": "Revise the current plan", "json": revised}, *STEP_REPLY["replies"]]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [llm("first"), gate()])
        await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
        receipt = await submit(handle, Queue(request_id="q1", text="Also write an extra section."))
        assert receipt.status == "pending"
        (workspace / "GO").touch()
        result = await handle.result()
        inbox = await handle.query(GoalWorkflow.inbox)
        snapshot = await handle.query(GoalWorkflow.progress)

    planner = [r for r in server.requests() if "Revise the current plan" in r["last_message"]]
    assert len(planner) == 1 and "Also write an extra section." in planner[0]["last_message"]
    assert inbox.entries[0].status == "applied" and inbox.entries[0].detail["added"] == ["extra"]
    assert snapshot.plan_version == 2 and result.outcome == "succeeded"
    # Kept steps were not run again: one call for "first", one for "extra".
    assert len(calls_for(server, "first")) == 1 and len(calls_for(server, "extra")) == 1


@pytest.mark.slow
async def test_narrow_asks_about_loose_dependants_and_redoes_on_request(env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    steps = [
        llm("judge", premises={"scope": None}),
        llm("use", ["judge", "gate"]),
        gate(),
    ]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps, premises={"scope": "all"})
        await wait_until(handle, lambda s: statuses(s)["judge"] == "succeeded")
        receipt = await submit(handle, Narrow(request_id="n1", premises={"scope": "docs"}))
        (workspace / "GO").touch()
        snapshot = await wait_until(handle, lambda s: s.questions and statuses(s)["gate"] == "succeeded")
        assert statuses(snapshot)["use"] == "pending"  # held until the question is answered
        assert snapshot.phase == "awaiting_human"
        answer = await submit(handle, Answer(request_id="n2", question_id="q1", choice="redo"))
        result = await handle.result()

    assert receipt.detail["to_confirm"] == ["judge"] and receipt.detail["void"] == []
    assert answer.status == "applied" and result.outcome == "succeeded"
    assert len(calls_for(server, "judge")) == 2 and len(calls_for(server, "use")) == 1
