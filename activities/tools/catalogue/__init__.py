"""perdure's built-in tools, one module each (or one per small family), and the registry
that gathers them.

## Where do I add a tool (with a compensation)

In one module of this package, listed once in `TOOL_MODULES` below, and its test. The
module declares everything about its tools: the argument model (a `ToolArgs`: the JSON
schema planners and agents are shown), a `ToolSpec` (name, risk class, replay policy,
description, timeouts, where it may run, the name of the tool that undoes it), an
`example` of valid arguments, and a class that is both the declaration and the
implementation: a `LocalTool` (`run` returns the text the step sees) or, for a call that
reaches outside the workspace, an `EffectTool` with `effect` (the target, action and
payload its effect key is made from), `undo` (the compensation: which tool undoes it and
with what arguments, built from the effect's key before the effect is attempted),
`send`, `lookup` (for `check` tools: find the effect by its key), `describe` and
`target`. payment_tools.py is the model of a keyed irreversible call with a refund,
git_tools.py of a checked one with a lookup. tests/test_tool_catalogue.py checks every
declaration is complete and consistent (`declaration_problems`); nothing else names a
tool: the planner, plan checks, the effect guard, the tool activity and the compensation
run all read this registry.

## Why the workflow imports these modules, and what that asks of them

The goal workflow validates a built-in tool's arguments and makes its effect key and
compensation itself, with no activity (workflows/shared/effects.py
`prepared_in_workflow`), so it needs the argument models and the `effect` and `undo`
rules as code, the same code the activity runs. So every module here is pure at import:
at module level it imports only the standard library, pydantic, perdure.workflows and
this package; whatever runs only on a worker (HTTP, git, the sandbox, the workspace's
disk, the environment) is imported inside the function that uses it, from the plumbing
modules of activities/tools/. The package is passed through the workflow sandbox with
the workflow modules (runtime/plugin.py WORKFLOW_MODULES) and scanned with them for
clocks, randomness, the environment and the disk (tests/test_workflow_code_sources.py);
tests/test_tool_catalogue.py checks that importing it loads no worker code. Tools that
are not built in reach the workflow as data, never as code: an MCP tool is a `ToolSpec`
with the JSON schema its server gives (workflows/shared/mcp_tools.py), its effect key
made by one rule for all of them (`McpDeclaration`).
"""

from __future__ import annotations

import importlib

from perdure.activities.tools.catalogue.file_tools import COMPACTION_TOOL
from perdure.workflows.shared.tool_specs import Tool, ToolSpec

TOOL_MODULES: tuple[str, ...] = (
    "file_tools",
    "command_tool",
    "http_tools",
    "email_tool",
    "git_tools",
    "webhook_tool",
    "payment_tools",
)
"""The modules whose `DECLARED` tools make the catalogue, in the order planners are shown them."""


def gathered(modules: tuple[str, ...]) -> dict[str, Tool]:
    """Every tool the modules declare, by name; a name declared twice is refused at import."""
    tools: dict[str, Tool] = {}
    for module in modules:
        for tool in importlib.import_module(f"{__name__}.{module}").DECLARED:
            if tool.spec.name in tools:
                raise ValueError(f"tool {tool.spec.name} is declared twice (again in {module})")
            tools[tool.spec.name] = tool
    return tools


TOOLS: dict[str, Tool] = gathered(TOOL_MODULES)
TOOL_SPECS: dict[str, ToolSpec] = {name: tool.spec for name, tool in TOOLS.items()}

DEFAULT_TOOLS: list[str] = [
    name for name, spec in TOOL_SPECS.items() if spec.risk in ("read", "local-write") and name != COMPACTION_TOOL
]
"""Tools a goal may use unless it names its own: nothing that reaches outside the workspace."""
DEVICE_TOOLS: tuple[str, ...] = tuple(name for name, spec in TOOL_SPECS.items() if spec.on_devices)
"""What a device can run: the workspace tools and git commits (git reads are `run_command`
with `git status/diff/log/show`, which are replay-safe). HTTP and payment tools stay on
the workers, which hold their credentials."""
VERSIONED_WRITES: frozenset[str] = frozenset(name for name, spec in TOOL_SPECS.items() if spec.versioned_write)
"""Workspace writes based on a version of their file: the goal sends what the node saw (ToolInput.based_on)."""
COMMAND_TOOLS: frozenset[str] = frozenset(name for name, spec in TOOL_SPECS.items() if spec.runs_commands)
"""Tools that run a shell command in the sandbox; the goal's or step's network permission reaches them."""
LOW_VALUE_TOOLS: frozenset[str] = frozenset(name for name, spec in TOOL_SPECS.items() if spec.low_value)
"""Dropped first when a goal runs degraded (past its soft budget gate)."""

__all__ = [
    "COMMAND_TOOLS",
    "COMPACTION_TOOL",
    "DEFAULT_TOOLS",
    "DEVICE_TOOLS",
    "LOW_VALUE_TOOLS",
    "TOOLS",
    "TOOL_MODULES",
    "TOOL_SPECS",
    "VERSIONED_WRITES",
]
