"""`perdure mcp` as an MCP client meets it, for the tests that talk to it: the real command
over stdio, a tool's structured result, and a goal's status polled until it holds. Not a
test module."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.subprocess_rig import PERDURE, user_env


def stdio_server(env, tmp_path: Path, task_queue: str, **extra: str) -> Client:
    variables = {**user_env(env, tmp_path, task_queue), **extra}
    return Client(StdioServerParameters(command=PERDURE, args=["mcp"], env=variables), read_timeout_seconds=60)


async def call(client: Client, tool: str, **arguments: Any) -> dict:
    """A tool's structured result; the test fails with the tool's words when it is an error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content[0].text
    return result.structured_content


async def status_until(client: Client, goal_id: str, holds, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        snapshot = await call(client, "goal_status", goal_id=goal_id)
        if holds(snapshot):
            return snapshot
        assert time.monotonic() < deadline, snapshot
        await asyncio.sleep(0.2)
