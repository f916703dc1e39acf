"""Devices from the outside, with real processes: `perdure worker`, `perdure device` daemons
on their own roots (two "machines"), goals started with `perdure start`, and devices killed,
frozen and started again while the goal waits for them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata

from perdure.activities.artifacts import DiskArtifactStore
from perdure.testing.repo import git, init_repo
from perdure.workflows.goal.contracts.goal_contracts import GoalSpec
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import spec
from tests.helpers import new_goal_id
from tests.subprocess_rig import PERDURE, perdure, result_of, snapshot, user_env, wait_for, worker_process, write_plan

pytestmark = pytest.mark.process

NOTES = "# notes from machine A\n\n- ship the export fix\n"
LEASE_S = "3"


class DeviceRig:
    """`perdure device` daemons as a user starts them, each logging to its own file."""

    def __init__(self, variables: dict[str, str], logs: Path) -> None:
        self.variables = variables
        self.logs = logs
        self.procs: list[subprocess.Popen] = []

    def start(
        self, name: str, root: Path, *options: str, scratch: Path | None = None, lease_s: str = LEASE_S
    ) -> subprocess.Popen:
        log_path = self.logs / f"device-{name}-{len(self.procs)}.log"
        scratch = scratch or self.logs / f"scratch-{name}"
        argv = [PERDURE, "device", "--name", name, "--root", str(root), "--lease-s", lease_s, "--scratch", str(scratch)]
        with open(log_path, "w") as log:
            proc = subprocess.Popen([*argv, *options], env=self.variables, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        deadline = time.monotonic() + 60
        while f"device {name} online" not in log_path.read_text():
            assert proc.poll() is None, f"device {name} exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"device {name} did not come online:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.1)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()


@pytest.fixture
def machines(env, tmp_path, task_queue) -> Iterator[tuple[dict[str, str], DeviceRig]]:
    """A `perdure worker` (the cluster) and a way to start device daemons (the machines)."""
    variables = user_env(env, tmp_path, task_queue)
    # The watchdog's schedule exists but runs only when a test says `watchdog run-now`.
    variables["PERDURE_WATCHDOG_INTERVAL_S"] = "3600"
    rig = DeviceRig(variables, tmp_path)
    with worker_process(variables, tmp_path / "worker.log"):
        try:
            yield variables, rig
        finally:
            rig.close()


def start_goal(variables: dict[str, str], plan: Path, workspace: Path, goal_id: str, *extra: str) -> None:
    argv = ["start", "--plan", str(plan), "--workspace", str(workspace), "--id", goal_id, *extra]
    started = perdure(*argv, env=variables)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]


def start_workflow(env, goal_id: str, goal: GoalSpec, task_queue: str) -> None:
    async def start() -> None:
        await env.client.start_workflow(GoalWorkflow.run, GoalInput(spec=goal), id=goal_id, task_queue=task_queue)

    asyncio.run(start())


def ui_details(env, goal_id: str) -> str:
    """What the Temporal UI shows as the goal's current details (the SDK's metadata query)."""

    async def ask() -> str:
        handle = env.client.get_workflow_handle(goal_id)
        metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        return metadata.current_details

    return asyncio.run(ask())


def finished(env, workflow_id: str) -> None:
    """Wait for a workflow (a watchdog run) to finish."""

    async def wait() -> None:
        await asyncio.wait_for(env.client.get_workflow_handle(workflow_id).result(), 60)

    asyncio.run(wait())


def test_a_goal_reads_on_device_a_writes_and_commits_on_device_b_and_each_file_lands_only_there(
    env, machines, tmp_path
):
    variables, devices = machines
    two_machines = new_goal_id("two-machines")
    root_a, root_b, workspace = tmp_path / "laptop-a", tmp_path / "laptop-b", tmp_path / "worker-ws"
    root_a.mkdir()
    workspace.mkdir()
    (root_a / "notes.md").write_text(NOTES)
    init_repo(root_b)
    devices.start("a", root_a, "--tools", "read_file,list_dir")
    devices.start("b", root_b, "--approve", "*=never")
    plan = write_plan(
        tmp_path / "plan.yaml",
        [
            {"name": "read", "kind": "tool", "tool": "read_file", "device": "a", "args": {"path": "notes.md"}},
            {
                "name": "copy",
                "kind": "tool",
                "tool": "write_file",
                "device": "b",
                "needs": ["read"],
                "args": {"path": "copied.md", "content": "{{steps.read}}"},
            },
            {
                "name": "commit",
                "kind": "tool",
                "tool": "git_commit",
                "device": "b",
                "needs": ["copy"],
                "args": {"message": "Copy the notes from machine A", "paths": ["copied.md"]},
            },
        ],
    )
    ghost = write_plan(
        tmp_path / "ghost.yaml",
        [{"name": "read", "kind": "tool", "tool": "read_file", "device": "ghost", "args": {"path": "notes.md"}}],
    )
    refused = perdure("start", "--plan", str(ghost), "--workspace", str(workspace), env=variables)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "no device named 'ghost' (devices: a (read_file, list_dir), b (" in " ".join(refused.stderr.split())
    start_goal(variables, plan, workspace, two_machines)
    result = result_of(env, two_machines)

    assert result.outcome == "succeeded", result.excerpt
    assert (root_b / "copied.md").read_text() == NOTES
    assert sorted(p.name for p in root_a.iterdir()) == ["notes.md"]  # A was only read
    assert list(workspace.iterdir()) == []  # nothing ran on the worker's own workspace
    log = git(root_b, "log", "--format=%s%n%b%x00").split("\x00")
    commits = [entry.strip() for entry in log if entry.strip()]
    assert len(commits) == 2 and commits[0].startswith("Copy the notes from machine A"), commits
    assert "Effect-Key: fx-" in commits[0]
    assert git(root_b, "status", "--porcelain") == ""
    nodes = {n.name: n for n in snapshot(env, two_machines).nodes}
    assert nodes["read"].placements["read_file"].startswith("device a")
    assert nodes["commit"].placements["git_commit"].startswith("device b")

    assert _device_row(variables, "a") == _device_row(variables, "b") == "online"


def test_a_device_killed_mid_step_parks_the_step_until_it_returns_and_nothing_is_written_twice(env, machines, tmp_path):
    variables, devices = machines
    killed_device = new_goal_id("killed-device")
    root, workspace = tmp_path / "laptop", tmp_path / "worker-ws"
    workspace.mkdir()
    init_repo(root)
    first = devices.start("a", root, "--approve", "*=never")
    plan = write_plan(
        tmp_path / "plan.yaml",
        [
            {
                "name": "build",
                "kind": "tool",
                "tool": "run_command",
                "device": "a",
                "replay": "safe",
                "args": {"command": "sleep 4 && printf 'built\\n' > built.txt", "timeout_s": 60},
            },
            {
                "name": "commit",
                "kind": "tool",
                "tool": "git_commit",
                "device": "a",
                "needs": ["build"],
                "args": {"message": "Add the build output", "paths": ["built.txt"]},
            },
        ],
        stall_after_s=1,
    )
    start_goal(variables, plan, workspace, killed_device, "--max-wall", "3600")
    wait_for(lambda: "build" in snapshot(env, killed_device).running, "the build step to start")
    time.sleep(1)  # the command is in its sleep on the device
    first.kill()
    first.wait()

    def waiting() -> bool:
        snap = snapshot(env, killed_device)
        return snap.waiting_for_devices == {"build": "a"} and snap.phase == "awaiting_device"

    wait_for(waiting, "the goal to wait for device a")
    status = perdure("status", killed_device, env=variables)
    assert status.returncode == 0, status.stderr
    assert "waiting for device a" in status.stdout
    assert "waiting for device a (offline)" in ui_details(env, killed_device)
    active_before = snapshot(env, killed_device).active_seconds
    measured_at = time.monotonic()
    assert snapshot(env, killed_device).stall_after_s == 1  # the watchdog would call any other goal stalled
    watchdog = perdure("watchdog", "run-now", env=variables)
    assert watchdog.returncode == 0, watchdog.stdout + watchdog.stderr
    finished(env, re.search(r"watchdog run (\S+) started", watchdog.stdout).group(1))
    time.sleep(max(0.0, measured_at + 3 - time.monotonic()))  # 3 s of waiting, the watchdog's run among them
    later = snapshot(env, killed_device)
    assert later.active_seconds == active_before  # waiting for a device is not active time
    assert later.waiting_for_devices == {"build": "a"}
    inbox = perdure("inbox", killed_device, env=variables)
    assert "wd-" not in inbox.stdout  # the watchdog sent nothing: no nudge, no escalation
    report = perdure("watchdog", "report", env=variables)
    assert "waiting for offline devices: build on a" in report.stdout and "stalled" not in report.stdout, report.stdout

    devices.start("a", root, "--approve", "*=never", scratch=tmp_path / "fresh-scratch")
    result = result_of(env, killed_device)
    assert result.outcome == "succeeded", result.excerpt
    assert (root / "built.txt").read_text() == "built\n"
    subjects = git(root, "log", "--format=%s").splitlines()
    assert subjects == ["Add the build output", "initial commit"]  # committed once
    gate = " ".join(snapshot(env, killed_device).gate_log)
    assert "device a lost a call" in gate


def test_a_goal_started_while_its_device_is_offline_waits_through_continue_as_new_and_finishes_when_it_appears(
    env, machines, tmp_path
):
    variables, devices = machines
    offline_at_start = new_goal_id("offline-at-start")
    root, workspace = tmp_path / "laptop", tmp_path / "worker-ws"
    root.mkdir()
    workspace.mkdir()
    (root / "notes.md").write_text(NOTES)
    devices.start("a", root).kill()  # known to the registry, then offline
    wait_for(lambda: "offline" in _device_row(variables, "a"), "device a to be offline")
    read = {"name": "read", "kind": "tool", "tool": "read_file", "device": "a", "args": {"path": "notes.md"}}
    # Started by a client: a plan file cannot set how soon the goal continues as new.
    goal = spec(workspace, plan={"steps": [read]}, allowed_tools=["read_file"], continue_as_new_after_events=50)
    start_workflow(env, offline_at_start, goal, variables["PERDURE_TASK_QUEUE"])
    wait_for(lambda: snapshot(env, offline_at_start).waiting_for_devices == {"read": "a"}, "the wait")
    # Messages grow the history until the goal continues as new while it waits.
    for i in range(40):
        if snapshot(env, offline_at_start).runs >= 2:
            break
        sent = perdure("steer", offline_at_start, f"note {i}: the laptop is on its way", env=variables)
        assert sent.returncode == 0, sent.stderr
    carried = snapshot(env, offline_at_start)
    assert carried.runs >= 2 and carried.waiting_for_devices == {"read": "a"}

    devices.start("a", root)
    result = result_of(env, offline_at_start)
    assert result.outcome == "succeeded", result.excerpt
    assert snapshot(env, offline_at_start).results["read"]


def test_a_result_from_a_replaced_device_session_is_refused_and_the_step_runs_on_the_new_one(env, machines, tmp_path):
    variables, devices = machines
    fenced = new_goal_id("fenced")
    root, workspace = tmp_path / "laptop", tmp_path / "worker-ws"
    root.mkdir()
    workspace.mkdir()
    (root / "state.txt").write_text("old\n")
    # A long lease: the frozen session's call is not given up before its late result comes.
    old = devices.start("a", root, "--approve", "*=never", lease_s="10")
    plan = write_plan(
        tmp_path / "plan.yaml",
        [
            {
                "name": "look",
                "kind": "tool",
                "tool": "run_command",
                "device": "a",
                "replay": "safe",
                "args": {"command": "sleep 3 && cat state.txt", "timeout_s": 60},
            }
        ],
    )
    start_goal(variables, plan, workspace, fenced)
    wait_for(lambda: "look" in snapshot(env, fenced).running, "the step to run")
    time.sleep(0.5)
    os.kill(old.pid, signal.SIGSTOP)  # frozen mid-command: its completion will come late
    (root / "state.txt").write_text("new\n")
    devices.start("a", root, "--approve", "*=never", lease_s="10")  # a new session of device a
    wait_for(lambda: "session 2" in snapshot(env, fenced).devices.get("a", ""), "the goal to hear of session 2")
    os.kill(old.pid, signal.SIGCONT)  # the old session finishes its command and reports
    result = result_of(env, fenced)

    assert result.outcome == "succeeded", result.excerpt
    snap = snapshot(env, fenced)
    gate = " ".join(snap.gate_log)
    assert "refused a result from device a session 1" in gate, gate
    store = DiskArtifactStore(Path(variables["PERDURE_HOME"]) / "artifacts")
    assert store.get_text(snap.results["look"]) == "$ sleep 3 && cat state.txt\nnew\n\n[exit code 0]"


def _device_row(variables: dict[str, str], name: str) -> str:
    listed = perdure("devices", "--json", env=variables)
    if listed.returncode != 0:
        return ""
    for device in json.loads(listed.stdout).get("devices", []):
        if device["name"] == name:
            return "online" if device["online"] else "offline"
    return ""


def test_a_second_daemon_of_a_name_with_another_root_is_refused_unless_it_replaces_the_first(env, machines, tmp_path):
    """Two terminals, one name: the second daemon, working elsewhere, would silently take
    the device over and later steps would run in its directory. It is refused in one line;
    with --replace it takes over, and the first says so in one line and exits."""
    variables, devices = machines
    here, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    first = devices.start("a", here)
    argv = [PERDURE, "device", "--name", "a", "--root", str(elsewhere), "--lease-s", LEASE_S]
    refused = subprocess.run(
        [*argv, "--scratch", str(tmp_path / "scratch-second")],
        env=variables,
        capture_output=True,
        text=True,
        timeout=40,
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and f"device a is online with root {here}" in error, error
    assert "--replace" in error, error
    [listed] = json.loads(perdure("devices", "--json", env=variables).stdout)["devices"]
    assert (listed["root"], listed["online"], listed["generation"]) == (str(here), True, 1)
    assert first.poll() is None  # the first daemon goes on

    devices.start("a", elsewhere, "--replace")
    assert first.wait(60) == 0
    log = (tmp_path / "device-a-0.log").read_text()
    after_online = log.split(f"device a online · session 1 · root {here}", 1)[1]
    assert "Traceback" not in log and "│" not in log, log[-3000:]
    replaced = [line for line in after_online.splitlines() if "replaced" in line]
    assert len(replaced) == 1 and f"session 2, root {elsewhere}" in replaced[0], after_online[-3000:]
    [listed] = json.loads(perdure("devices", "--json", env=variables).stdout)["devices"]
    assert (listed["root"], listed["online"], listed["generation"]) == (str(elsewhere), True, 2)
