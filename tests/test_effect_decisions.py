"""The goal's side of effects: a person decides what cannot be known (an uncertain
`once` call after a SIGKILL), confirms irreversible calls, and an abort with
rollback undoes registered effects newest first. Real fake services keep the
ledgers; the workers are real (a subprocess where one is killed).
"""

from __future__ import annotations

from collections import Counter

import pytest

from perdure.activities.tools.catalogue.http_tools import HttpRequestArgs
from perdure.testing.fakes import LedgerAPI, WebhookReceiver
from perdure.testing.repo import git, init_repo
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.messages import Abort, Answer, Approve
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.shared.effects import effect_key_for
from tests.builders import agent, gate, openai_profile, spec, tool_then_answer
from tests.helpers import (
    goal_result,
    local_activities,
    running_worker,
    scheduled_activities,
    start,
    statuses,
    submit,
    wait_until,
)

RECIPIENTS = ["ada", "grace", "alan", "edsger", "barbara"]


def pay_step(name: str = "pay", **extra) -> dict:
    args = {"amount_cents": 12_500, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 42"}
    return {"name": name, "kind": "tool", "tool": "make_payment", "args": args, **extra}


@pytest.mark.process
async def test_uncertain_once_call_becomes_a_question_and_nothing_is_sent_twice(tmp_path, fake_service, crash_rig):
    hook = fake_service(WebhookReceiver, respond_delay_s=0.2)
    rig = crash_rig()
    steps = [
        {
            "name": f"notice-{i}",
            "kind": "tool",
            "tool": "notify_webhook",
            "args": {"url": f"{hook.base_url}/deploys", "payload": {"to": who}},
            **({"needs": [f"notice-{i - 1}"]} if i > 1 else {}),
        }
        for i, who in enumerate(RECIPIENTS, start=1)
    ]
    workspace = tmp_path / "ws"
    workspace.mkdir()
    worker = rig.start_worker(fault="after_effect:notify_webhook:4")
    handle = await rig.start_goal(
        spec(workspace, plan=Plan.model_validate({"steps": steps}), allowed_tools=["notify_webhook"])
    )
    await rig.wait_killed(worker)
    assert [e["body"]["to"] for e in hook.ledger()] == RECIPIENTS[:4]
    await rig.after_kill(handle)
    rig.start_worker()

    snapshot = await wait_until(handle, lambda s: s.questions, timeout_s=60)
    assert snapshot.questions[0].title == "Did notify_webhook in step 'notice-4' happen?"
    assert statuses(snapshot)["notice-4"] == "uncertain" and statuses(snapshot)["notice-5"] == "pending"
    assert len(hook.ledger()) == 4  # nothing re-sent while the question is open
    await submit(handle, Answer(request_id="u1", question_id="q1", choice="happened"))
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.excerpt
    assert Counter(e["body"]["to"] for e in hook.ledger()) == Counter(RECIPIENTS)  # five, one each
    assert "question q1 (Did notify_webhook in step 'notice-4' happen?): happened" in rig.store.get_text(result.report)


async def test_irreversible_call_waits_for_approval(env, task_queue, store, workspace, scripted, payments):
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [pay_step()], allowed_tools=["make_payment"])
        snapshot = await wait_until(handle, lambda s: s.questions)
        question = snapshot.questions[0]
        # Asked on the approvals-ahead card at adoption (issue 38), with the arguments it will run with.
        assert question.topic == "approvals_ahead" and question.title == "Approve ahead: 'pay'"
        assert '"amount_cents":12500' in question.stuck and "ACME GmbH" in question.stuck
        assert payments.ledger() == []  # nothing paid before the answer
        await submit(handle, Approve(request_id="c1", question_id="q1"))
        result = await handle.result()

    assert result.outcome == "succeeded"
    assert [(e["kind"], e["amount_cents"]) for e in payments.ledger()] == [("payment", 12_500)]


