"""run_command is not re-run blindly: a command whose run was interrupted (its worker
SIGKILLed, its attempt timed out) becomes a question for a person, unless the plan step
or the agent's call declares it `replay: safe` or it is an allowlisted read-only command;
then it runs again within seconds of the kill, since the command's activity heartbeats.

The process tests kill real `perdure worker` subprocesses (testing/crash.py); the command
appends a line to a file in the workspace, so every run that happened shows as a line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from perdure.activities.artifacts import ArtifactStore
from perdure.activities.models.model_activities import agent_tools
from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.activities.tools.catalogue.command_tool import RunCommandArgs as Args
from perdure.activities.tools.catalogue.command_tool import command_replay, read_only_command
from perdure.activities.tools.run_tool import ToolActivities
from perdure.workflows.goal.contracts.messages import Answer
from perdure.workflows.goal.contracts.plan import Plan, parse_plan
from perdure.workflows.shared.contracts import ToolInput, ToolResult
from tests.builders import agent, openai_profile, spec, tool_then_answer
from tests.helpers import running_worker, start, statuses, submit, wait_until

APPEND = "echo ran >> runs.log; sleep 5"
"""One line per run that happened; the sleep keeps it running until the test kills its worker."""


def lines(workspace: Path) -> list[str]:
    log = workspace / "runs.log"
    return log.read_text().splitlines() if log.exists() else []


async def wait_for_lines(workspace: Path, count: int, timeout_s: float = 60) -> float:
    """Poll until runs.log has `count` lines; the time.monotonic() it was seen."""
    deadline = time.monotonic() + timeout_s
    while len(lines(workspace)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"runs.log has {lines(workspace)} after {timeout_s:g} s, expected {count} lines")
        await asyncio.sleep(0.02)
    return time.monotonic()


def append_then_read() -> Plan:
    append = {"name": "append", "kind": "tool", "tool": "run_command", "args": {"command": APPEND}}
    after = {"name": "after", "kind": "tool", "tool": "read_file", "args": {"path": "runs.log"}, "needs": ["append"]}
    return Plan.model_validate({"steps": [append, after]})


async def kill_while_appending(crash_rig, tmp_path: Path, plan: Plan):
    """A goal whose worker is SIGKILLed while `append` runs, and a new worker started."""
    rig = crash_rig()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    worker = rig.start_worker()
    handle = await rig.start_goal(spec(workspace, plan=plan, allowed_tools=["run_command", "read_file"]))
    await wait_for_lines(workspace, 1)
    worker.kill()
    killed_at = time.monotonic()
    await rig.after_kill(handle)  # the command's activity has a heartbeat timeout
    await rig.start_worker().wait_polling()
    return rig, workspace, handle, killed_at


# --- process tier: a real worker killed mid-command ---------------------------------------


@pytest.mark.process
async def test_default_command_killed_mid_run_asks_and_happened_keeps_one_run(crash_rig, tmp_path):
    rig, workspace, handle, _ = await kill_while_appending(crash_rig, tmp_path, append_then_read())

    snapshot = await wait_until(handle, lambda s: s.questions, timeout_s=60)
    question = snapshot.questions[0]
    assert question.title == "Did run_command in step 'append' happen?"
    assert "never run twice on its own" in question.stuck and APPEND in question.stuck
    assert [o["id"] for o in question.options] == ["happened", "not_happened", "fail"]
    assert "not run again" in question.options[0]["cost"]
    assert statuses(snapshot) == {"append": "uncertain", "after": "pending"}
    assert lines(workspace) == ["ran"]  # not re-run while the question is open

    await submit(handle, Answer(request_id="u1", question_id=question.id, choice="happened"))
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.excerpt
    assert lines(workspace) == ["ran"]  # one run, the interrupted one
    assert "not run again: a person answered that the interrupted run happened" in rig.store.get_text(
        result.outputs["append"]
    )
    assert rig.store.get_text(result.outputs["after"]) == "ran\n"  # the goal went on
    assert "(Did run_command in step 'append' happen?): happened" in rig.store.get_text(result.report)


@pytest.mark.process
async def test_default_command_answered_not_happened_runs_once_more(crash_rig, tmp_path):
    rig, workspace, handle, _ = await kill_while_appending(crash_rig, tmp_path, append_then_read())
    snapshot = await wait_until(handle, lambda s: s.questions, timeout_s=60)
    await submit(handle, Answer(request_id="u1", question_id=snapshot.questions[0].id, choice="not_happened"))
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.excerpt
    assert lines(workspace) == ["ran", "ran"]  # exactly one more run
    assert "[exit code 0]" in rig.store.get_text(result.outputs["append"])


@pytest.mark.process
async def test_replay_safe_step_reruns_within_seconds_of_the_kill(crash_rig, tmp_path):
    # timeout_s 300: the activity's start-to-close is 330 s, what a kill cost without heartbeats.
    plan = Plan.model_validate(
        {
            "steps": [
                {
                    "name": "append",
                    "kind": "tool",
                    "tool": "run_command",
                    "replay": "safe",
                    "args": {"command": APPEND, "timeout_s": 300},
                },
            ]
        }
    )
    rig, workspace, handle, killed_at = await kill_while_appending(crash_rig, tmp_path, plan)

    rerun_at = await wait_for_lines(workspace, 2, timeout_s=120)
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.excerpt
    assert lines(workspace) == ["ran", "ran"]
    assert "[exit code 0]" in rig.store.get_text(result.outputs["append"])
    history = await handle.fetch_history()
    asked = [e for e in history.events if "uncertain_effect" in str(e)]
    assert not asked, "a replay-safe command is re-run without a question"
    assert rerun_at - killed_at < 30, f"re-run {rerun_at - killed_at:.1f} s after the kill (start-to-close: 330 s)"


# --- the activity's decision on an attempt after an interrupted one ------------------------


def second_attempt() -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=2)
    return env


async def run_tool(
    store: ArtifactStore, ws: Path, args: dict, *, env: ActivityEnvironment | None = None, model_written=False, **kw
) -> ToolResult:
    if model_written:
        # What an agent's call carries: the model's JSON text in the artifact store.
        kw["args_ref"] = store.put_text(json.dumps(args))
    else:
        kw["args"] = args
    tool_input = ToolInput(goal_id="g1", node_key="n1", tool="run_command", workspace=str(ws), **kw)
    return await (env or ActivityEnvironment()).run(ToolActivities(store).run_tool, tool_input)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("alpha\nbeta\n")
    return root


async def test_second_attempt_of_a_default_command_is_uncertain_and_does_not_run(store, ws):
    result = await run_tool(store, ws, {"command": "echo ran >> runs.log"}, env=second_attempt())
    assert result.uncertain and not result.ok
    assert "interrupted" in (result.error or "") and "a person must check" in (result.error or "")
    assert lines(ws) == []


async def test_first_attempt_of_a_default_command_runs(store, ws):
    result = await run_tool(store, ws, {"command": "echo ran >> runs.log"})
    assert result.ok and lines(ws) == ["ran"]


async def test_allowlisted_read_only_command_reruns_without_a_question(store, ws):
    result = await run_tool(store, ws, {"command": "cat notes.txt | grep beta | wc -l"}, env=second_attempt())
    assert result.ok and not result.uncertain
    assert store.get_text(result.output).startswith("$ cat notes.txt | grep beta | wc -l\n1\n")


async def test_agent_call_declaring_replay_safe_reruns(store, ws):
    args = {"command": "echo ran >> runs.log", "replay": "safe"}
    result = await run_tool(store, ws, args, env=second_attempt(), model_written=True)
    assert result.ok and not result.uncertain and lines(ws) == ["ran"]


async def test_happened_answer_records_the_call_without_running_it(store, ws):
    result = await run_tool(store, ws, {"command": "echo ran >> runs.log"}, resolution="happened")
    assert result.ok and lines(ws) == []
    assert "its output and exit code were lost" in store.get_text(result.output)


async def test_malformed_replay_argument_is_a_tool_error_the_model_sees(store, ws):
    args = {"command": "echo ran >> runs.log", "replay": "always"}
    result = await run_tool(store, ws, args, model_written=True)
    assert not result.ok and not result.uncertain and lines(ws) == []
    assert "bad arguments for run_command: replay:" in (result.error or "")
    assert 'replay must be "safe"' in (result.error or "") and "'always'" in (result.error or "")


# --- what the planner and the model are told -------------------------------------------------


def test_tool_schema_the_model_sees_documents_replay():
    (tool,) = agent_tools(["run_command"])
    replay = tool.json_schema["properties"]["replay"]
    assert "safe" in json.dumps(replay)
    assert "interrupted" in replay["description"] and "question for a person" in replay["description"]
    assert '"replay": "safe"' in tool.description


def test_malformed_replay_in_a_plan_is_refused_with_the_reason():
    step = {"name": "build", "kind": "tool", "tool": "run_command", "args": {"command": "make"}}
    plan, reason = parse_plan({"steps": [{**step, "replay": "yes"}]}, ["run_command"])
    assert plan is None and "replay" in (reason or "") and "'safe'" in (reason or "")
    plan, reason = parse_plan({"steps": [{**step, "args": {"command": "make", "replay": 1}}]}, ["run_command"])
    assert plan is None and "bad arguments for run_command: replay:" in (reason or "")
    plan, reason = parse_plan({"steps": [{**step, "replay": "safe"}]}, ["run_command"])
    assert plan is not None and reason is None


@pytest.mark.parametrize(
    "command",
    ["ls", "ls -la docs", "pwd && ls", "git status", "git diff --stat", "git log --oneline -5", "git show HEAD",
     "cat a.txt | grep x | wc -l", "head -n 3 a.txt; tail -n 2 b.txt", "grep -rn 'TODO' src"],
)  # fmt: skip
def test_read_only_commands_are_replay_safe(command):
    assert read_only_command(command)
    assert command_replay(Args(command=command)) == "a read-only command"


@pytest.mark.parametrize(
    "command",
    ["", "echo hi >> log", "cat a > b", "cat < a", "ls; rm -rf x", "ls && rm x", "ls &&rm x", "ls&&rm x",
     "ls || rm x", "cat a | tee b", "ls\nrm x", "ls $(rm x)", "ls `rm x`", "ls &", "ls |& cat", "ls ;", "| cat",
     "git push", "git commit -m x", "git branch new", "git -c core.pager=x log", "git diff --output=x",
     "git log --ext-diff", "sort -o x y", "find . -delete", "sed -i s/a/b/ f", "X=1 ls", "/bin/ls",
     "cat 'unterminated", "bash -c ls", "make test", "(ls)", "{ ls; }"],
)  # fmt: skip
def test_anything_else_is_not_replay_safe(command):
    assert not read_only_command(command)
    assert command_replay(Args(command=command)) is None


def test_declared_replay_safe_wins_over_the_allowlist():
    assert command_replay(Args(command="make test", replay="safe")) == 'declared replay: "safe"'
    assert TOOL_SPECS["run_command"].replay == "once"


# --- an agent's command, end to end in one worker --------------------------------------------


@pytest.mark.slow
async def test_agent_malformed_replay_comes_back_as_an_error_and_the_goal_goes_on(
    env, task_queue, store, workspace, scripted
):
    server = scripted(
        tool_then_answer(
            "run_command",
            {"command": "echo ran >> runs.log", "replay": "yes"},
            when="bad arguments for run_command",
            answer="The call was refused; nothing ran.",
        )
    )
    step = agent("build", "Append a line to runs.log.", ["run_command"])
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [step], allowed_tools=["run_command"])
        result = await asyncio.wait_for(handle.result(), 60)

    assert result.outcome == "succeeded", result.excerpt
    assert lines(workspace) == []
    first, second = server.requests()
    assert "bad arguments for run_command: replay:" in second["last_message"]


@pytest.mark.process
async def test_agent_command_killed_mid_run_asks_and_the_agent_goes_on_from_the_answer(crash_rig, scripted, tmp_path):
    model = scripted(
        tool_then_answer("run_command", {"command": APPEND}, when="not run again", answer="Appended once.")
    )
    rig = crash_rig(model=model)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    plan = Plan.model_validate({"steps": [agent("log", "Append a line to runs.log.", ["run_command"])]})
    worker = rig.start_worker()
    handle = await rig.start_goal(spec(workspace, plan=plan, allowed_tools=["run_command"]))
    await wait_for_lines(workspace, 1)
    worker.kill()
    await rig.after_kill(handle)
    rig.start_worker()

    snapshot = await wait_until(handle, lambda s: s.questions, timeout_s=60)
    assert snapshot.questions[0].title == "Did run_command in step 'log' happen?"
    assert statuses(snapshot) == {"log": "uncertain"}
    await submit(handle, Answer(request_id="u1", question_id=snapshot.questions[0].id, choice="happened"))
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.excerpt
    assert rig.store.get_text(result.outputs["log"]) == "Appended once."
    assert lines(workspace) == ["ran"]  # the agent's resumed loop did not run the command again
    # Turn 1 asked for the command, turn 2 saw "not run again": no turn was repeated.
    assert len(model.requests()) == 2, [r["last_message"][:80] for r in model.requests()]
