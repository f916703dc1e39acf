"""Budgets that match what the user means (issue 15, section 1), end to end on a real
server: the wall budget counts active time only (a park or a wait for a person is
free), a calendar deadline counts everything, a clock stops the goal the moment a
time budget runs out whatever is in flight, a cost budget's hard gate refuses the
steps it cannot cover, and the plan's wrap-up steps run past both, once.
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from temporalio.client import WorkflowExecutionStatus
from typer.testing import CliRunner

from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI, WebhookReceiver
from perdure.workflows.goal.contracts.goal_contracts import Budget
from perdure.workflows.goal.contracts.messages import Approve, Park, Resume
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, llm, openai_profile
from tests.helpers import goal_result, perdure_status, running_worker, start, statuses, submit, wait_until

WALL_S = 31
PAY = {"amount_cents": 1_000, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 3"}


@pytest.fixture
def hook(fake_service) -> WebhookReceiver:
    return fake_service(WebhookReceiver)


async def start_budgeted(env, task_queue, workspace, steps: list[dict], budget: Budget, tools: list[str]):
    """Start a goal running `steps` under `budget`, allowed `tools`, with no drift check."""
    return await start(env, task_queue, workspace, steps, allowed_tools=tools, drift_every=0, budget=budget)


def notice(hook: WebhookReceiver, needs: list[str]) -> dict:
    """A wrap-up step: tell the owner how it went, whatever happened to the rest."""
    args = {"url": f"{hook.base_url}/owner", "payload": {"goal": "finished or stopped"}}
    return {
        "name": "tell-owner",
        "kind": "tool",
        "tool": "notify_webhook",
        "args": args,
        "needs": needs,
        "wrap_up": True,
    }


@pytest.mark.slow
async def test_a_park_and_a_wait_for_a_person_are_not_charged_to_the_wall_budget(
    env, task_queue, store, workspace, scripted, fake_service
):
    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)
    steps = [
        llm("one"),
        {"name": "pay", "kind": "tool", "tool": "make_payment", "args": PAY, "needs": ["one"]},
        llm("two", ["pay"]),
    ]
    deadline = datetime.now(UTC) + timedelta(hours=1)
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(
            env,
            task_queue,
            workspace,
            steps,
            allowed_tools=["make_payment"],
            drift_every=0,
            # Room for the steps' estimates (a tool step's default P80 is 30 s, an llm step's 60 s).
            budget=Budget(max_wall_seconds=61, deadline=deadline),
        )
        await wait_until(handle, lambda s: s.questions)
        # Five seconds parked, then more waiting for the approval. A query reads the goal's
        # clock as of its last workflow task: the resume.
        await submit(handle, Park(request_id="p1", reason="lunch"))
        await asyncio.sleep(5)
        await submit(handle, Resume(request_id="p2"))
        await asyncio.sleep(1)
        waited = await handle.query(GoalWorkflow.progress)
        status = await perdure_status(env, handle.id)
        await submit(handle, Approve(request_id="ok", question_id="q1"))
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    # Counted as active: the first step and the dispatch of the payment, not the five seconds
    # (which would be 8 % of the 61 s budget); the deadline counts them.
    assert statuses(waited)["pay"] == "blocked" and waited.active_seconds < 1.5, waited.active_seconds
    assert waited.budget["wall_seconds"] < 0.03 and waited.budget["calendar_seconds"] > 5 / 3600
    assert [e["kind"] for e in payments.ledger()] == ["payment"]
    # Both time budgets are shown, each saying what it counts.
    [active] = [line for line in status.splitlines() if line.startswith("budget active time")]
    assert "active (parked, waiting for a person or a device not counted)" in active
    [due] = [line for line in status.splitlines() if line.startswith("budget deadline")]
    assert f"due {deadline:%Y-%m-%d %H:%M} UTC (parks included)" in due


def chained_reads(workspace) -> list[dict]:
    """Three reads one after the other. With a wall budget just past a tool step's default
    P80 (30 s) the first may start; after three the tool estimate is theirs (milliseconds),
    so a command step after them is admitted."""
    (workspace / "notes.md").write_text("a note\n")
    return [
        {"name": f"read-{i}", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md", "max_bytes": 100 + i}}
        | ({"needs": [f"read-{i - 1}"]} if i else {})
        for i in range(3)
    ]


@pytest.mark.slow
async def test_a_command_running_past_the_wall_budget_is_stopped_by_the_clock_and_the_wrap_up_runs_once(
    env, task_queue, store, workspace, scripted, hook
):
    reads = chained_reads(workspace)
    build = {"name": "build", "kind": "tool", "tool": "run_command", "args": {"command": "sleep 120"}}
    steps = [*reads, build | {"needs": ["read-2"]}, notice(hook, ["build"])]
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        began = time.monotonic()
        handle = await start(
            env,
            task_queue,
            workspace,
            steps,
            allowed_tools=["read_file", "run_command", "notify_webhook"],
            drift_every=0,
            budget=Budget(max_wall_seconds=WALL_S),
        )
        result = await asyncio.wait_for(goal_result(handle), 90)
        took = time.monotonic() - began
        snapshot = await handle.query(GoalWorkflow.progress)

    # No model call was charged: the clock alone stopped it, at the budget, not at the command's end.
    assert WALL_S <= took < WALL_S + 10, took
    assert result.outcome == "aborted", ([(n.name, n.status, n.error) for n in snapshot.nodes], snapshot.gate_log)
    # At the budget, give or take the workflow task that reads the clock: 100 %, or just past it
    # (a loaded 2-core CI run read it a second late: 32 s of 31 s).
    stopped = re.search(r"emergency stop: active wall time at 10\d% \(3[12] s of 31 s\)", result.failure or "")
    assert stopped, result.failure
    assert {k: v for k, v in statuses(snapshot).items() if not k.startswith("read")} == {
        "build": "abandoned",
        "tell-owner": "succeeded",
    }
    assert len(hook.ledger()) == 1


@pytest.mark.slow
async def test_a_goal_parked_while_a_command_outlives_the_wall_budget_stays_parked_and_is_judged_at_resume(
    env, task_queue, store, workspace, scripted, hook
):
    # The command runs past the 31 s budget while the goal is parked (issue 34, item 3).
    build = {"name": "build", "kind": "tool", "tool": "run_command", "args": {"command": f"sleep {WALL_S + 4}"}}
    check = {"name": "check", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md"}, "needs": ["build"]}
    steps = [*chained_reads(workspace), build | {"needs": ["read-2"]}, check, notice(hook, ["check"])]
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        tools = ["read_file", "run_command", "notify_webhook"]
        handle = await start_budgeted(env, task_queue, workspace, steps, Budget(max_wall_seconds=WALL_S), tools)
        await wait_until(handle, lambda s: statuses(s)["build"] == "running")
        await submit(handle, Park(request_id="lunch", reason="lunch"))
        await wait_until(handle, lambda s: statuses(s)["build"] != "running", timeout_s=WALL_S + 30)
        await asyncio.sleep(4)  # parked with nothing running
        parked = await handle.query(GoalWorkflow.progress)
        # Parked all along: the command settled, nothing new started, no verdict ended the goal.
        described = await handle.describe()
        assert described.status == WorkflowExecutionStatus.RUNNING, (parked.failure, parked.gate_log)
        await submit(handle, Resume(request_id="back"))
        result = await asyncio.wait_for(handle.result(), 30)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert parked.phase == "parked" and statuses(parked)["build"] == "succeeded", statuses(parked)
    assert statuses(parked)["check"] == "pending"
    assert not [e for e in parked.gate_log if "emergency stop" in e], parked.gate_log
    # Judged at resume: the command's time is active time, the park after it is not.
    assert result.outcome == "partial", result.failure
    assert statuses(snapshot)["check"] == "abandoned" and statuses(snapshot)["tell-owner"] == "succeeded"
    check_error = next(n.error for n in snapshot.nodes if n.name == "check") or ""
    spent = re.search(r"active wall time at 1\d\d% \((\d+) s of 31 s\): only wrap-up nodes run", check_error)
    assert spent and WALL_S + 4 <= int(spent[1]) <= WALL_S + 7, check_error
    assert len(hook.ledger()) == 1


async def test_a_charge_past_the_cost_budget_while_parked_waits_for_the_resume(
    env, task_queue, store, workspace, scripted, hook
):
    # "spend" bills $3 against a $0.10 budget and answers while the goal is parked; "slow" is
    # still running when the goal resumes, so the verdict made then is an emergency stop.
    dear = {"when_last": "step: spend", "content": "step done", "delay_s": 1.5}
    dear["usage"] = {"input_tokens": 0, "output_tokens": 1_500_000}
    slow = {"when_last": "step: slow", "content": "step done", "delay_s": 6}
    steps = [llm("spend"), llm("slow"), llm("next", ["spend"]), notice(hook, ["next", "slow"])]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": [dear, slow]}))):
        # Room for both llm steps' estimates ($0.03 each) to run side by side.
        handle = await start_budgeted(env, task_queue, workspace, steps, Budget(max_cost_usd=0.1), ["notify_webhook"])
        await wait_until(handle, lambda s: statuses(s)["spend"] == "running" and statuses(s)["slow"] == "running")
        await submit(handle, Park(request_id="lunch", reason="lunch"))
        parked = await wait_until(handle, lambda s: statuses(s)["spend"] != "running")
        await submit(handle, Resume(request_id="back"))
        result = await asyncio.wait_for(goal_result(handle), 30)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert parked.phase == "parked" and statuses(parked)["spend"] == "succeeded", (parked.failure, parked.gate_log)
    assert statuses(parked)["slow"] == "running" and parked.cost_usd == pytest.approx(3.0)
    assert result.outcome == "aborted" and "emergency stop: cost at" in (result.failure or ""), result.failure
    ended = {"spend": "succeeded", "slow": "abandoned", "next": "abandoned", "tell-owner": "succeeded"}
    assert statuses(snapshot) == ended
    assert len(hook.ledger()) == 1


async def test_a_cost_budget_refuses_the_step_it_cannot_cover_and_the_wrap_up_step_still_runs_once(
    env, task_queue, store, workspace, scripted, hook
):
    # Each call bills $0.30 (100k tokens in at $1/M, 100k out at $2/M): two fit in $0.70, three do not.
    costly = {
        "when": "PERDURE-STEP",
        "content": "step done",
        "usage": {"input_tokens": 100_000, "output_tokens": 100_000},
    }
    steps = [llm("s0"), llm("s1", ["s0"]), llm("s2", ["s1"]), notice(hook, ["s2"])]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": [costly]}))):
        handle = await start_budgeted(env, task_queue, workspace, steps, Budget(max_cost_usd=0.7), ["notify_webhook"])
        result = await handle.result()
        snapshot = await handle.query(GoalWorkflow.progress)

    assert statuses(snapshot) == {"s0": "succeeded", "s1": "succeeded", "s2": "abandoned", "tell-owner": "succeeded"}
    s2 = next(n for n in snapshot.nodes if n.name == "s2")
    assert "would exceed the remaining $0.1000 of the $0.7000 cost budget" in s2.error, s2.error
    assert snapshot.cost_usd == pytest.approx(0.6)
    assert result.outcome == "partial"
    assert len(hook.ledger()) == 1


async def test_the_eta_is_in_the_progress_query_and_in_perdure_status_while_the_goal_runs(
    env, task_queue, store, workspace, scripted
):
    from tests.builders import gate

    steps = [llm("a"), llm("b"), gate(["a", "b"]), llm("c", ["gate"]), llm("d", ["c"])]
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(env, task_queue, workspace, steps, drift_every=0)
        running = await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
        status = await perdure_status(env, handle.id)
        (workspace / "GO").touch()
        await handle.result()

    assert running.eta and running.eta_confidence in ("low", "medium", "high")
    assert f"ETA: {running.eta}" in status


def test_start_refuses_a_deadline_in_the_past_or_not_a_time_with_a_clear_error():
    with mock.patch.object(terminal.err_console, "_width", 200):
        for value, says in [("2001-01-01T09:00", "is in the past"), ("tomorrow", "is not an ISO 8601 time")]:
            result = CliRunner().invoke(cli.app, ["start", "a goal", "--deadline", value])
            assert result.exit_code == 2, result.output
            assert says in result.output and "Traceback" not in result.output


async def test_a_branch_spending_far_over_its_fair_share_gets_no_successor_while_the_others_go_on(
    env, task_queue, store, workspace, scripted
):
    # $100 for ten steps: a fair share of $10 per node, twice that before a branch is cut.
    dear = {"when": "Do dear.", "content": "step done", "usage": {"input_tokens": 0, "output_tokens": 12_500_000}}
    steps = [
        llm("cheap"),
        llm("cheap-next", ["cheap"]),
        llm("dear"),  # bills $25 at $2 per million output tokens
        llm("dear-next", ["dear"]),
        *[llm(f"filler-{i}") for i in range(6)],
    ]
    server = scripted({"replies": [dear, *STEP_REPLY["replies"]]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps, drift_every=0, budget=Budget(max_cost_usd=100))
        result = await handle.result()
        snapshot = await handle.query(GoalWorkflow.progress)

    nodes = {n.name: n for n in snapshot.nodes}
    assert nodes["cheap-next"].status == "succeeded" and nodes["dear"].status == "succeeded"
    assert nodes["dear-next"].status == "abandoned"
    assert "branch dear" in nodes["dear-next"].error and "over the $20.0000 limit" in nodes["dear-next"].error
    assert result.outcome == "partial"


def test_the_planner_is_told_of_wrap_up_steps_and_of_a_commands_replay_and_network_flags():
    from perdure.activities.models.model_activities import planner_system_prompt
    from perdure.workflows.goal.contracts.goal_contracts import ModelContext

    prompt = planner_system_prompt(ModelContext(profile="test", goal="g"), ["run_command", "notify_webhook"])
    assert "`wrap_up: true` marks wrap-up work" in prompt and "runs even when the budget is spent" in prompt
    assert '`replay: "safe"`' in prompt and "`network: true`" in prompt


async def test_an_emergency_stop_whose_wrap_up_step_asks_a_person_still_ends_with_a_report(
    env, task_queue, store, workspace, scripted, fake_service
):
    from tests.builders import gate

    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)
    # One call bills $3 against a $0.05 budget while the gate still runs: an emergency stop.
    dear = {"when": "PERDURE-STEP", "content": "step done", "usage": {"input_tokens": 0, "output_tokens": 1_500_000}}
    settle = {"name": "settle", "kind": "tool", "tool": "make_payment", "args": PAY, "needs": ["spend"]}
    steps = [llm("spend"), gate(), settle | {"wrap_up": True}]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": [dear]}))):
        handle = await start(
            env,
            task_queue,
            workspace,
            steps,
            allowed_tools=["run_command", "make_payment"],
            drift_every=0,
            budget=Budget(max_cost_usd=0.05),
        )
        # The wrap-up payment asks for a confirmation nobody can give while the goal stops.
        result = await asyncio.wait_for(goal_result(handle), 30)

    assert result.outcome == "aborted" and "emergency stop: cost at" in (result.failure or ""), result.excerpt
    assert payments.ledger() == []
    assert "settle" in " ".join(result.unfinished)
