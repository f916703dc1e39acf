"""Tools from MCP servers: how their names read, what a goal keeps of their catalogue,
and how a catalogue entry becomes a perdure ToolSpec and declaration.

The worker's config.toml names MCP servers and declares a risk class and a replay
policy per tool (activities/mcp/mcp_config.py); the catalogue activity lists each server's
tools (activities/mcp/mcp_session.py) and the goal keeps the answer in its state
(`GoalState.mcp_tools`), so planner and agent prompts, plan checks and the effect rules
read the same catalogue on every replay. A tool named `mcp__SERVER__TOOL` fits the
tool-name patterns of OpenAI (`^[a-zA-Z0-9_-]{1,64}$`) and Anthropic.

Pure data and checks. Never a server's command, URL, environment or headers: those stay
on the worker. Arguments are checked against the tool's own JSON schema with the
`jsonschema` package (deterministic, no I/O).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio import workflow

from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.workflows.shared.tool_specs import ONCE_TIMEOUTS, Effect, ReplayPolicy, RiskClass, Tool, ToolArgs, ToolSpec
from perdure.workflows.shared.user_tools import UserTool

with workflow.unsafe.imports_passed_through():
    # Pure validation library; loaded once for every workflow run, not per sandbox.
    import jsonschema

MCP_PREFIX = "mcp__"
SEPARATOR = "__"
SERVER_NAME = r"^[a-z0-9][a-z0-9-]{0,23}$"
"""A server's name in config.toml: short, lower case, no `_` (`__` separates server and tool)."""
TOOL_NAME_LIMIT = 64
DEFAULT_RISK: RiskClass = "remote-write"
DEFAULT_REPLAY: ReplayPolicy = "once"
"""A tool the config says nothing about may write and is never sent twice on its own."""
DEFAULT_CALL_TIMEOUT_S = 60.0
MAX_DESCRIPTION_CHARS = 1_000
MAX_SCHEMA_PROBLEMS = 5


def is_mcp_tool(name: str) -> bool:
    return name.startswith(MCP_PREFIX)


def mcp_tool_name(server: str, tool: str) -> str:
    """`mcp__SERVER__TOOL`, with characters the model APIs refuse in a tool name made `_`,
    cut to 64 characters."""
    safe = re.sub(r"[^a-zA-Z0-9_-]", "_", tool)
    return f"{MCP_PREFIX}{server}{SEPARATOR}{safe}"[:TOOL_NAME_LIMIT]


def server_of(name: str) -> str:
    """The server part of `mcp__SERVER__TOOL` (server names hold no `__`)."""
    return name.removeprefix(MCP_PREFIX).split(SEPARATOR, 1)[0]


class McpArgs(ToolArgs):
    """An MCP tool's arguments: any JSON object; `McpTool.input_schema` checks it."""

    model_config = ConfigDict(extra="allow")


class McpDeclaration(Tool):
    """What every MCP tool's call reaches, does and sends: the tool on its server is the
    target, the arguments are the whole request. It has no compensation."""

    def __init__(self, name: str) -> None:
        self.name = name

    def effect(self, args: McpArgs, workspace: str) -> Effect:
        return Effect(f"mcp:{self.name}", "call", args.model_dump(mode="json"))


class McpTool(BaseModel):
    """One MCP tool as a goal knows it: what it is called here and on its server, what it
    says it does and takes, and the risk and replay policy the worker's config declares."""

    name: str = Field(description="The perdure tool name, mcp__SERVER__TOOL.")
    server: str
    tool: str = Field(description="The tool's name on its server.")
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    risk: RiskClass = DEFAULT_RISK
    replay: ReplayPolicy = DEFAULT_REPLAY
    timeout_s: float = Field(default=DEFAULT_CALL_TIMEOUT_S, gt=0, le=3_600)

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            risk=self.risk,
            replay=self.replay,
            description=f"[MCP server {self.server}] {self.description[:MAX_DESCRIPTION_CHARS]}".strip(),
            args_model=McpArgs,
            input_schema=self.input_schema,
            # The call's own limit, plus room to start the server and connect.
            start_to_close_s=self.timeout_s + 30,
            heartbeat_timeout_s=ONCE_TIMEOUTS["heartbeat_timeout_s"],
        )


class McpCatalogueInput(BaseModel):
    servers: list[str] | None = Field(
        default=None, description="The servers whose tools to list (those the goal names); None: every one."
    )


class McpCatalogue(BaseModel):
    """The tools the worker's MCP servers offer, and why a server offers none."""

    tools: dict[str, McpTool] = Field(default_factory=dict)
    problems: dict[str, str] = Field(default_factory=dict, description="Server -> why its tools could not be listed.")

    def unknown(self, name: str) -> str:
        """Why `name` is not a tool of this catalogue, in one sentence."""
        server = server_of(name)
        if server in self.problems:
            return f"unknown tool '{name}': MCP server '{server}' could not be reached: {self.problems[server]}"
        offered = sorted(t for t in self.tools if server_of(t) == server)
        if offered:
            return f"unknown tool '{name}': MCP server '{server}' offers {', '.join(offered)}"
        return f"unknown tool '{name}': the worker's config.toml names no MCP server '{server}'"


def tool_table(mcp_tools: Iterable[McpTool] = (), user_tools: Iterable[UserTool] = ()) -> dict[str, ToolSpec]:
    """Every tool a goal may know: the built-in ones, these of its MCP catalogue and these of
    the user's own (workflows/shared/user_tools.py)."""
    return {
        **TOOL_SPECS,
        **{tool.name: tool.spec() for tool in sorted(mcp_tools, key=lambda t: t.name)},
        **{tool.name: tool.spec() for tool in sorted(user_tools, key=lambda t: t.name)},
    }


def names_mcp_tools(tools: list[str]) -> list[str]:
    """The servers a goal's tools name, sorted."""
    return sorted({server_of(t) for t in tools if is_mcp_tool(t)})


def schema_problems(schema: Mapping[str, Any], args: Any) -> list[str]:
    """What is wrong with `args` for this JSON schema, one line per problem (at most a few),
    each saying where; empty when they fit. A schema that is itself broken checks nothing."""
    try:
        validator_type = jsonschema.validators.validator_for(schema)
        validator = validator_type(schema)
        errors = sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path))
    except (jsonschema.SchemaError, TypeError, ValueError):
        return []
    problems = []
    for error in errors[:MAX_SCHEMA_PROBLEMS]:
        where = ".".join(str(p) for p in error.absolute_path) or "(arguments)"
        problems.append(f"{where}: {error.message[:300]}")
    if len(errors) > MAX_SCHEMA_PROBLEMS:
        problems.append(f"and {len(errors) - MAX_SCHEMA_PROBLEMS} more")
    return problems


def schema_summary(schema: Mapping[str, Any]) -> str:
    """The fields a schema asks for, for a message to a model: `a (required), b`."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(properties, Mapping) or not properties:
        return "expected: a JSON object"
    required = set(schema.get("required") or [])
    fields = [f"{name} (required)" if name in required else str(name) for name in properties]
    return "expected fields: " + ", ".join(fields)
