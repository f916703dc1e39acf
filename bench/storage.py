"""The storage `make bench-peers` puts every system on, and the Temporal server it runs.

Two settings, each run in full, so a figure is only ever compared with one on equal storage:

- "db file", the headline: the dev server with its SQLite database in a file (the very
  command `perdure server start` runs: `starters/devserver.py`'s argv), and everything
  else (the peers' SQLite files, perdure's artifact and payload stores, the workspaces)
  beside it in one scratch directory on the same disk;
- "memory": the same command without `--db-filename` (the server keeps its history in
  memory) and that scratch directory on a tmpfs (/dev/shm), so the peers' SQLite files
  are in memory too.

A setting whose directory is not what its name says (a "db file" directory on a tmpfs,
a "memory" one on a disk) is refused: it would compare unequal storage under an equal name.
This module starts and stops only the server process it spawned, by its own handle.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError

from perdure.runtime.plugin import PerdurePlugin
from perdure.starters.devserver import DB_FILE, dev_server_argv, server_env
from perdure.testing.servers import free_ports
from perdure.workflows.shared.search_attributes import CUSTOM_SEARCH_ATTRIBUTES

MEMORY_FILESYSTEMS = {"tmpfs", "ramfs"}


def filesystem(path: Path) -> str:
    """The type of the filesystem `path` is on (ext4, tmpfs, ...), from the mount table."""
    target = os.path.realpath(path)
    best, kind = "", "unknown"
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # The mount table escapes spaces and the like as octal (\040).
        mount = fields[1].encode().decode("unicode_escape")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


@dataclass(frozen=True)
class Storage:
    """One setting of the run: where its scratch directory goes and where the server keeps
    its history. `suffix` ends the setting's keys in the results file."""

    name: str  # "db file" or "memory"
    suffix: str  # "" (the headline keeps the plain keys) or "_memory"
    parent: Path  # the scratch directory is made in here
    server_on_file: bool

    @property
    def filesystem(self) -> str:
        return filesystem(self.parent)

    def server(self) -> str:
        """Where the Temporal server keeps perdure's history."""
        return f"dev server, db file on {self.filesystem}" if self.server_on_file else "dev server, in memory"

    def files(self) -> str:
        """What the peers' SQLite files (and perdure's own files) are on."""
        return f"SQLite file on {self.filesystem}"

    def title(self) -> str:
        if self.server_on_file:
            return f"on a db file: the dev server's SQLite db file and the peers' SQLite files on {self.filesystem}"
        return f"in memory: the dev server in memory, the peers' SQLite files on {self.filesystem}"

    def refusal(self) -> str | None:
        if not self.parent.is_dir():
            return f"{self.parent} is not a directory"
        on_memory = self.filesystem in MEMORY_FILESYSTEMS
        if self.server_on_file and on_memory:
            return f"{self.parent} is on {self.filesystem}: the db-file row would keep every file in memory"
        if not self.server_on_file and not on_memory:
            return f"{self.parent} is on {self.filesystem}, not in memory: the in-memory row would write to disk"
        return None


def settings(disk_dir: str, memory_dir: str) -> list[Storage]:
    return [
        Storage("db file", "", Path(disk_dir), server_on_file=True),
        Storage("memory", "_memory", Path(memory_dir), server_on_file=False),
    ]


def server_argv(port: int, ui_port: int, data: Path, on_file: bool) -> list[str]:
    """`perdure server start`'s command on `data`; without its `--db-filename` when not `on_file`."""
    argv = dev_server_argv(port, ui_port, data)
    if on_file:
        return argv
    at = argv.index("--db-filename")
    return argv[:at] + argv[at + 2 :]


@dataclass
class Server:
    """A dev server this module started, and a client of it as perdure's CLI makes one."""

    proc: subprocess.Popen
    client: Client
    db: Path | None  # None: in memory

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop(self.proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server this module started, SIGKILL if it is still there after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def start_server(data: Path, on_file: bool, wait_s: float = 60) -> Server:
    """The dev server on `data` (its db file, its log), answering with every perdure
    search attribute registered; RuntimeError with its log's tail if it does not."""
    data.mkdir(parents=True, exist_ok=True)
    port, ui_port = free_ports(2)
    log = data / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            server_argv(port, ui_port, data, on_file),
            env=server_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=data,
        )
    deadline = time.monotonic() + wait_s
    while True:
        problem = "no answer"
        try:
            client = await Client.connect(f"127.0.0.1:{port}", plugins=[PerdurePlugin()])
            listed = await client.operator_service.list_search_attributes(
                ListSearchAttributesRequest(namespace=client.namespace)
            )
            if set(CUSTOM_SEARCH_ATTRIBUTES) <= set(listed.custom_attributes):
                return Server(proc, client, data / DB_FILE if on_file else None)
            problem = "search attributes not registered"
        except (RuntimeError, RPCError) as err:
            problem = str(err)
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            tail = log.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"the dev server did not start ({problem}):\n{tail}")
        await asyncio.sleep(0.2)
