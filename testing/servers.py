"""What tests, benchmarks and the screenshot script share to start their own Temporal dev
server: its options (the venv's `temporal` binary, perdure's search attributes and
plugin, the dynamic config `perdure server start` gives its own) and free local ports."""

from __future__ import annotations

import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from perdure.runtime.plugin import PerdurePlugin
from perdure.starters.devserver import dynamic_config_argv
from perdure.workflows.shared.search_attributes import ALL_KEYS

BIN = Path(sys.executable).parent
DEV_SERVER_STARTUP = timedelta(seconds=30)


def dev_server_options(*extra_args: str) -> dict[str, Any]:
    """Keyword arguments for `WorkflowEnvironment.start_local` / `start_time_skipping_v2`: the
    venv's `temporal` binary (no download), perdure's search attributes and its plugin (the
    data converter, read from the payload-store environment now); `extra_args` go to
    `temporal server start-dev`, after the values of temporal-dev/dynamic-config.yaml."""
    return {
        "dev_server_existing_path": str(BIN / "temporal"),
        "search_attributes": ALL_KEYS,
        "plugins": [PerdurePlugin()],
        "dev_server_log_level": "error",
        "dev_server_extra_args": [*dynamic_config_argv(), *extra_args],
        # The SDK waits 5 s; a loaded CI machine (three test processes on 2 cores) needs longer.
        "dev_server_startup_timeout": DEV_SERVER_STARTUP,
    }


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free right now (all held open together while they are picked)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
