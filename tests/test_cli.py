"""The `perdure` CLI as a user runs it: real subprocesses for the worker and
the commands, against the session's dev server and a scripted model server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perdure.testing.crash import write_model_config
from perdure.workflows.goal.contracts.state import GoalInput, GoalState
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, SUMMARY_TEXT, chain, demo_script, spec, write_notes
from tests.helpers import workflow_task_failures
from tests.subprocess_rig import PERDURE, perdure, worker_process

pytestmark = [pytest.mark.process, pytest.mark.parallel_safe]


def cli_env(env, tmp_path: Path, task_queue: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PERDURE_TEMPORAL": env.client.service_client.config.target_host,
        "PERDURE_TASK_QUEUE": task_queue,
        "PERDURE_HOME": str(tmp_path / "home"),
        "PERDURE_CONFIG": str(tmp_path / "config.toml"),
        "NO_COLOR": "1",
        "COLUMNS": "200",
        **extra,
    }


@pytest.fixture
def cli_worker(env, tmp_path, task_queue, scripted):
    """A real `perdure worker` subprocess whose 'test' profile points at a scripted server."""
    write_model_config(tmp_path / "config.toml", scripted(demo_script()))
    variables = cli_env(env, tmp_path, task_queue)
    with worker_process(variables, tmp_path / "worker.log"):
        yield variables


def test_start_then_watch_completes_and_prints_the_result(cli_worker, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    write_notes(workspace)

    started = perdure(
        "start",
        "Summarise the notes into SUMMARY.md",
        "--workspace",
        str(workspace),
        "--profile",
        "test",
        "--id",
        "cli-goal-1",
        env=cli_worker,
    )
    assert started.returncode == 0, started.stderr
    assert "goal cli-goal-1 started" in started.stdout
    assert "http://localhost:8233/namespaces/default/workflows/cli-goal-1" in started.stdout

    watched = perdure("watch", "cli-goal-1", env=cli_worker, timeout=120)
    assert watched.returncode == 0, watched.stderr
    assert "outcome: succeeded" in watched.stdout
    assert "write-summary" in watched.stdout  # the report's step table
    assert (workspace / "SUMMARY.md").read_text() == SUMMARY_TEXT

    status = perdure("status", "cli-goal-1", "--why", env=cli_worker)
    assert status.returncode == 0, status.stderr
    assert "Completed" in status.stdout and "read-todo" in status.stdout
    assert "read-todo · read_file local activity: read, safe to re-run" in status.stdout
    assert "write-summary · run_command activity: replay policy 'once'" in status.stdout

    listed = perdure("ls", env=cli_worker)
    assert "cli-goal-1" in listed.stdout

    out = tmp_path / "history.json"
    exported = perdure("history", "cli-goal-1", "--out", str(out), env=cli_worker)
    assert exported.returncode == 0, exported.stderr
    assert '"workflowExecutionStartedEventAttributes"' in out.read_text()

    result = perdure("result", "cli-goal-1", env=cli_worker)
    assert result.returncode == 0 and "outcome: succeeded" in result.stdout


def test_plan_file_goal_runs_without_a_planner(cli_worker, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "in.txt").write_text("hello")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "goal: copy a file\n"
        "steps:\n"
        "  - {name: read, kind: tool, tool: read_file, args: {path: in.txt}}\n"
        "  - name: write\n"
        "    kind: tool\n"
        "    tool: write_file\n"
        "    needs: [read]\n"
        "    args: {path: out.txt, content: '{{steps.read}}!'}\n"
    )
    started = perdure(
        "start", "--plan", str(plan), "--workspace", str(workspace), "--id", "cli-plan-1", "--watch", env=cli_worker
    )
    assert started.returncode == 0, started.stderr
    assert "outcome: succeeded" in started.stdout
    assert (workspace / "out.txt").read_text() == "hello!"


def test_clear_errors(env, tmp_path, task_queue):
    variables = cli_env(env, tmp_path, task_queue)

    unknown = perdure("status", "no-such-goal", env=variables)
    assert unknown.returncode == 2 and "no goal with id 'no-such-goal'" in unknown.stderr

    bad_plan = tmp_path / "bad.yaml"
    # No name a tool of the user's own could have (those only a worker's offer can refuse).
    bad_plan.write_text("steps:\n  - {name: a, kind: tool, tool: rm -rf}\n")
    rejected = perdure("start", "--plan", str(bad_plan), "x", env=variables)
    assert rejected.returncode == 2 and "unknown tool 'rm -rf'" in rejected.stderr

    not_yaml = tmp_path / "broken.yaml"
    not_yaml.write_text("steps: [unclosed\n")
    broken = perdure("start", "--plan", str(not_yaml), "x", env=variables)
    assert broken.returncode == 2 and "is not valid YAML" in broken.stderr

    down = perdure("ls", env={**variables, "PERDURE_TEMPORAL": "127.0.0.1:1"})
    assert down.returncode == 2 and "cannot reach Temporal at 127.0.0.1:1" in down.stderr
    assert "perdure server start" in down.stderr


def test_goal_waits_durably_when_no_worker_runs(env, tmp_path, task_queue):
    """Admission does not need a worker: the goal is accepted and reports it waits."""
    variables = cli_env(env, tmp_path, task_queue)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    started = perdure("start", "anything", "--workspace", str(workspace), "--id", "cli-nowork-1", env=variables)
    assert started.returncode == 0, started.stderr
    begin = time.monotonic()
    status = perdure("status", "cli-nowork-1", env=variables, timeout=30)
    assert status.returncode == 0
    assert "Running" in status.stdout and "no worker answered" in status.stdout
    assert time.monotonic() - begin < 20


def test_a_steering_session(env, tmp_path, task_queue, scripted):
    """Steer with no worker running (durable), then rewind and inspect the inbox."""
    server = scripted(STEP_REPLY)
    (tmp_path / "config.toml").write_text(
        f'[profiles.test]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.openai_base_url}"\n'
    )
    variables = cli_env(env, tmp_path, task_queue)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "goal: steer me\n"
        "steps:\n"
        "  - {name: first, kind: llm, prompt: Write the first part.}\n"
        "  - name: gate\n"
        "    kind: tool\n"
        "    tool: run_command\n"
        "    args: {command: 'while [ ! -f GO ]; do sleep 0.05; done'}\n"
        "  - {name: after, kind: llm, needs: [first, gate], prompt: Finish.}\n"
        "premises: {scope: everything}\n"
    )
    started = perdure(
        "start",
        "--plan",
        str(plan),
        "--workspace",
        str(workspace),
        "--profile",
        "test",
        "--id",
        "cli-steer-1",
        env=variables,
    )
    assert started.returncode == 0, started.stderr

    steered = perdure("steer", "cli-steer-1", "Use short sentences.", "--request-id", "s-1", env=variables)
    assert steered.returncode == 0, steered.stderr
    assert "accepted by the server (request id s-1); no worker answered yet" in steered.stdout

    log = open(tmp_path / "worker.log", "w")
    worker = subprocess.Popen([PERDURE, "worker"], env=variables, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "first" not in str([r["last_message"][:12] for r in server.requests()]):
            assert time.monotonic() < deadline, "the first step never ran"
            time.sleep(0.2)
        refused = perdure("rewind", "cli-steer-1", "nope", "--why", "x", env=variables)
        assert refused.returncode == 2 and "rejected: unknown step 'nope'" in refused.stderr
        unknown = perdure("narrow", "cli-steer-1", "colour=red", env=variables)
        assert "unknown premise key(s): colour (this goal's premises: scope=everything)" in unknown.stderr

        time.sleep(1)
        rewound = perdure("rewind", "cli-steer-1", "first", "--why", "too long", env=variables)
        assert rewound.returncode == 0, rewound.stderr
        assert "rewind" in rewound.stdout and "applied" in rewound.stdout and "void: first" in rewound.stdout

        (workspace / "GO").touch()
        watched = perdure("watch", "cli-steer-1", env=variables, timeout=60)
        assert "outcome: succeeded" in watched.stdout, watched.stdout + watched.stderr

        inbox = perdure("inbox", "cli-steer-1", env=variables)
        assert inbox.returncode == 0, inbox.stderr
        assert "s-1" in inbox.stdout and inbox.stdout.count("applied") >= 2
    finally:
        worker.kill()
        worker.wait()
        log.close()
    first_calls = [r for r in server.requests() if r["last_message"].startswith("step: first\n")]
    assert len(first_calls) == 2
    assert "Use short sentences." in first_calls[0]["last_message"]
    assert "step 'first' was rejected: too long" in first_calls[1]["last_message"]


def test_ls_finds_goals_that_need_a_person(cli_worker, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "goal: wait for me\n"
        "steps:\n"
        "  - {name: gate, kind: tool, tool: run_command, args: {command: 'while [ ! -f GO ]; do sleep 0.05; done'}}\n"
        "  - {name: after, kind: tool, tool: list_dir, needs: [gate], args: {}}\n"
    )
    started = perdure(
        "start", "--plan", str(plan), "--workspace", str(workspace), "--id", "cli-human-1", env=cli_worker
    )
    assert started.returncode == 0, started.stderr
    parked = perdure(
        "park", "cli-human-1", "--reason", "waiting for review", "--expiry-hours", "0.0005", env=cli_worker
    )
    assert parked.returncode == 0 and "applied" in parked.stdout, parked.stdout + parked.stderr

    deadline = time.monotonic() + 30
    while "cli-human-1" not in perdure("ls", "--needs-human", env=cli_worker).stdout:
        assert time.monotonic() < deadline, "the goal never showed up as needing a person"
        time.sleep(0.5)
    assert "cli-human-1" in perdure("ls", "--parked", env=cli_worker).stdout
    status = perdure("status", "cli-human-1", env=cli_worker)
    assert "needs you · q1: Still parked: waiting for review" in status.stdout
    assert "perdure answer cli-human-1 q1 <option>" in status.stdout

    answered = perdure("answer", "cli-human-1", "q1", "resume", env=cli_worker)
    assert answered.returncode == 0 and "applied" in answered.stdout
    (workspace / "GO").touch()
    watched = perdure("watch", "cli-human-1", env=cli_worker, timeout=60)
    assert "outcome: succeeded" in watched.stdout
    assert "cli-human-1" not in perdure("ls", "--needs-human", env=cli_worker).stdout


GATE_PLAN = (
    "goal: wait for me\n"
    "steps:\n"
    "  - {name: gate, kind: tool, tool: run_command, args: {command: 'while [ ! -f GO ]; do sleep 0.05; done'}}\n"
    "  - {name: after, kind: tool, tool: list_dir, needs: [gate], args: {}}\n"
)


def temporal(*args: str, env) -> subprocess.CompletedProcess:
    """The real Temporal CLI from the venv, against the session's dev server."""
    address = env.client.service_client.config.target_host
    command = [str(Path(sys.executable).parent / "temporal"), *args, "--address", address]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


