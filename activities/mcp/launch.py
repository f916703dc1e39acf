"""How a stdio MCP server's process is started: in the sandbox shell commands run in
(activities/tools/sandbox.py), unless its config table says `sandbox = false`.

A sandboxed server gets what a command gets: new PID, IPC and UTS namespaces with a
fresh /proc (no process of the worker to read), no capabilities, the system
directories read-only with their secrets masked, a private /tmp, and nothing of
PERDURE_HOME, the config file, the stores, the payload keys or the worker's home
directory. Its workspace is its own scratch directory, PERDURE_HOME/mcp/NAME, which is
its HOME and outlives the call (a server starts per call: its caches and state stay, on
this host: never beside the artifact store, whose directory other hosts may share).
It may also read what it needs to start (the executable's install prefix; for a Python
virtualenv, its base interpreter and the sources its editable installs import from),
its `cwd`, and the paths its table lists as `readable`; it may write those listed as
`writable`. Its environment is the commands' allowlist with the variables its table
names in `env`, and bwrap itself starts with exactly that environment (it is PID 1 of
the namespace, where /proc/1/environ shows what it started with). The network only
with `network = true`.

Without a usable bwrap the server is not started (its catalogue entry and its calls
say why and how to fix it), unless the worker runs with PERDURE_UNSANDBOXED_COMMANDS=1:
then, as a command would, it runs directly, with that same environment, in its `cwd`
or its scratch directory. `sandbox = false` starts it as the worker's own child with
the MCP SDK's default variables and its own; the worker warns about each such server
at start. This module decides how a server starts, never whether it may be called.
"""

from __future__ import annotations

import ast
import os
import pwd
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from perdure.activities.mcp.mcp_config import McpConfigInvalid, McpServer, resolve_env
from perdure.activities.tools import sandbox
from perdure.runtime import settings

if TYPE_CHECKING:
    from mcp.client.stdio import StdioServerParameters

EDITABLE_MAPPING = re.compile(r"^MAPPING\b[^=\n]*=\s*(\{.*\})\s*$", re.MULTILINE)
"""The package -> source directory table of a setuptools editable install's finder module."""


def scratch_dir(server: McpServer, home: Path | None) -> Path:
    """The server's own directory on this host: under `home`, default PERDURE_HOME."""
    return (home or settings.perdure_home()) / "mcp" / server.name


async def stdio_parameters(
    server: McpServer, artifact_store: Path | None = None, home: Path | None = None
) -> StdioServerParameters:
    """How to start `server`. McpConfigInvalid for a path of its table this worker cannot
    give it; SandboxUnavailable (saying how to fix it) when it must be sandboxed and cannot."""
    from mcp.client.stdio import StdioServerParameters

    assert server.command is not None
    if not server.sandbox:
        env = resolve_env(server)
        return StdioServerParameters(command=server.command, args=list(server.args), env=env, cwd=server.cwd)
    scratch = scratch_dir(server, home)
    scratch.mkdir(parents=True, exist_ok=True)
    scratch = scratch.resolve()
    env = server_env(server, scratch)
    if sandbox.unsandboxed():
        return StdioServerParameters(
            command=server.command, args=list(server.args), env=env, cwd=server.cwd or str(scratch)
        )
    try:
        bwrap = await sandbox.ensure_available(scratch)
    except sandbox.SandboxUnavailable as err:
        raise sandbox.SandboxUnavailable(
            f"{err}; or start this server unsandboxed: `sandbox = false` in [mcp_servers.{server.name}]"
        ) from None
    executable = _executable(server.command)
    hidden = sandbox.hidden_paths(artifact_store)
    cwd = _cwd(server, hidden)
    readable = [*_configured(server, "readable", hidden), *([cwd] if cwd and not _in_system_dir(cwd) else [])]
    runtime = [p for p in runtime_paths(executable) if _bindable(p, hidden)] if executable else []
    box = sandbox.Sandbox(
        scratch,
        network=server.network,
        hidden=tuple(hidden),
        read_only=tuple(dict.fromkeys([*runtime, *readable])),
        writable=tuple(_configured(server, "writable", hidden)),
        chdir=cwd,
    )
    command = str(executable.parent.resolve() / executable.name) if executable else server.command
    argv = box.argv(bwrap, [command, *server.args])
    return StdioServerParameters(command=argv[0], args=argv[1:], env=env)


def server_env(server: McpServer, scratch: Path) -> dict[str, str]:
    """The whole environment of a sandboxed server and of bwrap: the commands' allowlist and
    the variables its table names. Every variable the MCP SDK would copy from the worker
    (HOME, LOGNAME, PATH, SHELL, TERM, USER) is set here, so none of the worker's is left."""
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    return {**sandbox.command_env(scratch), "SHELL": "/bin/sh", "USER": user, "LOGNAME": user, **resolve_env(server)}


