"""The sandbox every shell command of a goal runs in: bubblewrap (`bwrap`).

Owns how a command's process is started, what it can reach and how it ends, for
every tool that runs a command (`run_command`: activities/tools/command_runs.py) and for stdio MCP
servers (activities/mcp/launch.py, which also binds paths a server needs). A
command gets new PID, IPC and UTS namespaces with a fresh `/proc` (the worker and
its other processes are not there to read), no capabilities, the workspace
read-write at its own path, the system directories (SYSTEM_DIRS) read-only with
the host's password hashes, private keys and service key files masked
(SYSTEM_SECRETS), a private `/tmp` and `/dev`, and nothing else of the host's
filesystem: not the worker's home directory, PERDURE_HOME, the config file, the
artifact store or the payload store (masked even when they lie inside something
bound, as is whatever PERDURE_SANDBOX_HIDE names). Its environment is
`command_env` only, and bwrap itself starts with that same environment: bwrap
stays as PID 1 of the namespace, where `/proc/1/environ` would show whatever it
was started with.
There is no network (a namespace with only its own loopback) unless the goal or
the plan step allows it; then the command shares the worker's network.

The whole process tree ends with the step: bwrap runs in its own process group
with `--die-with-parent`, and killing that group kills the namespace's PID 1,
which takes every process in it along, a `setsid` child included; the worker's
death does the same.

Without a usable bwrap a command is refused (SandboxUnavailable, with how to
install it), unless the worker runs with PERDURE_UNSANDBOXED_COMMANDS=1: then a
command runs directly, with the scrubbed environment in its own process group,
and can read whatever the worker can. This module must not decide whether a
command may run at all (replay policy is the tool's) or capture its output.
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import signal
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perdure.runtime import settings

UNSANDBOXED_ENV = "PERDURE_UNSANDBOXED_COMMANDS"

INSTALL_HINT = (
    "install bubblewrap on the worker's machine (Debian/Ubuntu: sudo apt-get install bubblewrap; "
    "Fedora: sudo dnf install bubblewrap; or `make system-packages` as root) and restart the worker; "
    f"to run commands without a sandbox instead, start the worker with {UNSANDBOXED_ENV}=1"
)

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
"""Bound read-only where they exist (a symlink, as in a merged /usr, stays a symlink)."""

SYSTEM_SECRETS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/ssh/ssh_host_*_key",
    "/etc/ssl/private",
    "/etc/sudoers",
    # Where a service's keys are often kept: an EnvironmentFile, a unit's Environment=
    # lines, systemd credentials, PAM's environment.
    "/etc/perdure",
    "/etc/systemd",
    "/etc/credstore",
    "/etc/credstore.encrypted",
    "/etc/environment",
)
"""Masked inside the read-only /etc: a command runs as the worker's user, which may be root.
Any other file with a key under a system directory needs PERDURE_SANDBOX_HIDE."""

HIDE_ENV = "PERDURE_SANDBOX_HIDE"
"""More paths to mask, colon-separated (a key file under /etc or /opt, say)."""

SETTING_PREFIXES = ("PERDURE_", "TEMPORAL_")
"""Variables whose path values are perdure's or its Temporal connection's files (the payload
store and key file, a TLS key, the Temporal config file, the dev server's data...)."""

AWS_KEY_FILES = (
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
)
"""The AWS variables that name a file holding the object store's credentials (the default
files are under the worker's home, masked anyway). Named one by one, not by prefix: an
AWS_CA_BUNDLE may be the system's CA file, which commands need."""


class SandboxUnavailable(Exception):
    """bwrap is missing or cannot create its namespaces here; the message says how to fix it."""


def unsandboxed() -> bool:
    """The worker runs commands without a sandbox (PERDURE_UNSANDBOXED_COMMANDS=1)."""
    return os.environ.get(UNSANDBOXED_ENV, "").strip() == "1"


def command_env(home: Path) -> dict[str, str]:
    """The whole environment of a command, and of bwrap itself. Built from scratch so no
    API key or token of the worker reaches it. PATH is the worker's (its entries outside
    the sandbox find nothing); HOME is the workspace, the one place a command can write
    that outlives it."""
    return {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": str(home),
        "TERM": "dumb",
    }


def hidden_paths(artifact_store: Path | None = None) -> list[Path]:
    """What a command must never reach, wherever it lies: PERDURE_HOME, the config file, the
    artifact store, the worker's home directory, every path a PERDURE_* or TEMPORAL_*
    variable names (the payload store, a key file, TLS keys...) and the AWS credential
    files. Only the workspace and the system directories are bound at all; these are
    masked where they lie inside one of them."""
    candidates = [settings.perdure_home(), settings.config_path(), Path.home()]
    if artifact_store is not None:
        candidates.append(artifact_store)
    for name, value in os.environ.items():
        where = value.strip().removeprefix("disk:")
        setting = name.startswith(SETTING_PREFIXES) and name != HIDE_ENV
        if (setting or name in AWS_KEY_FILES) and where.startswith(("/", "~")):
            candidates.append(Path(where))
    candidates += [Path(p) for p in os.environ.get(HIDE_ENV, "").split(":") if p.strip()]
    return [path.expanduser().resolve() for path in candidates]


@dataclass(frozen=True)
class Sandbox:
    """What one command may reach: its workspace (a real, resolved path), the network or
    not, and the paths masked even inside what is bound. A stdio MCP server
    (activities/mcp/launch.py) may also read `read_only` and write `writable` (real,
    resolved paths, each bound at its own path), and start in `chdir`."""

    workspace: Path
    network: bool = False
    hidden: Sequence[Path] = field(default_factory=tuple)
    read_only: Sequence[Path] = field(default_factory=tuple)
    writable: Sequence[Path] = field(default_factory=tuple)
    chdir: Path | None = None

    def argv(self, bwrap: str, command: Sequence[str]) -> list[str]:
        args = [
            bwrap,
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            # Root outside without a user namespace would keep every capability inside
            # (mount, mknod, ...): the read-only binds would be only a convention.
            "--cap-drop",
            "ALL",
        ]
        if not self.network:
            args.append("--unshare-net")
        roots: list[Path] = []
        for name in SYSTEM_DIRS:
            path = Path(name)
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), name]
            elif path.is_dir():
                args += ["--ro-bind", name, name]
                roots.append(path)
        args += _system_secret_masks()
        if self.network:
            args += _resolver_outside_etc()
        inside_workspace = [p for p in self.hidden if _strictly_inside(p, self.workspace)]
        # Before the workspace is bound: a mask over a directory that holds the workspace
        # (PERDURE_HOME=/opt/perdure, workspace /opt/perdure/ws) must not cover it.
        args += _masks([p for p in self.hidden if p not in inside_workspace], roots)
        # A fresh /proc shows only the namespace's processes; /tmp is private and goes with
        # the command. Both after the binds above, so nothing of the host's shadows them.
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        # After /tmp, like the workspace: a path under /tmp is bound on top of the private one.
        # Masked inside at once, and before the workspace is bound, for the same reason as above.
        for path in self.read_only:
            args += ["--ro-bind", str(path), str(path)]
        for path in self.writable:
            args += ["--bind", str(path), str(path)]
        args += _masks([p for p in self.hidden if p not in inside_workspace], [*self.read_only, *self.writable])
        args += ["--bind", str(self.workspace), str(self.workspace)]
        args += _masks(inside_workspace, [self.workspace])
        args += ["--chdir", str(self.chdir or self.workspace), "--", *command]
        return args


