"""Machines apart on one machine, for the fleet test: each worker in a network namespace of
its own whose one link is a veth on a bridge, where TCP relays in the test process stand for
the Temporal server, the object store and the fake services. From inside, 127.0.0.1 is the
namespace's own loopback and the bridge's address leads only to what a relay forwards.

Needs root and `unshare`, `ip` and `nsenter` (util-linux, iproute2); `NetLab.unavailable()`
says why a machine does not allow it. Not a test module.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

WAIT_FOR_LINK = 'while ! ip -4 -o addr show dev eth0 2>/dev/null | grep -q inet; do sleep 0.05; done; exec "$@"'
"""Run in the new namespace before the worker: it starts once its link is up and addressed."""


class Relays:
    """TCP relays on one address, served by an event loop of their own in a thread (a test
    that blocks its own loop, or has none, never stalls them)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.loop = asyncio.new_event_loop()
        self.servers: list[asyncio.Server] = []
        self.thread = threading.Thread(target=self.loop.run_forever, name="netns-relays", daemon=True)
        self.thread.start()

    def forward(self, host: str, port: int) -> int:
        """A port on this address whose connections are relayed to host:port."""
        server = asyncio.run_coroutine_threadsafe(self._serve(host, port), self.loop).result(10)
        self.servers.append(server)
        return server.sockets[0].getsockname()[1]

    async def _serve(self, host: str, port: int) -> asyncio.Server:
        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
            except OSError:
                writer.close()
                return
            try:
                await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
            finally:
                for end in (writer, upstream_writer):
                    end.close()

        return await asyncio.start_server(relay, self.host, 0)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    async def _close(self) -> None:
        for server in self.servers:
            server.close()
        relaying = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in relaying:
            task.cancel()
        await asyncio.gather(*relaying, return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass  # a worker SIGKILLed mid-call: its side of the connection is gone


class NetLab:
    """A bridge on this machine with one address (the gateway), relays on that address, and
    a namespace per process started through `argv` and `attach`."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 10_000}{random.randrange(100)}"
        self.bridge = f"pfl{tag}"
        self.network = _free_network()
        self.gateway = str(self.network.network_address + 1)
        self.relays: Relays | None = None
        self.attached = 0
        self._tag = tag

    @staticmethod
    def unavailable() -> str | None:
        """Why this machine cannot give processes a network of their own; None when it can."""
        if os.geteuid() != 0:
            return "not root"
        missing = [tool for tool in ("unshare", "ip", "nsenter") if shutil.which(tool) is None]
        if missing:
            return f"no {', '.join(missing)}"
        probe = f"pflprobe{os.getpid() % 10_000}"
        made = subprocess.run(["ip", "link", "add", probe, "type", "bridge"], capture_output=True, text=True)
        if made.returncode != 0:
            return f"cannot add a bridge: {made.stderr.strip()}"
        subprocess.run(["ip", "link", "del", probe], capture_output=True)
        ns = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
        return None if ns.returncode == 0 else f"cannot unshare the network: {ns.stderr.strip()}"

    @contextlib.contextmanager
    def opened(self) -> Iterator[NetLab]:
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.gateway}/{self.network.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            self.relays = Relays(self.gateway)
            yield self
        finally:
            if self.relays is not None:
                self.relays.close()
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def reach(self, host: str, port: int) -> str:
        """The address (`HOST:PORT`) a namespace reaches host:port, a service of this machine, at."""
        assert self.relays is not None, "open the lab first"
        return f"{self.gateway}:{self.relays.forward(host, port)}"

    @staticmethod
    def argv(command: list[str]) -> list[str]:
        """`command` in a namespace of its own, started once `attach` has given it its link."""
        return ["unshare", "-n", "sh", "-c", WAIT_FOR_LINK, "sh", *command]

    def attach(self, pid: int, timeout_s: float = 10) -> str:
        """Give process `pid` (started through `argv`) its link to the bridge; its address."""
        ours = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + timeout_s
        while os.readlink(f"/proc/{pid}/ns/net") == ours:  # not unshared yet: the link would land here
            assert time.monotonic() < deadline, f"process {pid} never entered a network namespace of its own"
            time.sleep(0.01)
        self.attached += 1
        address = str(self.network.network_address + 10 + self.attached)
        outside = f"pfv{self._tag}{self.attached}"[:15]
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", str(pid))
        _ip("link", "set", outside, "master", self.bridge, "up")
        inside = ["nsenter", "-t", str(pid), "-n", "ip"]
        for args in (["link", "set", "lo", "up"], ["link", "set", "eth0", "up"]):
            _run([*inside, *args])
        _run([*inside, "addr", "add", f"{address}/{self.network.prefixlen}", "dev", "eth0"])
        return address

    @staticmethod
    def connects(pid: int, address: str) -> bool:
        """Whether a TCP connection from inside `pid`'s namespace to `HOST:PORT` is accepted."""
        host, _, port = address.rpartition(":")
        probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=2).close()"
        done = subprocess.run(["nsenter", "-t", str(pid), "-n", "python3", "-c", probe], capture_output=True)
        return done.returncode == 0


def _free_network() -> ipaddress.IPv4Network:
    taken = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for _ in range(100):
        network = ipaddress.IPv4Network(f"10.213.{random.randrange(256)}.0/24")
        if str(network.network_address)[:-1] not in taken:
            return network
    raise RuntimeError("no free 10.213.x.0/24 network for the lab")


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
