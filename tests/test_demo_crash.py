"""`make demo-crash` as a new user runs it: its own embedded server and ports, a real worker killed
mid-effect, a second worker finishing the goal, each effect once in the printed ledgers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import isolated_demo_env

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.process


def test_demo_crash_shows_each_effect_once(tmp_path):
    env, _, _ = isolated_demo_env(tmp_path)
    try:
        demo = subprocess.run(
            [BIN / "python", "-m", "perdure.starters.demo_crash"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=280,
        )
        out = demo.stdout
        assert demo.returncode == 0, out[-4000:] + demo.stderr[-3000:]
        assert "worker 1 killed (SIGKILL) right after the mail API accepted notice 2" in out
        assert "goal outcome: succeeded" in out
        for email in ("ada@example.com", "grace@example.com", "alan@example.com"):
            assert f"{email:20} 1 message(s)" in out
            assert f"{email:20} 1 credit(s)" in out
        assert "every effect exactly once; goal finished" in out
        assert "sent 'Sorry about Tuesday's outage' to grace@example.com" in out
    finally:
        subprocess.run([BIN / "perdure", "server", "stop"], env=env, capture_output=True, text=True, timeout=60)
