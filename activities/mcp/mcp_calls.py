"""MCP tools on the worker: the catalogue activity, and one MCP tool call as an effect.

`perdure.mcp.catalogue` lists the tools of the servers a goal names (each with the risk
class and replay policy the worker's config.toml declares); the goal keeps the answer
(workflows/shared/mcp_tools.py). A server that cannot be reached is reported as a problem of
that server, never raised: the goal says why and does not retry in a loop.

A call runs through `run_tool` (activities/tools/run_tool.py) like every tool: a read with replay
`safe` is a `LocalTool` called directly; anything else is an `EffectTool` whose `send` is the MCP call,
so `run_effect` (activities/tools/effect_runner.py) gives it an effect key (sent in the
request's `_meta`), the intent and done heartbeats, the refusal of an unconfirmed
irreversible call and the retry decision of its replay policy: a `once` call whose
attempt was interrupted is `uncertain`, never sent again. The receipt holds the output's
digest in the artifact store, not the output, so heartbeats and history stay small.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import get_args

from temporalio import activity

from perdure.activities.artifacts import ArtifactMissing
from perdure.activities.heartbeat import Heartbeat
from perdure.activities.mcp.mcp_config import McpServer, McpToolPolicy
from perdure.activities.mcp.mcp_session import catalogue_entries, connect
from perdure.activities.tools.catalogue.tool_base import EffectCall, EffectTool, LocalCall, LocalTool
from perdure.activities.tools.catalogue.tool_errors import OutcomeUnknown, ToolError
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.shared.mcp_tools import McpArgs, McpCatalogue, McpCatalogueInput, McpDeclaration, McpTool
from perdure.workflows.shared.tool_specs import Effect, RiskClass

SERVERS_LISTED_AT_ONCE = 4
RISKS: tuple[str, ...] = get_args(RiskClass)
"""The risk classes, the gravest last."""


class McpServers:
    """The worker's MCP servers (config.toml), and what one tool's call needs of them."""

    def __init__(
        self, servers: dict[str, McpServer], artifact_store: Path | None = None, home: Path | None = None
    ) -> None:
        self.servers = servers
        # The worker's: hidden from a sandboxed server.
        self.artifact_store = artifact_store
        # Where a sandboxed server's scratch directory is (None: PERDURE_HOME when it starts):
        # this host's, never a store's directory other hosts may share.
        self.home = home

    def server(self, tool: McpTool) -> McpServer:
        server = self.servers.get(tool.server)
        if server is None:
            known = ", ".join(sorted(self.servers)) or "none"
            raise ToolError(
                f"this worker's config.toml names no MCP server '{tool.server}' (it names: {known}); "
                f"{tool.name} cannot be called here"
            )
        return server

    def policy(self, tool: McpTool) -> McpToolPolicy:
        """The policy this worker declares for the tool now (the goal holds the one it planned with)."""
        server = self.servers.get(tool.server)
        return server.policy(tool.tool) if server is not None else McpToolPolicy()

    def graver(self, tool: McpTool) -> McpTool:
        """The tool with the graver of the goal's and this worker's risk class: a tool the
        config made irreversible since the goal started still needs its confirmation."""
        declared = self.policy(tool).risk
        if RISKS.index(declared) > RISKS.index(tool.risk):
            return tool.model_copy(update={"risk": declared})
        return tool

    @activity.defn(name=Activities.MCP_CATALOGUE)
    async def catalogue(self, input: McpCatalogueInput) -> McpCatalogue:
        names = input.servers if input.servers is not None else sorted(self.servers)
        catalogue = McpCatalogue()
        limit = asyncio.Semaphore(SERVERS_LISTED_AT_ONCE)

        async def list_one(name: str) -> None:
            server = self.servers.get(name)
            if server is None:
                catalogue.problems[name] = (
                    f"this worker's config.toml names no MCP server '{name}' "
                    f"(it names: {', '.join(sorted(self.servers)) or 'none'})"
                )
                return
            async with limit:
                try:
                    async with connect(server, self.artifact_store, self.home) as session:
                        tools = await session.tools()
                except ToolError as err:
                    catalogue.problems[name] = err.message
                    return
            for entry in catalogue_entries(server, tools):
                catalogue.tools[entry.name] = entry

        async with Heartbeat(lambda: "listing MCP tools", every_s=2.0):
            await asyncio.gather(*(list_one(name) for name in names))
        catalogue.tools = dict(sorted(catalogue.tools.items()))
        activity.logger.info(
            "mcp catalogue", extra={"tools": len(catalogue.tools), "problems": sorted(catalogue.problems)}
        )
        return catalogue


class McpReadTool(LocalTool):
    """One MCP tool that is safe to run again: called directly; no answer is a failure the
    model or the step sees, and running it again is free."""

    def __init__(self, servers: McpServers, tool: McpTool) -> None:
        self._servers = servers
        self._tool = tool
        self.spec = tool.spec()

    async def run(self, call: LocalCall, args: McpArgs) -> str:
        try:
            return await call_tool(self._servers, self._tool, args, effect_key=None)
        except OutcomeUnknown as err:
            raise ToolError(str(err)) from None


class McpEffectTool(EffectTool):
    """One MCP tool, called through the effect protocol."""

    def __init__(self, servers: McpServers, tool: McpTool) -> None:
        self._servers = servers
        self._tool = tool
        self.spec = tool.spec()

    def effect(self, args: McpArgs, workspace: str) -> Effect:
        return McpDeclaration(self._tool.name).effect(args, workspace)

    def target(self, args: McpArgs) -> str:
        return f"MCP server '{self._tool.server}' (tool {self._tool.tool})"

    async def send(self, call: EffectCall, args: McpArgs) -> dict:
        text = await call_tool(self._servers, self._tool, args, call.key)
        return {"output": (await call.store.aput_text(text)).digest, "chars": len(text)}

    def describe(self, call: EffectCall, args: McpArgs, receipt: dict) -> str:
        digest = receipt.get("output")
        if receipt.get("confirmed_by") and not digest:
            return f"{self._tool.name}: not called again; {receipt['confirmed_by']} said it happened"
        try:
            return call.store.get_text(digest) if digest else ""
        except ArtifactMissing:
            return f"{self._tool.name} happened; its output {digest} is not in this worker's artifact store"


async def call_tool(servers: McpServers, tool: McpTool, args: McpArgs, effect_key: str | None) -> str:
    server = servers.server(tool)
    async with connect(server, servers.artifact_store, servers.home) as session:
        return await session.call(
            tool.tool, args.model_dump(mode="json"), server.call_timeout_s(tool.tool), effect_key=effect_key
        )
