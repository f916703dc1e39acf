"""The one client (`perdure.starters.client.PerdureClient`) as a Python program uses it,
against the session's dev server and a real worker: a start repeated under the same id is
a retry, a steering message sent twice under one request id is one message, a question is
answered, and the goal's progress, inbox, events and report are read, the same calls the
CLI, `perdure ui` and `perdure mcp` make. A fake payments API keeps the ledger."""

from __future__ import annotations

import asyncio

import pytest

from perdure.starters.client import PerdureClient
from perdure.starters.client.client_errors import GoalNotFound, StartRefused
from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI
from perdure.workflows.goal.contracts.messages import Approve, Steer
from perdure.workflows.goal.contracts.plan import Plan
from tests.builders import openai_profile, spec
from tests.helpers import new_goal_id, running_worker

PAY = {"amount_cents": 12_500, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 42"}


@pytest.mark.slow
async def test_a_program_starts_a_goal_steers_and_answers_it_and_reads_its_events_and_report(
    env, task_queue, store, workspace, scripted, fake_service, monkeypatch
):
    monkeypatch.setenv("PERDURE_TASK_QUEUE", task_queue)
    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)
    plan = Plan.model_validate({"steps": [{"name": "pay", "kind": "tool", "tool": "make_payment", "args": PAY}]})
    goal = spec(workspace, plan=plan, allowed_tools=["make_payment"])
    client = PerdureClient(env.client)
    goal_id = new_goal_id("client")
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        first = await client.start(goal, goal_id)
        again = await client.start(goal, goal_id)
        with pytest.raises(StartRefused, match="already running with a different spec"):
            await client.start(goal.model_copy(update={"goal": "something else"}), goal_id)
        asked = await client.progress(goal_id)
        while not asked.questions:
            await asyncio.sleep(0.1)
            asked = await client.progress(goal_id)
        steer = Steer(request_id="client-steer-1", text="keep the memo as it is")
        steered, resent = await client.send(goal_id, steer), await client.send(goal_id, steer)
        approve = Approve(request_id="client-ok-1", question_id=asked.questions[0].id)
        approved = await client.send(goal_id, approve)
        retried = await client.send(goal_id, approve)
        events = [item async for item in client.events(goal_id)]
        report = await client.report(goal_id)
        inbox = await client.messages(goal_id)
        late = await client.send(goal_id, approve)  # after the end: the receipt the goal left
    assert first.started and first.goal_id == goal_id and not again.started
    assert "already running with this spec" in again.text
    assert steered.receipt is not None and resent.receipt is not None
    assert steered.receipt.request_id == resent.receipt.request_id == "client-steer-1"
    assert approved.receipt is not None and approved.receipt.kind == "approve"
    assert retried.receipt is not None and late.receipt is not None and late.receipt.request_id == "client-ok-1"
    # One message per request id, however often it was sent; and one payment.
    assert [(e.request_id, e.kind) for e in inbox.entries] == [("client-steer-1", "steer"), ("client-ok-1", "approve")]
    assert inbox.source == "goal"
    assert [(e["kind"], e["amount_cents"]) for e in payments.ledger()] == [("payment", 12_500)]
    offsets = [item.offset for item in events]
    assert offsets == sorted(offsets) and events[-1].kind == "end" and events[-1].data["outcome"] == "succeeded"
    assert {item.data.get("node") for item in events if item.kind == "node"} == {"pay"}
    assert (report.goal_id, report.outcome) == (goal_id, "succeeded")


async def test_the_client_says_a_goal_does_not_exist(env):
    client = PerdureClient(env.client)
    with pytest.raises(GoalNotFound, match="no goal with id 'no-such-goal'"):
        await client.progress("no-such-goal")
    with pytest.raises(GoalNotFound):
        await client.send("no-such-goal", Steer(request_id="r-1", text="hello"))
