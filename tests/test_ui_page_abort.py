"""perdure ui's page shows an abort as requested, then achieved (issue 38, item 5), in a real
browser (Debian's headless Chromium): while the payment it waits for lands and its refund
runs, the goal's summary says "abort requested" with what still runs and what is to undo;
once the refund has settled, "aborted" with what was undone. Live, from the goal's events."""

from __future__ import annotations

import pytest

from perdure.testing.browser import CHROMIUM, Browser
from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI
from perdure.workflows.goal.contracts.messages import Abort, Approve
from tests.builders import gate, openai_profile
from tests.helpers import goal_result, running_worker, start, submit, until, wait_until

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium (make installs it)"),
    pytest.mark.process,  # starts Chromium
    pytest.mark.slow,
]

SLOW_S = 3.0
PAY = {"amount_cents": 12_500, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 42"}
ABORT = "document.getElementById('abort')"


async def test_the_page_shows_an_abort_requested_while_its_refund_runs_then_aborted_with_what_was_undone(
    env, task_queue, store, workspace, ui, tmp_path, monkeypatch, scripted, fake_service
):
    monkeypatch.setenv("PERDURE_HOME", str(tmp_path))  # the server reads the report the worker wrote
    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY, respond_delay_s=SLOW_S)
    steps = [{"name": "pay", "kind": "tool", "tool": "make_payment", "args": PAY, "defer": False}, gate()]
    profile = openai_profile(scripted({"replies": []}))
    async with running_worker(env, task_queue, store, profile), Browser(tmp_path / "profile") as page:
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["make_payment", "run_command"])
        await wait_until(handle, lambda s: s.questions)
        await submit(handle, Approve(request_id="c1", question_id="q1"))
        await until(lambda: payments.ledger())  # the payment is made; its answer is seconds away
        await page.open(f"{ui}/goals/{handle.id}")
        await page.wait_for("!!document.getElementById('summary')")
        await submit(handle, Abort(request_id="a1", reason="wrong invoice", rollback=True))
        requested = await page.wait_for(f"{ABORT}?.dataset.stage === 'requested' && {ABORT}.textContent")
        undoing = await page.wait_for(
            'document.querySelector(\'#abort li[data-list="to undo"][data-status="running"]\')?.textContent'
        )
        achieved = await page.wait_for(f"{ABORT}?.dataset.stage === 'achieved' && {ABORT}.textContent")
        result = await goal_result(handle)

    assert result.outcome == "aborted"
    assert [e["kind"] for e in payments.ledger()] == ["payment", "refund"]
    assert "abort requested" in requested and "by message a1" in requested, requested
    assert "still running: pay (make_payment)" in requested, requested
    assert "to undo: pay · make_payment by refund_payment (pending)" in requested, requested
    assert undoing == "to undo: pay · make_payment by refund_payment (running)", undoing
    assert achieved.startswith("aborted ") and "rollback: yes · wrong invoice" in achieved, achieved
    assert "undone: pay · make_payment by refund_payment" in achieved and "to undo" not in achieved, achieved
    assert page.errors == []
