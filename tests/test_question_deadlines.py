"""Every question has a deadline, a reminder before it and a safe outcome on expiry (issue 38,
item 2), on a real server: durable timers in history, the reminder in the gate log, status,
`perdure questions`, the event stream and the owner's router inbox; the expiry recorded as
expiry (never as a person's answer) in the gate log, the report and the event stream; deny,
park and abort; an assumption only for a tool that declares it safe, refused in one line
otherwise; across continue-as-new and a worker SIGKILL. A payment is first asked on the
approvals-ahead card at adoption (item 1), which takes its step's deadline."""

from __future__ import annotations

import asyncio
import os
import textwrap
import uuid
from datetime import timedelta
from unittest import mock

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from typer.testing import CliRunner

from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.testing.fakes import WebhookReceiver
from perdure.workflows.goal.contracts.events import QuestionChanged
from perdure.workflows.goal.contracts.messages import Approve, Resume
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.router.router_contracts import (
    ROUTER_WORKFLOW,
    RouterHandlers,
    RouterInput,
    RouterView,
    router_id,
)
from perdure.workflows.shared.search_attributes import OWNER
from tests.builders import STEP_REPLY, llm, openai_profile, spec
from tests.helpers import (
    events_until_end,
    goal_result,
    new_goal_id,
    perdure_status,
    run_ids,
    running_worker,
    start,
    statuses,
    submit,
    wait_until,
)
from tests.subprocess_rig import perdure

pytestmark = [pytest.mark.slow]

