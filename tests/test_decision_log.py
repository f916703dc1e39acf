"""The decision log (issue 38, item 3), seen from outside: `perdure log GOAL` lists every
decision that shaped a goal's work in order, with who decided (the model with its stated
reasons, a rule, a person by name) and the steps it is about; the state keeps a bounded
part of it and stores the rest in the artifact store in chunks, so a log longer than the
bound crosses continue-as-new and still reads back whole; with no worker `perdure log`
says so at once (and shows what the server holds), never a traceback or a hang. The pure
rules that bound it are tested first."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from unittest import mock

import pytest
from typer.testing import CliRunner

from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.starters.client import PerdureClient
from perdure.workflows.goal.contracts import decision_contracts as decisions
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.messages import Escalate
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared.contracts import ArtifactRef
from tests.builders import STEP_REPLY, agent, gate, llm, openai_profile, spec
from tests.helpers import (
    goal_result,
    local_activities,
    new_goal_id,
    run_ids,
    running_worker,
    start,
    statuses,
    submit,
    wait_until,
)

AT = datetime(2026, 12, 1, tzinfo=UTC)
PAY = {"amount_cents": 1_000, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 38"}


# --- the rules ---------------------------------------------------------------------


def test_entries_are_numbered_in_order_and_cut_never_the_log_grown():
    log = decisions.DecisionLog()
    first = decisions.record(log, AT, "plan", "plan v1", "model", ["a", "b", "a"])
    long = decisions.record(log, AT, "gate", "x" * 5_000, "rule", [f"s{i}" for i in range(50)])
    assert (first.seq, long.seq, log.count) == (1, 2, 2)
    assert first.about == ["a", "b"]
    assert len(long.text) == decisions.MAX_TEXT and long.text.endswith("…")
    assert len(long.about) == decisions.MAX_ABOUT and long.about[-1] == "(and 31 more)"


def test_a_chunk_is_due_once_kept_and_half_as_many_again_have_gathered():
    log = decisions.DecisionLog()
    for i in range(14):
        decisions.record(log, AT, "gate", f"d{i + 1}", "rule")
        assert decisions.chunk_due(log, kept=10) == []
    decisions.record(log, AT, "gate", "d15", "rule")
    due = decisions.chunk_due(log, kept=10)
    assert [e.seq for e in due] == [1, 2, 3, 4, 5]
    ref = ArtifactRef(digest="sha256:" + "0" * 64, size=1)
    decisions.stored(log, due, ref)
    assert [c.first for c in log.chunks] == [1] and [c.last for c in log.chunks] == [5]
    assert [e.seq for e in log.recent] == list(range(6, 16)) and log.count == 15
    assert decisions.gaps(log.recent, log.count) == [(1, 5)]
    assert decisions.gaps([], 0) == []


# --- perdure log, as a user runs it -------------------------------------------------


async def perdure_log(env, home: Path, *args: str) -> tuple[int, str, float]:
    """`perdure log ARGS` in this process against the test's server, reading the artifact store
    under `home` as the worker wrote it: (exit code, output, seconds it took)."""
    variables = {"PERDURE_TEMPORAL": env.client.service_client.config.target_host, "PERDURE_HOME": str(home)}
    began = time.monotonic()
    with mock.patch.object(terminal.console, "_width", 400):
        ran = await asyncio.to_thread(CliRunner().invoke, cli.app, ["log", *args], env=variables)
    return ran.exit_code, ran.output, time.monotonic() - began


# `perdure log` as it should be takes one 5 s query timeout at most, plus start-up: 30 s leaves
# room for a loaded 2-core machine and still fails a wait on something that never answers (one
# that never ends at all is failed by pytest's own timeout).
NO_HANG_S = 30


async def test_a_chunk_whose_local_activity_fails_stays_in_the_state_and_waits_for_more_before_trying_again(
    monkeypatch,
):
    """A local activity fails as its own error (here an ApplicationError: the store refused),
    not an ActivityError. The chunk stays in the state and the log waits for more entries
    before it tries again (before: the error escaped the store task, and every new decision
    started another write)."""
    from temporalio.exceptions import ApplicationError

    from perdure.workflows.goal import decision_log
    from perdure.workflows.goal.context import GoalContext
    from perdure.workflows.goal.contracts.state import GoalState

    async def refused(*args, **kwargs):
        raise ApplicationError("No space left on device", type="OSError")

    monkeypatch.setattr(decision_log.workflow, "execute_local_activity", refused)
    monkeypatch.setattr(decision_log.workflow, "logger", logging.getLogger("perdure.test"))  # no workflow here
    state = GoalState(spec=spec(Path("/tmp"), plan={"steps": [llm("a")]}, decisions_kept=4))
    room = decision_log.DecisionLogRoom(GoalContext(state, "g", lambda: None))
    for i in range(7):
        decisions.record(state.decisions, AT, "gate", f"d{i + 1}", "rule")
    due = decisions.chunk_due(state.decisions, 4)
    assert due
    await room._store(due)  # raised before
    assert len(state.decisions.recent) == 7 and state.decisions.chunks == []
    room._store_if_due()
    assert room._writing is None  # not again before kept // 2 more entries


def rows(output: str) -> list[list[str]]:
    """The log table's rows as cells (the seq first), in the order printed."""
    found = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if len(cells) == 6 and cells[0].isdigit():
            found.append(cells)
    return found


