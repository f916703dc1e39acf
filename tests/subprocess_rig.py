"""Real processes for tests that run perdure as a user does: the `perdure` command, a
user's shell environment, a worker's start, and a Temporal dev server this code did
not start (someone else's). Not a test module: the tests that need these import them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client

from perdure.runtime import converter
from perdure.starters import devserver
from perdure.workflows.goal.contracts.goal_contracts import GoalResult, ProgressSnapshot
from perdure.workflows.goal.goal_workflow import GoalWorkflow

PERDURE = str(Path(sys.executable).parent / "perdure")
MODEL_KEYS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY")


def user_env(env, tmp_path: Path, task_queue: str) -> dict[str, str]:
    """A user's shell: no model key, no perdure settings but where the server and queue are."""
    return {
        **{k: v for k, v in os.environ.items() if k not in MODEL_KEYS and not k.startswith("PERDURE_")},
        converter.STORE_ENV: os.environ[converter.STORE_ENV],
        "PERDURE_TEMPORAL": env.client.service_client.config.target_host,
        "PERDURE_TASK_QUEUE": task_queue,
        "PERDURE_HOME": str(tmp_path / "home"),
        "NO_COLOR": "1",
        "COLUMNS": "200",
    }


def wait_for_polling(log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while "worker polling" not in log.read_text():
        assert time.monotonic() < deadline, f"the worker did not start polling:\n{log.read_text()[-2000:]}"
        time.sleep(0.1)


def perdure(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PERDURE, *args], env=env, capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def worker_process(variables: dict[str, str], log_path: Path, *args: str) -> Iterator[subprocess.Popen]:
    """`perdure worker ARGS` as a user starts it, in `variables`, logging to `log_path`;
    yields once it polls, and stops it (politely, then by force) on the way out."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen([PERDURE, "worker", *args], env=variables, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_polling(log_path)
        yield proc
    finally:
        stop(proc, 15)


def registered_attributes(address: str) -> dict[str, str]:
    async def listing() -> dict[str, str]:
        client = await Client.connect(address)
        response = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace="default")
        )
        return {name: IndexedValueType.Name(kind) for name, kind in response.custom_attributes.items()}

    return asyncio.run(listing())


def spawn_raw_server(port: int, ui_port: int, *extra: str) -> subprocess.Popen[bytes]:
    """A server this module did not start (someone else's), with the same binary name."""
    process = subprocess.Popen(
        [str(devserver.temporal_binary()), "server", "start-dev", "--ip", "127.0.0.1",
         "--port", str(port), "--ui-port", str(ui_port), "--log-level", "error", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if registered_attributes(f"127.0.0.1:{port}") is not None:
                return process
        except Exception:
            time.sleep(0.1)
    process.kill()
    raise AssertionError(f"raw dev server on {port} never answered")


def stop(process: subprocess.Popen, wait_s: float = 10) -> None:
    """End a process a test started: politely (SIGTERM), then by force after `wait_s`."""
    process.terminate()
    try:
        process.wait(wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def kill_raw(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


def marker_sleep() -> str:
    """A `sleep` whose argument no other process has: found on this machine by its command
    line, since a sandboxed command's PIDs are its namespace's, not ours."""
    return f"sleep 30.{uuid.uuid4().int % 10**9:09d}"


def process_running(command: str) -> bool:
    """A live (not zombie: PID 1 in a container may never reap it) process runs `command`."""
    wanted = command.encode().replace(b" ", b"\0") + b"\0"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "cmdline").read_bytes() != wanted:
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # it ended while we looked
        if state not in ("Z", "X"):
            return True
    return False


def process_gone(command: str, wait_s: float = 3.0) -> bool:
    """True once no process on this machine runs `command`."""
    deadline = time.monotonic() + wait_s
    while process_running(command):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def write_plan(path: Path, steps: list[dict], **settings) -> Path:
    path.write_text(yaml.safe_dump({"goal": "Work on two machines", "steps": steps, **settings}))
    return path


def snapshot(env, goal_id: str) -> ProgressSnapshot:
    async def ask() -> ProgressSnapshot:
        return await env.client.get_workflow_handle(goal_id).query(GoalWorkflow.progress)

    return asyncio.run(ask())


def result_of(env, goal_id: str) -> GoalResult:
    async def wait() -> GoalResult:
        return await env.client.get_workflow_handle(goal_id, result_type=GoalResult).result()

    return asyncio.run(wait())


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