PAY = {"amount_cents": 1_000, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 38"}
TIMER_SUMMARY = "a question's reminder or deadline"


def pay_step(**deadline) -> dict:
    return {"name": "pay", "kind": "tool", "tool": "make_payment", "args": PAY, "question_deadline": deadline}


def question_timers(history, fired_only: bool = True) -> list[tuple[timedelta, object]]:
    """(start-to-fire, fired at or None) of every timer the goal set for a question's reminder or
    deadline (only those that fired, unless not `fired_only`)."""
    started, fired = {}, {}
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            summary = event.user_metadata.summary.data.decode().strip('"') if event.HasField("user_metadata") else ""
            if summary == TIMER_SUMMARY:
                started[event.event_id] = event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        elif event.event_type == EventType.EVENT_TYPE_TIMER_FIRED:
            fired[event.timer_fired_event_attributes.started_event_id] = event.event_time.ToDatetime()
    return [(started[i], fired.get(i)) for i in sorted(started) if i in fired or not fired_only]


def question_events(events, question: str = "q1") -> list[QuestionChanged]:
    return [e for e in events if isinstance(e, QuestionChanged) and e.question == question]


async def cli_output(env, *args: str, user: str = "nobody", width: int = 400) -> str:
    """What `perdure ARGS` prints as `user`, run in this process against the test's server."""
    variables = {"PERDURE_TEMPORAL": env.client.service_client.config.target_host, "PERDURE_USER": user}
    with mock.patch.object(terminal.console, "_width", width):
        result = await asyncio.to_thread(CliRunner().invoke, cli.app, list(args), env=variables)
    assert result.exit_code == 0, result.output
    return result.output


async def test_a_ten_minute_deadline_reminds_at_its_time_then_denies_and_the_goal_goes_on(
    ts_env, task_queue, store, workspace, scripted, payments
):
    """The Done-when: 10 minutes, reminder 2 minutes before, deny; time-skipped."""
    steps = [
        pay_step(after="10m", remind_before="2m", on_expiry="deny"),
        llm("receipt", ["pay"]),  # needs the payment: dropped with it
        llm("summary"),  # independent: the goal goes on with it
    ]
    async with running_worker(ts_env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(ts_env, task_queue, workspace, steps, allowed_tools=["make_payment"], drift_every=0)
        result = await goal_result(handle)
        history = await handle.fetch_history()
        snapshot = await handle.query(GoalWorkflow.progress)
        events = await events_until_end(ts_env, handle.id)
        log = await handle.query(GoalWorkflow.decisions)
        status = await perdure_status(ts_env, handle.id)

    assert result.outcome == "partial", result.excerpt
    assert "expired question q1 (Approve ahead: 'pay'): expired (deny), nobody answered" in status
    assert payments.ledger() == []  # nobody confirmed it: never sent
    assert statuses(snapshot) == {"pay": "failed", "receipt": "abandoned", "summary": "succeeded"}
    pay = next(n for n in snapshot.nodes if n.name == "pay")
    assert "make_payment not run: q1 expired unanswered" in (pay.error or ""), pay.error
    # Two durable timers: the reminder 8 minutes after the question, then the deadline 2 minutes later.
    (remind_wait, reminded), (expiry_wait, expired) = question_timers(history)
    assert timedelta(minutes=7, seconds=55) <= remind_wait <= timedelta(minutes=8)
    assert timedelta(minutes=1, seconds=55) <= expiry_wait <= timedelta(minutes=2)
    assert timedelta(minutes=1, seconds=59) <= expired - reminded <= timedelta(minutes=2, seconds=5)
    # The event stream: asked with its deadline, reminded, then expired (not answered).
    asked, reminder, expiry = question_events(events)
    assert asked.status == "open" and asked.on_expiry == "deny" and asked.reminded_at is None
    assert asked.deadline_at - asked.asked_at == timedelta(minutes=10)
    remind_at = asked.deadline_at - timedelta(minutes=2)
    assert reminder.status == "open" and remind_at <= reminder.reminded_at <= remind_at + timedelta(seconds=5)
    assert expiry.status == "expired" and expiry.answer == "reject" and expiry.expired_at >= asked.deadline_at
    gates = " | ".join(snapshot.gate_log)
    assert "reminder: q1 (Approve ahead: 'pay') is unanswered; it expires at" in gates
    assert "expired: q1 (Approve ahead: 'pay') unanswered by" in gates and "deny (reject)" in gates
    assert snapshot.expired_questions == ["question q1 (Approve ahead: 'pay'): expired (deny), nobody answered"]
    # The decision log says who decided: the deadline, not a person.
    [expiry] = [d for d in log.recent if d.kind == "expiry"]
    assert expiry.who == "expired" and expiry.about == ["pay"] and "deny (reject)" in expiry.text
    assert not [d for d in log.recent if d.kind == "answer"]
    report = store.get_text(result.report)
    assert "expired (deny), nobody answered" in report
    assert "a person refused" not in report  # an expiry is not a person's answer


async def test_park_on_expiry_parks_the_goal_and_keeps_the_question_for_a_person(
    ts_env, task_queue, store, workspace, scripted, payments
):
    steps = [pay_step(after="30m", on_expiry="park"), llm("summary")]
    async with running_worker(ts_env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(ts_env, task_queue, workspace, steps, allowed_tools=["make_payment"], drift_every=0)
        parked = await wait_until(handle, lambda s: s.parked, timeout_s=60)
        await submit(handle, Approve(request_id="late-ok", question_id="q1"))
        await submit(handle, Resume(request_id="back"))
        result = await goal_result(handle)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert parked.pause_reason == "question q1 expired unanswered: Approve ahead: 'pay'"
    # Time skips on while it is parked: the park's own expiry may have asked too.
    open_card = next(q for q in parked.questions if q.id == "q1")
    assert open_card.id == "q1" and open_card.expired_at is not None and open_card.on_expiry == "park"
    assert open_card.expired_at - open_card.asked_at >= timedelta(minutes=30)
    assert result.outcome == "succeeded", result.excerpt
    assert [e["kind"] for e in payments.ledger()] == ["payment"]  # the person's late approval
    assert "the goal parks; the question stays open" in " | ".join(snapshot.gate_log)
    assert "question q1 (Approve ahead: 'pay'): expired (park), then approve" in store.get_text(result.report)


async def test_abort_on_expiry_stops_the_goal(ts_env, task_queue, store, workspace, scripted, payments):
    steps = [pay_step(after="1h", on_expiry="abort"), llm("after", ["pay"])]
    async with running_worker(ts_env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(ts_env, task_queue, workspace, steps, allowed_tools=["make_payment"], drift_every=0)
        result = await goal_result(handle)

    assert result.outcome == "aborted"
    assert result.failure == "aborted: question q1 expired unanswered (Approve ahead: 'pay')"
    assert payments.ledger() == []
    assert "question q1 (Approve ahead: 'pay'): expired (abort), nobody answered" in store.get_text(result.report)


async def test_a_declared_assumption_settles_an_uncertain_webhook_on_expiry_without_sending_it_again(
    ts_env, task_queue, store, workspace, scripted, fake_service
):
    hook = fake_service(WebhookReceiver)
    hook.reply_status = 503  # never a definite answer: uncertain
    notice = {
        "name": "notice",
        "kind": "tool",
        "tool": "notify_webhook",
        "args": {"url": f"{hook.base_url}/deploys", "payload": {"release": "2.0"}},
        "question_deadline": {"after": "20m", "on_expiry": "happened"},
    }
    async with running_worker(ts_env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(ts_env, task_queue, workspace, [notice], allowed_tools=["notify_webhook"], drift_every=0)
        result = await goal_result(handle)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert statuses(snapshot) == {"notice": "succeeded"}, result.excerpt
    assert "expired: q1 (Did notify_webhook in step 'notice' happen?)" in " | ".join(snapshot.gate_log)
    assert "happened (happened)" in " | ".join(snapshot.gate_log)
    assert len(hook.ledger()) == 1  # the one uncertain attempt: nothing sent after the expiry


def test_an_assumption_is_refused_for_a_tool_that_does_not_declare_it(tmp_path):
    """`perdure start` with such a plan exits 2 with one line; nothing is started."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "goal: pay the invoice\n"
        "steps:\n"
        "  - name: pay\n"
        "    kind: tool\n"
        "    tool: make_payment\n"
        "    args: {amount_cents: 1000, currency: EUR, recipient: ACME}\n"
        "    question_deadline: {after: 10m, on_expiry: happened}\n"
    )
    # Nothing listens there: the plan is refused before anything connects.
    refused = CliRunner().invoke(cli.app, ["start", "--plan", str(plan)], env={"PERDURE_TEMPORAL": "127.0.0.1:1"})
    assert refused.exit_code == 2, refused.output
    lines = [line for line in refused.output.splitlines() if line.strip()]
    assert lines == [
        f"error: {plan}: step 'pay': on_expiry happened assumes what became of a make_payment call, and "
        "make_payment does not declare that safe (it declares: nothing); use deny, park or abort"
    ], refused.output
    whole_goal = CliRunner().invoke(
        cli.app, ["start", "pay it", "--on-expiry", "happened"], env={"PERDURE_TEMPORAL": "127.0.0.1:1"}
    )
    assert whole_goal.exit_code == 2 and "Traceback" not in whole_goal.output, whole_goal.output


async def test_the_reminder_shows_in_status_questions_the_stream_and_the_owners_router_then_an_answer_wins(
    env, task_queue, store, workspace, scripted, payments
):
    """Real time: a 40 s deadline reminding 30 s before it; a person approves after the reminder."""
    user = f"u{uuid.uuid4().hex[:8]}"
    goal_spec = spec(
        workspace,
        plan={"steps": [pay_step(after="40s", remind_before="30s")]},
        allowed_tools=["make_payment"],
        drift_every=0,
    )
    owned = TypedSearchAttributes([SearchAttributePair(OWNER, user)])
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        router = await env.client.start_workflow(
            ROUTER_WORKFLOW, RouterInput(user=user), id=router_id(user), task_queue=task_queue
        )
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=goal_spec),
            id=new_goal_id("remind"),
            task_queue=task_queue,
            search_attributes=owned,
        )
        asked = await wait_until(handle, lambda s: s.questions)
        before = await cli_output(env, "questions", handle.id)
        reminded = await wait_until(handle, lambda s: s.questions and s.questions[0].reminded_at, timeout_s=30)
        status = await perdure_status(env, handle.id)
        listed = await cli_output(env, "questions", handle.id)
        held = await router.query(RouterHandlers.VIEW, result_type=RouterView)
        inbox = await cli_output(env, "inbox", "--router", user=user)
        await submit(handle, Approve(request_id="ok", question_id="q1"))
        result = await goal_result(handle)
        events = await events_until_end(env, handle.id)
        snapshot = await handle.query(GoalWorkflow.progress)
        await router.terminate("test over")

    card = asked.questions[0]
    assert card.on_expiry == "deny"  # a confirmation of a write: denied by default
    assert card.deadline_at - card.asked_at == timedelta(seconds=40)
    assert card.remind_at == card.deadline_at - timedelta(seconds=30)
    assert "deadline: deadline " in before and "on expiry: deny; reminder at" in before
    assert reminded.questions[0].reminded_at >= card.remind_at
    for shown in (status, listed):
        assert "reminder: deadline " in shown and "on expiry: deny; reminded " in shown, shown
    assert "reminder: q1 (Approve ahead: 'pay') is unanswered" in status  # the gate log
    [reminder] = held.reminders
    assert (reminder.goal_id, reminder.question_id, reminder.on_expiry) == (handle.id, "q1", "deny")
    assert reminder.deadline_at == card.deadline_at and reminder.options == [
        "approve",
        "approve_some",
        "refuse_some",
        "reject",
    ]
    assert f"reminder goal {handle.id} asks q1: Approve ahead: 'pay' · unanswered" in inbox
    assert f"answer with: perdure say --card {handle.id}:q1=approve|approve_some|refuse_some|reject" in inbox
    marks = [e.id for e in question_events(events)]
    assert marks == ["question:q1:open", "question:q1:open:reminded", "question:q1:answered"]
    assert result.outcome == "succeeded", result.excerpt
    assert [e["kind"] for e in payments.ledger()] == ["payment"]
    assert not any(entry.startswith("expired") for entry in snapshot.gate_log)


@pytest.mark.process
def test_a_worker_whose_tool_asks_for_an_assumption_it_does_not_declare_does_not_start(tmp_path):
    (tmp_path / "ut_notice.py").write_text(
        textwrap.dedent(
            """
            import perdure
            from pydantic import BaseModel

            class Notice(BaseModel):
                text: str

            @perdure.tool(risk="remote-write", replay="once", on_expiry="happened")
            async def notice(args: Notice) -> str:
                '''Tell the team.'''
                return "told"
            """
        )
    )
    variables = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")},
        "PERDURE_TEMPORAL": "127.0.0.1:1",  # nothing listens: refused before anything connects
        "PERDURE_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(tmp_path),
        "COLUMNS": "300",
    }
    started = perdure("worker", "--tools", "ut_notice", env=variables, timeout=60)
    assert started.returncode == 2, started.stderr
    assert started.stderr.strip() == (
        "error: tool module ut_notice: tool notice: on_expiry happened assumes what became of its call, but it "
        'does not declare that safe: add safe_on_expiry=["happened"] if it is, or use deny, park or abort'
    ), started.stderr
    assert "Traceback" not in started.stderr + started.stdout


async def test_a_deadline_set_in_one_run_expires_in_a_later_one(
    ts_env, task_queue, store, workspace, scripted, payments
):
    """The deadline is state: asked in the first run, it is waited on and acted on after
    continues-as-new (a chain of reads makes them), as it was set."""
    (workspace / "notes.md").write_text("a note\n")
    reads = [
        {
            "name": f"read-{i:02d}",
            "kind": "tool",
            "tool": "read_file",
            "args": {"path": "notes.md", "max_bytes": 1000 + i},
        }
        | ({"needs": [f"read-{i - 1:02d}"]} if i else {})
        for i in range(40)
    ]
    steps = [pay_step(after="1h", remind_before="10m") | {"defer": False}, *reads]
    async with running_worker(ts_env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start(
            ts_env,
            task_queue,
            workspace,
            steps,
            allowed_tools=["read_file", "make_payment"],
            drift_every=0,
            continue_as_new_after_events=50,
            local_activities_up_to_s=0,
        )
        result = await goal_result(handle)
        snapshot = await handle.query(GoalWorkflow.progress)
        runs = await run_ids(handle)
        first = await ts_env.client.get_workflow_handle(handle.id, run_id=runs[0]).fetch_history()
        last = await ts_env.client.get_workflow_handle(handle.id, run_id=runs[-1]).fetch_history()

    assert len(runs) >= 3, runs
    # Asked in the first run, which set one timer for it (not one per step settled), never fired.
    assert [fired for _, fired in question_timers(first, fired_only=False)] == [None]
    (remind_wait, reminded), (_, expired) = question_timers(last)
    assert timedelta(minutes=49) < remind_wait <= timedelta(minutes=50)  # counted from the asking, runs ago
    assert timedelta(minutes=9, seconds=59) <= expired - reminded <= timedelta(minutes=10, seconds=5)
    assert result.outcome == "partial" and payments.ledger() == []
    assert statuses(snapshot)["pay"] == "failed" and snapshot.counts["succeeded"] == 40
    assert any(e.startswith("expired: q1") for e in snapshot.gate_log)


@pytest.mark.process
async def test_a_deadline_holds_when_the_worker_is_sigkilled_while_it_runs(crash_rig, tmp_path, payments):
    rig = crash_rig(payments=payments)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    # Replay-safe: the kill may land while it runs, and it runs again.
    after = {
        "name": "after",
        "kind": "tool",
        "tool": "run_command",
        "args": {"command": "echo went on"},
        "replay": "safe",
    }
    # The reminder 5 s after asking, the deadline 35 s after it: room for a slow restart in between.
    steps = [pay_step(after="40s", remind_before="35s") | {"defer": False}, after]
    goal_spec = spec(workspace, plan={"steps": steps}, allowed_tools=["make_payment", "run_command"], drift_every=0)
    handle = await rig.start_goal(goal_spec)
    worker = rig.start_worker()
    asked = await wait_until(handle, lambda s: s.questions, timeout_s=60)
    worker.kill()  # SIGKILL: the deadline is state, its timer the server's
    await asyncio.sleep(8)  # the reminder's time (5 s after asking) passes with no worker
    await rig.start_worker().wait_polling()
    result = await rig.result(handle)
    history = await handle.fetch_history()
    snapshot = await handle.query(GoalWorkflow.progress)

    card = asked.questions[0]
    assert result.outcome == "partial", result.excerpt
    assert payments.ledger() == []
    assert statuses(snapshot) == {"pay": "failed", "after": "succeeded"}
    gates = " | ".join(snapshot.gate_log)
    assert "reminder: q1" in gates and "expired: q1" in gates
    # The reminder went out late (no worker at its time), the expiry at its time.
    (_, reminded), (_, expired) = question_timers(history)
    assert reminded.replace(tzinfo=card.remind_at.tzinfo) >= card.remind_at
    assert (
        card.deadline_at <= expired.replace(tzinfo=card.deadline_at.tzinfo) <= card.deadline_at + timedelta(seconds=10)
    )
