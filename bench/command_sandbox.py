"""What the bubblewrap sandbox adds to one shell command (`command_sandbox_ms`).

A `true` command is started and awaited through activities/tools/sandbox.py, REPEATS
times in the sandbox and REPEATS times unsandboxed (PERDURE_UNSANDBOXED_COMMANDS=1),
alternating so that a busy moment of the machine costs both alike. The figure is
the median sandboxed run minus the median unsandboxed one: bwrap's own start
(namespaces, mounts, a fresh /proc) and its exit. The whole run_command activity
(output capture, exit polled every 50 ms, the artifact write) is timed the same way
and printed only: its poll interval dominates both.

    .venv/bin/python -m bench.command_sandbox [--repeats 50]
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from bench.common import Section, median, parse_options, run_standalone
from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.tools import sandbox
from perdure.activities.tools.run_tool import ToolActivities
from perdure.workflows.shared.contracts import ToolInput

KEY = "command_sandbox_ms"
KEYS = (KEY,)


async def _start_and_wait(workspace: Path) -> float:
    started = time.perf_counter()
    proc = await sandbox.start(
        sandbox.Sandbox(workspace), ["/bin/true"], stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL
    )
    code = await proc.wait()
    elapsed = (time.perf_counter() - started) * 1000
    if code != 0:
        raise RuntimeError(f"`true` exited with {code} ({'un' if sandbox.unsandboxed() else ''}sandboxed)")
    return elapsed


async def _run_command(tools: ToolActivities, workspace: Path) -> float:
    tool_input = ToolInput(
        goal_id="bench", node_key="n", tool="run_command", workspace=str(workspace), args={"command": "true"}
    )
    started = time.perf_counter()
    result = await ActivityEnvironment().run(tools.run_tool, tool_input)
    if not result.ok:
        raise RuntimeError(f"run_command `true` failed: {result.error}")
    return (time.perf_counter() - started) * 1000


async def _alternating(timed, repeats: int) -> tuple[list[float], list[float]]:
    """(sandboxed, unsandboxed) milliseconds of `timed()`, one of each per repeat."""
    sandboxed: list[float] = []
    unsandboxed: list[float] = []
    before = os.environ.get(sandbox.UNSANDBOXED_ENV)
    try:
        for _ in range(repeats):
            os.environ.pop(sandbox.UNSANDBOXED_ENV, None)
            sandboxed.append(await timed())
            os.environ[sandbox.UNSANDBOXED_ENV] = "1"
            unsandboxed.append(await timed())
    finally:
        if before is None:
            os.environ.pop(sandbox.UNSANDBOXED_ENV, None)
        else:
            os.environ[sandbox.UNSANDBOXED_ENV] = before
    return sandboxed, unsandboxed


async def measure(client: Client, workdir: Path, repeats: int = 50) -> Section:
    del client  # no server involved: the sandbox is the worker's own business
    workspace = (workdir / "command-sandbox").resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    try:
        await sandbox.ensure_available(workspace)
    except sandbox.SandboxUnavailable as err:
        return Section(figures={}, notes=[f"command_sandbox: not measured: {err}"])
    spawn = await _alternating(lambda: _start_and_wait(workspace), repeats)
    tools = ToolActivities(DiskArtifactStore(workdir / "command-sandbox-artifacts"))
    tool = await _alternating(lambda: _run_command(tools, workspace), repeats)
    (spawn_in, spawn_out), (tool_in, tool_out) = spawn, tool
    overhead = median(spawn_in) - median(spawn_out)
    notes = [
        f"`true`, {repeats} runs each, alternating: started and awaited {median(spawn_in):.2f} ms in the sandbox, "
        f"{median(spawn_out):.2f} ms without (medians; sandboxed min {min(spawn_in):.2f}, max {max(spawn_in):.2f})",
        f"the whole run_command activity: {median(tool_in):.1f} ms sandboxed, {median(tool_out):.1f} ms without "
        "(its exit is polled every 50 ms)",
    ]
    return Section(figures={KEY: round(overhead, 2)}, notes=notes)


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, repeats=50))


if __name__ == "__main__":
    main()