def runtime_paths(executable: Path) -> list[Path]:
    """What an executable needs to start, as real paths: its install prefix (the directory
    above its `bin`, else its own directory), that of the file a symlink points to, and
    for a Python virtualenv its base interpreter and the sources of its editable installs."""
    paths: list[Path] = []
    for exe in dict.fromkeys([executable.parent.resolve() / executable.name, executable.resolve()]):
        prefix = exe.parent.parent if exe.parent.name == "bin" else exe.parent
        paths.append(prefix)
        if (prefix / "pyvenv.cfg").is_file():
            paths += _virtualenv_paths(prefix)
    return list(dict.fromkeys(p.resolve() for p in paths if p.exists()))


def _virtualenv_paths(venv: Path) -> list[Path]:
    paths = []
    for line in (venv / "pyvenv.cfg").read_text(errors="replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            home = Path(value.strip())
            paths.append(home.parent if home.name == "bin" else home)
    for site in venv.glob("lib/python*/site-packages"):
        # A .pth line that is an absolute path is a directory put on sys.path (uv's and pip's
        # editable installs); relative ones are under site-packages, `import` lines are code.
        for pth in site.glob("*.pth"):
            lines = pth.read_text(errors="replace").splitlines()
            paths += [Path(line.strip()) for line in lines if line.startswith("/")]
        for finder in site.glob("__editable__*finder.py"):
            found = EDITABLE_MAPPING.search(finder.read_text(errors="replace"))
            try:
                mapping = ast.literal_eval(found.group(1)) if found else {}
            except (ValueError, SyntaxError):
                continue
            paths += [Path(source) for source in mapping.values() if isinstance(source, str)]
    return paths


def _executable(command: str) -> Path | None:
    found = shutil.which(command, path=os.environ.get("PATH") or sandbox.DEFAULT_PATH)
    return Path(found).absolute() if found else None


def _in_system_dir(path: Path) -> bool:
    return any(path.is_relative_to(name) for name in sandbox.SYSTEM_DIRS)


def _bindable(path: Path, hidden: list[Path]) -> bool:
    """Not a system directory (already there, read-only, its secrets masked) and not hidden.
    What it holds that is hidden is masked in it."""
    return not _in_system_dir(path) and not _hidden(path, hidden)


def _hidden(path: Path, hidden: list[Path]) -> bool:
    """`/`, a path the sandbox hides, or one inside any but the worker's home directory
    (where a server's data may well live): PERDURE_HOME, the stores, a key file's directory."""
    home = Path.home().resolve()
    return path == Path("/") or path in hidden or any(path.is_relative_to(h) for h in hidden if h != home)


def _configured(server: McpServer, kind: str, hidden: list[Path]) -> list[Path]:
    """The table's `readable` or `writable` paths, as real paths; McpConfigInvalid for one
    that does not exist, is hidden, or (writable) is in a system directory."""
    paths = []
    for entry in getattr(server, kind):
        path = _listed(server, kind, entry, hidden)
        if _in_system_dir(path):
            if kind == "writable":
                raise McpConfigInvalid(
                    f"MCP server '{server.name}': writable path {entry} is in a system directory, "
                    "read-only in the sandbox"
                )
            continue  # already readable
        paths.append(path)
    return paths


def _cwd(server: McpServer, hidden: list[Path]) -> Path | None:
    return _listed(server, "cwd", server.cwd, hidden) if server.cwd is not None else None


def _listed(server: McpServer, kind: str, entry: str, hidden: list[Path]) -> Path:
    path = Path(entry).expanduser().absolute()
    if not path.exists():
        raise McpConfigInvalid(f"MCP server '{server.name}': {kind} path {entry} does not exist on this worker")
    path = path.resolve()
    if _hidden(path, hidden):
        raise McpConfigInvalid(
            f"MCP server '{server.name}': {kind} path {entry} is hidden from every sandbox (perdure's home, "
            "config, stores and keys and what is in them, the worker's home directory itself, `/`)"
        )
    return path


def start_warnings(servers: Iterable[McpServer]) -> list[str]:
    """One line per stdio server that runs unsandboxed by its table's choice, for the worker's start."""
    return [
        f"MCP server '{server.name}' runs WITHOUT a sandbox (sandbox = false in [mcp_servers.{server.name}]): "
        "it can read this worker's files and its processes' environments (API keys), and use its network"
        for server in servers
        if server.command is not None and not server.sandbox
    ]
