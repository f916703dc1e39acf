"""The one client, as a Python program uses it (`perdure.Client`, the class the CLI, `perdure
ui` and `perdure mcp` use too), against the session's dev server and a real worker: a start
repeated under the same id or request id is the same goal, a steering verb sent twice under
one request id is one message, a question is listed and approved, and the goal's progress,
inbox, events and report are read. Bad input is refused before anything is sent, and an
unknown goal id is GoalNotFound. A fake payments API keeps the ledger."""

from __future__ import annotations

import asyncio
import json

import pytest

import perdure
from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI
from tests.builders import openai_profile
from tests.helpers import new_goal_id, running_worker

PAY = {"amount_cents": 12_500, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 42"}
PLAN = {"goal": "Pay invoice 42", "steps": [{"name": "pay", "kind": "tool", "tool": "make_payment", "args": PAY}]}


@pytest.mark.slow
async def test_a_program_starts_a_goal_steers_and_answers_it_and_reads_its_events_and_report(
    env, task_queue, store, workspace, scripted, fake_service, monkeypatch, tmp_path
):
    monkeypatch.setenv("PERDURE_TASK_QUEUE", task_queue)
    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)
    plan_file = tmp_path / "pay.json"
    plan_file.write_text(json.dumps(PLAN))
    client = perdure.Client(env.client)
    goal_id = new_goal_id("client")
    options = {"goal_id": goal_id, "workspace": workspace, "profile": "test"}
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        first = await client.start(plan=plan_file, **options)  # a plan file's path
        again = await client.start(
            plan=perdure.Plan.model_validate({"steps": PLAN["steps"]}), goal="Pay invoice 42", **options
        )
        with pytest.raises(perdure.StartRefused, match="already running with a different spec"):
            await client.start("something else", plan=PLAN, **options)
        asked = await client.questions(goal_id)
        while not asked:
            await asyncio.sleep(0.1)
            asked = await client.questions(goal_id)
        steered = await client.steer(goal_id, "keep the memo as it is", request_id="client-steer-1")
        resent = await client.steer(goal_id, "keep the memo as it is", request_id="client-steer-1")
        approved = await client.approve(goal_id, asked[0].id, request_id="client-ok-1")
        retried = await client.approve(goal_id, asked[0].id, request_id="client-ok-1")
        events = [item async for item in client.events(goal_id)]
        result = await client.result(goal_id)
        report = await client.report(goal_id)
        inbox = await client.messages(goal_id)
        late = await client.approve(goal_id, asked[0].id, request_id="client-ok-1")  # after the end: its receipt
    assert first.started and first.goal_id == goal_id and not again.started
    assert "already running with this spec" in again.text
    assert {o["id"] for o in asked[0].options} >= {"approve", "reject"}
    assert steered.request_id == resent.request_id == "client-steer-1"
    assert steered.receipt is not None and resent.receipt is not None
    assert steered.receipt.request_id == resent.receipt.request_id == "client-steer-1"
    assert approved.receipt is not None and approved.receipt.kind == "approve" and approved.request_id == "client-ok-1"
    assert retried.receipt is not None and late.receipt is not None and late.receipt.request_id == "client-ok-1"
    # One message per request id, however often it was sent; and one payment.
    assert [(e.request_id, e.kind) for e in inbox.entries] == [("client-steer-1", "steer"), ("client-ok-1", "approve")]
    assert inbox.source == "goal"
    assert [(e["kind"], e["amount_cents"]) for e in payments.ledger()] == [("payment", 12_500)]
    # The events, in order, to the goal's end; each a typed event too.
    offsets = [item.offset for item in events]
    assert offsets == sorted(offsets) and events[-1].kind == "end" and events[-1].data["outcome"] == "succeeded"
    assert {item.data.get("node") for item in events if item.kind == "node"} == {"pay"}
    assert [type(item.event).__name__ for item in events if item.kind == "question"][:1] == ["QuestionChanged"]
    assert events[-1].event is not None and events[-1].event.outcome == "succeeded"
    assert result.outcome == "succeeded" and (report.goal_id, report.outcome) == (goal_id, "succeeded")


