"""An abort reported as requested, then achieved (issue 38, item 5).

While an abort waits for a write still on its way and for its compensations, the progress
snapshot, `perdure status` and `perdure abort` say it is requested, with what still runs
(each step with its tool) and what is still to undo; once everything has settled they say
it is achieved, with what was undone and what could not be, and why. The event stream
says when. The fake services answer slowly, so each stage lasts seconds and is seen from
outside: in the services' ledgers, the snapshot and the commands' output.
"""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from typer.testing import CliRunner

from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI, WebhookReceiver
from perdure.workflows.goal.contracts.messages import Abort, Approve
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import gate, openai_profile
from tests.helpers import (
    events_until_end,
    goal_result,
    perdure_status,
    running_worker,
    start,
    submit,
    until,
    wait_until,
)

# Services slow to answer on purpose: seconds per stage.
pytestmark = pytest.mark.slow

SLOW_S = 3.0
PAY = {"amount_cents": 12_500, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 42"}


@pytest.fixture
def slow_payments(fake_service) -> PaymentsAPI:
    return fake_service(PaymentsAPI, api_key=PAYMENTS_KEY, respond_delay_s=SLOW_S)


async def perdure(env, *args: str) -> tuple[int, str]:
    """A perdure command run in this process against the test's server: (exit code, output)."""
    address = {"PERDURE_TEMPORAL": env.client.service_client.config.target_host}
    with mock.patch.object(terminal.console, "_width", 400):
        done = await asyncio.to_thread(CliRunner().invoke, cli.app, list(args), env=address)
    return done.exit_code, done.output


async def test_an_abort_with_rollback_is_requested_while_the_payment_lands_and_its_refund_runs_then_achieved(
    env, task_queue, store, workspace, scripted, slow_payments
):
    steps = [{"name": "pay", "kind": "tool", "tool": "make_payment", "args": PAY, "defer": False}, gate()]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["make_payment", "run_command"])
        await wait_until(handle, lambda s: s.questions)
        await submit(handle, Approve(request_id="c1", question_id="q1"))
        await until(lambda: slow_payments.ledger())  # the payment is made; its answer is seconds away
        await submit(handle, Abort(request_id="a1", reason="wrong invoice", rollback=True, by="alice"))
        landing = await handle.query(GoalWorkflow.progress)
        said_landing = await perdure_status(env, handle.id)
        await until(lambda: len(slow_payments.ledger()) == 2)  # the refund is made; its answer is seconds away
        undoing = await wait_until(
            handle, lambda s: s.abort and s.abort.to_undo and s.abort.to_undo[0].status == "running"
        )
        said_undoing = await perdure_status(env, handle.id)
        result = await goal_result(handle)
        done = await handle.query(GoalWorkflow.progress)
        said_done = await perdure_status(env, handle.id)
        events = await events_until_end(env, handle.id)

    assert [e["kind"] for e in slow_payments.ledger()] == ["payment", "refund"]
    assert result.outcome == "aborted"
    abort = landing.abort
    assert abort is not None and abort.stage == "requested" and abort.rollback and abort.by == "alice (message a1)"
    assert abort.reason == "wrong invoice" and abort.requested_at is not None and abort.achieved_at is None
    assert [(s.node, s.tools) for s in abort.running] == [("pay", ["make_payment"])]
    assert [(s.node, s.tools) for s in abort.stopped] == [("gate", ["run_command"])]  # cancelled at once
    assert [(e.node, e.undo, e.status) for e in abort.to_undo] == [("pay", "refund_payment", "pending")]
    assert landing.phase == "aborting"
    assert "abort requested" in said_landing and "by alice (message a1)" in said_landing, said_landing
    assert "still running: pay (make_payment)" in said_landing, said_landing
    assert "to undo: pay · make_payment by refund_payment (pending)" in said_landing, said_landing

    assert undoing.abort.stage == "requested" and undoing.abort.running == []
    assert "to undo: pay · make_payment by refund_payment (running)" in said_undoing, said_undoing

    abort = done.abort
    assert abort.stage == "achieved" and abort.achieved_at >= abort.requested_at
    assert abort.running == [] and abort.to_undo == [] and abort.not_undone == []
    assert [(e.node, e.tool, e.undo, e.status) for e in abort.undone] == [
        ("pay", "make_payment", "refund_payment", "done")
    ]
    assert "aborted" in said_done and "abort requested" not in said_done, said_done
    assert "undone: pay · make_payment by refund_payment" in said_done, said_done

    kinds = [(e.type, getattr(e, "stage", None)) for e in events]
    assert ("abort", "requested") in kinds and ("abort", "achieved") in kinds, kinds
    assert kinds.index(("abort", "requested")) < kinds.index(("abort", "achieved")) < kinds.index(("end", None))


