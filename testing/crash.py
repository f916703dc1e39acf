"""Crash-test harness: real `perdure worker` subprocesses that a fault point SIGKILLs, and what they leave behind.

The crash tests, `make soak` and `bench/recovery.py` drive workers through it.
A `CrashRig` owns one task queue, one PERDURE_HOME (artifact store) and the fake
services the goal's tools talk to. It starts workers exactly as a user does
(`perdure worker` with PERDURE_* variables), with PERDURE_FAULT set when a test
wants the process killed at a fault point, waits for that process to die of
SIGKILL, and starts the next one. Goals are started from the test process
through the client, so only the subprocess ever runs workflow or activity code.

After a kill, `after_kill` checks that every activity the dead worker held has a
heartbeat timeout: without one the server would notice the death only at the
activity's start-to-close timeout (minutes).

Where to kill is found from outside: the worker whose activity the server says is
running (`running_activity_worker`), or the one holding a FIFO open (`reader_of`): a
read step whose FIFO's writer is late (`open_writer` holds it open without writing,
`serve_fifo` then lets every later reader through) blocks inside its read.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.models.scripted import ScriptedServer
from perdure.starters.client.goal_reads import ended
from perdure.testing.fakes import FakeService
from perdure.workflows.goal.contracts.goal_contracts import GoalResult, GoalSpec
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow

PERDURE = str(Path(sys.executable).parent / "perdure")
HOST = socket.gethostname()


@dataclass
class WorkerProcess:
    proc: subprocess.Popen
    log: Path
    fault: str | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def identity(self) -> str:
        """The SDK's default worker identity, which `perdure worker` keeps (what history names)."""
        return f"{self.pid}@{HOST}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def killed_by_sigkill(self) -> bool:
        return self.proc.poll() == -signal.SIGKILL

    def kill(self) -> None:
        """SIGKILL this (our own child) process and reap it."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    async def wait_polling(self, timeout_s: float = 30) -> None:
        """Wait until the worker logs that it polls its task queue; fail with its log if it dies first."""
        deadline = time.monotonic() + timeout_s
        while "worker polling" not in self.log_text():
            if not self.alive() or time.monotonic() > deadline:
                raise AssertionError(f"worker {self.pid} did not start polling; log:\n{self.log_tail()}")
            await asyncio.sleep(0.05)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]


def write_model_config(path: Path, server: ScriptedServer, profile: str = "test") -> None:
    path.write_text(
        f"[profiles.{profile}]\n"
        'provider = "openai"\n'
        'model = "scripted-gpt"\n'
        f'base_url = "{server.openai_base_url}"\n'
        "price_input_per_mtok = 1.0\n"
        "price_output_per_mtok = 2.0\n"
    )


@dataclass
class CrashRig:
    client: Client
    root: Path
    mail: FakeService | None = None
    payments: FakeService | None = None
    model: ScriptedServer | None = None
    task_queue: str = field(default_factory=lambda: f"crash-{uuid.uuid4().hex[:10]}")
    workers: list[WorkerProcess] = field(default_factory=list)
    worker_args: tuple[str, ...] = ()
    """What every `perdure worker` it starts is given (`--tools MODULE`...)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """Variables every worker it starts gets besides perdure's (PYTHONPATH for a tool module...)."""

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.home = self.root / "home"
        self.config = self.root / "config.toml"
        if self.model is not None:
            write_model_config(self.config, self.model)
        else:
            self.config.write_text("")

    @property
    def store(self) -> DiskArtifactStore:
        return DiskArtifactStore(self.home / "artifacts")

    @property
    def target(self) -> str:
        return self.client.service_client.config.target_host

    def worker_env(self, fault: str | None) -> dict[str, str]:
        variables = {k: v for k, v in os.environ.items() if k != "PERDURE_FAULT"}
        variables.update(
            PERDURE_TEMPORAL=self.target,
            PERDURE_NAMESPACE=self.client.namespace,
            PERDURE_TASK_QUEUE=self.task_queue,
            PERDURE_HOME=str(self.home),
            PERDURE_CONFIG=str(self.config),
        )
        for service in (self.mail, self.payments):
            if service is not None:
                variables.update(service.worker_env())
        variables.update(self.extra_env)
        if fault:
            variables["PERDURE_FAULT"] = fault
        return variables

    def start_worker(self, fault: str | None = None) -> WorkerProcess:
        log = self.root / f"worker-{len(self.workers) + 1}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [PERDURE, "worker", *self.worker_args],
                env=self.worker_env(fault),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        worker = WorkerProcess(proc, log, fault)
        self.workers.append(worker)
        return worker

    async def start_standby_pair(self) -> None:
        """Two workers polling the queue: whichever runs a step, the other takes over when it dies."""
        self.start_worker()
        self.start_worker()
        await self.wait_polling()

    async def wait_polling(self, timeout_s: float = 60) -> None:
        """Wait until every worker started so far polls its task queue; RuntimeError (with
        its log) for one that dies or does not within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            while "worker polling" not in worker.log_text():
                if not worker.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"worker {worker.pid} did not start; log:\n{worker.log_tail()}")
                await asyncio.sleep(0.1)

    def worker_with_identity(self, identity: str) -> WorkerProcess | None:
        return next((w for w in self.workers if w.alive() and w.identity == identity), None)

    async def running_activity_worker(
        self, handle: WorkflowHandle, never: str, timeout_s: float, ready: Callable[[], object] = lambda: True
    ) -> WorkerProcess:
        """The worker that runs one of the goal's started activities, once `ready()`;
        AssertionError(`never`) after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                description = await handle.describe()
                for pending in description.raw_description.pending_activities:
                    if pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
                        worker = self.worker_with_identity(pending.last_worker_identity)
                        if worker is not None:
                            return worker
            await asyncio.sleep(0.05)
        raise RuntimeError(never)

    async def reader_of(self, fifo: Path, timeout_s: float = 5) -> WorkerProcess:
        """The worker holding `fifo` open (its read step is blocked in it)."""
        # The reader's open() returns as the writer opens, so its descriptor may show a moment later.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reader = next((w for w in self.workers if w.alive() and _holds(w.pid, fifo)), None)
            if reader is not None:
                return reader
            await asyncio.sleep(0.01)
        raise RuntimeError(f"no worker has {fifo} open")

    async def start_goal(self, spec: GoalSpec, goal_id: str | None = None) -> WorkflowHandle:
        return await self.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec),
            id=goal_id or f"crash-goal-{uuid.uuid4().hex[:10]}",
            task_queue=self.task_queue,
            task_timeout=spec.task_timeout(),
        )

    async def wait_killed(self, worker: WorkerProcess, timeout_s: float = 60) -> None:
        """Wait for the fault point to SIGKILL the worker; fail with its log otherwise."""
        deadline = time.monotonic() + timeout_s
        while worker.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if worker.alive():
            worker.kill()
            raise AssertionError(f"fault {worker.fault} never fired in {timeout_s:g}s; log:\n{worker.log_tail()}")
        if not worker.killed_by_sigkill():
            raise AssertionError(
                f"the worker exited with {worker.proc.returncode}, not SIGKILL; log:\n{worker.log_tail()}"
            )

    async def after_kill(self, handle: WorkflowHandle) -> None:
        """Check the dead worker's activities can be noticed quickly. The goal's sticky queue is
        left alone: the worker's short sticky timeout is what hands it to the next worker."""
        history = await handle.fetch_history()
        blind = pending_without_heartbeat_timeout(history)
        if blind:
            raise AssertionError(
                "the workflow scheduled these activities without a heartbeat timeout, so a killed worker is "
                "noticed only at their start-to-close timeout: "
                + ", ".join(blind)
                + ". Set heartbeat_timeout from ToolSpec.heartbeat_timeout_s (tools) and on model activities."
            )

    async def result(self, handle: WorkflowHandle, timeout_s: float = 120) -> GoalResult:
        return await asyncio.wait_for(ended(handle), timeout_s)

    def close(self) -> None:
        for worker in self.workers:
            if worker.alive():
                worker.kill()