REVISED = {
    "rationale": "The extra section needs only the gate's outcome; finding sources again is not needed.",
    "steps": [gate(), llm("extra", ["gate"])],
}


@pytest.mark.slow
async def test_a_replan_a_rewind_and_an_answer_are_logged_in_order_with_who_decided(
    env, task_queue, store, workspace, scripted, tmp_path, monkeypatch
):
    monkeypatch.setenv("PERDURE_USER", "alice")  # who this machine's messages say sent them
    server = scripted({"replies": [{"when": "Revise the current plan", "json": REVISED}, *STEP_REPLY["replies"]]})
    client = PerdureClient(env.client)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [llm("find"), gate()], allowed_tools=["run_command"])
        await wait_until(handle, lambda s: statuses(s) == {"find": "succeeded", "gate": "running"})
        await submit(
            handle, Escalate(request_id="wd-1", finding="slow", detail="no step settled lately", by="watchdog")
        )
        snapshot = await wait_until(handle, lambda s: s.questions)
        await client.answer(handle.id, snapshot.questions[0].id, "continue", text="it is waiting for GO")
        await client.rewind(handle.id, "find", "it read the wrong source")
        await client.queue(handle.id, "Add an extra section; finding sources again is not needed.")
        (workspace / "GO").touch()
        result = await asyncio.wait_for(goal_result(handle), 60)
        assert result.outcome == "succeeded", (result.outcome, result.failure, result.unfinished)
    # The goal has ended and no worker runs: the log is read from its result.
    code, output, _ = await perdure_log(env, tmp_path, handle.id)
    assert code == 0, output
    table = rows(output)
    kinds = [(cells[2], cells[3]) for cells in table]
    assert kinds[0] == ("plan", "plan file")
    answer = kinds.index(("answer", "alice"))
    rewind = kinds.index(("rewind", "alice"))
    reason = kinds.index(("reason", "model"))
    replan = kinds.index(("replan", "model"))
    drop = kinds.index(("drop", "model"))
    assert 0 < answer < rewind < reason < replan < drop < len(kinds) - 1, kinds
    assert kinds[-1] == ("end", "rule") and "the goal ended succeeded" in table[-1][4]
    assert [int(cells[0]) for cells in table] == list(range(1, len(table) + 1))  # every entry, in order
    assert "escalation" not in table[answer][4] and "continue: it is waiting for GO" in table[answer][4]
    assert table[rewind][5].startswith("find") and "it read the wrong source" in table[rewind][4]
    assert "finding sources again is not needed" in table[reason][4]  # the planner's own words
    assert table[drop][5] == "find" and "leaves out find" in table[drop][4]
    assert "read from its result" in output

    code, only, _ = await perdure_log(env, tmp_path, handle.id, "--kind", "answer", "--json")
    read = json.loads(only)
    assert code == 0 and [(e["kind"], e["who"]) for e in read["entries"]] == [("answer", "alice")]
    assert read["count"] == len(table)
    report = store.get_text(result.report)
    assert "## Decisions" in report and f"`perdure log {handle.id}`" in report
    assert "· answer · alice ·" in report