def _system_secret_masks() -> list[str]:
    args: list[str] = []
    for pattern in SYSTEM_SECRETS:
        for name in sorted(glob.glob(pattern)):
            args += _mask(Path(name))
    return args


def _resolver_outside_etc() -> list[str]:
    """/etc/resolv.conf is often a symlink into /run (systemd-resolved), which is not
    bound: bind its target, so a command with the network can resolve names."""
    resolv = Path("/etc/resolv.conf")
    if not resolv.is_symlink():
        return []
    target = resolv.resolve()
    if not target.is_file() or target.is_relative_to("/etc"):
        return []
    return ["--ro-bind", str(target), str(target)]


def _strictly_inside(path: Path, root: Path) -> bool:
    return path != root and path.is_relative_to(root)


def _masks(hidden: Iterable[Path], roots: Sequence[Path]) -> list[str]:
    """Masks for the hidden paths that lie inside something bound (nothing else is there)."""
    args: list[str] = []
    for path in hidden:
        if path.exists() and any(_strictly_inside(path, root) for root in roots):
            args += _mask(path)
    return args


def _mask(path: Path) -> list[str]:
    # An empty tmpfs over a directory; the host's /dev/null over a file, which the sandbox
    # mounts nodev, so reading it is refused rather than empty.
    return ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]


