"""Approvals collected ahead (issue 38, item 1): when a plan is adopted, one card lists
every step that will wait for a person (irreversible, or on a device whose rules ask) with
the call it will make; an early approval is bound to a digest of that call, so the payment
runs later (as late as risk ordering puts it) with no second card; a step whose arguments
changed after approval is asked again, and the card shows the old and the new; refusing
some drops them. A card replaced by a re-plan, a card none of whose steps can still run,
a device write bound to the folder it first ran in; the answer with steps from the CLI and
perdure.Client, bad steps refused in one line. From outside: the progress query's cards,
the fake payments service's ledger, the order of activities in the goal's history, what
`perdure status` and `perdure answer` print."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

import perdure
from perdure.workflows.goal.contracts.goal_contracts import AheadApproval
from perdure.workflows.goal.contracts.messages import Answer, Queue, Rewind
from perdure.workflows.goal.contracts.state import Question
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.rules import approvals_ahead
from perdure.workflows.shared.canonical import digest_of
from tests.builders import STEP_REPLY, gate, llm, openai_profile
from tests.device_rig import InProcessDevice, question_of, registry_says, write_on
from tests.helpers import (
    cards_until_the_end,
    completed_at,
    first_event,
    goal_result,
    running_worker,
    start,
    statuses,
    submit,
    wait_until,
)
from tests.helpers import run_cli as cli


def pay_step(name: str, cents: int = 12_500, **extra) -> dict:
    args = {"amount_cents": cents, "currency": "EUR", "recipient": "ACME GmbH", "memo": f"invoice {name}"}
    return {"name": name, "kind": "tool", "tool": "make_payment", "args": args, **extra}


@pytest.mark.slow
async def test_two_payments_are_approved_once_on_one_card_at_the_start_and_run_last(
    env, task_queue, store, workspace, payments
):
    # The local work is a gate (it ends when the test creates GO), not a timed command: the card
    # must be seen while it is still to do, however slowly a loaded machine reaches the card.
    steps = [pay_step("pay-a"), pay_step("pay-b", needs=["pay-a"]), gate()]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["make_payment", "run_command"])
        first = await wait_until(handle, lambda s: s.questions)
        assert statuses(first)["gate"] in ("pending", "running")  # asked while the work goes on
        [card] = first.questions
        assert card.topic == "approvals_ahead"
        assert [a.step for a in card.ahead] == ["pay-a", "pay-b"]
        assert all('"amount_cents":12500' in a.arguments and a.digest for a in card.ahead)
        await submit(handle, Answer(request_id="ok", question_id=card.id, choice="approve"))
        (workspace / "GO").touch()
        seen = await cards_until_the_end(handle)
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.outcome == "succeeded", result.excerpt
    assert [e["kind"] for e in payments.ledger()] == ["payment", "payment"]
    assert completed_at(history, "gate") < first_event(history, "pay-a")  # run last, as risk ordering says
    assert seen - {card.id} == set()  # no other card, ever


@pytest.mark.slow
async def test_a_refused_step_is_dropped_with_what_needs_it_and_an_approved_one_runs(
    env, task_queue, store, workspace, payments
):
    steps = [pay_step("pay-a"), pay_step("pay-b", needs=["pay-a"]), pay_step("pay-c")]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["make_payment"])
        card = (await wait_until(handle, lambda s: s.questions)).questions[0]
        await submit(handle, Answer(request_id="some", question_id=card.id, choice="refuse_some", steps=["pay-a"]))
        result = await asyncio.wait_for(handle.result(), 30)

    assert [e["memo"] for e in payments.ledger()] == ["invoice pay-c"]
    assert result.outcome == "partial", result.excerpt


@pytest.mark.slow
async def test_an_argument_changed_after_approval_asks_again_and_shows_old_and_new(
    env, task_queue, store, workspace, payments, scripted
):
    revised = {"steps": [gate(), pay_step("pay-a", cents=13_000, needs=["gate"])]}
    server = scripted({"replies": [{"when": "Revise the current plan", "json": revised}, *STEP_REPLY["replies"]]})
    steps = [gate(), pay_step("pay-a", needs=["gate"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["make_payment", "run_command"])
        card = (await wait_until(handle, lambda s: s.questions)).questions[0]
        await submit(handle, Answer(request_id="ok", question_id=card.id, choice="approve"))
        await submit(handle, Queue(request_id="q", text="Pay the new invoice of 130 EUR too."))
        (workspace / "GO").touch()
        # The follow-up plan changes pay-a's amount: its approval was bound to 125 EUR.
        again = await wait_until(handle, lambda s: any(q.id != card.id for q in s.questions))
        assert [e["amount_cents"] for e in payments.ledger()] == [12_500]  # not the changed call
        [second] = again.questions
        assert second.topic == "approvals_ahead"
        assert '"amount_cents":12500' in second.ahead[0].approved_before
        assert '"amount_cents":13000' in second.ahead[0].arguments
        await submit(handle, Answer(request_id="ok2", question_id=second.id, choice="approve"))
        result = await asyncio.wait_for(handle.result(), 30)

    assert result.outcome == "succeeded", result.excerpt
    assert [e["amount_cents"] for e in payments.ledger()] == [12_500, 13_000]


@pytest.mark.slow
async def test_a_card_still_open_when_the_plan_changes_is_replaced_and_its_waiting_step_waits_for_the_new_one(
    env, task_queue, store, workspace, payments, scripted
):
    pinned = pay_step("pay-a", defer=False)  # runs at once, so it waits for the first card
    revised = {"steps": [pinned, llm("one"), llm("two", ["one"]), pay_step("pay-b", needs=["two"])]}
    server = scripted(
        {
            "replies": [
                {"when": "PERDURE-DRIFT", "times": 1, "json": {"on_track": False, "reason": "pay the second too"}},
                {"when": "PERDURE-DRIFT", "json": {"on_track": True, "reason": "fine"}},
                {"when": "Revise the current plan", "json": revised},
                *STEP_REPLY["replies"],
            ]
        }
    )
    steps = [pinned, llm("one"), llm("two", ["one"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["make_payment"], drift_every=2)
        first = (await wait_until(handle, lambda s: s.questions)).questions[0]
        second = await wait_until(handle, lambda s: any(q.id != first.id for q in s.questions))
        [card] = second.questions  # the first is closed: nobody answers a list that changed
        assert [a.step for a in card.ahead] == ["pay-a", "pay-b"] and statuses(second)["pay-a"] == "blocked"
        await submit(handle, Answer(request_id="ok", question_id=card.id, choice="approve"))
        seen = await cards_until_the_end(handle)
        result = await asyncio.wait_for(handle.result(), 30)

    assert result.outcome == "succeeded", result.excerpt
    assert [e["memo"] for e in payments.ledger()] == ["invoice pay-a", "invoice pay-b"]
    assert seen - {card.id} == set()  # no other card after it


# --- the answer with steps, from outside -------------------------------------------------


@pytest.mark.slow
async def test_the_cli_and_the_client_answer_some_steps_and_bad_steps_are_refused_in_one_line(
    env, task_queue, store, workspace, payments, tmp_path
):
    (workspace / "memo.txt").write_text("invoice 9, April")
    steps = [
        {"name": "memo", "kind": "tool", "tool": "read_file", "args": {"path": "memo.txt"}},
        pay_step("pay-a"),
        pay_step("pay-b", needs=["pay-a"]),
        {**pay_step("pay-t"), "args": {**pay_step("pay-t")["args"], "memo": "{{steps.memo}}"}, "needs": ["memo"]},
    ]
    client = perdure.Client(env.client)
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["make_payment", "read_file"])
        await wait_until(handle, lambda s: s.questions)
        shown = (await cli(env, tmp_path, "status", handle.id)).stdout
        answer = ("answer", handle.id, "q1")
        said = {
            "unknown step": await cli(env, tmp_path, *answer, "approve_some", "--steps", "pay-x", code=2),
            "steps with approve": await cli(env, tmp_path, *answer, "approve", "--steps", "pay-a", code=2),
            "no steps": await cli(env, tmp_path, *answer, "refuse_some", code=2),
            "bad name": await cli(env, tmp_path, *answer, "refuse_some", "--steps", "Pay A", code=2),
        }
        with pytest.raises(perdure.InvalidRequest) as not_sent:
            await client.answer(handle.id, "q1", "refuse_some", steps=["Pay A"])
        still = await handle.query(GoalWorkflow.progress)
        refused = await client.answer(handle.id, "q1", "refuse_some", steps=["pay-b"])
        confirm = await wait_until(handle, lambda s: any(q.topic == "confirm_effect" for q in s.questions))
        said["steps on a card that takes none"] = await cli(
            env, tmp_path, "answer", handle.id, confirm.questions[0].id, "approve", "--steps", "pay-t", code=2
        )
        await cli(env, tmp_path, "approve", handle.id, confirm.questions[0].id)
        result = await asyncio.wait_for(handle.result(), 30)

    # `perdure status` lists the card's steps, a line each, and how to name some.
    assert '  · pay-a: make_payment {"amount_cents":12500,"currency":"EUR","memo":"invoice pay-a"' in shown, shown
    assert '"memo":"{{steps.memo}}","recipient":"ACME GmbH"} (will ask when known)' in shown, shown
    assert f"perdure answer {handle.id} q1 approve_some --steps STEP,STEP" in shown, shown
    expected = {
        "unknown step": "rejected: step(s) pay-x are not on q1 (its steps: pay-a, pay-b, pay-t)",
        "steps with approve": "rejected: approve is about every step on q1; name steps with approve_some",
        "no steps": "rejected: refuse_some names the steps it is about (steps on q1: pay-a, pay-b, pay-t)",
        "bad name": "error: steps.0: String should match pattern",
        "steps on a card that takes none": f"rejected: {confirm.questions[0].id} takes no steps",
    }
    for case, words in expected.items():
        text = said[case].stdout + said[case].stderr
        assert words in text and len(text.strip().splitlines()) == 1, (case, text)
    assert "steps.0: String should match pattern" in str(not_sent.value)
    assert [q.id for q in still.questions] == ["q1"]  # nothing lost: the card waits as it was
    assert refused.receipt is not None and refused.receipt.status == "applied"
    assert [e["memo"] for e in payments.ledger()] == ["invoice pay-a", "invoice 9, April"]
    assert result.outcome == "partial", result.excerpt  # pay-b refused


@pytest.mark.slow
async def test_a_card_whose_steps_can_no_longer_run_is_closed_and_the_goal_ends_without_an_answer(
    env, task_queue, store, workspace, payments
):
    # fetch fails only once the test has seen the card (a fetch that failed at once closed the
    # card before a loaded machine's first poll saw it).
    command = "while [ ! -f GO ]; do sleep 0.05; done; exit 1"
    fetch = {"name": "fetch", "kind": "tool", "tool": "run_command", "args": {"command": command}}
    async with running_worker(env, task_queue, store):
        steps = [fetch, pay_step("pay", needs=["fetch"])]
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["run_command", "make_payment"])
        await wait_until(handle, lambda s: s.questions)
        (workspace / "GO").touch()
        result = await asyncio.wait_for(goal_result(handle), 30)  # nobody answers: fetch fails, pay cannot run
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "failed" and snapshot.questions == [], result.excerpt
    assert payments.ledger() == []


# --- steps on a device or the goal's host ---------------------------------------------------


@pytest.mark.slow
async def test_a_device_write_is_on_the_card_with_the_payment_and_its_approval_is_bound_to_the_root_it_ran_in(
    env, task_queue, store, workspace, payments, devices, tmp_path
):
    async with running_worker(env, task_queue, store):
        laptop = devices("laptop")
        await laptop.start()
        steps = [write_on("laptop"), pay_step("pay-a"), gate(["save", "pay-a"])]  # the gate keeps the goal on
        tools = ["write_file", "make_payment", "run_command"]
        handle = await start(env, task_queue, workspace, steps, allowed_tools=tools)
        [card] = (await wait_until(handle, lambda s: s.questions)).questions
        await submit(handle, Answer(request_id="ok", question_id=card.id, choice="approve"))
        await wait_until(handle, lambda s: statuses(s).get("gate") == "running")
        ran = await handle.query(GoalWorkflow.progress)
        # The laptop now serves another folder: the approval was for the one it ran in.
        await laptop.stop()
        await registry_says(env, task_queue, "laptop", online=False)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        moved = InProcessDevice(env, task_queue, "laptop", elsewhere)
        await moved.start()
        try:
            await wait_until(handle, lambda s: "session 2" in s.devices.get("laptop", ""))
            await submit(handle, Rewind(request_id="again", node="save", why="write it once more"))
            again = await question_of(handle, "confirm_device_call")
            await handle.terminate()
        finally:
            await moved.stop()

    assert [(a.step, a.on) for a in card.ahead] == [("save", "laptop"), ("pay-a", None)]
    assert 'save: write_file {"base_version":null,"content":"hello\\n","path":"out.txt"} on laptop;' in card.stuck
    assert ran.questions == [] and (laptop.root / "out.txt").read_text() == "hello\n"  # no card on the device
    assert "approved earlier as {" in again.stuck and f"on laptop in {laptop.root}; now different" in again.stuck
    assert str(elsewhere) in again.stuck and not (elsewhere / "out.txt").exists()


# --- the pure rules -----------------------------------------------------------------------


def ahead_card(*entries: AheadApproval) -> Question:
    return Question(
        id="q1", topic="approvals_ahead", title="t", done="", stuck="", options=[], recommendation="",
        asked_at=datetime(2026, 12, 1, tzinfo=UTC), ahead=list(entries),
    )  # fmt: skip


def entry(step: str, digest: str | None = "d") -> AheadApproval:
    return AheadApproval(step=step, tool="make_payment", arguments="{}", digest=digest)


@pytest.mark.parametrize(
    ("choice", "steps", "decided"),
    [
        ("approve", [], {"a": "approved", "b": "approved", "t": "ask"}),
        ("reject", [], {"a": "refused", "b": "refused", "t": "refused"}),
        ("approve_some", ["a", "t"], {"a": "approved", "b": "ask", "t": "ask"}),
        ("refuse_some", ["a"], {"a": "refused", "b": "approved", "t": "ask"}),
    ],
)
def test_an_answer_decides_each_step_and_a_template_is_never_approved_ahead(choice, steps, decided):
    card = ahead_card(entry("a"), entry("b"), entry("t", digest=None))
    approvals_ahead.decide(card, choice, steps)
    assert {e.step: e.decision for e in card.ahead} == decided


def test_a_call_matches_its_approval_by_the_validated_or_the_plans_own_arguments():
    args = {"amount_cents": 1200, "recipient": "ACME GmbH"}
    approved = entry("wire", digest=digest_of(args))
    pay = "make_payment"
    assert approvals_ahead.matches(approved, pay, args, prepared_digest="other")  # a user tool's defaults filled in
    assert approvals_ahead.matches(approved, pay, {**args, "memo": "x"}, prepared_digest=digest_of(args))
    assert not approvals_ahead.matches(approved, pay, {**args, "amount_cents": 1300}, prepared_digest="other")
    assert not approvals_ahead.matches(entry("t", digest=None), pay, args, prepared_digest=digest_of(args))
    # A re-plan that keeps the step's name and arguments but swaps its tool: nothing runs on it.
    assert not approvals_ahead.matches(approved, "cancel_order", args, prepared_digest=digest_of(args))


def test_a_card_nobody_answered_refuses_what_it_could_approve_and_asks_the_rest_when_known():
    card = ahead_card(entry("a"), entry("t", digest=None))
    card.status = "expired"
    approvals_ahead.decide(card, "reject", [])
    assert {e.step: e.decision for e in card.ahead} == {"a": "refused", "t": "ask"}
