"""Background processes for the embedded set-up (`make demo`): an orchestrator worker
and `perdure ui`.

Each is started detached, tracked by a pid file next to the dev server's, and stopped
by that pid only. The environment that selects models is fingerprinted (a hash,
never the values), with the code's file times, so a changed key, base URL or
code restarts the worker.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from activities.models.config import PROVIDER_ENV

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


def ensure_ui(data_dir: Path, port: int) -> tuple[int, bool]:
    """Return (pid, reused). Starts `perdure ui --port PORT` detached when none runs."""
    return _ensure(data_dir, "ui", ["--port", str(port)])


def _ensure(data_dir: Path, command: str, options: list[str]) -> tuple[int, bool]:
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
    time.sleep(0.5)
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
