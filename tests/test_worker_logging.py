"""The worker's console shows a log record's structured fields, whichever logger wrote it."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import logging, structlog
from perdure.workers.orchestrator import configure_logging
configure_logging()
logging.getLogger("perdure.activities.tools.run_tool").info(
    "tool ran", extra={"tool": "read_file", "effect_key": "k1", "temporal_activity": {"activity_id": "7"}}
)
structlog.get_logger("workers").info("worker polling", task_queue="perdure")
"""


@pytest.mark.slow
def test_worker_logs_print_the_structured_fields_of_stdlib_and_structlog_records():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    tool = next(line for line in lines if "tool ran" in line)
    assert "tool=read_file" in tool and "effect_key=k1" in tool
    # The SDK's own context dict is already in its message; it is not printed twice.
    assert "temporal_activity" not in tool
    assert any("worker polling" in line and "task_queue=perdure" in line for line in lines)


SWAPPED = """
import io, logging, sys
from perdure.workers.orchestrator import configure_logging
first = sys.stderr = io.StringIO()
configure_logging()  # set up while a test runner had swapped stderr
first.close()
second = sys.stderr = io.StringIO()
logging.getLogger("httpx").info("HTTP Request: GET /x")
sys.stderr = sys.__stderr__
print(repr(second.getvalue()))
"""


@pytest.mark.slow
def test_logging_set_up_under_a_swapped_stderr_writes_to_the_current_one_not_a_closed_one():
    """A command run under CliRunner set up logging on its captured stderr, closed after it:
    every later record printed '--- Logging error ---' into the next command's output."""
    done = subprocess.run([sys.executable, "-c", SWAPPED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "HTTP Request: GET /x" in done.stdout and "Logging error" not in done.stdout + done.stderr, done