@pytest.mark.slow
async def test_an_expiry_a_rewind_and_a_replan_are_one_log_in_order(
    env, task_queue, store, workspace, scripted, tmp_path, monkeypatch
):
    """Issue 38's Done-when: `perdure log` of a goal whose approval expired (deny), then a person
    rewound a step and a re-plan followed; printed, as a user reads it."""
    monkeypatch.setenv("PERDURE_USER", "alice")
    server = scripted({"replies": [{"when": "Revise the current plan", "json": REVISED}, *STEP_REPLY["replies"]]})
    client = PerdureClient(env.client)
    pay = {"name": "pay", "kind": "tool", "tool": "make_payment", "args": PAY, "needs": ["gate"]}
    pay["question_deadline"] = {"after": "6s", "remind_before": "3s", "on_expiry": "deny"}
    async with running_worker(env, task_queue, store, openai_profile(server)):
        steps = [llm("find"), gate(), pay]
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["run_command", "make_payment"])
        await wait_until(handle, lambda s: s.questions and statuses(s).get("find") == "succeeded")
        await wait_until(handle, lambda s: not s.questions, timeout_s=30)  # nobody answered: it expired
        await client.rewind(handle.id, "find", "it read the wrong source")
        await client.queue(handle.id, "Add an extra section; finding sources again is not needed.")
        (workspace / "GO").touch()
        await asyncio.wait_for(goal_result(handle), 60)
    code, output, _ = await perdure_log(env, tmp_path, handle.id)
    print(output)  # the paste of issue 38's closing note
    assert code == 0, output
    table = rows(output)
    kinds = [(cells[2], cells[3]) for cells in table]
    expiry = kinds.index(("expiry", "expired"))
    rewind = kinds.index(("rewind", "alice"))
    replan = kinds.index(("replan", "model"))
    assert kinds[0] == ("plan", "plan file") and 0 < expiry < rewind < replan, kinds
    assert "q1" in table[expiry][4] and "deny" in table[expiry][4] and "pay" in table[expiry][5], table[expiry]
    assert [int(cells[0]) for cells in table] == list(range(1, len(table) + 1))
    # A reminder is no decision, and the expiry is logged once, as an expiry.
    assert not any("reminder" in cells[4] for cells in table) and sum("expired: q1" in c[4] for c in table) == 1


def reasoned_turns(count: int) -> list[dict]:
    """An agent's turns, each listing another folder and saying why (its stated reason)."""
    return [
        {
            "when": "PERDURE-AGENT",
            "times": 1,
            "content": f"I look in d{i} next: its notes may name the owner.",
            "tool_calls": [{"name": "list_dir", "arguments": {"path": f"d{i}"}}],
        }
        for i in range(count)
    ]


def folders(workspace: Path, count: int) -> None:
    for i in range(count):
        (workspace / f"d{i}").mkdir()
        (workspace / f"d{i}" / f"note-{i}.md").write_text(f"note {i}\n")


async def start_small_log(env, task_queue: str, workspace: Path, steps: list[dict], tools: list[str]):
    """A goal whose state keeps 4 decisions (a chunk stored every 2 more) and that continues
    as new after 50 events."""
    return await start(
        env, task_queue, workspace, steps, allowed_tools=tools, decisions_kept=4, continue_as_new_after_events=50
    )


