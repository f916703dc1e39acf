"""`make demo`'s command, as a user runs it, on its own embedded server.

Runs `perdure demo` in a subprocess with a scratch dev directory and free
ports, so it starts a real dev server and a background worker, then checks the
goal is on the server and that `perdure server stop` leaves nothing behind.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers import isolated_demo_env

BIN = Path(sys.executable).parent
CHECKOUT = BIN.parent.parent

pytestmark = [pytest.mark.process, pytest.mark.parallel_safe]


def pids_in(data: Path) -> list[int]:
    pid_files = (data / "server.pid", data / "worker.pid", data / "ui.pid")
    return [int(p.read_text().split()[0]) for p in pid_files if p.exists()]


def test_demo_runs_end_to_end_offline(tmp_path):
    env, port, ui_port = isolated_demo_env(tmp_path)
    data = tmp_path / "temporal-dev" / "data"
    try:
        # As `make demo` runs it: from the checkout, as .venv/bin/perdure (not on PATH).
        demo = subprocess.run(
            [BIN / "perdure", "demo"], cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=120
        )
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert "on model profile 'scripted'" in demo.stdout
        assert "outcome: succeeded" in demo.stdout
        assert "SUMMARY.md (written by the goal)" in demo.stdout
        assert "Fix the nightly export: the CSV parser" in demo.stdout  # what the agent wrote
        assert f"http://localhost:{ui_port}/namespaces/default/workflows/goal-demo-" in demo.stdout
        page = env["PERDURE_UI_PORT"]
        link = next(w for w in demo.stdout.split() if w.startswith(f"http://127.0.0.1:{page}/goals/goal-demo-"))
        goal_id = link.rsplit("/", 1)[1]
        snapshot = httpx.get(f"http://127.0.0.1:{page}/api/goals/{goal_id}", timeout=30).json()
        assert snapshot["phase"] == "finished" and snapshot["percent_done"] == 100  # the page's API serves it
        # The demo says how to call the CLI from here, and the call it shows works.
        [shown] = [line.strip() for line in demo.stdout.splitlines() if line.strip().endswith(f"result {goal_id}")]
        called = subprocess.run(shlex.split(shown), cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=60)
        assert called.returncode == 0 and "outcome: succeeded" in called.stdout, shown + called.stderr[-2000:]
        # Its decision log: the plan the model adopted and why, its agent's reasons, how it ended.
        logged = subprocess.run(
            [BIN / "perdure", "log", goal_id, "--json"],
            cwd=CHECKOUT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert logged.returncode == 0, logged.stderr[-2000:]
        entries = json.loads(logged.stdout)["entries"]
        said = [(e["kind"], e["who"], e["text"]) for e in entries]
        assert said[0][:2] == ("reason", "model") and "Read the notes before judging them" in said[0][2]
        assert said[1][:2] == ("plan", "model") and said[1][2].endswith("prioritise, write-summary")
        turns = [text for kind, _, text in said if kind == "reason"][1:]
        assert turns[0].startswith("write-summary, turn 1: calls write_file: I write SUMMARY.md"), turns
        assert said[-1] == ("end", "rule", "the goal ended succeeded")

        listed = subprocess.run(
            [BIN / "temporal", "workflow", "list", "--address", f"127.0.0.1:{port}", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        goals = json.loads(listed.stdout)
        assert [g["type"]["name"] for g in goals] == ["GoalWorkflow"]
        assert goals[0]["status"] == "WORKFLOW_EXECUTION_STATUS_COMPLETED"
        started = pids_in(data)
        assert len(started) == 3  # the dev server, the demo's background worker and its perdure ui
    finally:
        stop = subprocess.run([BIN / "perdure", "server", "stop"], env=env, capture_output=True, text=True, timeout=60)
    assert "demo worker stopped" in stop.stdout and "demo ui stopped" in stop.stdout
    assert "dev server stopped" in stop.stdout
    for pid in started:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "zombie" in status.read_text()


def test_a_demo_given_a_ui_port_that_is_no_port_says_so_before_starting_anything(tmp_path):
    env, _, _ = isolated_demo_env(tmp_path)
    env["PERDURE_UI_PORT"] = "abc"
    demo = subprocess.run([BIN / "perdure", "demo"], env=env, capture_output=True, text=True, timeout=60)
    assert demo.returncode == 2
    assert "PERDURE_UI_PORT must be a port number (1-65535), got 'abc'" in demo.stderr
    assert "Traceback" not in demo.stdout + demo.stderr
    assert pids_in(tmp_path / "temporal-dev" / "data") == []  # no server, worker or ui left behind
