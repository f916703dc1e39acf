"""Commands given input they cannot use, run as a user runs them (the `perdure` command in
a subprocess, against the session's dev server): each answers with one clear line and an
exit code, never a Python traceback, and starts or changes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from perdure.testing.crash import write_model_config
from tests.builders import chain, gate, openai_profile, spec
from tests.helpers import run_goal, running_worker, start, wait_until
from tests.subprocess_rig import perdure, user_env, worker_process

pytestmark = [pytest.mark.process, pytest.mark.slow, pytest.mark.parallel_safe]


def one_clear_line(done, code: int = 2) -> str:
    """The error line of a refused command (and that it is one line, not a traceback)."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_plan_file_that_is_not_utf8_is_refused_in_one_line(env, tmp_path, task_queue):
    variables = user_env(env, tmp_path, task_queue)
    latin1 = tmp_path / "cafe.yaml"
    latin1.write_bytes(
        "goal: café\nsteps:\n  - {name: a, kind: tool, tool: read_file, args: {path: x}}\n".encode("latin-1")
    )
    binary = tmp_path / "blob.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    for path in (latin1, binary):
        goal_id = f"not-utf8-{path.stem}-{task_queue}"
        refused = perdure(
            "start", "--plan", str(path), "x", "--workspace", str(tmp_path), "--id", goal_id, env=variables
        )
        line = one_clear_line(refused)
        assert f"{path} is not UTF-8 text" in line and "save it as UTF-8" in line
        # Nothing started: the server has no goal under the id (other tests' goals share the server).
        described = perdure("status", goal_id, env=variables)
        assert described.returncode != 0 and "Traceback" not in described.stdout + described.stderr


def test_a_perdure_home_that_is_not_a_directory_is_refused_in_one_line(env, tmp_path, task_queue):
    home_file = tmp_path / "home-is-a-file"
    home_file.write_text("not a directory\n")
    for home in (home_file, home_file / "below"):
        variables = {**user_env(env, tmp_path, task_queue), "PERDURE_HOME": str(home)}
        variables.pop("PERDURE_PAYLOAD_STORE")  # the default store, under PERDURE_HOME
        for command in (["ls"], ["memory", "ls"], ["result", "some-goal"]):
            line = one_clear_line(perdure(*command, env=variables))
            assert f"PERDURE_HOME={home} cannot be used: {home_file} is a file, not a directory" in line, line
    assert home_file.read_text() == "not a directory\n"


def test_output_that_is_not_a_terminal_is_not_wrapped_inside_urls(env, tmp_path, task_queue):
    """Piped (as here, and into a file or a log) at the default 80 columns: every URL is whole
    on its line, so it can be opened, copied or grepped."""
    variables = {k: v for k, v in user_env(env, tmp_path, task_queue).items() if k != "COLUMNS"}
    goal_id = "a-goal-whose-id-is-long-enough-to-reach-past-eighty-columns-" + task_queue
    workspace = tmp_path / "a-workspace-with-a-long-name-that-reaches-past-the-edge-of-the-screen"
    workspace.mkdir()
    started = perdure("start", "wait for a worker", "--workspace", str(workspace), "--id", goal_id, env=variables)
    listed = perdure("ls", env=variables)
    assert started.returncode == 0 and listed.returncode == 0, started.stderr + listed.stderr
    goal_link = f"http://localhost:8233/namespaces/default/workflows/{goal_id}"
    goals_link = "http://localhost:8233/namespaces/default/workflows?query=WorkflowType%20%3D%20%22GoalWorkflow%22"
    assert f"UI: {goal_link}" in started.stdout.splitlines()
    assert any(line.endswith(goals_link) for line in listed.stdout.splitlines()), listed.stdout