def _holds(pid: int, path: Path) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


async def open_writer(fifo: Path, timeout_s: float) -> int:
    """Open the FIFO for writing once a reader has it open (ENXIO until then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            if err.errno != errno.ENXIO:
                raise
        await asyncio.sleep(0.01)
    raise RuntimeError(f"nobody opened {fifo} for reading in {timeout_s:g} s")


async def serve_fifo(fifo: Path, first: asyncio.Future) -> None:
    """Give every later reader its content; `first` gets the time the first one opened it."""
    while True:
        fd = await open_writer(fifo, timeout_s=3600)
        if not first.done():
            first.set_result(time.time())
        os.write(fd, b"gate open\n")
        os.close(fd)
        await asyncio.sleep(0.05)


def pending_without_heartbeat_timeout(history) -> list[str]:
    """Activities scheduled but not finished whose heartbeat timeout is unset."""
    scheduled: dict[int, tuple[str, float]] = {}
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            heartbeat = attrs.heartbeat_timeout.ToTimedelta().total_seconds()
            scheduled[event.event_id] = (attrs.activity_type.name, heartbeat)
        for kind, name in (
            (EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, "activity_task_completed_event_attributes"),
            (EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, "activity_task_failed_event_attributes"),
            (EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT, "activity_task_timed_out_event_attributes"),
            (EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED, "activity_task_canceled_event_attributes"),
        ):
            if event.event_type == kind:
                scheduled.pop(getattr(event, name).scheduled_event_id, None)
    return sorted({name for name, heartbeat in scheduled.values() if heartbeat <= 0})
