"""Where things are, read from the environment. Worker- and CLI-side only.

PERDURE_HOME        state on this machine (artifacts), default ~/.perdure
PERDURE_TEMPORAL    Temporal frontend address, default localhost:7233
PERDURE_NAMESPACE   Temporal namespace, default "default"
PERDURE_TASK_QUEUE  task queue of the orchestrator workers, default "perdure"
PERDURE_UI          Temporal UI base URL, default http://localhost:8233
PERDURE_CONFIG      model profiles file, default $PERDURE_HOME/config.toml
PERDURE_PAYLOAD_STORE            large payloads outside history, default $PERDURE_HOME/payloads
PERDURE_PAYLOAD_THRESHOLD_BYTES  size from which a payload goes there, default 128 KiB
                                 (both read by runtime/converter.py, which documents them)
"""

from __future__ import annotations

import os
from pathlib import Path

from workflows.contracts import TASK_QUEUE


def perdure_home() -> Path:
    return Path(os.environ.get("PERDURE_HOME") or Path.home() / ".perdure").expanduser()


def temporal_address() -> str:
    return os.environ.get("PERDURE_TEMPORAL", "localhost:7233")


def namespace() -> str:
    return os.environ.get("PERDURE_NAMESPACE", "default")


def task_queue() -> str:
    return os.environ.get("PERDURE_TASK_QUEUE", TASK_QUEUE)


def ui_base() -> str:
    return os.environ.get("PERDURE_UI", "http://localhost:8233").rstrip("/")


def config_path() -> Path:
    return Path(os.environ.get("PERDURE_CONFIG") or perdure_home() / "config.toml").expanduser()


def goal_ui_link(goal_id: str) -> str:
    return f"{ui_base()}/namespaces/{namespace()}/workflows/{goal_id}"


def dev_server_ports() -> tuple[int, int]:
    """Frontend and UI ports for the embedded server, taken from PERDURE_TEMPORAL and PERDURE_UI."""
    frontend = temporal_address().rpartition(":")[2]
    ui = ui_base().rpartition(":")[2]
    return int(frontend) if frontend.isdigit() else 7233, int(ui) if ui.isdigit() else 8233