def test_the_worker_log_prints_one_line_per_failed_activity_attempt(env, tmp_path, task_queue, scripted):
    """A model step whose server fails twice (HTTP 500) and then answers: the worker's log
    has one line for each failed attempt, saying which and why, and no traceback (whose
    locals would print the activity's inputs and the client's settings)."""
    variables = user_env(env, tmp_path, task_queue)
    failing = {"when": "[PERDURE-STEP]", "status": 500, "body": {"error": {"message": "boom"}}, "times": 2}
    home = Path(variables["PERDURE_HOME"])
    home.mkdir()
    write_model_config(home / "config.toml", scripted({"replies": [failing], "policy": "offline"}))
    plan = tmp_path / "plan.yaml"
    plan.write_text("goal: ask once\nsteps:\n  - {name: ask, kind: llm, prompt: Say hello.}\n")
    with worker_process(variables, tmp_path / "worker.log"):
        argv = ["start", "--plan", str(plan), "--workspace", str(tmp_path), "--profile", "test", "--watch"]
        done = perdure(*argv, env=variables)
    assert done.returncode == 0 and "outcome: succeeded" in done.stdout, done.stdout + done.stderr
    log = (tmp_path / "worker.log").read_text()
    failed = [line for line in log.splitlines() if "activity attempt failed" in line]
    assert len(failed) == 2, log[-4000:]
    for attempt, line in enumerate(failed, 1):
        assert f"attempt={attempt}" in line and "activity=perdure.model.generate" in line, line
        assert "error=" in line and "500" in line, line
    assert "Traceback" not in log and "locals" not in log, log[-4000:]


async def test_status_of_a_finished_goal_no_worker_answers_for_shows_what_the_goal_published(
    env, tmp_path, task_queue, store, workspace
):
    """The progress query needs a worker, which may be replaying a long goal's history or not
    run at all; a finished goal's own account of how it ended (its result, in the close event)
    needs none: `perdure status` shows it, and says why the step table is missing."""
    (workspace / "in.txt").write_text("hello\n")
    steps = [
        {"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "in.txt"}},
        {
            "name": "write",
            "kind": "tool",
            "tool": "write_file",
            "needs": ["read"],
            "args": {"path": "out.txt", "content": "hi"},
        },
    ]
    async with running_worker(env, task_queue, store):
        handle, result = await run_goal(env, task_queue, spec(workspace, plan={"steps": steps}))
    assert result.outcome == "succeeded"
    status = await asyncio.to_thread(perdure, "status", handle.id, env=user_env(env, tmp_path, task_queue))
    assert status.returncode == 0, status.stderr
    out = status.stdout
    assert "no worker answered the progress query" in out and "showing what the goal published" in out, out
    assert f"outcome: succeeded · tokens {result.tokens} · ${result.cost_usd:.4f}" in out, out
    assert f"the report: perdure result {handle.id}" in out, out


def test_a_commands_spans_are_exported_before_it_exits(env, tmp_path, task_queue):
    """The CLI leaves with os._exit (sdk-python #300): its spans must be sent first, or the
    trace of a goal has no start."""
    from perdure.testing.otlp import OtlpReceiver

    workspace = tmp_path / "ws"
    workspace.mkdir()
    with OtlpReceiver() as collector:
        variables = user_env(env, tmp_path, task_queue) | {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.base_url,
        }
        started = perdure("start", "wait for a worker", "--workspace", str(workspace), env=variables)
        assert started.returncode == 0, started.stderr
        assert "StartWorkflow:GoalWorkflow" in collector.span_names()


async def test_ls_returns_while_a_goal_that_continued_as_new_runs_and_lists_it_once(
    env, tmp_path, task_queue, store, workspace, scripted
):
    """The listing holds every run of a goal: a run that continued as new is closed, and
    reading its outcome waited for the goal's end (the SDK's result follows the chain):
    `perdure ls` hung while such a goal ran (seen in CI, 120 s)."""
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "ok"}]})
    steps = [*chain(10), gate(["s09"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(
            env, task_queue, workspace, steps, allowed_tools=["run_command"], continue_as_new_after_events=50
        )
        await wait_until(handle, lambda s: s.runs >= 2 and "gate" in s.running, timeout_s=60)
        listed = await asyncio.to_thread(perdure, "ls", env=user_env(env, tmp_path, task_queue), timeout=30)
        (workspace / "GO").write_text("")
        await asyncio.wait_for(handle.result(), 60)
    assert listed.returncode == 0, listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if handle.id in line]
    assert "running" in row, listed.stdout
