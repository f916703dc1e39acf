"""Risk placed on purpose (issue 20, section 5): a remote-write or irreversible step goes
after the independent local work unless the plan pins it, and steps writing the same
target run one after the other. From outside: the fake mail service's ledger, the
order of activities in the goal's history, and `perdure status --why`; then the pure
rules of workflows/goal/rules/risk_order.py.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from unittest import mock

import pytest
from typer.testing import CliRunner

from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.testing.fakes import MAIL_KEY, MailAPI
from perdure.workflows.goal.contracts.messages import Answer, Approve, Steer
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.rules import risk_order
from tests.builders import STEP_REPLY, agent, gate, llm, openai_profile, write_notes
from tests.helpers import completed_at, first_event, running_worker, start, statuses, submit, wait_until

MAIL = {"to": "owner@example.com", "subject": "Done", "body": "The notes are summarised."}


@pytest.fixture
def mail(fake_service) -> MailAPI:
    return fake_service(MailAPI, api_key=MAIL_KEY)


def pay_step(name: str = "pay", **extra) -> dict:
    args = {"amount_cents": 12_500, "currency": "EUR", "recipient": "ACME GmbH", "memo": f"invoice {name}"}
    return {"name": name, "kind": "tool", "tool": "make_payment", "args": args, **extra}


def email(name: str = "email", **extra) -> dict:
    return {"name": name, "kind": "tool", "tool": "send_email", "args": MAIL, **extra}


def command(name: str, line: str, **extra) -> dict:
    return {"name": name, "kind": "tool", "tool": "run_command", "args": {"command": line}, "replay": "safe", **extra}


async def status_why(env, goal_id: str) -> str:
    address = {"PERDURE_TEMPORAL": env.client.service_client.config.target_host}
    with mock.patch.object(terminal.console, "_width", 400):
        ran = await asyncio.to_thread(CliRunner().invoke, cli.app, ["status", goal_id, "--why"], env=address)
    assert ran.exit_code == 0, ran.output
    return ran.output


# --- from outside ---------------------------------------------------------------------


@pytest.mark.slow
async def test_an_email_ready_at_once_is_sent_after_the_independent_reads_and_local_write(
    env, task_queue, store, workspace, mail
):
    write_notes(workspace)
    steps = [
        email(),
        command("read-a", "sleep 0.6; cat notes/ideas.md"),
        command("read-b", "sleep 0.8; cat notes/todo.md"),
        command("write-local", "sleep 1; echo draft > DRAFT.md"),
    ]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["send_email", "run_command"])
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.outcome == "succeeded", result.excerpt
    assert len(mail.ledger()) == 1
    assert (workspace / "DRAFT.md").read_text() == "draft\n"
    email_first = first_event(history, "email")
    for independent in ("read-a", "read-b", "write-local"):
        assert completed_at(history, independent) < email_first, independent
    # The mail arrived after the last local step ended: its file was written first.
    assert mail.ledger()[0]["received_at"] >= (workspace / "DRAFT.md").stat().st_mtime


@pytest.mark.slow
async def test_a_pinned_email_goes_at_once(env, task_queue, store, workspace, mail):
    write_notes(workspace)
    steps = [email(defer=False), command("read-slow", "sleep 1.5; cat notes/ideas.md")]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["send_email", "run_command"])
        result = await handle.result()
        history = await handle.fetch_history()
        snapshot = await handle.query(GoalWorkflow.progress)

    assert result.outcome == "succeeded", result.excerpt
    assert first_event(history, "email") < completed_at(history, "read-slow")
    assert all(not n.held_back for n in snapshot.nodes)


@pytest.mark.slow
async def test_status_why_says_the_email_waits_for_the_gate_and_later_that_it_waited(
    env, task_queue, store, workspace, mail, scripted
):
    steps = [gate(), email(), llm("after-mail", ["email"])]
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["send_email", "run_command"])
        await wait_until(handle, lambda s: any(n.held_back for n in s.nodes if n.name == "email"))
        waiting = await status_why(env, handle.id)
        assert mail.ledger() == []  # nothing sent while the gate is open
        (workspace / "GO").touch()
        result = await handle.result()
        done = await status_why(env, handle.id)

    assert result.outcome == "succeeded", result.excerpt
    assert len(mail.ledger()) == 1
    assert "email · order deferred: remote-write (send_email); waits for 1 independent step (gate); since " in waiting
    # `after-mail` is downstream of the email: it never kept the email waiting.
    assert "after-mail" not in waiting.split("email · order", 1)[1].splitlines()[0]
    assert "email · order deferred: remote-write (send_email); waited for 1 independent step (gate) from " in done


@pytest.mark.slow
async def test_two_writers_of_one_file_run_one_after_the_other_and_a_third_file_beside_them(
    env, task_queue, store, workspace
):
    (workspace / "src").mkdir()
    steps = [
        command("fix-a", "sleep 0.8; echo a >> src/util.py", writes=["src/util.py"]),
        command("fix-b", "sleep 0.8; echo b >> src/util.py", writes=["./src//util.py"]),
        command("fix-c", "sleep 0.8; echo c >> src/other.py", writes=["src/other.py"]),
    ]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["run_command"])
        result = await handle.result()
        history = await handle.fetch_history()
        why = await status_why(env, handle.id)

    assert result.outcome == "succeeded", result.excerpt
    assert (workspace / "src" / "util.py").read_text() == "a\nb\n"
    assert completed_at(history, "fix-a") < first_event(history, "fix-b")
    assert first_event(history, "fix-c") < completed_at(history, "fix-a")  # beside fix-a, not after it
    assert "fix-b · order serialized with fix-a: both write src/util.py" in why
    assert "fix-c · order" not in why


@pytest.mark.slow
async def test_two_payments_to_one_payee_stay_serialized_across_continue_as_new_and_a_new_worker(
    env, task_queue, store, workspace, payments
):
    """Both are risky, so neither defers the other; they share a remote target, so the
    second waits while the first waits for its approval. That wait is state: the goal
    continues as new meanwhile, and a new worker replays it; the decision holds in both."""
    payee = ["payments:ACME GmbH"]
    steps = [pay_step("pay-a", writes=payee), pay_step("pay-b", writes=payee)]
    tools = ["make_payment"]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=tools, continue_as_new_after_events=50)
        first = await wait_until(handle, lambda s: s.questions)
        # Both on the approvals-ahead card (issue 38); pay-a waits for it, pay-b behind pay-a.
        assert [[a.step for a in q.ahead] for q in first.questions] == [["pay-a", "pay-b"]]
        for i in range(40):  # each steer adds events: the goal continues as new at 50
            if (await handle.query(GoalWorkflow.progress)).runs > first.runs:
                break
            await submit(handle, Steer(request_id=f"st-{i}", text="Pay exactly the invoiced amount."))
        later = await wait_until(handle, lambda s: s.runs > first.runs and s.questions)
    # A new worker: it replays the goal's current run from its history.
    async with running_worker(env, task_queue, store):
        why = await status_why(env, handle.id)
        assert statuses(later)["pay-b"] == "pending" and payments.ledger() == []
        # Only pay-a approved ahead: pay-b is asked when its turn comes, after pay-a ran.
        ahead = Answer(request_id="ok-a", question_id=later.questions[0].id, choice="approve_some", steps=["pay-a"])
        await submit(handle, ahead)
        second = await wait_until(handle, lambda s: any("pay-b" in q.title for q in s.questions))
        assert [e["kind"] for e in payments.ledger()] == ["payment"]  # pay-a only
        await submit(handle, Approve(request_id="ok-b", question_id=second.questions[0].id))
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    assert len(payments.ledger()) == 2
    assert "pay-b · order serialized with pay-a: both write payments:ACME GmbH" in why


# --- the pure rules ---------------------------------------------------------------------


def plan_of(*steps: dict) -> Plan:
    return Plan.model_validate({"steps": list(steps)})


def pass_over(plan: Plan, statuses_now: dict[str, str]) -> risk_order.OrderPass:
    ready = [s.name for s in plan.steps if statuses_now.get(s.name, "pending") == "pending"]
    in_flight = [n for n, st in statuses_now.items() if st in ("running", "blocked", "parked", "offline", "uncertain")]
    ready = [n for n in ready if all(statuses_now.get(d) == "succeeded" for d in plan.step(n).needs)]
    return risk_order.OrderPass(risk_order.risk_facts(plan), ready, in_flight, lambda n: statuses_now.get(n, "pending"))


def test_a_risky_step_waits_for_independent_local_work_but_not_for_its_own_downstream():
    plan = plan_of(email(), command("lint", "true"), llm("after", ["email"]))
    judged = pass_over(plan, {})
    assert judged.order() == ["lint", "email"]  # the risky step is judged last
    key, note = judged.hold("email")
    assert key == risk_order.DEFERRED
    assert note == "deferred: remote-write (send_email); waits for 1 independent step (lint)"
    assert pass_over(plan, {"lint": "succeeded"}).hold("email") is None


def test_risky_steps_do_not_wait_for_each_other_nor_for_work_behind_one():
    # pay -> check and email -> log: the email must not wait for `check`, which waits for
    # the (deferred) payment, and the payment not for `log`: that would be a deadlock.
    plan = plan_of(pay_step("pay"), llm("check", ["pay"]), email(), llm("log", ["email"]), command("read", "cat a"))
    judged = pass_over(plan, {})
    assert judged.hold("pay")[1].endswith("waits for 1 independent step (read)")
    assert judged.hold("email")[1].endswith("waits for 1 independent step (read)")
    done = pass_over(plan, {"read": "succeeded"})
    assert done.hold("pay") is None and done.hold("email") is None


def test_work_waiting_for_a_person_or_in_flight_keeps_a_risky_step_waiting_and_a_settled_one_does_not():
    plan = plan_of(email(), command("a", "true"), command("b", "true"), command("c", "true"), command("d", "true"))
    judged = pass_over(plan, {"a": "running", "b": "blocked", "c": "uncertain", "d": "failed"})
    assert judged.hold("email")[1].startswith(
        "deferred: remote-write (send_email); waits for 2 independent steps (a, b)"
    )


def test_more_than_three_blockers_are_named_with_an_ellipsis():
    plan = plan_of(email(), *(llm(f"r{i}") for i in range(5)))
    assert pass_over(plan, {}).hold("email")[1].endswith("waits for 5 independent steps (r0, r1, r2, …)")


def test_a_pinned_risky_step_and_an_agent_without_risky_tools_are_not_deferred():
    plan = plan_of(email(defer=False), command("lint", "true"), agent("look", "Look.", ["read_file"]))
    judged = pass_over(plan, {})
    assert judged.hold("email") is None and judged.hold("look") is None


def test_an_agent_that_may_pay_is_irreversible():
    plan = plan_of(agent("settle", "Settle.", ["read_file", "send_email", "make_payment"]), llm("x"))
    assert (
        pass_over(plan, {})
        .hold("settle")[1]
        .startswith("deferred: irreversible (send_email, make_payment); waits for 1 independent step (x)")
    )


def test_a_wrap_up_risky_step_does_not_wait_for_work_upstream_of_it():
    plan = plan_of(
        command("slow", "true"),
        llm("mid", ["slow", "bad"]),
        llm("bad"),
        email("notify", needs=["mid"], wrap_up=True),
    )
    statuses_now = {"slow": "running", "bad": "failed", "mid": "abandoned"}
    judged = risk_order.OrderPass(
        risk_order.risk_facts(plan), ["notify"], ["slow"], lambda n: statuses_now.get(n, "pending")
    )
    assert judged.hold("notify") is None


def test_writers_of_one_file_or_of_a_directory_and_a_file_in_it_wait_in_plan_order():
    plan = plan_of(
        command("a", "x", writes=["src/util.py"]),
        command("b", "x", writes=["src/util.py"]),
        command("c", "x", writes=["src"]),
        command("d", "x", writes=["src/other.py"]),
        command("e", "x", writes=["docs/util.py", "mailto:ops@example.com"]),
        command("f", "x", writes=["mailto:ops@example.com"]),
    )
    judged = pass_over(plan, {})
    assert judged.hold("a") is None
    judged.claim("a")  # started
    assert judged.hold("b") == (risk_order.SERIALIZED, "serialized with a: both write src/util.py")
    judged.claim("b")  # waits in line
    assert judged.hold("c") == (risk_order.SERIALIZED, "serialized with a: both write src/util.py (src/ holds it)")
    judged.claim("c")
    assert judged.hold("d") == (risk_order.SERIALIZED, "serialized with c: both write src/other.py (src/ holds it)")
    assert judged.hold("e") is None
    judged.claim("e")
    assert judged.hold("f") == (risk_order.SERIALIZED, "serialized with e: both write mailto:ops@example.com")


def test_a_running_writer_holds_a_ready_one_and_a_settled_writer_does_not():
    plan = plan_of(command("a", "x", writes=["out.txt"]), command("b", "x", writes=["./out.txt"]))
    statuses_now = {"a": "running"}
    judged = risk_order.OrderPass(risk_order.risk_facts(plan), ["b"], ["a"], lambda n: statuses_now.get(n, "pending"))
    assert judged.hold("b")[0] == risk_order.SERIALIZED
    statuses_now["a"] = "uncertain"  # settled for progress: its effect is a person's question now
    settled = risk_order.OrderPass(risk_order.risk_facts(plan), ["b"], ["a"], lambda n: statuses_now.get(n, "pending"))
    assert settled.hold("b") is None


def test_write_sets_are_inferred_from_write_file_and_git_commits_and_declared_ones_win():
    write = {"name": "w", "kind": "tool", "tool": "write_file", "args": {"path": "./a//b.md", "content": ""}}
    templated = {"name": "t", "kind": "tool", "tool": "write_file", "args": {"path": "{{steps.w}}", "content": ""}}
    commit = {"name": "g", "kind": "tool", "tool": "git_commit", "args": {"message": "m"}}
    plan = plan_of(write, templated, commit, {**write, "name": "n", "writes": []}, command("r", "x"))
    assert risk_order.risk_facts(plan).writes == {"w": ("a/b.md",), "g": (".git",)}


def test_targets_overlap_by_path_prefix_but_remote_targets_only_as_written():
    assert risk_order.overlap("src", "src/a.py") and risk_order.overlap(".", "docs/x")
    assert not risk_order.overlap("src/a", "src/a.py")
    assert not risk_order.overlap("https://api.example.com/a", "https://api.example.com/a/b")
    assert risk_order.normal_target("src/") == "src"


def test_a_deferral_keeps_the_time_it_began_and_says_when_it_ended():
    placements: dict[str, str] = {}
    t0, t1 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC), datetime(2025, 1, 2, 3, 9, 0, tzinfo=UTC)
    risk_order.record_hold(
        placements, risk_order.DEFERRED, "deferred: remote-write (send_email); waits for 2 independent steps (a, b)", t0
    )
    risk_order.record_hold(
        placements, risk_order.DEFERRED, "deferred: remote-write (send_email); waits for 1 independent step (b)", t1
    )
    assert placements[risk_order.DEFERRED].endswith("(b); since 2025-01-02 03:04:05 UTC")
    risk_order.record_start(placements, t1)
    assert placements[risk_order.DEFERRED] == (
        "deferred: remote-write (send_email); waited for 1 independent step (b) "
        "from 2025-01-02 03:04:05 UTC to 2025-01-02 03:09:00 UTC"
    )
    risk_order.record_start(placements, t1)  # started again (a rewind): the note stays
    assert placements[risk_order.DEFERRED].endswith("to 2025-01-02 03:09:00 UTC")


def test_a_pass_costs_what_is_ready_and_in_flight_not_the_size_of_the_goal():
    """10,000 steps, one email at the end: the facts are built once per plan version, and
    a pass over a handful of ready steps takes far less than one scan of the plan."""
    plan = plan_of(*(llm(f"s{i:05d}", [f"s{i - 1:05d}"] if i else []) for i in range(9_999)), email())
    statuses_now = {f"s{i:05d}": "succeeded" for i in range(5_000)} | {"s05000": "running"}
    facts = risk_order.risk_facts(plan)
    assert risk_order.risk_facts(plan) is facts  # cached on the plan
    started = time.perf_counter()
    for _ in range(1_000):
        judged = risk_order.OrderPass(facts, ["email"], ["s05000"], statuses_now.get)
        assert judged.hold("email")[1].endswith("(s05000)")
    per_pass = (time.perf_counter() - started) / 1_000
    scan = time.perf_counter()
    sum(1 for s in plan.steps if statuses_now.get(s.name) == "pending")
    one_scan = time.perf_counter() - scan
    assert per_pass < one_scan, (per_pass, one_scan)
