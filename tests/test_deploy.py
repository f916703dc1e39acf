"""Worker Deployments (issue 23, part 3): `perdure worker` processes of two builds, A then
B, against a real dev server. A goal started on A runs every workflow task of its first run
on A; once B is current it continues as new at its next safe point and its next run is on
B. A worker of B alone never takes a task of a run pinned to A, and `perdure status` says
the goal waits for a worker of A. `perdure deploy status` lists the goals per version."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from typer.testing import CliRunner

from perdure.activities.models.profiles import ModelConfig
from perdure.starters.cli import app
from perdure.workers import deployment
from perdure.workers.orchestrator import build_worker
from tests.builders import gate
from tests.helpers import free_ports, start, statuses, wait_until
from tests.subprocess_rig import perdure, user_env, worker_process

TOOLS = ["run_command", "read_file"]


def second_gate() -> dict:
    """A step after the first gate that waits for GO2: keeps the goal open in its next run."""
    command = "while [ ! -f GO2 ]; do sleep 0.05; done; echo second gate open"
    return {"name": "gate-2", "kind": "tool", "tool": "run_command", "args": {"command": command}, "needs": ["gate"]}


@pytest.fixture
def variables(env, tmp_path: Path, task_queue: str) -> dict[str, str]:
    """A user's shell for workers of a deployment no other test uses, without a watchdog."""
    return {
        **user_env(env, tmp_path, task_queue),
        "PERDURE_DEPLOYMENT": f"dep-{uuid.uuid4().hex[:8]}",
        "PERDURE_WATCHDOG_INTERVAL_S": "0",
    }


