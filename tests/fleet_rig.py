"""`perdure worker` processes as a user starts them on separate machines, for the host and
fleet tests: each with its own PERDURE_HOME, and with a `NetLab` each in its own network
namespace that reaches only what the lab relays. Not a test module."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.netns_rig import NetLab
from tests.subprocess_rig import PERDURE, user_env

HOST_LEASE_S = "2"


class Fleet:
    """Workers on machines of their own: each its own PERDURE_HOME; the artifact store (a
    directory standing for a shared one, or an object store) the one thing they share."""

    def __init__(self, env, tmp_path: Path, task_queue: str, *, lab: NetLab | None = None) -> None:
        self.tmp_path = tmp_path
        self.lab = lab
        self.base = user_env(env, tmp_path, task_queue)
        self.base["PERDURE_ARTIFACT_STORE"] = str(tmp_path / "artifacts")
        self.base["PERDURE_WATCHDOG_INTERVAL_S"] = "3600"
        self.inside: dict[str, str] = {}
        """What a worker in a namespace of its own sees in place of `base`'s values (relays)."""
        self.procs: list[subprocess.Popen] = []
        self.addresses: dict[int, str] = {}
        """pid -> its address on the lab's bridge."""

    def variables(self, machine: str) -> dict[str, str]:
        return {**self.base, "PERDURE_HOME": str(self.tmp_path / f"home-{machine}")}

    def start(self, machine: str, *args: str, fault: str | None = None) -> tuple[subprocess.Popen, Path]:
        """`perdure worker ARGS` on `machine` (not waited for: see `ready`)."""
        log_path = self.tmp_path / f"worker-{machine}-{len(self.procs)}.log"
        variables = self.variables(machine)
        if fault is not None:
            variables["PERDURE_FAULT"] = fault
        command = [PERDURE, "worker", *args]
        if self.lab is not None:
            variables.update(self.inside)
            command = self.lab.argv(command)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(command, env=variables, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        if self.lab is not None:
            self.addresses[proc.pid] = self.lab.attach(proc.pid)
        return proc, log_path

    def host(self, name: str, workspaces: dict[str, Path], fault: str | None = None) -> tuple[subprocess.Popen, Path]:
        held = [f"{workspace}={path}" for workspace, path in workspaces.items()]
        args = ("--host", name, "--workspaces", ",".join(held), "--host-lease-s", HOST_LEASE_S)
        return self.start(name, *args, fault=fault)

    @staticmethod
    def ready(started: tuple[subprocess.Popen, Path], says: str = "worker polling", timeout_s: float = 60) -> None:
        proc, log_path = started
        deadline = time.monotonic() + timeout_s
        while says not in log_path.read_text():
            assert proc.poll() is None, f"the worker exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no '{says}' in time:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.1)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
