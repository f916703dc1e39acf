"""Effects in flight when the goal stops or voids their step (issue 14, section 1).

The fake services record an effect and then take a few seconds to answer, so the
abort or rewind lands while the write is on its way. What must hold, read off the
services' ledgers and the goal's report: a write in flight is never abandoned, its
compensation is known before it is sent and a rollback runs it, a voided write is
not sent a second time, and an ended goal shows no open question.
"""

from __future__ import annotations

import asyncio

import pytest

from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI, WebhookReceiver
from perdure.workflows.goal.contracts.goal_contracts import Budget
from perdure.workflows.goal.contracts.messages import Abort, Answer, Approve, Rewind
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, gate, llm, openai_profile
from tests.helpers import goal_result, running_worker, start, statuses, submit, until, wait_until

# Waits on purpose (chains across continue-as-new, services slow to answer): not in test-fast.
pytestmark = pytest.mark.slow

SLOW_S = 3.0


@pytest.fixture
def slow_payments(fake_service) -> PaymentsAPI:
    return fake_service(PaymentsAPI, api_key=PAYMENTS_KEY, respond_delay_s=SLOW_S)


@pytest.fixture
def slow_hook(fake_service) -> WebhookReceiver:
    return fake_service(WebhookReceiver, respond_delay_s=SLOW_S)


async def test_abort_with_rollback_refunds_a_payment_whose_answer_was_still_on_its_way(
    env, task_queue, store, workspace, scripted, slow_payments
):
    pay = {"amount_cents": 12_500, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 42"}
    steps = [{"name": "pay", "kind": "tool", "tool": "make_payment", "args": pay, "defer": False}, gate()]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["make_payment", "run_command"])
        await wait_until(handle, lambda s: s.questions)
        await submit(handle, Approve(request_id="c1", question_id="q1"))
        await until(lambda: slow_payments.ledger())  # recorded by the API, its reply not yet sent
        await submit(handle, Abort(request_id="a1", reason="wrong invoice", rollback=True))
        result = await goal_result(handle)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert [e["kind"] for e in slow_payments.ledger()] == ["payment", "refund"]
    assert result.outcome == "aborted"
    assert statuses(snapshot)["pay"] == "succeeded"  # it happened; then it was refunded
    assert "undo by refund_payment done" in store.get_text(result.report)
    assert snapshot.questions == []


async def test_an_http_write_in_flight_at_abort_is_undone_and_the_ended_goal_has_no_open_question(
    env, task_queue, store, workspace, scripted, slow_hook
):
    ship = {
        "method": "POST",
        "url": f"{slow_hook.base_url}/ship",
        "body": {"order": 7},
        "undo": {"method": "POST", "url": f"{slow_hook.base_url}/unship", "body": {"order": 7}},
    }
    steps = [{"name": "ship", "kind": "tool", "tool": "http_request", "args": ship, "defer": False}, gate()]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["http_request", "run_command"])
        await until(lambda: slow_hook.ledger())
        await submit(handle, Abort(request_id="a1", reason="customer cancelled", rollback=True))
        result = await goal_result(handle)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert [e["path"] for e in slow_hook.ledger()] == ["/ship", "/unship"]
    assert result.outcome == "aborted"
    assert "undo by http_request done" in store.get_text(result.report)
    assert snapshot.questions == []


async def test_a_rewind_while_a_once_write_is_in_flight_waits_for_it_and_never_sends_it_twice(
    env, task_queue, store, workspace, scripted, slow_hook
):
    notice = {"url": f"{slow_hook.base_url}/deploys", "payload": {"release": "1.4"}}
    steps = [{"name": "notice", "kind": "tool", "tool": "notify_webhook", "args": notice}]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["notify_webhook"])
        await until(lambda: slow_hook.ledger())
        receipt = await submit(handle, Rewind(request_id="r1", node="notice", why="re-check the release"))
        result = await handle.result()

    assert receipt.status == "applied"
    assert len(slow_hook.ledger()) == 1  # the voided step ran again and reused the effect
    assert result.outcome == "succeeded", result.excerpt


