"""A `perdure worker` SIGKILLed while an MCP tool call is in flight (issue 23, part 1b).

The test MCP server (testing/ledger_mcp_server.py) writes each call to its ledger and then
holds it while the test's hold file exists, so the kill lands after the server has the
request and before the worker hears back. A new worker then takes the goal over, and the
ledger says what was sent again: a `once` tool is not (its step becomes the usual
uncertain question), a `keyed` tool is, under the same effect key, and a `safe` read is.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from perdure.testing.ledger_mcp_server import read_ledger
from perdure.workflows.goal.contracts.messages import Answer
from tests.builders import spec
from tests.helpers import statuses, submit, wait_until

pytestmark = pytest.mark.process

TOOL = "mcp__notes__slow_write"


def mcp_table(directory: Path, tool_policy: str) -> str:
    """The test server, its ledger and hold file in `directory`, which its sandbox may write."""
    return (
        "[mcp_servers.notes]\n"
        f"command = {json.dumps(sys.executable)}\n"
        f'args = ["-m", "perdure.testing.ledger_mcp_server", "--ledger", '
        f"{json.dumps(str(directory / 'ledger.jsonl'))}, "
        f'"--hold", {json.dumps(str(directory / "hold"))}]\n'
        f"writable = [{json.dumps(str(directory))}]\n" + tool_policy
    )


async def until_called(ledger: Path, count: int, timeout_s: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        calls = read_ledger(ledger)
        if len(calls) >= count:
            return calls
        await asyncio.sleep(0.05)
    raise AssertionError(f"the MCP server did not see {count} call(s) in {timeout_s:g} s: {read_ledger(ledger)}")


async def killed_mid_call(crash_rig, tmp_path: Path, tool_policy: str):
    """A goal of one slow_write step; its worker SIGKILLed while the server holds the call;
    a second worker started. Returns the rig, the goal's handle, the ledger's path."""
    rig = crash_rig()
    directory = rig.root / "ledger"
    directory.mkdir()
    rig.config.write_text(mcp_table(directory, tool_policy))
    hold = directory / "hold"
    hold.write_text("hold")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    steps = [{"name": "write", "kind": "tool", "tool": TOOL, "args": {"text": "hello"}}]
    first = rig.start_worker()
    await first.wait_polling()
    handle = await rig.start_goal(spec(workspace, plan={"steps": steps}, allowed_tools=[TOOL]))
    ledger = directory / "ledger.jsonl"
    await until_called(ledger, 1)
    first.kill()
    assert first.killed_by_sigkill()
    await rig.after_kill(handle)  # the call's activity has a heartbeat timeout: the loss is seen in seconds
    hold.unlink()  # a call made again is answered at once
    second = rig.start_worker()
    await second.wait_polling()
    return rig, handle, ledger


async def test_a_once_mcp_call_cut_off_by_a_sigkill_is_not_sent_again_and_becomes_a_question(crash_rig, tmp_path):
    rig, handle, ledger = await killed_mid_call(crash_rig, tmp_path, "")  # undeclared: remote-write / once
    snapshot = await wait_until(handle, lambda s: s.questions, timeout_s=60)

    assert statuses(snapshot)["write"] == "uncertain"
    question = snapshot.questions[0]
    assert "mcp__notes__slow_write" in question.stuck and "never sent twice on its own" in question.stuck
    assert len(read_ledger(ledger)) == 1  # the new worker asked instead of calling again
    await submit(handle, Answer(request_id="a1", question_id=question.id, choice="happened"))
    result = await rig.result(handle)
    assert result.outcome == "succeeded"
    assert len(read_ledger(ledger)) == 1  # `happened` records it; nothing is sent


async def test_a_keyed_mcp_call_cut_off_by_a_sigkill_is_sent_again_under_the_same_effect_key(crash_rig, tmp_path):
    keyed = '[mcp_servers.notes.tools.slow_write]\nrisk = "remote-write"\nreplay = "keyed"\n'
    rig, handle, ledger = await killed_mid_call(crash_rig, tmp_path, keyed)
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.failure
    first, again = read_ledger(ledger)
    assert first["process"] != again["process"]  # two server processes: one per worker's attempt
    assert first["effect_key"] == again["effect_key"] and first["effect_key"].startswith("fx-")
    assert rig.store.get_text(result.outputs["write"]) == "wrote hello"


async def test_a_safe_mcp_read_cut_off_by_a_sigkill_simply_runs_again(crash_rig, tmp_path):
    safe = '[mcp_servers.notes.tools.slow_write]\nrisk = "read"\nreplay = "safe"\n'
    rig, handle, ledger = await killed_mid_call(crash_rig, tmp_path, safe)
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.failure
    assert [c["args"] for c in read_ledger(ledger)] == [{"text": "hello"}, {"text": "hello"}]
    assert rig.store.get_text(result.outputs["write"]) == "wrote hello"