async def test_what_an_abort_could_not_undo_is_shown_with_why(
    env, task_queue, store, workspace, scripted, fake_service
):
    hook = fake_service(WebhookReceiver)
    ship = {
        "method": "POST",
        "url": f"{hook.base_url}/ship",
        "body": {"order": 7},
        "undo": {"method": "POST", "url": f"{hook.base_url}/unship", "body": {"order": 7}},
    }
    notice = {"method": "POST", "url": f"{hook.base_url}/notice", "body": {"order": 7}}
    steps = [
        {"name": "ship", "kind": "tool", "tool": "http_request", "args": ship, "defer": False},
        {"name": "notice", "kind": "tool", "tool": "http_request", "args": notice, "defer": False},
        gate(["ship", "notice"]),
    ]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["http_request", "run_command"])
        await wait_until(handle, lambda s: "gate" in s.running)
        hook.reply_status = 403  # the undo is refused
        await submit(handle, Abort(request_id="a1", reason="customer cancelled", rollback=True))
        result = await goal_result(handle)
        done = await handle.query(GoalWorkflow.progress)
        said = await perdure_status(env, handle.id)

    paths = [e["path"] for e in hook.ledger()]
    assert sorted(paths[:2]) == ["/notice", "/ship"] and paths[2:] == ["/unship"], paths  # the two ran side by side
    assert result.outcome == "aborted"
    abort = done.abort
    assert abort.stage == "achieved" and abort.undone == []
    why = {e.node: (e.status, e.why) for e in abort.not_undone}
    assert why["ship"][0] == "failed" and "HTTP 403" in why["ship"][1], why
    assert why["notice"][0] == "no_undo" and "declares no undo" in why["notice"][1], why
    assert "not undone: ship · http_request: undo by http_request failed: " in said and "HTTP 403" in said, said
    assert "not undone: notice · http_request: " in said and "declares no undo" in said, said


async def test_perdure_abort_says_the_abort_is_requested_and_how_to_watch_it_while_a_write_lands(
    env, task_queue, store, workspace, scripted, fake_service
):
    hook = fake_service(WebhookReceiver, respond_delay_s=SLOW_S)
    ship = {"method": "POST", "url": f"{hook.base_url}/ship", "body": {"order": 9}}
    steps = [{"name": "ship", "kind": "tool", "tool": "http_request", "args": ship, "defer": False}, gate()]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["http_request", "run_command"])
        await until(lambda: hook.ledger())  # the write is on its way
        code, said = await perdure(env, "abort", handle.id, "--reason", "not now")
        result = await goal_result(handle)
        done = await handle.query(GoalWorkflow.progress)
        code_after, said_after = await perdure(env, "abort", handle.id, "--request-id", "again")

    assert code == 0, said
    assert "abort requested" in said and "still running: ship (http_request)" in said, said
    assert f"perdure status {handle.id}" in said and f"perdure watch {handle.id}" in said, said
    assert "aborted" not in said.replace("abort requested", ""), said
    assert result.outcome == "aborted"
    assert done.abort.stage == "achieved" and done.abort.rollback is False
    # Without a rollback the write stays done, and the abort says so.
    assert [(e.node, e.status) for e in done.abort.not_undone] == [("ship", "kept")]
    assert code_after != 0 and "Traceback" not in said_after, said_after


async def test_perdure_abort_says_aborted_when_nothing_was_left_to_wait_for(env, task_queue, store, workspace):
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, [gate()], allowed_tools=["run_command"])
        await wait_until(handle, lambda s: "gate" in s.running)
        code, said = await perdure(env, "abort", handle.id, "--reason", "changed my mind")
        result = await goal_result(handle)

    assert code == 0, said
    assert result.outcome == "aborted"
    assert "aborted " in said and "· rollback: no · changed my mind" in said, said
    assert "stopped: gate (run_command): cancelled" in said and "abort requested" not in said, said
    assert "watch it" not in said, said
