"""The `[mcp_servers.NAME]` tables of the worker's config.toml: which MCP servers give
goals their tools, how to reach each one, and each tool's risk class and replay policy.

    [mcp_servers.notes]
    command = "python"                          # stdio: a command the worker starts per call
    args = ["-m", "notes_server"]
    env = ["NOTES_TOKEN"]                       # NAMES of worker variables the server gets
    network = true                              # default false: no network in its sandbox
    writable = ["/srv/notes"]                   # besides its scratch directory; also `readable`
    # sandbox = false                           # runs as the worker's own child: warned at start
    [mcp_servers.notes.tools.add_note]
    risk = "remote-write"                       # read | local-write | remote-write | irreversible
    replay = "keyed"                            # safe | keyed | once

    [mcp_servers.tracker]
    url = "https://mcp.example.com/mcp"         # streamable HTTP
    headers = { Authorization = "Bearer ${TRACKER_TOKEN}" }   # ${NAME}: a worker variable

A tool the table does not name is `remote-write` / `once`: never sent twice on its own.
A stdio server runs in the sandbox of shell commands (activities/mcp/launch.py) unless its
table says `sandbox = false`.
This module holds variable *names* and header templates; the values are read only by
`resolve_env` and `resolve_headers`, inside the activity that starts or calls a server,
and never logged, returned or put into a goal. A table that cannot be used is one line
saying where and what (`McpConfigInvalid`, a ValueError the CLI prints as it is).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator

from perdure.runtime.settings import config_path
from perdure.workflows.goal.contracts.plan import describe_validation_error
from perdure.workflows.shared.mcp_tools import DEFAULT_CALL_TIMEOUT_S, DEFAULT_REPLAY, DEFAULT_RISK, SERVER_NAME
from perdure.workflows.shared.tool_specs import RiskClass

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]{0,127})\}")


class McpConfigInvalid(ValueError):
    """The config file's MCP servers cannot be used; the message says where and why."""


class McpToolPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    risk: RiskClass = DEFAULT_RISK
    # `check` needs a way to look an effect up by its key, which MCP does not have.
    replay: Literal["safe", "keyed", "once"] = DEFAULT_REPLAY
    timeout_s: float | None = Field(default=None, gt=0, le=3_600)

    @field_validator("replay", mode="before")
    @classmethod
    def _no_check(cls, value: object) -> object:
        if value == "check":
            raise ValueError("'check' needs a lookup by effect key, which an MCP tool has not; use keyed or once")
        return value


class McpServer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SERVER_NAME)
    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: list[str] = Field(default_factory=list, description="Names of worker variables passed to the server.")
    cwd: str | None = None
    sandbox: StrictBool = Field(default=True, description="false: started as the worker's own child, unsandboxed.")
    network: StrictBool = Field(default=False, description="The sandboxed server shares the worker's network.")
    readable: list[str] = Field(default_factory=list, description="Absolute paths the sandboxed server may read.")
    writable: list[str] = Field(default_factory=list, description="Absolute paths the sandboxed server may write.")
    url: str | None = Field(default=None, pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict, description="Header -> value; ${NAME} is a worker variable.")
    timeout_s: float = Field(default=DEFAULT_CALL_TIMEOUT_S, gt=0, le=3_600, description="A call's default limit.")
    tools: dict[str, McpToolPolicy] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _names_not_values(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.fullmatch(ENV_NAME, name):
                raise ValueError(f"'{name[:40]}' is not a variable name: list the NAMES of worker variables")
        return names

    @field_validator("readable", "writable", "cwd")
    @classmethod
    def _absolute(cls, value: list[str] | str | None) -> list[str] | str | None:
        for path in [value] if isinstance(value, str) else value or []:
            if not path.startswith(("/", "~")):
                raise ValueError(f"'{path[:80]}' is not an absolute path")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (a stdio server) or `url` (a streamable-HTTP server)")
        if self.url is None and self.headers:
            raise ValueError("`headers` are for a `url` server")
        sandboxing = self.network or self.readable or self.writable or not self.sandbox
        if self.command is None and (self.args or self.env or self.cwd or sandboxing):
            raise ValueError(
                "`args`, `env`, `cwd`, `sandbox`, `network`, `readable` and `writable` are for a `command` server"
            )
        if not self.sandbox and (self.network or self.readable or self.writable):
            raise ValueError(
                "`network`, `readable` and `writable` say what a sandboxed server may reach; "
                "with `sandbox = false` it reaches whatever the worker can"
            )
        return self

    def policy(self, tool: str) -> McpToolPolicy:
        return self.tools.get(tool) or McpToolPolicy()

    def call_timeout_s(self, tool: str) -> float:
        return self.policy(tool).timeout_s or self.timeout_s

    def secret_names(self) -> list[str]:
        """The worker variables whose values this server is given: redacted from what it answers."""
        return [*self.env, *(m for value in self.headers.values() for m in VARIABLE.findall(value))]


def resolve_env(server: McpServer) -> dict[str, str]:
    """The listed variables' values, for the server process only. An unset one is left out."""
    return {name: os.environ[name] for name in server.env if name in os.environ}


def resolve_headers(server: McpServer) -> dict[str, str]:
    """The headers with `${NAME}` replaced by the worker's variable; an unset one is an error
    naming it (never its value)."""
    missing = sorted({m for v in server.headers.values() for m in VARIABLE.findall(v) if m not in os.environ})
    if missing:
        raise McpConfigInvalid(
            f"MCP server '{server.name}': header variable{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} not set on this worker"
        )
    return {header: VARIABLE.sub(lambda m: os.environ[m.group(1)], value) for header, value in server.headers.items()}


def secret_values(server: McpServer) -> list[str]:
    """The values of the variables this server is given, longest first (for redaction)."""
    values = {os.environ.get(name, "").strip() for name in server.secret_names()}
    return sorted((v for v in values if len(v) >= 4), key=len, reverse=True)


def load_mcp_servers(path: Path | None = None) -> dict[str, McpServer]:
    """The servers the config file names (none without a file or an `mcp_servers` table)."""
    path = path or config_path()
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise McpConfigInvalid(f"cannot read MCP servers from {path}: {err}") from None
    return servers_from(data.get("mcp_servers", {}), str(path))


def servers_from(tables: Any, where: str) -> dict[str, McpServer]:
    if not isinstance(tables, dict):
        raise McpConfigInvalid(f"{where}: 'mcp_servers' must be a table of [mcp_servers.NAME] tables")
    servers = {}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise McpConfigInvalid(f"{where}: [mcp_servers.{name}] must be a table")
        try:
            servers[name] = McpServer.model_validate({**table, "name": name})
        except ValidationError as err:
            problem = describe_validation_error(err).replace("name: String should match pattern", "name must match")
            raise McpConfigInvalid(f"{where}: [mcp_servers.{name}] is invalid: {problem}") from None
    return servers
