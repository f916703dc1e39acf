"""The work of run_command (activities/tools/catalogue/command_tool.py) on this machine:
`/bin/sh -c` in the sandbox of activities/tools/sandbox.py, bounded in time, its output
capped, the whole process tree ended with the step.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from temporalio import activity

from perdure.activities.heartbeat import Heartbeat
from perdure.activities.tools import sandbox
from perdure.activities.tools.catalogue.command_tool import RunCommandArgs
from perdure.activities.tools.catalogue.tool_base import decoded
from perdure.activities.tools.catalogue.tool_errors import ToolError
from perdure.activities.tools.workspace import workspace_root

COMMAND_OUTPUT_CAP = 64 * 1024
"""Bytes of combined stdout+stderr kept from a command: the first half and the last half."""

COMMAND_ERROR_TAIL = 800
"""Characters of command output quoted in the error, so the model sees why without opening the artifact."""

HEARTBEAT_EVERY_S = 5.0
POLL_EVERY_S = 0.05


class _CappedOutput:
    """Keeps the first and last halves of a stream; commands put the cause of a failure at the end."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[: max(0, len(self.tail) - self.tail_cap)]

    def text(self) -> str:
        omitted = self.total - len(self.head) - len(self.tail)
        if omitted <= 0:
            return decoded(bytes(self.head + self.tail))
        head = decoded(bytes(self.head), capped=True)
        tail = decoded(bytes(self.tail))
        return f"{head}\n[truncated: {omitted} of {self.total} bytes of output omitted]\n{tail}"


async def run_command(root: Path, args: RunCommandArgs, *, network: bool = False, hidden: tuple[Path, ...] = ()) -> str:
    """`/bin/sh -c` in the sandbox (activities/tools/sandbox.py): `network` as the goal or plan
    step allows, `hidden` masked even where it lies inside the workspace."""
    real_root = workspace_root(root)
    started = time.monotonic()
    try:
        proc = await sandbox.start(
            sandbox.Sandbox(real_root, network=network, hidden=hidden),
            ["/bin/sh", "-c", args.command],
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except sandbox.SandboxUnavailable as err:
        raise ToolError(f"run_command refused: shell commands run only in a sandbox, and {err}") from None
    captured = _CappedOutput(COMMAND_OUTPUT_CAP)

    async def pump() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65_536):
            captured.feed(chunk)

    reader = asyncio.create_task(pump())
    timed_out = False
    # Beats with or without a heartbeat timeout: they are how a cancelled activity learns it is.
    beat = Heartbeat(lambda: f"running for {time.monotonic() - started:.0f}s", every_s=_beat_every_s())
    try:
        async with beat:
            # Poll the exit status rather than await proc.wait(): wait() also waits for
            # the output pipe to close, which a background child can hold open forever.
            while proc.returncode is None:
                now = time.monotonic()
                if now - started >= args.timeout_s:
                    timed_out = True
                    break
                await asyncio.sleep(min(POLL_EVERY_S, args.timeout_s - (now - started)))
    finally:
        # SIGKILL, not SIGTERM: the tool promises a bounded wall time, and a
        # group that ignores TERM would break it. After a normal exit this also
        # removes background children that would otherwise outlive the activity
        # and keep the output pipe open. Runs on cancellation too.
        sandbox.kill_tree(proc)
        try:
            await asyncio.wait_for(asyncio.shield(reader), timeout=5)
            await asyncio.wait_for(proc.wait(), timeout=5)
        except TimeoutError:
            # Only an unsandboxed process that left the group (setsid) can hold the pipe this long.
            reader.cancel()

    output = captured.text()
    if timed_out:
        text = f"$ {args.command}\n{output}\n[killed: timed out after {args.timeout_s:g}s]"
        raise ToolError(f"timed out after {args.timeout_s:g}s; {_tail(output)}", output=text)
    code = proc.returncode
    assert code is not None  # the loop above only ends on exit or timeout
    text = f"$ {args.command}\n{output}\n[exit code {code}]"
    if code != 0:
        raise ToolError(f"command exited with {code}; {_tail(output)}", output=text)
    return text


def _beat_every_s() -> float:
    """HEARTBEAT_EVERY_S, or more often when the activity's heartbeat timeout is short."""
    timeout = activity.info().heartbeat_timeout if activity.in_activity() else None
    return min(HEARTBEAT_EVERY_S, timeout.total_seconds() / 3) if timeout else HEARTBEAT_EVERY_S


def _tail(output: str) -> str:
    stripped = output.strip()
    if not stripped:
        return "no output"
    if len(stripped) <= COMMAND_ERROR_TAIL:
        return "output:\n" + stripped
    return "last output:\n…" + stripped[-COMMAND_ERROR_TAIL:]
