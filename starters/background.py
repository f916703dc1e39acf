"""Background processes for the embedded set-up (`make demo`): an orchestrator worker
and `perdure ui`.

Each is started detached, tracked by a pid file next to the dev server's, and stopped
by that pid only. The environment that selects models is fingerprinted (a hash,
never the values), with the code's file times, so a changed key, base URL or
code restarts the worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from perdure.activities.models.profiles import PROVIDER_ENV

# How long `perdure ui` may take to answer on its port (its imports take ~2 s on a slow machine).
UI_READY_S = 15.0
MODEL_ENV = (
    *(name for names in PROVIDER_ENV.values() for name in names),
    "PERDURE_CONFIG",
    "PERDURE_SCRIPT",
    "PERDURE_HOME",
)


def _env_fingerprint() -> str:
    """Changes when the model environment or the code changes: a worker started
    before `git pull` must not keep serving the demo with old workflow code."""
    material = "\n".join(f"{k}={os.environ.get(k, '')}" for k in MODEL_ENV)
    root = Path(__file__).resolve().parents[1]
    for package in ("workflows", "activities", "runtime", "workers", "starters"):
        for source in sorted((root / package).rglob("*.py")):
            material += f"\n{source.relative_to(root)}:{source.stat().st_mtime_ns}"
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def _alive_worker(pid: int, command: str = "worker") -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith(b"perdure") for part in cmdline) and command.encode() in cmdline


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def ensure_worker(data_dir: Path) -> tuple[int, bool]:
    """Return (pid, reused). Starts `perdure worker` detached when none runs."""
    return _ensure(data_dir, "worker", [])


def ensure_ui(data_dir: Path, port: int, wait_s: float = UI_READY_S) -> tuple[int, bool]:
    """Return (pid, reused). Starts `perdure ui --port PORT` detached when none runs, and
    returns once it answers on the port (a link printed before that would not open)."""
    return _ensure(data_dir, "ui", ["--port", str(port)], ready=lambda: _listening(port), wait_s=wait_s)


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True
    return False


def _ensure(
    data_dir: Path,
    command: str,
    options: list[str],
    ready: Callable[[], bool] = lambda: True,
    wait_s: float = 0.5,
) -> tuple[int, bool]:
    data_dir.mkdir(parents=True, exist_ok=True)
    pid_file = data_dir / f"{command}.pid"
    fingerprint = f"{_env_fingerprint()}:{':'.join(options)}"
    pid = _read_pid(pid_file)
    if pid and _alive_worker(pid, command):
        recorded = pid_file.read_text().split()[1:2]
        if recorded == [fingerprint]:
            return pid, True
        stop_worker(data_dir, command=command)
    log = open(data_dir / f"{command}.log", "ab")
    perdure = Path(sys.executable).parent / "perdure"
    proc = subprocess.Popen(
        [str(perdure), command, *options],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    pid_file.write_text(f"{proc.pid} {fingerprint}\n")
    # At least a moment (a command that fails on start says so at once), then until ready.
    time.sleep(min(0.5, wait_s))
    deadline = time.monotonic() + wait_s
    while proc.poll() is None and not ready():
        if time.monotonic() > deadline:
            log_path = data_dir / f"{command}.log"
            raise RuntimeError(f"`perdure {command}` did not get ready in {wait_s:.0f} s; see {log_path}")
        time.sleep(0.1)
    if proc.poll() is not None:
        raise RuntimeError(f"`perdure {command}` exited at once; see {data_dir / f'{command}.log'}")
    return proc.pid, False


def stop_worker(data_dir: Path, wait_s: float = 10, command: str = "worker") -> bool:
    """Stop the background `perdure COMMAND` (the worker by default) this set-up started."""
    pid_file = data_dir / f"{command}.pid"
    pid = _read_pid(pid_file)
    pid_file.unlink(missing_ok=True)
    if not pid or not _alive_worker(pid, command):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _alive_worker(pid, command):
        time.sleep(0.1)
    if _alive_worker(pid, command):
        os.kill(pid, signal.SIGKILL)
    return True