async def test_an_emergency_stop_lets_a_write_in_flight_settle_and_reports_it_done(
    env, task_queue, store, workspace, scripted, slow_hook
):
    big = {**STEP_REPLY["replies"][0], "usage": {"input_tokens": 4_500, "output_tokens": 4_500}}
    ship = {"method": "POST", "url": f"{slow_hook.base_url}/ship", "body": {"order": 8}}
    steps = [{"name": "ship", "kind": "tool", "tool": "http_request", "args": ship, "defer": False}, llm("big")]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": [big]}))):
        handle = await start(
            env, task_queue, workspace, steps, allowed_tools=["http_request"], budget=Budget(max_tokens=4_000)
        )
        result = await goal_result(handle)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert result.failure.startswith("aborted: emergency stop")
    assert len(slow_hook.ledger()) == 1
    assert statuses(snapshot)["ship"] == "succeeded"  # it happened: not "aborted", not "not run"
    assert not any(line.startswith("ship:") for line in result.unfinished)


async def test_the_confirmation_card_shows_the_arguments_with_templates_resolved(
    env, task_queue, store, workspace, scripted, slow_payments
):
    (workspace / "memo.txt").write_text("invoice 42 for ACME, March")
    pay = {"amount_cents": 900, "currency": "EUR", "recipient": "ACME GmbH", "memo": "{{steps.memo}}"}
    steps = [
        {"name": "memo", "kind": "tool", "tool": "read_file", "args": {"path": "memo.txt"}},
        {"name": "pay", "kind": "tool", "tool": "make_payment", "args": pay, "needs": ["memo"]},
    ]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["read_file", "make_payment"])
        ahead = (await wait_until(handle, lambda s: s.questions)).questions[0]
        # Its memo is not known at adoption: the approvals-ahead card says it will ask when known.
        assert '"memo":"{{steps.memo}}","recipient":"ACME GmbH"} (will ask when known)' in ahead.stuck
        await submit(handle, Answer(request_id="ok", question_id=ahead.id, choice="approve"))
        snapshot = await wait_until(handle, lambda s: any(q.topic == "confirm_effect" for q in s.questions))
        await submit(handle, Abort(request_id="a1", reason="only looking"))
        await goal_result(handle)

    card = snapshot.questions[0].stuck
    assert "invoice 42 for ACME, March" in card and "{{steps.memo}}" not in card
    assert slow_payments.ledger() == []


async def test_a_drift_replan_that_drops_a_write_in_flight_waits_for_it_and_keeps_it_as_done(
    env, task_queue, store, workspace, scripted, slow_hook
):
    notice = {"url": f"{slow_hook.base_url}/deploys", "payload": {"release": "3.1"}}
    revised = {"steps": [llm("one"), llm("two"), llm("three", ["one", "two"])]}
    server = scripted(
        {
            "replies": [
                {"when": "PERDURE-DRIFT", "times": 1, "json": {"on_track": False, "reason": "no notice needed"}},
                {"when": "PERDURE-DRIFT", "json": {"on_track": True, "reason": "fine"}},
                {"when": "Revise the current plan", "json": revised},
                *STEP_REPLY["replies"],
            ]
        }
    )
    steps = [
        {"name": "notice", "kind": "tool", "tool": "notify_webhook", "args": notice, "defer": False},
        llm("one"),
        llm("two"),
    ]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        # The two llm steps finish while the notice is on its way: the check is due then.
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["notify_webhook"], drift_every=2)
        result = await asyncio.wait_for(handle.result(), 60)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert len(slow_hook.ledger()) == 1
    # The re-plan came after the write settled: it was left out as done, not cut off.
    assert [(n.name, n.status, n.plan_version) for n in snapshot.earlier] == [("notice", "succeeded", 1)]
    assert result.outcome == "succeeded", result.excerpt
    assert snapshot.plan_version == 2
