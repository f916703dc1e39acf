"""Hosts from the outside, with real processes: `perdure worker` processes, each with its own
PERDURE_HOME (no shared disk but the artifact store), two of them hosts (`--host NAME
--workspaces DIR`) holding a workspace of the same name in directories of their own; goals
started with `perdure start --workspace HOST:NAME`; a host SIGKILLed mid-write (a fault point
in its own process, right after the file landed), then started again, or never again."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import WorkflowQueryFailedError

from tests.fleet_rig import Fleet
from tests.helpers import new_goal_id
from tests.subprocess_rig import perdure, result_of, snapshot, wait_for, write_plan

pytestmark = pytest.mark.process

NOTES = "# notes written on the host\n"


@pytest.fixture
def fleet(env, tmp_path, task_queue) -> Iterator[Fleet]:
    machines = Fleet(env, tmp_path, task_queue)
    try:
        yield machines
    finally:
        machines.close()


def workspace_dir(tmp_path: Path, machine: str) -> Path:
    path = tmp_path / f"{machine}-disk" / "repo"
    path.mkdir(parents=True)
    return path


def write_then_read(tmp_path: Path, **settings) -> Path:
    return write_plan(
        tmp_path / "plan.yaml",
        [
            {"name": "write", "kind": "tool", "tool": "write_file", "args": {"path": "notes.md", "content": NOTES}},
            {"name": "read", "kind": "tool", "tool": "read_file", "needs": ["write"], "args": {"path": "notes.md"}},
        ],
        **settings,
    )


def start_on(variables: dict[str, str], plan: Path, workspace: str, goal_id: str) -> None:
    started = perdure("start", "--plan", str(plan), "--workspace", workspace, "--id", goal_id, env=variables)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]


def snapshot_or_none(env, goal_id: str, seen: list[str]):
    """The goal's progress, or None when the query failed for now: while a killed worker's
    cached goal moves to another worker, a query may fail once (kept in `seen`, so a failure
    that lasts names itself when the wait times out)."""
    try:
        return snapshot(env, goal_id)
    except WorkflowQueryFailedError as err:
        seen.append(str(err))
        return None


def waited_for(condition, what: str, failed: list[str], timeout_s: float = 30) -> None:
    try:
        wait_for(condition, what, timeout_s=timeout_s)
    except AssertionError:
        raise AssertionError(f"timed out waiting for {what}; queries that failed: {failed[-3:]}") from None


def died_by_sigkill(proc: subprocess.Popen, timeout_s: float = 60) -> None:
    assert proc.wait(timeout_s) == -9  # the fault point's SIGKILL, in the host's own process


def test_a_host_killed_mid_write_holds_its_goal_until_it_returns_and_the_file_is_written_once(fleet, env, tmp_path):
    repo = workspace_dir(tmp_path, "h1")
    worker = fleet.start("w")
    # Killed the first time a write_file has landed, before the call returns: mid-step.
    host, _ = first = fleet.host("h1", {"repo": repo}, fault="tool_done:write_file:1")
    fleet.ready(worker)
    fleet.ready(first, "host h1 online")
    goal_id = new_goal_id("host-killed")
    start_on(fleet.variables("cli"), write_then_read(tmp_path), "h1:repo", goal_id)

    died_by_sigkill(host)
    landed = (repo / "notes.md").stat()
    assert (repo / "notes.md").read_text() == NOTES

    failed: list[str] = []

    def waiting() -> bool:
        snap = snapshot_or_none(env, goal_id, failed)
        return snap is not None and snap.waiting_for_devices == {"write": "h1"} and snap.phase == "awaiting_device"

    waited_for(waiting, "the goal to wait for host h1", failed)
    status = perdure("status", goal_id, env=fleet.variables("cli"))
    assert status.returncode == 0, status.stderr
    assert "waiting for host h1" in status.stdout

    back_at = time.monotonic()
    fleet.ready(fleet.host("h1", {"repo": repo}), "host h1 online")
    result = result_of(env, goal_id)
    done_s = time.monotonic() - back_at
    assert result.outcome == "succeeded", result.excerpt
    again = (repo / "notes.md").stat()
    # Sent again to the new session, the write found its content there and left the file alone.
    assert (again.st_ino, again.st_mtime_ns) == (landed.st_ino, landed.st_mtime_ns)
    nodes = {n.name: n for n in snapshot(env, goal_id).nodes}
    assert nodes["read"].placements["read_file"].startswith("host h1")
    assert nodes["read"].preview.startswith(NOTES.strip())
    assert "host h1 lost a call" in " ".join(snapshot(env, goal_id).gate_log)
    for machine in ("w", "cli"):  # no file of the workspace on another machine
        assert not list((tmp_path / f"home-{machine}").rglob("notes.md"))
    print(f"host back -> goal done: {done_s:.1f} s")


def test_a_host_gone_for_good_is_asked_about_and_the_answer_moves_the_goals_steps_to_another_host(fleet, env, tmp_path):
    repo_1, repo_2 = workspace_dir(tmp_path, "h1"), workspace_dir(tmp_path, "h2")
    worker = fleet.start("w")
    host_1, _ = first = fleet.host("h1", {"repo": repo_1}, fault="tool_done:write_file:1")
    second = fleet.host("h2", {"repo": repo_2})
    for started in (worker, first, second):
        fleet.ready(started)
    fleet.ready(first, "host h1 online")
    fleet.ready(second, "host h2 online")
    goal_id = new_goal_id("host-gone")
    start_on(fleet.variables("cli"), write_then_read(tmp_path, device_wait_s=1), "h1:repo", goal_id)
    died_by_sigkill(host_1)  # and never started again

    failed: list[str] = []

    def card():
        snap = snapshot_or_none(env, goal_id, failed)
        return next((q for q in snap.questions if q.topic == "device_offline"), None) if snap else None

    waited_for(lambda: card() is not None, "the card about host h1", failed)
    question = card()
    assert question.title.endswith("for host h1")
    assert [o["id"] for o in question.options] == ["wait", "device:h2", "skip"]
    answered = perdure("answer", goal_id, question.id, "device:h2", env=fleet.variables("cli"))
    assert answered.returncode == 0, answered.stdout + answered.stderr
    result = result_of(env, goal_id)
    assert result.outcome == "succeeded", result.excerpt
    assert (repo_2 / "notes.md").read_text() == NOTES
    nodes = {n.name: n for n in snapshot(env, goal_id).nodes}
    assert nodes["write"].placements["write_file"].startswith("host h2")
    assert nodes["read"].placements["read_file"].startswith("host h2")


@pytest.mark.parallel_safe
def test_start_refuses_a_workspace_no_host_offers_and_a_worker_refuses_unusable_host_settings(fleet, env, tmp_path):
    repo = workspace_dir(tmp_path, "h1")
    host = fleet.host("h1", {"repo": repo})
    cli = fleet.variables("cli")
    # Bad settings are one line each, before anything connects (the rest: test_host_settings.py).
    for args, said in (
        (["--host", "h1"], "--host needs --workspaces DIR"),
        (["--host", "h9", "--workspaces", str(tmp_path / "nowhere")], "does not exist"),
    ):
        refused = perdure("worker", *args, env=cli, timeout=60)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert said in " ".join(refused.stderr.split()), refused.stderr
    fleet.ready(host)
    fleet.ready(host, "host h1 online")
    plan = write_then_read(tmp_path)
    for workspace, said in (
        ("ghost:repo", "workspace ghost:repo: no host named 'ghost' (hosts: h1 (repo))"),
        ("h1:docs", f"workspace h1:docs: host h1 offers no workspace 'docs' (it offers: repo ({repo.resolve()}))"),
    ):
        refused = perdure("start", "--plan", str(plan), "--workspace", workspace, env=cli)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
        assert said in " ".join(refused.stderr.split()), refused.stderr
    listing = perdure("devices", "--json", env=cli)
    assert listing.returncode == 0, listing.stdout + listing.stderr
    (h1,) = json.loads(listing.stdout)["devices"]
    assert h1["name"] == "h1" and h1["workspaces"] == {"repo": str(repo.resolve())}


def test_a_park_until_a_file_is_checked_on_the_goals_host_where_the_file_appears(fleet, env, tmp_path):
    repo = workspace_dir(tmp_path, "h1")
    fleet.ready(fleet.host("h1", {"repo": repo}), "host h1 online")
    goal_id = new_goal_id("host-park")
    cli = fleet.variables("cli")
    fleet.ready(fleet.start("w"))
    slow = {"name": "slow", "kind": "tool", "tool": "run_command", "args": {"command": "sleep 4"}}
    write = {"name": "write", "kind": "tool", "tool": "write_file", "needs": ["slow"]}
    write["args"] = {"path": "notes.md", "content": NOTES}
    start_on(cli, write_plan(tmp_path / "plan.yaml", [slow, write]), "h1:repo", goal_id)
    # Parked while the first step runs: the write waits for the file.
    args = ("--reason", "waiting for the build", "--until-file", "build/READY", "--poll-first-s", "0.5")
    parked = perdure("park", goal_id, *args, "--poll-max-s", "1", env=cli)
    assert parked.returncode == 0, parked.stdout + parked.stderr

    failed: list[str] = []

    def checked_twice() -> bool:
        snap = snapshot_or_none(env, goal_id, failed)
        return snap is not None and snap.parked and "checked 2 times" in (snap.pause_reason or "")

    waited_for(checked_twice, "two checks of build/READY", failed)
    assert not (repo / "notes.md").exists()  # nothing new ran while parked
    (repo / "build").mkdir()
    (repo / "build" / "READY").touch()  # on the host's disk only: a worker's check never sees it

    def resumed() -> bool:
        snap = snapshot_or_none(env, goal_id, failed)
        return snap is not None and not snap.parked

    waited_for(resumed, "the park to end on the host's file", failed, timeout_s=20)
    result = result_of(env, goal_id)
    assert result.outcome == "succeeded", result.excerpt
    assert (repo / "notes.md").read_text() == NOTES
    assert "park ended: file build/READY exists" in " ".join(snapshot(env, goal_id).gate_log)