@pytest.mark.slow
async def test_a_start_repeated_under_one_request_id_is_the_same_goal(
    env, task_queue, store, workspace, scripted, monkeypatch
):
    monkeypatch.setenv("PERDURE_TASK_QUEUE", task_queue)
    client = perdure.Client(env.client)
    wait = {"steps": [{"name": "pause", "kind": "wait", "after": "1h"}]}
    request_id = new_goal_id("start-request")
    options = {"plan": wait, "request_id": request_id, "workspace": workspace, "profile": "test"}
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        first = await client.start("wait an hour", **options)
        again = await client.start("wait an hour", **options)
        with pytest.raises(perdure.StartRefused, match="different spec"):
            await client.start("wait two hours", **options)
        aborted = await client.abort(first.goal_id, "done with it")
        ended = await client.result(first.goal_id)
    assert first.started and not again.started and again.goal_id == first.goal_id
    assert aborted.receipt is not None and ended.outcome == "aborted"


async def test_the_client_says_a_goal_does_not_exist(env):
    client = perdure.Client(env.client)
    with pytest.raises(perdure.GoalNotFound, match="no goal with id 'no-such-goal'"):
        await client.progress("no-such-goal")
    with pytest.raises(perdure.GoalNotFound):
        await client.steer("no-such-goal", "hello")
    with pytest.raises(perdure.GoalNotFound):
        await client.report("no-such-goal")
    with pytest.raises(perdure.GoalNotFound):
        async for _ in client.events("no-such-goal"):
            pass
    assert issubclass(perdure.GoalNotFound, perdure.PerdureError) and issubclass(perdure.GoalNotFound, LookupError)


async def test_bad_input_is_refused_before_anything_is_sent(env, tmp_path):
    client = perdure.Client(env.client)
    goal_id = new_goal_id("bad-input")
    listed = tmp_path / "list.yaml"
    listed.write_text("- name: pay\n")
    bad_starts = [
        ({"goal": ""}, perdure.InvalidRequest, "goal"),
        ({"goal": "   "}, perdure.InvalidRequest, "give the goal text"),
        ({}, perdure.InvalidRequest, "give the goal text"),
        ({"goal": "pay", "plan": {"steps": [{"name": "a", "kind": "teleport"}]}}, perdure.BadPlanFile, "plan"),
        ({"goal": "pay", "plan": {"steps": "pay it"}}, perdure.BadPlanFile, "plan"),
        ({"goal": "pay", "plan": ["not", "a", "mapping"]}, perdure.BadPlanFile, "not list"),
        ({"goal": "pay", "plan": listed}, perdure.BadPlanFile, "list.yaml: expected a mapping"),
        ({"goal": "pay", "plan": tmp_path / "missing.yaml"}, perdure.BadPlanFile, "cannot read plan file"),
        ({"goal": "pay", "plan": 42}, perdure.BadPlanFile, "expected a perdure.Plan"),
        ({"goal": "pay", "max_tokens": -5}, perdure.InvalidRequest, "max_tokens"),
        ({"goal": "pay", "no_budget": True, "max_cost": 1.0}, perdure.InvalidRequest, "no budget"),
    ]
    for options, error, text in bad_starts:
        with pytest.raises(error, match=text):
            await client.start(goal_id=goal_id, **options)
    with pytest.raises(perdure.StartRefused, match="not allowed"):
        await client.start("pay", goal_id="no spaces allowed")
    with pytest.raises(perdure.GoalNotFound):
        await client.describe(goal_id)  # none of them started anything
    # A message's fields are checked before the goal is looked up: an unknown goal does
    # not answer GoalNotFound when the message itself is wrong.
    bad_messages = [
        client.steer("no-such-goal", ""),
        client.queue("no-such-goal", "x" * 9_000),
        client.answer("no-such-goal", "q1", ""),
        client.park("no-such-goal", "lunch", expiry_hours=0),
        client.narrow("no-such-goal", {}),
        client.steer("no-such-goal", "hello", request_id="no spaces"),
    ]
    for call in bad_messages:
        with pytest.raises(perdure.InvalidRequest):
            await call
    assert issubclass(perdure.BadPlanFile, perdure.InvalidRequest) and issubclass(perdure.InvalidRequest, ValueError)
