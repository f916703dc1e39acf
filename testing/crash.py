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
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from activities.artifacts import ArtifactStore
from starters.goals import GOAL_TASK_TIMEOUT
from testing.fakes import FakeService
from testing.scripted import ScriptedServer
from workflows.contracts import GoalResult, GoalSpec
from workflows.goal import GoalWorkflow
from workflows.state import GoalInput

PERDURE = str(Path(sys.executable).parent / "perdure")


@dataclass
class WorkerProcess:
    proc: subprocess.Popen
    log: Path
    fault: str | None

    @property
    def pid(self) -> int:
        return self.proc.pid

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

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.home = self.root / "home"
        self.config = self.root / "config.toml"
        if self.model is not None:
            write_model_config(self.config, self.model)
        else:
            self.config.write_text("")

    @property
    def store(self) -> ArtifactStore:
        return ArtifactStore(self.home / "artifacts")

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
        if fault:
            variables["PERDURE_FAULT"] = fault
        return variables

    def start_worker(self, fault: str | None = None) -> WorkerProcess:
        log = self.root / f"worker-{len(self.workers) + 1}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [PERDURE, "worker"],
                env=self.worker_env(fault),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        worker = WorkerProcess(proc, log, fault)
        self.workers.append(worker)
        return worker

    async def start_goal(self, spec: GoalSpec, goal_id: str | None = None) -> WorkflowHandle:
        return await self.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec),
            id=goal_id or f"crash-goal-{uuid.uuid4().hex[:10]}",
            task_queue=self.task_queue,
            task_timeout=GOAL_TASK_TIMEOUT,
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
        return await asyncio.wait_for(handle.result(), timeout_s)

    def close(self) -> None:
        for worker in self.workers:
            if worker.alive():
                worker.kill()


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
