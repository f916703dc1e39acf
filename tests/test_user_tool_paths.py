"""A user's own tools (`perdure.tool`, tests/usertool_sample.py) on the paths a goal takes,
shown from outside on the session's dev server with the production worker: what the fake
services' ledgers received, what the goal charged, the questions it asked, and what its
history scheduled. The same rules as the built-in tools follow: a keyed write is sent once
under its effect key, a checked one looked up first, an irreversible one asks first, an
abort with rollback runs the compensations newest first, and what a paid call reported it
cost is on the goal's budget before the next step is admitted."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from perdure.activities.tools.user.tool_modules import load_toolbox
from perdure.testing.fakes import QUOTES_KEY, LedgerAPI, QuotesAPI, WebhookReceiver
from perdure.workflows.goal.contracts.goal_contracts import Budget
from perdure.workflows.goal.contracts.messages import Abort, Answer, Approve
from perdure.workflows.shared.retries import RETRY_BY_POLICY
from tests import usertool_sample
from tests.builders import agent, gate, openai_profile
from tests.device_rig import InProcessDevice
from tests.helpers import goal_result, running_worker, scheduled_activities, start, statuses, submit, wait_until

SAMPLE = "tests.usertool_sample"
CHARGE = {"amount_cents": 1200, "recipient": "ACME GmbH", "memo": "invoice 7"}


@pytest.fixture(scope="module")
def toolbox():
    return load_toolbox([SAMPLE], with_entry_points=False)


def step(name: str, tool: str, args: dict, needs: list[str] | None = None) -> dict:
    return {"name": name, "kind": "tool", "tool": tool, "args": args, "needs": needs or []}


@pytest.mark.slow
async def test_a_plan_runs_user_tools_once_each_and_charges_what_they_reported_to_the_budget(
    env, task_queue, store, workspace, payments, fake_service, toolbox
):
    books = fake_service(LedgerAPI)
    entry = {"url": books.base_url, "account": "ACME GmbH", "amount_cents": 1200}
    steps = [
        step("price", "quote", {"amount_cents": 1200}),
        step("pay", "charge", CHARGE, ["price"]),
        step("book", "file_entry", entry, ["pay"]),
    ]
    async with running_worker(env, task_queue, store, user_tools=toolbox):
        allowed = ["quote", "charge", "file_entry"]
        handle = await start(env, task_queue, workspace, steps, allowed_tools=allowed, budget=Budget(max_cost_usd=5))
        result = await goal_result(handle)
        history = await handle.fetch_history()

    assert result.outcome == "succeeded", result.failure
    [payment] = payments.ledger()
    assert payment["kind"] == "payment" and payment["amount_cents"] == 1200
    assert payment["idempotency_key"].startswith("fx-")
    [created] = books.ledger()
    assert created["op"] == "create" and created["body"]["effect_key"].startswith("fx-")
    # The quote (a paid read), the charge and the entry reported their fees; nothing else cost anything.
    fees = usertool_sample.QUOTE_FEE_USD + usertool_sample.CHARGE_FEE_USD + usertool_sample.ENTRY_FEE_USD
    assert result.cost_usd == pytest.approx(fees)
    assert '"payment": "' + payment["id"] in store.get_text(result.outputs["pay"])
    kinds = [summary.split(" · ")[0] for _, _, summary in scheduled_activities(history)]
    assert kinds.count("user tools") == 1  # the catalogue, listed once


@pytest.mark.slow
async def test_an_irreversible_user_tool_asks_first_and_abort_with_rollback_runs_its_compensation(
    env, task_queue, store, workspace, payments, toolbox
):
    # No memo: the workflow cannot fill in a user tool's defaults, so the approval ahead is bound
    # to the arguments as the plan gives them, and the call with them needs no second card.
    wire = {k: v for k, v in CHARGE.items() if k != "memo"}
    steps = [step("send", "wire", wire), step("pay", "charge", {**CHARGE, "memo": "fee"}, ["send"]), gate(["pay"])]
    async with running_worker(env, task_queue, store, user_tools=toolbox):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["wire", "charge", "run_command"])
        snapshot = await wait_until(handle, lambda s: s.questions)
        assert payments.ledger() == []  # nothing sent before the person said yes
        [question] = snapshot.questions  # at adoption (issue 38): approved, wire runs without a second card
        assert question.topic == "approvals_ahead" and '"recipient":"ACME GmbH"' in f"{question.title} {question.stuck}"
        await submit(handle, Approve(request_id="c1", question_id=question.id))
        await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
        await submit(handle, Abort(request_id="a1", reason="wrong invoice", rollback=True))
        result = await goal_result(handle)
        history = await handle.fetch_history()

    assert result.outcome == "aborted"
    assert [e["kind"] for e in payments.ledger()] == ["payment", "payment", "refund", "refund"]
    compensations = [s for _, _, s in scheduled_activities(history) if s.startswith("compensate")]
    assert [c.split(" · ")[2] for c in compensations] == ["pay", "send"]  # newest first
    assert all(c.split(" · ")[1] == "refund_charge" for c in compensations)
    # The compensation runs by its own declaration (its timeout, a keyed write's retries), not
    # by a tool perdure knows nothing of: the goal's catalogue lists it with charge and wire.
    for attrs in compensation_schedules(history):
        assert attrs.start_to_close_timeout.ToTimedelta() == timedelta(seconds=usertool_sample.REFUND_TIMEOUT_S)
        assert attrs.retry_policy.maximum_attempts == RETRY_BY_POLICY["keyed"].maximum_attempts
    report = store.get_text(result.report)
    assert report.count("undo by refund_charge done") == 2


@pytest.mark.slow
async def test_abort_with_rollback_undoes_a_user_tool_effect_made_on_a_device_there(
    env, task_queue, store, workspace, payments, toolbox, tmp_path
):
    """The charge runs on the device, so its compensation does too: the goal ends aborted
    (it hung before, its workflow task failing on a compensation missing from its catalogue)."""
    root = tmp_path / "machine-laptop"
    root.mkdir()
    device = InProcessDevice(
        env, task_queue, "laptop", root, user_tools=toolbox, tools=["read_file", "charge", "refund_charge"],
        network=True, approval={"*": "never"},
    )  # fmt: skip
    steps = [{**step("pay", "charge", CHARGE), "device": "laptop"}, gate(["pay"])]
    async with running_worker(env, task_queue, store, user_tools=toolbox):
        await device.start()
        try:
            handle = await start(env, task_queue, workspace, steps, allowed_tools=["charge", "run_command"])
            await wait_until(handle, lambda s: statuses(s).get("gate") == "running")
            await submit(handle, Abort(request_id="a1", reason="wrong invoice", rollback=True))
            result = await asyncio.wait_for(goal_result(handle), 60)
            history = await handle.fetch_history()
        finally:
            await device.stop()

    assert result.outcome == "aborted", result.failure
    assert [e["kind"] for e in payments.ledger()] == ["payment", "refund"]
    [attrs] = compensation_schedules(history)
    assert attrs.task_queue.name.endswith("laptop"), attrs.task_queue.name  # on the device's queue
    assert attrs.start_to_close_timeout.ToTimedelta() == timedelta(seconds=usertool_sample.REFUND_TIMEOUT_S)
    assert "undo by refund_charge done" in store.get_text(result.report)
    assert result.cost_usd == pytest.approx(usertool_sample.CHARGE_FEE_USD)


def compensation_schedules(history):
    """The scheduled-event attributes of every compensation the goal ran, in order."""
    wanted = {event_id for event_id, _, summary in scheduled_activities(history) if summary.startswith("compensate")}
    return [e.activity_task_scheduled_event_attributes for e in history.events if e.event_id in wanted]


@pytest.mark.slow
async def test_an_agent_is_offered_a_user_tool_and_bad_arguments_go_back_to_it_as_data(
    env, task_queue, store, workspace, scripted, payments, toolbox
):
    server = scripted(
        {
            "replies": [
                {"tool_calls": [{"name": "charge", "arguments": {"recipient": "ACME GmbH"}}], "times": 1},
                {"tool_calls": [{"name": "charge", "arguments": CHARGE}], "times": 1},
                {"content": "charged ACME GmbH", "times": 1},
            ]
        }
    )
    steps = [agent("bill", "Charge ACME GmbH 12 EUR for invoice 7.", ["charge"])]
    async with running_worker(env, task_queue, store, openai_profile(server), user_tools=toolbox):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["charge"])
        result = await goal_result(handle)

    assert result.outcome == "succeeded", result.failure
    first, second, _ = server.requests()
    assert first["tools"] == ["charge"]
    # Checked by the tool's own model on the worker; the payments API never saw the bad call.
    assert "bad arguments for charge" in second["last_message"] and "amount_cents" in second["last_message"]
    assert [e["amount_cents"] for e in payments.ledger()] == [1200]
    assert result.cost_usd > usertool_sample.CHARGE_FEE_USD  # the fee and the model's tokens


@pytest.mark.slow
async def test_a_paid_tool_step_is_not_started_when_its_declared_most_no_longer_fits_the_cost_budget(
    env, task_queue, store, workspace, payments, toolbox
):
    """The fee is charged as the call returns: the next step is judged with it spent. Each
    step also reserves the tool's declared most (max_cost_usd, 1 USD) before it starts, so
    the second (0.25 spent + 1 reserved > 1.1) is not started."""
    steps = [step("one", "charge", CHARGE), step("two", "charge", {**CHARGE, "memo": "again"}, ["one"])]
    async with running_worker(env, task_queue, store, user_tools=toolbox):
        handle = await start(
            env, task_queue, workspace, steps, allowed_tools=["charge"], budget=Budget(max_cost_usd=1.1)
        )
        result = await goal_result(handle)

    assert len(payments.ledger()) == 1
    [unfinished] = result.unfinished
    assert unfinished.startswith("two: not started") and "cost budget" in unfinished
    assert result.cost_usd == pytest.approx(usertool_sample.CHARGE_FEE_USD)


@pytest.mark.slow
async def test_a_goal_naming_a_tool_no_worker_loads_fails_saying_so(env, task_queue, store, workspace, toolbox):
    steps = [step("pay", "chrage", CHARGE)]
    async with running_worker(env, task_queue, store, user_tools=toolbox):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["chrage"])
        result = await goal_result(handle)

    assert result.outcome == "failed"
    assert "unknown tool 'chrage'" in (result.failure or "") and "charge" in (result.failure or "")
    assert (result.failure or "").count("unknown tool 'chrage'") == 1, result.failure  # said once


# --- what a paid call costs, however it ends ------------------------------------------


@pytest.mark.slow
async def test_a_paid_read_that_fails_after_billing_is_charged_for_every_attempt(
    env, task_queue, store, workspace, fake_service, toolbox
):
    """fx_quote is billed for its quote, then its rate lookup fails once: the quotes API
    billed two quotes, and the goal is charged two."""
    quotes = fake_service(QuotesAPI, api_key=QUOTES_KEY, rates_failures=1)
    async with running_worker(env, task_queue, store, user_tools=toolbox):
        handle = await start(
            env, task_queue, workspace, [step("fee", "fx_quote", {"amount_cents": 1200})], allowed_tools=["fx_quote"]
        )
        result = await goal_result(handle)

    assert result.outcome == "succeeded", result.failure
    assert [e["kind"] for e in quotes.ledger()] == ["quote", "quote"]
    assert result.cost_usd == pytest.approx(sum(e["price_usd"] for e in quotes.ledger()))


@pytest.mark.slow
async def test_a_paid_read_failing_for_good_is_charged_and_its_secret_stays_out_of_history(
    env, task_queue, store, workspace, fake_service, toolbox
):
    """Every attempt is billed and fails with an httpx error whose message holds the URL,
    key and all: the goal is charged each quote, and the key (fx_quote's declared secret)
    is in no event of the goal's history, nor in what the goal says of the failure."""
    quotes = fake_service(QuotesAPI, api_key=QUOTES_KEY, rates_failures=100)
    async with running_worker(env, task_queue, store, user_tools=toolbox):
        handle = await start(
            env, task_queue, workspace, [step("fee", "fx_quote", {"amount_cents": 1200})], allowed_tools=["fx_quote"]
        )
        result = await goal_result(handle)
        history = await handle.fetch_history()

    assert result.outcome != "succeeded"
    billed = quotes.ledger()
    assert len(billed) == 3  # the read's three attempts (TOOL_RETRY)
    assert result.cost_usd == pytest.approx(sum(e["price_usd"] for e in billed))
    said = " ".join([result.failure or "", *result.unfinished])
    assert "503" in said and "[redacted]" in said, said
    events = "\n".join(str(event) for event in history.events)
    assert "HTTPStatusError" in events and QUOTES_KEY not in events


@pytest.mark.slow
async def test_a_checked_write_whose_answer_was_lost_is_found_by_its_lookup_and_charged_at_its_most(
    env, task_queue, store, workspace, fake_service, toolbox
):
    """The bookkeeping API files the entry and its answer is lost (502): the retry's lookup
    finds it, nothing is filed twice, and, the lookup saying no price, the goal charges the
    tool's max_cost_usd (an unknown cost at its cap)."""
    books = fake_service(LedgerAPI, lose_answers=1)
    entry = {"url": books.base_url, "account": "ACME GmbH", "amount_cents": 1200}
    async with running_worker(env, task_queue, store, user_tools=toolbox):
        handle = await start(
            env, task_queue, workspace, [step("book", "file_entry", entry)], allowed_tools=["file_entry"]
        )
        result = await goal_result(handle)

    assert result.outcome == "succeeded", result.failure
    [created] = books.ledger()
    assert created["op"] == "create"
    assert created["id"] in store.get_text(result.outputs["book"])  # what the lookup found is the output
    assert result.cost_usd == pytest.approx(usertool_sample.ENTRY_MAX_USD)


@pytest.mark.slow
async def test_a_once_write_a_person_says_happened_is_charged_at_its_most(
    env, task_queue, store, workspace, fake_service, toolbox
):
    hook = fake_service(WebhookReceiver)
    hook.reply_status = 502
    note = {"url": hook.base_url, "text": "invoice 7 paid"}
    async with running_worker(env, task_queue, store, user_tools=toolbox):
        handle = await start(env, task_queue, workspace, [step("note", "post_note", note)], allowed_tools=["post_note"])
        snapshot = await wait_until(handle, lambda s: any(q.topic == "uncertain_effect" for q in s.questions))
        question = next(q for q in snapshot.questions if q.topic == "uncertain_effect")
        await submit(handle, Answer(request_id="a1", question_id=question.id, choice="happened"))
        result = await goal_result(handle)

    assert result.outcome == "succeeded", result.failure
    assert len(hook.ledger()) == 1  # posted once; the person's answer sent nothing
    assert result.cost_usd == pytest.approx(usertool_sample.NOTE_MAX_USD)


@pytest.mark.slow
async def test_an_agents_call_of_a_paid_tool_the_budget_cannot_pay_is_not_sent_and_the_agent_is_told_why(
    env, task_queue, store, workspace, scripted, payments, toolbox
):
    """charge may cost up to 1 USD; the goal's cost budget is 0.9: the call is refused before
    it is prepared or sent, and the refusal is the tool's result the model reads."""
    server = scripted(
        {
            "replies": [
                {"tool_calls": [{"name": "charge", "arguments": CHARGE}], "times": 1},
                {"content": "could not charge ACME GmbH within the budget", "times": 1},
            ]
        }
    )
    steps = [agent("bill", "Charge ACME GmbH 12 EUR for invoice 7.", ["charge"])]
    async with running_worker(env, task_queue, store, openai_profile(server), user_tools=toolbox):
        handle = await start(
            env, task_queue, workspace, steps, allowed_tools=["charge"], budget=Budget(max_cost_usd=0.9)
        )
        result = await goal_result(handle)
        history = await handle.fetch_history()

    assert payments.ledger() == []
    _, second = server.requests()
    assert "charge was not called: one call may cost up to 1 USD" in second["last_message"], second["last_message"]
    assert not [s for _, _, s in scheduled_activities(history) if s.startswith("tool charge")]  # never scheduled
    assert result.outcome == "succeeded", result.failure


@pytest.mark.slow
async def test_a_tool_charge_past_the_cost_budget_stops_the_work_in_flight(env, task_queue, store, workspace, toolbox):
    """quote declares no max_cost_usd, so nothing is reserved for it and it is charged after
    the fact: its 0.01 USD takes the goal past its 0.005 USD budget while the gate still
    runs, and the goal stops at once (an emergency stop), the gate with it."""
    steps = [gate(), step("price", "quote", {"amount_cents": 1200})]
    async with running_worker(env, task_queue, store, user_tools=toolbox):
        handle = await start(
            env, task_queue, workspace, steps, allowed_tools=["quote", "run_command"], budget=Budget(max_cost_usd=0.005)
        )
        result = await asyncio.wait_for(goal_result(handle), 60)

    assert result.outcome == "aborted", result.failure
    assert "emergency stop" in (result.failure or ""), result.failure
    assert result.cost_usd == pytest.approx(usertool_sample.QUOTE_FEE_USD)
    [stopped] = result.unfinished  # the gate, cancelled in flight
    assert stopped.startswith("gate: aborted: emergency stop: cost at 200%"), stopped
