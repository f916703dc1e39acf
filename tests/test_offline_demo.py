"""`make demo` leaves alone a Temporal server it did not start, unless told to attach.

A raw `temporal server start-dev` (someone else's) answers on the demo's port; `perdure demo`
as a user runs it refuses, says how to choose other ports or attach anyway, and has registered
nothing on that server.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import isolated_demo_env
from tests.subprocess_rig import PERDURE, kill_raw, registered_attributes, spawn_raw_server

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]


def test_demo_refuses_to_attach_to_a_server_it_did_not_start(tmp_path):
    env, port, ui_port = isolated_demo_env(tmp_path)
    foreign = spawn_raw_server(port, ui_port, "--headless")
    try:
        demo = subprocess.run([PERDURE, "demo"], env=env, capture_output=True, text=True, timeout=60)
        said = " ".join(demo.stderr.split())
        assert demo.returncode == 2, demo.stdout[-2000:] + demo.stderr[-2000:]
        assert "a Temporal server that perdure did not start" in said and f"answers on 127.0.0.1:{port}" in said
        assert f"PERDURE_TEMPORAL=127.0.0.1:{port + 10} PERDURE_UI=http://localhost:{ui_port + 10} make demo" in said
        assert "PERDURE_DEMO_ATTACH=1 make demo" in said
        assert "goal" not in demo.stdout  # no goal was started
        assert registered_attributes(f"127.0.0.1:{port}") == {}  # nothing registered on it
        assert not (tmp_path / "temporal-dev" / "data" / "worker.pid").exists()  # no worker started
    finally:
        kill_raw(foreign)
