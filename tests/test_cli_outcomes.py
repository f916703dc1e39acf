"""The CLI as a new user meets it (issue 17): every way a goal ends prints, a start is
idempotent, a finished goal is named in perdure's words, and quoted text prints as written.

The commands run in this process (typer's CliRunner) against the session's dev server, with
the production worker in this process too: their output is what a user's terminal shows.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from unittest import mock

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from perdure.runtime.connect import connect
from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.workflows.goal.contracts.messages import Abort, Steer
from perdure.workflows.goal.contracts.state import GoalInput, GoalState
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import gate, openai_profile, spec
from tests.helpers import new_goal_id, running_worker, submit, wait_until
from tests.helpers import run_cli as perdure

GATE_THEN_LIST = [gate(), {"name": "after", "kind": "tool", "tool": "list_dir", "needs": ["gate"], "args": {}}]


async def test_result_and_watch_of_an_aborted_goal_show_the_outcome_the_reason_and_the_unfinished_list(
    env, task_queue, store, tmp_path, workspace
):
    async with running_worker(env, task_queue, store):
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan={"steps": GATE_THEN_LIST})),
            id=new_goal_id("cli-abort"),
            task_queue=task_queue,
        )
        await wait_until(handle, lambda s: "gate" in s.running)
        await submit(handle, Abort(request_id="ab-1", reason="wrong folder"))
        result = await perdure(env, tmp_path, "result", handle.id)
        watched = await perdure(env, tmp_path, "watch", handle.id)
    # The last progress frame says how it ended, not the phase seen one poll before.
    assert watched.stdout.lstrip().startswith("finished ") or "\nfinished " in watched.stdout, watched.stdout[:300]
    for shown in (result.stdout, watched.stdout):
        assert "outcome: aborted" in shown
        assert "reason: aborted: wrong folder" in shown
        assert "unfinished (2):" in shown and "  after: " in shown
        assert "| after" in shown or "after" in shown.split("unfinished")[1]  # the report follows


async def test_result_of_a_goal_that_failed_shows_its_report_and_one_terminated_says_how_it_ended(
    env, task_queue, store, tmp_path, workspace, scripted
):
    cyclic = {
        "steps": [
            {"name": "a", "kind": "llm", "needs": ["b"], "prompt": "x"},
            {"name": "b", "kind": "llm", "needs": ["a"], "prompt": "y"},
        ]
    }
    server = scripted({"replies": [{"when": "PERDURE-PLANNER", "json": cyclic}]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        failed = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, max_plan_repairs=0)),
            id=new_goal_id("cli-failed"),
            task_queue=task_queue,
        )
        shown = (await perdure(env, tmp_path, "result", failed.id)).stdout
    assert "outcome: failed" in shown and "reason: the planner gave no valid plan in 1 attempt(s)" in shown
    assert "cycle: a -> b -> a" in shown

    stopped = await env.client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=spec(workspace, plan={"steps": GATE_THEN_LIST})),
        id=new_goal_id("cli-term"),
        task_queue=task_queue,
    )
    await stopped.terminate(reason="operator cleanup")
    ended = await perdure(env, tmp_path, "result", stopped.id, code=1)
    assert "goal ended without a result: terminated (operator cleanup)" in ended.stdout
    listed = await perdure(env, tmp_path, "ls", "--status", "Terminated")
    assert stopped.id in listed.stdout and "terminated" in listed.stdout


async def test_a_goal_with_no_step_succeeded_ends_failed_and_the_temporal_list_marks_failed_and_aborted_goals(
    env, task_queue, store, tmp_path, workspace
):
    broken = {"name": "build", "kind": "tool", "tool": "run_command", "args": {"command": "exit 3"}}
    listing = {"name": "look", "kind": "tool", "tool": "list_dir", "args": {}}
    plans = {
        "nothing": [broken, {"name": "after", "kind": "tool", "tool": "list_dir", "needs": ["build"], "args": {}}],
        "some": [broken, listing],
        "stopped": GATE_THEN_LIST,
    }
    async with running_worker(env, task_queue, store):
        handles = {
            name: await env.client.start_workflow(
                GoalWorkflow.run,
                GoalInput(spec=spec(workspace, plan={"steps": steps}, allowed_tools=["run_command", "list_dir"])),
                id=new_goal_id(f"cli-{name}"),
                task_queue=task_queue,
            )
            for name, steps in plans.items()
        }
        await wait_until(handles["stopped"], lambda s: "gate" in s.running)
        await submit(handles["stopped"], Abort(request_id="ab-2", reason="not today"))
        shown = {name: (await perdure(env, tmp_path, "result", h.id)).stdout for name, h in handles.items()}
        # The close event of each, as the Temporal UI's workflow list shows it (its Status column).
        ids = " OR ".join(f"WorkflowId = '{h.id}'" for h in handles.values())
        closed: dict[str, str] = {}
        for _ in range(50):
            closed = {wf.id: wf.status.name async for wf in env.client.list_workflows(ids) if wf.close_time}
            if len(closed) == len(handles):
                break
            await asyncio.sleep(0.1)
        listed = (await perdure(env, tmp_path, "ls", "--status", "Failed")).stdout

    assert "outcome: failed" in shown["nothing"], shown["nothing"]
    assert "reason: no step succeeded (1 failed, 1 abandoned)" in shown["nothing"]
    assert "unfinished (2):" in shown["nothing"] and "  build: " in shown["nothing"]
    assert "outcome: partial" in shown["some"] and "reason:" not in shown["some"]
    assert "outcome: aborted" in shown["stopped"] and "reason: aborted: not today" in shown["stopped"]
    assert {name: closed[h.id] for name, h in handles.items()} == {
        "nothing": "FAILED",
        "some": "COMPLETED",
        "stopped": "FAILED",
    }
    cells = [[c.strip() for c in line.split("│")[1:4]] for line in listed.splitlines() if line.startswith("│ cli-")]
    rows = {goal: [status, outcome] for goal, status, outcome in cells}
    assert rows[handles["nothing"].id] == ["Failed", "failed"] and rows[handles["stopped"].id] == ["Failed", "aborted"]
    assert handles["some"].id not in rows


def plan_file(tmp_path: Path, goal: str) -> Path:
    path = tmp_path / f"{abs(hash(goal))}.yaml"
    path.write_text(
        f"goal: {goal}\nsteps:\n"
        "  - {name: gate, kind: tool, tool: run_command, args: {command: 'while [ ! -f GO ]; do sleep 0.05; done'}}\n"
    )
    return path


async def test_start_with_an_id_is_a_safe_retry_refuses_a_clash_and_replaces_a_finished_goal_only_when_asked(
    env, task_queue, tmp_path, workspace
):
    gid = new_goal_id("cli-retry")
    first, other = plan_file(tmp_path, "first goal"), plan_file(tmp_path, "another goal")
    base = ("start", "--workspace", str(workspace), "--id", gid)
    with mock.patch.dict("os.environ", {"PERDURE_TASK_QUEUE": task_queue}):
        started = await perdure(env, tmp_path, *base, "--plan", str(first))
        assert f"goal {gid} started" in started.stdout
        run_id = (await env.client.get_workflow_handle(gid).describe()).run_id

        again = await perdure(env, tmp_path, *base, "--plan", str(first))
        assert f"goal {gid} already running with this spec" in again.stdout
        assert "nothing new started" in again.stdout

        clash = await perdure(env, tmp_path, *base, "--plan", str(other), code=2)
        assert f"goal {gid} is already running with a different spec; nothing started" in clash.stderr
        errors = [line for line in clash.stderr.splitlines() if line.startswith("error")]
        assert len(errors) == 1 and "error: 2" not in clash.stderr

        await env.client.get_workflow_handle(gid).terminate("done with it")
        retried = await perdure(env, tmp_path, *base, "--plan", str(first))
        assert f"goal {gid} has finished (outcome terminated); see `perdure result {gid}`" in retried.stdout
        refused = await perdure(env, tmp_path, *base, "--plan", str(other), code=2)
        assert "add --replace" in refused.stderr
        assert (await env.client.get_workflow_handle(gid).describe()).run_id == run_id

        replaced = await perdure(env, tmp_path, *base, "--plan", str(other), "--replace")
        assert f"goal {gid} started (replacing the finished goal of that id)" in replaced.stdout
        desc = await env.client.get_workflow_handle(gid).describe()
        assert desc.run_id != run_id
        assert await desc.static_summary() == "another goal"
        details = await desc.static_details()
        assert "**Goal:** another goal" in details and "**Plan:** plan file (1 steps)" in details
        await env.client.get_workflow_handle(gid).terminate("test over")

    bad = await perdure(env, tmp_path, "start", "x", "--id", "../etc/passwd?x=1", code=2)
    assert "goal id '../etc/passwd?x=1' is not allowed" in bad.stderr


@pytest.mark.slow  # waits for a query no worker answers to time out
async def test_a_finished_goal_is_named_in_perdures_words_and_inbox_without_a_worker_shows_what_the_server_holds(
    env, task_queue, tmp_path, workspace
):
    handle = await env.client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=spec(workspace, plan={"steps": GATE_THEN_LIST})),
        id=new_goal_id("cli-inbox"),
        task_queue=task_queue,
    )
    await handle.signal(GoalWorkflow.message_signal, Steer(request_id="st-1", text="short").model_dump(mode="json"))
    inbox = await perdure(env, tmp_path, "inbox", handle.id)
    assert "no worker answered the inbox query" in inbox.stdout and "Timeout expired" not in inbox.stdout
    assert "the server holds 1 message(s)" in inbox.stdout
    row = next(line for line in inbox.stdout.splitlines() if "st-1" in line)
    assert "steer" in row and "signal" in row

    await handle.terminate("gone")
    late = await perdure(env, tmp_path, "steer", handle.id, "more", code=2)
    said = " ".join(late.stderr.split())
    assert f"goal {handle.id} has finished (outcome terminated); see `perdure result {handle.id}`" in said

    # The goal closing between perdure's look and its call: the server's words are translated.
    async def signal_it() -> None:
        client = await connect(env.client.service_client.config.target_host)
        await client.get_workflow_handle(handle.id).signal(GoalWorkflow.message_signal, {})

    said = io.StringIO()
    address = {"PERDURE_TEMPORAL": env.client.service_client.config.target_host}
    with (
        mock.patch.dict("os.environ", address),
        mock.patch.object(terminal, "err_console", Console(file=said, width=300)),
        pytest.raises(typer.Exit),
    ):
        await asyncio.to_thread(terminal.run, signal_it, handle.id)
    assert (
        said.getvalue().split()
        == f"error: goal {handle.id} has finished (outcome terminated); see `perdure result {handle.id}`".split()
    )


@pytest.mark.slow  # waits for a query no worker answers to time out
async def test_questions_of_a_goal_no_worker_answers_for_or_that_is_stuck_says_what_status_says(
    env, task_queue, store, tmp_path, workspace
):
    """`perdure questions` needs the goal's answer; with no worker, or a goal whose workflow task
    fails, it says so in status's words and exits as status does: never a traceback, never only
    "error from Temporal"."""
    handle = await env.client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=spec(workspace, plan={"steps": GATE_THEN_LIST})),
        id=new_goal_id("cli-questions"),
        task_queue=task_queue,
    )
    status = await perdure(env, tmp_path, "status", handle.id)
    asked = await perdure(env, tmp_path, "questions", handle.id)
    unanswered = next(line for line in status.stdout.splitlines() if "no worker answered" in line)
    assert unanswered.startswith("no worker answered the progress query"), status.stdout
    assert asked.stderr == "" and asked.stdout.splitlines() == [
        unanswered.replace("showing server facts", "its open questions cannot be read until a worker answers")
    ], asked.stdout
    await handle.terminate("test over")

    # Stuck: a state newer than the worker's (as tests/test_cli.py does), the task failing.
    newer = GoalState(spec=spec(workspace)).model_dump(mode="json") | {"schema_version": "99.0"}
    async with running_worker(env, task_queue, store):
        stuck = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan={"steps": GATE_THEN_LIST}), state=json.dumps(newer)),
            id=new_goal_id("cli-questions-stuck"),
            task_queue=task_queue,
        )
        for _ in range(150):  # 30 s
            if (await stuck.describe()).raw_description.pending_workflow_task.attempt >= 2:
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("the workflow task never failed")
        status = await perdure(env, tmp_path, "status", stuck.id)
        asked = await perdure(env, tmp_path, "questions", stuck.id)
    await stuck.terminate("test over")
    said = [line for line in status.stdout.splitlines() if "stuck:" in line]
    assert said and said[0].startswith("stuck: every workflow task of this goal fails"), status.stdout
    assert said[0] in asked.stdout.splitlines(), asked.stdout
    assert "the carried state is schema v99.0, newer than this worker's" in asked.stdout
    assert "error from Temporal" not in asked.stdout + asked.stderr


async def test_quoted_text_prints_as_written_brackets_emoji_codes_and_control_characters(
    env, task_queue, store, tmp_path, workspace
):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - {name: 'Bad Name!', kind: tool, tool: list_dir}\n")
    refused = await perdure(env, tmp_path, "start", "--plan", str(bad), "--workspace", str(workspace), code=2)
    assert "should match pattern '^[a-z][a-z0-9_-]{0,63}$'" in refused.stderr, refused.stderr

    (workspace / "passwd").write_text("root:x:0:0 [bold]kept[/bold] \x1b]0;owned\x07 end")
    steps = [{"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "passwd"}}]
    async with running_worker(env, task_queue, store):
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan={"steps": steps})),
            id=new_goal_id("cli-literal"),
            task_queue=task_queue,
        )
        await handle.result()
        shown = (await perdure(env, tmp_path, "status", handle.id)).stdout
    assert "root:x:0:0 [bold]kept[/bold] \\x1b]0;owned\\x07 end" in shown
    assert "\x1b" not in shown and "❌" not in shown


async def test_report_totals_add_up_with_a_row_for_calls_outside_steps(tmp_path):
    from temporalio.testing import ActivityEnvironment

    from perdure.activities.artifacts import DiskArtifactStore
    from perdure.activities.goal.report import ReportActivities
    from perdure.workflows.goal.contracts.goal_contracts import ReportInput, StepOutcome

    store = DiskArtifactStore(tmp_path / "artifacts")
    steps = [StepOutcome(name="write", kind="llm", status="succeeded", tokens=1625, cost_usd=0.002)]
    report_input = ReportInput(goal_id="g", goal="x", outcome="succeeded", steps=steps, tokens=3492, cost_usd=0.005)
    result = await ActivityEnvironment().run(ReportActivities(store).write_report, report_input)
    text = store.get_text(result.report)
    assert "**Totals:** 3492 tokens, $0.0050" in text
    assert (
        "| write | llm | succeeded | 1625 | 0.0020 |\n"
        "| (planning, drift and other calls outside steps) | — | — | 1867 | 0.0030 |" in text
    )


async def test_ls_refuses_a_status_that_is_not_one_and_history_creates_its_folder(env, task_queue, tmp_path, workspace):
    injected = await perdure(env, tmp_path, "ls", "--status", "Running' OR 1=1", code=2)
    assert 'unknown --status "Running\' OR 1=1"; one of: Running, Completed' in injected.stderr
    # A completed goal is never awaiting a person: this filter matches nothing.
    none = await perdure(env, tmp_path, "ls", "--phase", "awaiting_human", "--status", "completed")
    assert none.stdout.strip() == "no goals match these filters"

    handle = await env.client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=spec(workspace, plan={"steps": GATE_THEN_LIST})),
        id=new_goal_id("cli-hist"),
        task_queue=task_queue,
    )
    await handle.terminate(reason="test over")
    out = tmp_path / "missing" / "folder" / "h.json"
    written = await perdure(env, tmp_path, "history", handle.id, "--out", str(out))
    assert f"to {out}" in written.stdout and "workflowExecutionStartedEventAttributes" in out.read_text()


def test_help_takes_dash_h_version_prints_and_worker_help_names_its_environment():
    runner = CliRunner()
    assert runner.invoke(cli.app, ["-h"]).exit_code == 0
    version = runner.invoke(cli.app, ["--version"])
    assert version.exit_code == 0 and version.stdout.startswith("perdure ")
    with mock.patch.object(terminal.console, "_width", 300):
        worker = " ".join(runner.invoke(cli.app, ["worker", "-h"], env={"COLUMNS": "300"}).stdout.split())
        start = " ".join(runner.invoke(cli.app, ["start", "-h"], env={"COLUMNS": "300"}).stdout.split())
    for variable in ("PERDURE_TEMPORAL", "PERDURE_TASK_QUEUE", "PERDURE_CONFIG", "PERDURE_PAYLOAD_KEYS"):
        assert variable in worker
    assert "A rule every step must keep" in start


def test_help_names_arguments_as_a_user_writes_them_and_gives_flags_no_type():
    runner = CliRunner()
    for command in (["status", "-h"], ["start", "-h"], ["abort", "-h"]):
        shown = runner.invoke(cli.app, command, env={"COLUMNS": "200"}).stdout
        assert "<bool>" not in shown and "{goal_id}" not in shown, shown
    assert "status [OPTIONS] GOAL_ID" in runner.invoke(cli.app, ["status", "-h"], env={"COLUMNS": "200"}).stdout


async def test_status_names_what_each_running_activity_is_for_not_only_its_type(
    env, task_queue, store, tmp_path, workspace
):
    from tests.helpers import perdure_status

    async with running_worker(env, task_queue, store):
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan={"steps": GATE_THEN_LIST})),
            id=new_goal_id("cli-pending"),
            task_queue=task_queue,
        )
        await wait_until(handle, lambda s: "gate" in s.running)
        status = await perdure_status(env, handle.id)
        (workspace / "GO").touch()
        await handle.result()
    [line] = [line for line in status.splitlines() if line.startswith("activity ")]
    assert line.startswith("activity tool run_command · gate · ") and "attempt 1" in line, line


async def test_a_closed_goal_whose_result_cannot_be_read_here_lists_as_unknown_not_a_crash(monkeypatch):
    from types import SimpleNamespace

    from temporalio.client import WorkflowExecutionStatus

    from perdure.runtime.payload_store import PayloadMissing
    from perdure.starters.client import goal_reads as goal_client

    async def unreadable(client, wf):
        raise PayloadMissing("the result's payload is in a store this machine does not see")

    monkeypatch.setattr(goal_client, "outcome", unreadable)
    closed = SimpleNamespace(id="g1", status=WorkflowExecutionStatus.COMPLETED)
    assert await goal_client.outcomes(None, [closed]) == {"g1": "?"}
