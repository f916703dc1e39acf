"""The worker's console shows a log record's structured fields, whichever logger wrote it."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import logging, structlog
from workers.orchestrator import configure_logging
configure_logging()
logging.getLogger("activities.tools").info(
    "tool ran", extra={"tool": "read_file", "effect_key": "k1", "temporal_activity": {"activity_id": "7"}}
)
structlog.get_logger("workers").info("worker polling", task_queue="perdure")
"""


def test_worker_logs_print_the_structured_fields_of_stdlib_and_structlog_records():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    tool = next(line for line in lines if "tool ran" in line)
    assert "tool=read_file" in tool and "effect_key=k1" in tool
    # The SDK's own context dict is already in its message; it is not printed twice.
    assert "temporal_activity" not in tool
    assert any("worker polling" in line and "task_queue=perdure" in line for line in lines)
