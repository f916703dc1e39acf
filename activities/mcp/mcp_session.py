"""Talking to one MCP server: connect (start a stdio server, or open a streamable-HTTP
session), list its tools, call one. A session per activity call: a server process lives
exactly as long as the call that needs it, and a worker's death ends it with the worker.

Failures are sorted by what they say about the call, for the effect rules of
activities/tools/effect_runner.py: a server that cannot be started or reached, or that refuses
the request with an error, is a ToolError (the call did not happen; a goal sees it as a
step failure or a model as data); a connection lost or a timeout after the request went
out is OutcomeUnknown (it may have happened). A stdio server is started as
activities/mcp/launch.py says (in the sandbox, unless its table opts out); headers are
resolved here (activities/mcp/mcp_config.py); what a server answers is redacted of the
values of its variables and headers before it leaves this module.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2

from perdure.activities.mcp.launch import stdio_parameters
from perdure.activities.mcp.mcp_config import McpConfigInvalid, McpServer, resolve_headers, secret_values
from perdure.activities.tools import credentials
from perdure.activities.tools.catalogue.tool_errors import OutcomeUnknown, ToolError
from perdure.activities.tools.sandbox import SandboxUnavailable
from perdure.workflows.shared.mcp_tools import McpTool, mcp_tool_name

if TYPE_CHECKING:
    from mcp import Client
    from mcp_types import CallToolResult, Tool

# The MCP SDK is imported where a server is reached, not with this module: it loads some
# 500 modules (1.8 s here), and a Worker without an explicit build id hashes the code of
# every loaded module when it is built (a device daemon's lease must be polled within
# its first second).

CONNECT_TIMEOUT_S = 20.0
"""Starting a server and its handshake; a stdio server in Python takes about a second."""
STDERR_TAIL = 600
EFFECT_KEY_META = "perdure/effect_key"
"""Where a keyed call's effect key travels: the request's `_meta`, for a server that
deduplicates by it (MCP has no standard idempotency key)."""


class McpSession:
    """One connected server. `tools()` lists, `call()` calls; both redact the server's secrets."""

    def __init__(self, server: McpServer, client: Client) -> None:
        self.server = server
        self._client = client
        self._secrets = secret_values(server)

    def redact(self, text: str) -> str:
        return credentials.redact(text, self._secrets)

    async def tools(self) -> list[Tool]:
        from mcp.shared.exceptions import MCPError

        try:
            listed: list[Tool] = []
            cursor = None
            while True:
                page = await asyncio.wait_for(self._client.list_tools(cursor=cursor), CONNECT_TIMEOUT_S)
                listed += page.tools
                cursor = page.next_cursor
                if not cursor:
                    return listed
        except (MCPError, TimeoutError, OSError) as err:
            raise ToolError(
                self.redact(f"MCP server '{self.server.name}' did not list its tools: {_said(err)}")
            ) from None

    async def call(self, tool: str, arguments: dict, timeout_s: float, effect_key: str | None = None) -> str:
        """The tool's text output; ToolError when the server answers with an error."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        meta = {EFFECT_KEY_META: effect_key} if effect_key else None
        what = f"MCP tool {tool} on server '{self.server.name}'"
        try:
            result = await self._client.call_tool(tool, arguments, read_timeout_seconds=timeout_s, meta=meta)
        except MCPError as err:
            if err.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                raise OutcomeUnknown(self.redact(f"{what}: no answer after the request went out ({err})")) from None
            raise ToolError(self.redact(f"{what} refused the call: {err} (code {err.code})")) from None
        except (OSError, TimeoutError, httpx2.HTTPError) as err:
            raise OutcomeUnknown(self.redact(f"{what}: no answer after the request went out ({_said(err)})")) from None
        text = self.redact(result_text(result))
        if result.is_error:
            raise ToolError(f"{what} returned an error: {text or '(no message)'}")
        return text


@asynccontextmanager
async def connect(
    server: McpServer, artifact_store: Path | None = None, home: Path | None = None
) -> AsyncIterator[McpSession]:
    """A session with `server`, closed (its process ended) on the way out. A server that
    cannot be started or reached, or that fails its handshake, is a ToolError saying why,
    with the end of what a stdio server wrote to its stderr. `artifact_store`: the worker's,
    hidden from a sandboxed server; `home`: the worker's PERDURE_HOME (default: the
    setting's), under which a sandboxed server's scratch directory is."""
    from mcp import Client

    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:
        try:
            transport = await _transport(server, errlog, artifact_store, home)
        except McpConfigInvalid as err:
            raise ToolError(str(err)) from None
        except SandboxUnavailable as err:
            raise ToolError(f"MCP server '{server.name}' cannot be started: {err}") from None
        client = Client(transport, read_timeout_seconds=CONNECT_TIMEOUT_S)
        try:
            entered = await asyncio.wait_for(client.__aenter__(), CONNECT_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - anyio groups wrap the transport's own error
            session_secrets = secret_values(server)
            said = credentials.redact(f"{_said(err)}{_stderr_tail(errlog)}", session_secrets)
            raise ToolError(f"MCP server '{server.name}' cannot be reached: {said}") from None
        session = McpSession(server, entered)
        try:
            yield session
        finally:
            # Ends a stdio server's process (stdin closed, then terminated).
            try:
                await client.__aexit__(None, None, None)
            except Exception:  # noqa: BLE001 - the call's outcome is already decided
                pass


async def _transport(server: McpServer, errlog: Any, artifact_store: Path | None, home: Path | None) -> Any:
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    if server.command is not None:
        return stdio_client(await stdio_parameters(server, artifact_store, home), errlog=errlog)
    assert server.url is not None
    http = httpx2.AsyncClient(headers=resolve_headers(server), timeout=httpx2.Timeout(CONNECT_TIMEOUT_S, read=None))
    return streamable_http_client(server.url, http_client=http)


def catalogue_entries(server: McpServer, tools: list[Tool]) -> list[McpTool]:
    """The server's tools as a goal keeps them, each with the policy config.toml declares."""
    entries = []
    for tool in tools:
        policy = server.policy(tool.name)
        entries.append(
            McpTool(
                name=mcp_tool_name(server.name, tool.name),
                server=server.name,
                tool=tool.name,
                description=tool.description or tool.title or "",
                input_schema=dict(tool.input_schema or {"type": "object"}),
                risk=policy.risk,
                replay=policy.replay,
                timeout_s=server.call_timeout_s(tool.name),
            )
        )
    return entries


def result_text(result: CallToolResult) -> str:
    """A tool result as text: its text blocks, else its structured content as JSON, and a
    line for each block of another kind."""
    from mcp_types import TextContent

    parts = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{getattr(block, 'type', type(block).__name__)} content not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, sort_keys=True))
    return "\n".join(parts)


def _said(err: BaseException) -> str:
    """The innermost message of an error (anyio wraps transport errors in groups)."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _stderr_tail(errlog: Any) -> str:
    try:
        errlog.flush()
        errlog.seek(0)
        text = errlog.read()[-STDERR_TAIL:].strip()
    except (OSError, ValueError):
        return ""
    return f"; its stderr ends: {text}" if text else ""