def wait_for_log(log: Path, text: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


def deploy_status(variables: dict[str, str]) -> str:
    done = perdure("deploy", "status", env=variables, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def goal_status(variables: dict[str, str], goal_id: str) -> str:
    done = perdure("status", goal_id, env=variables, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def task_builds(env, goal_id: str, run_id: str) -> list[str]:
    """The build id of every workflow task the run completed, from its history."""
    history = await env.client.get_workflow_handle(goal_id, run_id=run_id).fetch_history()
    return [
        e.workflow_task_completed_event_attributes.deployment_version.build_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]


async def last_event_type(env, goal_id: str, run_id: str) -> int:
    history = await env.client.get_workflow_handle(goal_id, run_id=run_id).fetch_history()
    return history.events[-1].event_type


@pytest.mark.process
async def test_a_goal_started_on_build_a_finishes_its_run_on_a_and_continues_on_b(
    env, task_queue, workspace, tmp_path, variables
):
    async with asyncio.timeout(120):
        with worker_process(variables, tmp_path / "a.log", "--build-id", "A"):
            wait_for_log(tmp_path / "a.log", "version made current")
            handle = await start(env, task_queue, workspace, [gate(), second_gate()], allowed_tools=TOOLS)
            await wait_until(handle, lambda s: "gate" in s.running)
            first_run = (await handle.describe()).run_id
            on_a = deploy_status(variables)
            assert "current version: A" in on_a
            assert f"A  current   1 open goal: {handle.id}" in on_a

            with worker_process(variables, tmp_path / "b.log", "--build-id", "B"):
                wait_for_log(tmp_path / "b.log", "version made current")
                both = deploy_status(variables)
                assert "current version: B" in both
                # B is current, yet the goal's run stays on A, the build that started it.
                assert f"A  draining  1 open goal: {handle.id}" in both
                assert "B  current   no open goals" in both
                # The first gate ends: the run's next task (on A) sees the new current
                # version and continues as new; the next run starts on B.
                (workspace / "GO").write_text("")
                moved = await wait_until(handle, lambda s: s.runs == 2 and "gate-2" in s.running)
                assert statuses(moved)["gate"] == "succeeded"
                second_run = (await handle.describe()).run_id
                after = deploy_status(variables)
                assert f"B  current   1 open goal: {handle.id}" in after
                assert "A  draining  no open goals" in after
                (workspace / "GO2").write_text("")
                result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    assert second_run != first_run
    assert await last_event_type(env, handle.id, first_run) == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    first, second = await task_builds(env, handle.id, first_run), await task_builds(env, handle.id, second_run)
    assert first and set(first) == {"A"}, first
    assert second and set(second) == {"B"}, second


@pytest.mark.process
# Waits on purpose: long enough for a worker of B to have taken the task, were it to.
@pytest.mark.slow
async def test_a_worker_of_build_b_alone_never_takes_a_task_of_a_run_pinned_to_a(
    env, task_queue, workspace, tmp_path, variables
):
    async with asyncio.timeout(150):
        with worker_process(variables, tmp_path / "a.log", "--build-id", "A") as worker_a:
            wait_for_log(tmp_path / "a.log", "version made current")
            first = gate()
            first["args"]["replay"] = "safe"  # cut off by the kill, it runs again (not uncertain)
            handle = await start(env, task_queue, workspace, [first, second_gate()], allowed_tools=TOOLS)
            await wait_until(handle, lambda s: "gate" in s.running)
            os.kill(worker_a.pid, signal.SIGKILL)
            worker_a.wait(10)
        with worker_process(variables, tmp_path / "b.log", "--build-id", "B"):
            wait_for_log(tmp_path / "b.log", "version made current")
            # A message makes a workflow task for the run; only a worker of A may take it.
            steer = perdure("steer", handle.id, "keep going", env=variables, timeout=60)
            assert steer.returncode == 0, steer.stderr
            assert "accepted by the server" in steer.stdout and "no worker answered yet" in steer.stdout
            await asyncio.sleep(4)
            history = await handle.fetch_history()
            last_started = max(
                i for i, e in enumerate(history.events) if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
            )
            signalled = max(
                i
                for i, e in enumerate(history.events)
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            )
            assert last_started < signalled, "a worker of B took a task of the run pinned to A"
            said = goal_status(variables, handle.id)
            assert "pinned to build A of deployment" in said and "it waits for a worker of build A" in said, said
            assert "current: B" in said, said
            # A worker of A comes back: it runs the pinned run to its boundary, then B takes over.
            with worker_process(variables, tmp_path / "a2.log", "--build-id", "A"):
                # Restarted to drain, the old build does not take "current" back from B.
                wait_for_log(tmp_path / "a2.log", "version left as it is: it was current before (B is current)")
                (workspace / "GO").write_text("")
                await wait_until(handle, lambda s: s.runs == 2 and "gate-2" in s.running, timeout_s=60)
                (workspace / "GO2").write_text("")
                result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt


@pytest.mark.process
async def test_deploy_move_sends_a_run_whose_build_is_gone_to_the_current_build(
    env, task_queue, workspace, tmp_path, variables
):
    async with asyncio.timeout(120):
        with worker_process(variables, tmp_path / "a.log", "--build-id", "A") as worker_a:
            wait_for_log(tmp_path / "a.log", "version made current")
            last = second_gate()
            last["args"]["replay"] = "safe"  # cut off by the kill, it runs again (not uncertain)
            handle = await start(env, task_queue, workspace, [gate(), last], allowed_tools=TOOLS)
            await wait_until(handle, lambda s: "gate" in s.running)
            (workspace / "GO").write_text("")
            await wait_until(handle, lambda s: "gate-2" in s.running)
            os.kill(worker_a.pid, signal.SIGKILL)
            worker_a.wait(10)
        run_id = (await handle.describe()).run_id
        with worker_process(variables, tmp_path / "b.log", "--build-id", "B"):
            wait_for_log(tmp_path / "b.log", "version made current")
            unknown = perdure("deploy", "move", handle.id, "--to", "C", env=variables, timeout=60)
            assert unknown.returncode == 2 and "has no build 'C'" in unknown.stderr, unknown.stderr
            moved = perdure("deploy", "move", handle.id, env=variables, timeout=60)
            assert moved.returncode == 0, moved.stderr
            assert f"goal {handle.id}: goes to build B at its next workflow task" in moved.stdout
            # Its in-flight gate-2 died with A: the run's next task (a timeout, a retry) is B's.
            (workspace / "GO2").write_text("")
            result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt
    builds = await task_builds(env, handle.id, run_id)
    # The same run: its tasks ran on A, then (all of the rest) on B once moved.
    assert set(builds) == {"A", "B"} and builds == sorted(builds), builds


def cli(variables: dict[str, str], *args: str):
    """`perdure ARGS` run in this process (the edges need no worker)."""
    return CliRunner().invoke(app, list(args), env=variables)


@pytest.mark.slow
def test_deploy_commands_refuse_what_they_cannot_do_in_one_line(env, tmp_path, task_queue, variables):
    status = cli(variables, "deploy", "status")
    assert status.exit_code == 0
    assert "no versioned worker has polled this server yet" in status.output
    unknown = cli(variables, "deploy", "promote", "nope")
    assert unknown.exit_code == 2 and "no worker of build nope has polled deployment" in unknown.output
    assert cli(variables, "deploy", "promote").exit_code == 2  # no build named
    dotted = cli({**variables, "PERDURE_DEPLOYMENT": "a.b"}, "deploy", "promote", "x")
    assert dotted.exit_code == 2 and "must be non-empty and have no '.'" in dotted.output
    missing = cli(variables, "deploy", "move", "no-such-goal")
    assert missing.exit_code == 2 and "no goal with id 'no-such-goal'" in missing.output
    both = cli(variables, "worker", "--unversioned", "--build-id", "A")
    assert both.exit_code == 2 and "--unversioned takes no --build-id" in both.output
    empty = cli(variables, "worker", "--build-id", " ")
    assert empty.exit_code == 2 and "must be 1 to 255 characters" in empty.output
    (port,) = free_ports(1)
    down = cli({**variables, "PERDURE_TEMPORAL": f"127.0.0.1:{port}"}, "deploy", "status")
    assert down.exit_code == 2 and "Traceback" not in down.output, down.output
    for result in (status, unknown, dotted, missing, both, empty):
        assert "Traceback" not in result.output


async def test_deploy_move_refuses_a_goal_no_versioned_worker_has_taken(env, task_queue, workspace, variables):
    handle = await start(env, task_queue, workspace, [gate()], allowed_tools=TOOLS)
    moved = await asyncio.to_thread(cli, variables, "deploy", "move", handle.id)
    assert moved.exit_code == 2 and f"goal {handle.id} is not pinned to a version" in moved.output, moved.output
    await handle.terminate("test over")


@pytest.mark.slow
async def test_workers_of_one_build_promoting_it_together_all_see_it_current(env, task_queue, store):
    """Compose starts its worker replicas together, and each promotes their build: the
    server refuses all but one request at a time (RESOURCE_EXHAUSTED), the others retry."""
    version = deployment.worker_version("A", deployment=f"dep-{uuid.uuid4().hex[:8]}")
    config = deployment.deployment_config(version)
    worker = build_worker(
        env.client, task_queue=task_queue, store=store, model_config=ModelConfig(profiles={}), deployment_config=config
    )
    async with worker:
        outcomes = await asyncio.gather(*(deployment.promote(env.client, version, only_if_new=True) for _ in range(4)))
        found = await deployment.status(env.client, version.deployment_name)
    assert set(outcomes) <= {"made current", "already current"}, outcomes
    assert found.current == "A"


@pytest.mark.process
async def test_a_new_builds_workers_publish_their_offer_after_the_old_builds_are_gone(
    env, task_queue, workspace, tmp_path, variables
):
    """The offers workflow (started by a worker of A) takes the offer of a worker of B once
    B is current and A's workers are gone: it is never left pinned to a build nobody runs."""
    variables = {**variables, "PERDURE_CONFIG": str(tmp_path / "config.toml")}
    async with asyncio.timeout(150):
        with worker_process(variables, tmp_path / "a.log", "--build-id", "A") as worker_a:
            wait_for_log(tmp_path / "a.log", "version made current")
            # A changed config file: A publishes again, now as the current build.
            (tmp_path / "config.toml").write_text('[profiles.mine]\nprovider = "scripted"\nmodel = "mine-model"\n')
            wait_for_log(tmp_path / "a.log", "model profiles reloaded")
            await asyncio.sleep(1)
            os.kill(worker_a.pid, signal.SIGKILL)
            worker_a.wait(10)
        with worker_process(variables, tmp_path / "b.log", "--build-id", "B") as worker_b:
            wait_for_log(tmp_path / "b.log", "version made current")
            deadline = time.monotonic() + 30
            while True:
                listed = perdure("profiles", env=variables, timeout=60)
                assert listed.returncode == 0, listed.stderr
                if f"as published by worker {worker_b.pid}@" in listed.stdout:
                    break
                assert time.monotonic() < deadline, f"build B's offer never published:\n{listed.stdout}"
                await asyncio.sleep(0.5)
