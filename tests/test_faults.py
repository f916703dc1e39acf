"""Fault points: inert unless PERDURE_FAULT is set, then a real SIGKILL at the N-th hit."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from perdure.activities.faults import Fault, fault_point, parse_fault


def test_parse_fault():
    assert parse_fault("after_effect:send_email:4") == Fault("after_effect", "send_email", 4)
    assert parse_fault("model_call:2+0.5") == Fault("model_call", None, 2, 0.5)
    key = "fx-" + "0" * 32
    assert parse_fault(f"before_effect:{key}:1") == Fault("before_effect", key, 1)
    assert str(parse_fault("model_call:2+0.5")) == "model_call:2+0.5"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("after_effect", "expected POINT"),
        ("explode:send_email:1", "unknown point"),
        ("after_effect:send_email:x", "must be an integer"),
        ("after_effect:send_email:0", ">= 1"),
        ("a:b:c:d", "expected POINT"),
    ],
)
def test_parse_fault_rejects(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_fault(text)


def test_fault_point_is_inert_when_unset(monkeypatch):
    monkeypatch.delenv("PERDURE_FAULT", raising=False)
    for _ in range(3):
        assert fault_point("after_effect", "send_email", effect_key="fx-1") is None


def test_fault_point_ignores_other_points_and_subjects(monkeypatch):
    monkeypatch.setenv("PERDURE_FAULT", "after_effect:git_commit:1")
    fault_point("after_effect", "send_email")
    fault_point("before_effect", "git_commit")
    fault_point("model_call", "test")  # we are still alive


SCRIPT = """
import sys
from perdure.activities.faults import fault_point
for i in range(1, 6):
    print(i, flush=True)
    fault_point(sys.argv[1], sys.argv[2], effect_key=sys.argv[3])
print("survived", flush=True)
"""


def run_script(fault: str, point: str, subject: str, key: str = "fx-k") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, point, subject, key],
        env={"PERDURE_FAULT": fault, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.process
def test_fault_point_kills_at_the_nth_hit():
    done = run_script("after_effect:send_email:3", "after_effect", "send_email")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["1", "2", "3"]
    assert "perdure fault: SIGKILL at after_effect:send_email:3" in done.stderr


@pytest.mark.process
def test_fault_point_aims_at_one_effect_key():
    done = run_script("before_effect:fx-target:1", "before_effect", "send_email", key="fx-target")
    assert done.returncode == -signal.SIGKILL and done.stdout.split() == ["1"]
    other = run_script("before_effect:fx-target:1", "before_effect", "send_email", key="fx-other")
    assert other.returncode == 0 and other.stdout.split()[-1] == "survived"


@pytest.mark.process
def test_fault_point_with_a_delay_kills_later():
    code = (
        "import time\nfrom perdure.activities.faults import fault_point\n"
        "fault_point('model_call', 'test')\nprint('in flight', flush=True)\ntime.sleep(10)\nprint('finished')"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PERDURE_FAULT": "model_call:1+0.3", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split("\n")[0] == "in flight" and "finished" not in done.stdout
    assert 0.3 <= time.monotonic() - started < 8
