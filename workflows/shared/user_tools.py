"""Tools a user declares in their own Python package (`perdure.tool`), as the goal knows
them: data, never code.

A user tool's code runs only on the workers (and devices) that load its module
(`perdure worker --tools MODULE`, or the `perdure.tools` entry point group). The workflow
cannot import a user's package, so the worker sends what it declares as a `UserTool` (its
name, description, JSON schema, risk class, replay policy, compensation, timeouts) and the
goal keeps the answer in its state (`GoalState.user_tools`), like an MCP server's catalogue
(workflows/shared/mcp_tools.py): planner and agent prompts, plan checks and the effect rules
read the same catalogue on every replay. Its effect key and compensation are made by the
prepare activity on a worker, from the declaration's own rules, never by the workflow.

A tool is a user tool by its name: one that is neither built in nor `mcp__SERVER__TOOL`.
Pure data and checks; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from perdure.workflows.shared.tool_specs import (
    ExpiryAssumption,
    ExpiryOutcome,
    ReplayPolicy,
    RiskClass,
    ToolArgs,
    ToolSpec,
)

USER_TOOL_NAME = r"^[a-z][a-z0-9_]{0,63}$"
"""A user tool's name: what the model APIs accept as a function name, lower case, no `__`
prefix of MCP's (`mcp__`)."""


def is_user_tool_name(name: str, built_in: Iterable[str]) -> bool:
    """Whether `name` can only be a user tool's: a valid name, not built in, not an MCP tool's."""
    return bool(re.fullmatch(USER_TOOL_NAME, name)) and not name.startswith("mcp__") and name not in set(built_in)


class UserArgs(ToolArgs):
    """A user tool's arguments as the goal sees them: any JSON object; `UserTool.input_schema`
    checks it (the worker validates with the tool's own pydantic model)."""

    model_config = ConfigDict(extra="allow")


class UserTool(BaseModel):
    """One user tool as a worker declares it: everything the goal decides by, nothing it runs."""

    name: str = Field(pattern=USER_TOOL_NAME)
    description: str
    input_schema: dict = Field(default_factory=lambda: {"type": "object"})
    risk: RiskClass
    replay: ReplayPolicy
    compensation: str | None = Field(default=None, description="The user tool that undoes its effect.")
    start_to_close_s: float = Field(gt=0)
    heartbeat_timeout_s: float | None = Field(default=None, gt=0)
    network: bool = Field(default=False, description="It reaches the network itself (a service it calls).")
    needs_workspace: bool = False
    on_devices: bool = Field(default=False, description="A device may offer it (`perdure device --tools`).")
    max_cost_usd: float | None = Field(
        default=None,
        ge=0,
        description="The most one call may cost: reserved before a `tool` step runs it; a call is refused when "
        "the cost budget has less left.",
    )
    module: str = Field(default="", description="The Python module that declares it.")
    safe_on_expiry: list[ExpiryAssumption] = Field(
        default_factory=list, description="What may be assumed of an uncertain call when its question expires."
    )
    on_expiry: ExpiryOutcome | None = Field(default=None, description="Its questions' outcome on expiry by default.")

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            risk=self.risk,
            replay=self.replay,
            description=self.description,
            args_model=UserArgs,
            input_schema=self.input_schema,
            compensation=self.compensation,
            start_to_close_s=self.start_to_close_s,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            needs_workspace=self.needs_workspace,
            on_devices=self.on_devices,
            max_cost_usd=self.max_cost_usd,
            safe_on_expiry=tuple(self.safe_on_expiry),
            on_expiry=self.on_expiry,
        )


class UserToolCatalogueInput(BaseModel):
    names: list[str] = Field(description="The user tools the goal names.")


class UserToolCatalogue(BaseModel):
    """The user tools a worker loads, of those a goal names, and their compensations (a
    rollback runs one by its declaration; naming a tool does not allow its compensation)."""

    tools: dict[str, UserTool] = Field(default_factory=dict)
    loaded: list[str] = Field(default_factory=list, description="Every user tool the answering worker loads.")

    def unknown(self, name: str) -> str:
        """Why `name` is not a tool of this catalogue, in one sentence."""
        loads = ", ".join(self.loaded) or "none"
        return (
            f"unknown tool '{name}': it is not built in and no worker loads a tool of that name "
            f"(the worker's own tools: {loads}; load a module with `perdure worker --tools MODULE`)"
        )


def user_tools_named(tools: Iterable[str], built_in: Iterable[str]) -> list[str]:
    """The names of `tools` that can only be user tools, sorted."""
    built = set(built_in)
    return sorted({t for t in tools if is_user_tool_name(t, built)})