# --- availability -------------------------------------------------------------------

_usable: set[str] = set()
"""bwrap paths that have created a sandbox in this process: each is probed once."""


def find_bwrap() -> str | None:
    return shutil.which("bwrap", path=os.environ.get("PATH") or DEFAULT_PATH)


async def ensure_available(workspace: Path) -> str:
    """The bwrap to use, once it has shown it can build a sandbox here (a trial run of
    `true` with this workspace, once per process); SandboxUnavailable otherwise."""
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailable(f"bwrap (bubblewrap) is not installed on this worker: {INSTALL_HINT}")
    if bwrap in _usable:
        return bwrap
    probe = await asyncio.create_subprocess_exec(
        *Sandbox(workspace).argv(bwrap, ["/bin/true"]),
        env=command_env(workspace),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _, stderr = await asyncio.wait_for(probe.communicate(), timeout=30)
    except TimeoutError:
        kill_tree(probe)
        raise SandboxUnavailable(f"{bwrap} did not start a sandbox within 30 s: {INSTALL_HINT}") from None
    if probe.returncode != 0:
        said = stderr.decode(errors="replace").strip() or f"exit code {probe.returncode}"
        raise SandboxUnavailable(
            f"{bwrap} cannot create a sandbox on this worker ({said}); it needs user namespaces (in a "
            f"container: allow them, e.g. a seccomp profile that permits unshare): {INSTALL_HINT}"
        )
    _usable.add(bwrap)
    return bwrap


async def describe_at_start() -> tuple[bool, str]:
    """(a warning?, what to say): how this worker's commands will run, for its start-up log."""
    if unsandboxed():
        return True, (
            f"shell commands and stdio MCP servers run WITHOUT a sandbox ({UNSANDBOXED_ENV}=1): they can read "
            "this worker's files and its processes' environments (API keys), and use its network"
        )
    try:
        bwrap = await ensure_available(Path(tempfile.gettempdir()))
    except SandboxUnavailable as err:
        return True, f"run_command will refuse every command and stdio MCP servers will not start: {err}"
    return False, f"shell commands run in a bubblewrap sandbox ({bwrap})"


# --- running ------------------------------------------------------------------------


async def start(sandbox: Sandbox, command: Sequence[str], **io) -> asyncio.subprocess.Process:
    """Start `command` in `sandbox` (stdin, stdout, stderr as in `io`), in its own process
    group, which kill_tree ends. SandboxUnavailable when there is no usable bwrap and the
    worker does not run commands unsandboxed."""
    env = command_env(sandbox.workspace)
    if unsandboxed():
        argv = list(command)
        cwd: Path | None = sandbox.workspace
    else:
        argv = sandbox.argv(await ensure_available(sandbox.workspace), command)
        cwd = None
    return await asyncio.create_subprocess_exec(*argv, cwd=cwd, env=env, start_new_session=True, **io)


def kill_tree(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the command's process group. In a sandbox that includes the namespace's PID 1,
    whose death kills every process left in the namespace; unsandboxed, a child that left
    the group (setsid) survives."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the whole group is already gone
