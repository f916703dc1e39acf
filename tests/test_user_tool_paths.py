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
from perdure.testing.fakes import PAYMENTS_KEY, LedgerAPI, PaymentsAPI
from perdure.workflows.goal.contracts.goal_contracts import Budget
from perdure.workflows.goal.contracts.messages import Abort, Approve
from perdure.workflows.shared.retries import RETRY_BY_POLICY
from tests import usertool_sample
from tests.builders import agent, gate, openai_profile
from tests.device_rig import InProcessDevice
from tests.helpers import goal_result, running_worker, scheduled_activities, start, statuses, submit, wait_until

SAMPLE = "tests.usertool_sample"
CHARGE = {"amount_cents": 1200, "recipient": "ACME GmbH", "memo": "invoice 7"}


@pytest.fixture
def payments(fake_service) -> PaymentsAPI:
    return fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)


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
    # The quote (a paid read) and the charge reported their fees; nothing else cost anything.
    assert result.cost_usd == pytest.approx(usertool_sample.QUOTE_FEE_USD + usertool_sample.CHARGE_FEE_USD)
    assert '"payment": "' + payment["id"] in store.get_text(result.outputs["pay"])
    kinds = [summary.split(" · ")[0] for _, _, summary in scheduled_activities(history)]
    assert kinds.count("user tools") == 1  # the catalogue, listed once


@pytest.mark.slow
async def test_an_irreversible_user_tool_asks_first_and_abort_with_rollback_runs_its_compensation(
    env, task_queue, store, workspace, payments, toolbox
):
    steps = [step("send", "wire", CHARGE), step("pay", "charge", {**CHARGE, "memo": "fee"}, ["send"]), gate(["pay"])]
    async with running_worker(env, task_queue, store, user_tools=toolbox):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["wire", "charge", "run_command"])
        snapshot = await wait_until(handle, lambda s: s.questions)
        assert payments.ledger() == []  # nothing sent before the person said yes
        [question] = snapshot.questions
        assert question.topic == "confirm_effect" and '"recipient":"ACME GmbH"' in f"{question.title} {question.stuck}"
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
async def test_a_paid_tool_past_the_cost_budget_stops_the_steps_after_it(
    env, task_queue, store, workspace, payments, toolbox
):
    """The fee is charged as the call returns: the next step is judged with it spent. Each
    step also reserves the tool's declared most (max_cost_usd, 1 USD) before it starts."""
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