async def test_a_message_signal_from_the_temporal_cli_without_input_is_refused_and_the_goal_goes_on(
    env, cli_worker, tmp_path
):
    """The easiest mistake: `temporal workflow signal --name message` and no --input (or two).
    The goal records why it refused each and still takes steering and finishes."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    plan = tmp_path / "plan.yaml"
    plan.write_text(GATE_PLAN)
    started = perdure("start", "--plan", str(plan), "--workspace", str(workspace), "--id", "cli-raw-1", env=cli_worker)
    assert started.returncode == 0, started.stderr

    bare = temporal("workflow", "signal", "--workflow-id", "cli-raw-1", "--name", "message", env=env)
    assert bare.returncode == 0, bare.stderr
    two = ["--input", '{"request_id": "t1", "kind": "resume"}', "--input", "{}"]
    doubled = temporal("workflow", "signal", "--workflow-id", "cli-raw-1", "--name", "message", *two, env=env)
    assert doubled.returncode == 0, doubled.stderr

    parked = perdure("park", "cli-raw-1", "--reason", "checking the logs", env=cli_worker)
    assert parked.returncode == 0 and ": applied" in parked.stdout, parked.stdout + parked.stderr
    status = perdure("status", "cli-raw-1", env=cli_worker)
    assert "parked: checking the logs" in status.stdout
    assert "refused (no id): the 'message' signal carries 2 arguments" in status.stdout
    inbox = perdure("inbox", "cli-raw-1", env=cli_worker)
    assert "refused (no id): the 'message' signal carries no argument; it takes exactly one JSON object" in (
        inbox.stdout.replace("\n", " ")
    ), inbox.stdout
    resumed = perdure("resume", "cli-raw-1", env=cli_worker)
    assert resumed.returncode == 0 and ": applied" in resumed.stdout
    (workspace / "GO").touch()
    watched = perdure("watch", "cli-raw-1", env=cli_worker, timeout=60)
    assert "outcome: succeeded" in watched.stdout, watched.stdout + watched.stderr
    assert workflow_task_failures(await env.client.get_workflow_handle("cli-raw-1").fetch_history()) == []
    late = perdure("steer", "cli-raw-1", "one more thing", env=cli_worker)
    assert late.returncode == 2
    said = " ".join(late.stderr.split())
    assert "goal cli-raw-1 has finished (outcome succeeded); see `perdure result cli-raw-1`; it takes no more" in said


async def test_status_and_abort_of_a_goal_whose_workflow_task_fails_say_why_and_what_to_do(
    env, cli_worker, task_queue, tmp_path
):
    """A goal stuck for a reason outside it (here a worker older than the state it carries):
    status and abort show the worker's failure message and the way out, at once, instead of
    "Workflow Task in failed state" or a query timeout."""
    newer = GoalState(spec=spec(tmp_path)).model_dump(mode="json") | {"schema_version": "99.0"}
    handle = await env.client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=spec(tmp_path, plan={"steps": chain(1)}), state=json.dumps(newer)),
        id="cli-stuck-1",
        task_queue=task_queue,
    )
    deadline = time.monotonic() + 30
    while (await handle.describe()).raw_description.pending_workflow_task.attempt < 2:
        assert time.monotonic() < deadline, "the workflow task never failed"
        await asyncio.sleep(0.2)
    try:
        # What starting the CLI and asking the server costs on this machine now: a goal that does
        # not exist is answered at once. A loaded 2-core CI run took 15.6 s for the two commands
        # below, so they are judged against this, not against a fixed bound.
        began = time.monotonic()
        assert perdure("status", "cli-no-such-goal", env=cli_worker).returncode != 0
        one_command_s = time.monotonic() - began
        begin = time.monotonic()
        status = perdure("status", "cli-stuck-1", env=cli_worker)
        assert status.returncode == 0, status.stderr
        assert "stuck: every workflow task of this goal fails" in status.stdout
        assert "the carried state is schema v99.0, newer than this worker's" in status.stdout
        assert "run a worker with that perdure version" in status.stdout
        assert "temporal workflow terminate --workflow-id cli-stuck-1" in status.stdout.replace("\n", " ")

        aborted = perdure("abort", "cli-stuck-1", "--request-id", "ab-1", env=cli_worker)
        assert aborted.returncode == 1
        said = aborted.stderr.replace("\n", " ")
        assert "goal cli-stuck-1 is stuck: its workflow task fails" in said
        assert "the carried state is schema v99.0, newer than this worker's" in said
        assert "abort stored by the server (request id ab-1); it is applied once a worker can run" in said
        # No query or update left waiting for a task that cannot run: each would add its 5 s
        # timeout (or more) to what the two commands cost (1 s each here when idle; 4.6 s each
        # beside a loaded CI run whose reference command took 2.3 s).
        assert time.monotonic() - begin < 3 * one_command_s + 6, (time.monotonic() - begin, one_command_s)
        assert "Traceback" not in status.stderr + aborted.stderr
    finally:
        await handle.terminate("test over")