async def test_a_refusal_is_shown_to_the_model(env, task_queue, store, workspace, scripted, payments):
    pay = {"amount_cents": 99_000, "currency": "EUR", "recipient": "ACME GmbH"}
    refused = "a person refused make_payment"
    server = scripted(tool_then_answer("make_payment", pay, when=refused, answer="Understood: no payment made."))
    settle = agent("settle", "Settle the invoice.", ["make_payment"])
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [settle], allowed_tools=["make_payment"])
        await wait_until(handle, lambda s: s.questions)
        await submit(handle, Approve(request_id="r1", question_id="q1", approved=False, text="too expensive"))
        result = await handle.result()

    assert payments.ledger() == []
    assert result.outcome == "succeeded"
    first, second = server.requests()
    assert "a person refused make_payment: too expensive" in second["last_message"]
    assert "rejected path: step 'settle' was rejected: a person refused make_payment" in store.get_text(result.report)


@pytest.mark.slow
async def test_abort_with_rollback_undoes_effects_newest_first(env, task_queue, store, tmp_path, scripted, payments):
    repo = tmp_path / "repo"
    init_repo(repo)
    server = scripted({"replies": []})
    steps = [
        pay_step(),
        {"name": "write", "kind": "tool", "tool": "write_file", "args": {"path": "PAID", "content": "yes"}},
        {
            "name": "commit",
            "kind": "tool",
            "tool": "git_commit",
            "needs": ["pay", "write"],
            "args": {"message": "Record the payment", "paths": ["PAID"]},
        },
        gate(["commit"]),
    ]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(
            env, task_queue, repo, steps, allowed_tools=["make_payment", "write_file", "git_commit", "run_command"]
        )
        await wait_until(handle, lambda s: s.questions)
        await submit(handle, Approve(request_id="c1", question_id="q1"))
        await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
        await submit(handle, Abort(request_id="a1", reason="wrong invoice", rollback=True))
        result = await goal_result(handle)
        history = await handle.fetch_history()
    (repo / "GO").touch()

    assert result.outcome == "aborted"
    assert [e["kind"] for e in payments.ledger()] == ["payment", "refund"]
    log = git(repo, "log", "--format=%s").splitlines()
    assert log[0].startswith('Revert "Record the payment') and log[1].startswith("Record the payment")
    compensations = [s for _, _, s in scheduled_activities(history) if s.startswith("compensate")]
    assert [c.split(" · ")[1] for c in compensations] == ["git_revert", "refund_payment"]  # newest first
    report = store.get_text(result.report)
    assert "undo by git_revert done" in report and "undo by refund_payment done" in report


async def test_a_write_whose_arguments_are_in_the_plan_is_prepared_without_a_local_activity(
    env, task_queue, store, workspace, fake_service
):
    """Its key, compensation and shown arguments need nothing from the artifact store, so the
    workflow prepares it with the activity's own function; a write whose body names another
    step's output still goes through the prepare activity, which reads that output."""
    ledger = fake_service(LedgerAPI)
    entry = {"method": "POST", "url": f"{ledger.base_url}/entries", "body": {"n": 1}}
    steps = [
        {"name": "first", "kind": "tool", "tool": "http_request", "args": entry},
        {
            "name": "second",
            "kind": "tool",
            "tool": "http_request",
            "args": {**entry, "body": {"after": "{{steps.first}}"}},
            "needs": ["first"],
        },
    ]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["http_request"])
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.outcome == "succeeded", result.excerpt
    prepares = [summary for _, kind, summary, _ in local_activities(history) if kind == Activities.PREPARE_EFFECT]
    assert len(prepares) == 1 and " · second · " in prepares[0], prepares
    sent = ledger.ledger()
    assert [e["body"].keys() for e in sent] == [{"n"}, {"after"}]  # each once, the second filled in
    expected = effect_key_for(handle.id, "http_request", HttpRequestArgs.model_validate(entry), str(workspace))
    assert sent[0]["idempotency_key"] == expected