async def carried_state(env, goal_id: str, run_id: str) -> dict:
    """The state the goal carried into run `run_id` (its start input), as JSON."""
    history = await env.client.get_workflow_handle(goal_id, run_id=run_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    [goal_input] = await env.client.data_converter.decode(list(started.input.payloads), [GoalInput])
    return json.loads(goal_input.state)


@pytest.mark.slow
async def test_a_log_past_its_bound_crosses_continue_as_new_and_reads_back_whole(
    env, task_queue, store, workspace, scripted, tmp_path
):
    folders(workspace, 8)
    script = {"replies": [*reasoned_turns(8), {"when": "PERDURE-AGENT", "content": "The owner is in d7."}]}
    server = scripted({"replies": [*script["replies"], *STEP_REPLY["replies"]]})
    steps = [agent("explore", "Find the owner.", ["list_dir"], max_turns=12), llm("wrap", ["explore"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_small_log(env, task_queue, workspace, steps, ["list_dir"])
        result = await asyncio.wait_for(handle.result(), 90)
    assert result.outcome == "succeeded"
    runs = await run_ids(handle)
    assert len(runs) >= 2, "the goal should have continued as new"
    carried = (await carried_state(env, handle.id, runs[-1]))["decisions"]
    # What continue-as-new carried is bounded: at most kept + half as many, the rest by ref.
    assert len(carried["recent"]) <= 6 and carried["chunks"], carried
    first_run = await env.client.get_workflow_handle(handle.id, run_id=runs[0]).fetch_history()
    stored_by = [a for a in local_activities(first_run) if a[1] == Activities.WRITE_DECISIONS]
    assert stored_by, "the first run should have stored chunks of its log"

    code, output, _ = await perdure_log(env, tmp_path, handle.id)
    assert code == 0, output
    table = rows(output)
    assert [int(cells[0]) for cells in table] == list(range(1, result.decisions.count + 1))
    assert result.decisions.count == 11 and len(result.decisions.chunks) >= 2  # plan, 8 reasons, run, end
    said = [cells[4] for cells in table if cells[2] == "reason"]
    assert said == [
        f"explore, turn {i + 1}: calls list_dir: I look in d{i} next: its notes may name the owner." for i in range(8)
    ]
    assert [cells[2] for cells in table].count("run") == len(runs) - 1
    assert table[0][2] == "plan" and table[-1][2] == "end"


@pytest.mark.slow
async def test_with_no_worker_the_log_says_why_at_once_and_shows_what_the_run_carried(
    env, task_queue, store, workspace, scripted, tmp_path
):
    # A goal no worker has ever run: nothing to show, said in a line, exit code 1.
    lonely = await env.client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=spec(workspace, plan={"steps": [llm("only")]})),
        id=new_goal_id("lonely"),
        task_queue=f"{task_queue}-nobody",
    )
    code, output, took = await perdure_log(env, tmp_path, lonely.id)
    # "At once" is the message: it comes from the pollers check, which asks no query to wait on.
    assert code == 1 and "no worker polls task queue" in output and "Traceback" not in output, output
    assert took < NO_HANG_S
    await lonely.terminate("test over")

    # A goal in its second run whose worker stopped: the entries carried into that run, and why no more.
    folders(workspace, 6)
    server = scripted({"replies": [*reasoned_turns(6), {"when": "PERDURE-AGENT", "content": "Done looking."}]})
    steps = [agent("explore", "Find the owner.", ["list_dir"], max_turns=10), gate(["explore"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_small_log(env, task_queue, workspace, steps, ["list_dir", "run_command"])
        await wait_until(handle, lambda s: s.runs >= 2 and statuses(s).get("gate") == "running", 60)
        code, live, _ = await perdure_log(env, tmp_path, handle.id)
    assert code == 0 and "read from the goal" in live, live
    code, output, took = await perdure_log(env, tmp_path, handle.id)
    await handle.terminate("test over")
    assert code == 0 and "Traceback" not in output, output
    assert "showing the log as it was carried into run 2" in output, output
    assert took < NO_HANG_S  # one 5 s query timeout, then the start of the run read
    carried = rows(output)
    assert carried and [int(c[0]) for c in carried] == list(range(1, len(carried) + 1))
    assert [c[2] for c in carried].count("reason") == 6 and carried[-1][2] == "run"
    assert len(rows(live)) >= len(carried)


def test_a_machine_with_no_login_name_sends_its_messages_as_user(monkeypatch):
    # Messages now carry who sent them: a container's bare uid has no login name, and a send must not fail on it.
    import getpass

    from perdure.runtime import settings

    def no_name() -> str:
        raise OSError("no login name for uid 12345")

    monkeypatch.delenv("PERDURE_USER", raising=False)
    monkeypatch.setattr(getpass, "getuser", no_name)
    assert settings.user() == "user"
