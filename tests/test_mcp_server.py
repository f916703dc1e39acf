"""`perdure mcp` as an MCP client meets it: the official SDK's client talks to the real
command (a subprocess, over stdio or streamable HTTP) against the session's dev server,
with an in-process orchestrator worker. A goal is started, its approval question answered
and its report read through tools and resources; retries with one request id are one goal
and one message; bad arguments, unknown goals, no worker and no Temporal are tool errors
that say what was wrong, and the server goes on serving."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from perdure.activities.artifacts import ArtifactStore, DiskArtifactStore
from perdure.starters.mcp_server import build_server
from perdure.testing.fakes import PaymentsAPI
from tests.builders import gate
from tests.helpers import free_ports, goal_result, running_worker
from tests.mcp_rig import call, status_until, stdio_server
from tests.subprocess_rig import PERDURE, kill_raw, spawn_raw_server, stop, user_env

VERBS = {"start_goal", "steer", "queue", "answer", "approve", "park", "resume", "signal", "narrow", "rewind", "abort"}
READS = {"goal_status", "goal_inbox", "goal_report"}
PAYMENT = {"amount_cents": 12_500, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 42"}
PAY_PLAN = {
    "goal": "Pay invoice 42",
    "steps": [{"name": "pay", "kind": "tool", "tool": "make_payment", "args": PAYMENT}],
}


@pytest.fixture
def home_store(tmp_path: Path) -> ArtifactStore:
    """The worker's artifact store where `perdure mcp` (PERDURE_HOME=tmp_path/home) reads reports."""
    return DiskArtifactStore(tmp_path / "home" / "artifacts")


@contextlib.asynccontextmanager
async def http_server(env, tmp_path: Path, task_queue: str) -> AsyncIterator[str]:
    """`perdure mcp --http PORT` as a subprocess: its URL once it answers; stopped after."""
    (port,) = free_ports(1)
    log = tmp_path / "mcp-http.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [PERDURE, "mcp", "--http", str(port)], env=user_env(env, tmp_path, task_queue), stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient() as http:
            while True:
                assert process.poll() is None, log.read_text()
                with contextlib.suppress(httpx.TransportError):
                    await http.get(url)
                    break
                assert time.monotonic() < deadline, log.read_text()
                await asyncio.sleep(0.1)
        yield url
    finally:
        stop(process)


async def refusal(client: Client, tool: str, **arguments: Any) -> str:
    """The text of a tool error (the call must be one)."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return result.content[0].text


async def pay_with_approval(client: Client, workspace: Path, payments: PaymentsAPI) -> tuple[dict, str]:
    """Start the payment goal, approve its question (the approval sent twice under one request
    id), wait for its end: (the report tool's answer, the report resource's text)."""
    request_id = f"pay-invoice-42-{uuid.uuid4().hex[:8]}"  # the session's server outlives this test
    started = await call(client, "start_goal", plan=PAY_PLAN, workspace=str(workspace), request_id=request_id)
    assert started["started"] is True and started["request_id"] == request_id and not started["warnings"]
    goal_id = started["goal_id"]
    snapshot = await status_until(client, goal_id, lambda s: s["questions"])
    question = snapshot["questions"][0]
    assert question["topic"] == "approvals_ahead" and [a["step"] for a in question["ahead"]] == ["pay"]
    assert payments.ledger() == []  # nothing paid before the approval
    some = {"goal_id": goal_id, "question_id": question["id"], "choice": "approve_some"}
    wrong = await refusal(client, "answer", **some, steps=["pay-x"])
    assert f"rejected: step(s) pay-x are not on {question['id']} (its steps: pay)" in wrong, wrong
    approved = await call(client, "approve", goal_id=goal_id, question_id=question["id"], request_id="ok-42")
    again = await call(client, "approve", goal_id=goal_id, question_id=question["id"], request_id="ok-42")
    assert approved["status"] == "applied" and approved["via"] == "update" and approved["request_id_made"] is False
    assert again["status"] == "applied"  # the retry is the same message, not a second answer
    await status_until(client, goal_id, lambda s: s["phase"] in ("finished", "failed", "aborted"))
    report = await call(client, "goal_report", goal_id=goal_id)
    resource = await client.read_resource(f"perdure://goals/{goal_id}/report")
    return report, resource.contents[0].text


def assert_paid_once(report: dict, resource_text: str, payments: PaymentsAPI) -> None:
    [payment] = payments.ledger()
    assert (payment["kind"], payment["amount_cents"]) == ("payment", 12_500)
    assert report["outcome"] == "succeeded", report
    assert report["report"].count(payment["id"]) == 1, report["report"]
    assert resource_text == report["report"]


@pytest.mark.process
async def test_over_stdio_an_agent_starts_a_goal_approves_its_payment_and_reads_a_report_of_one_payment(
    env, task_queue, home_store, workspace, tmp_path, payments
):
    async with running_worker(env, task_queue, home_store), stdio_server(env, tmp_path, task_queue) as client:
        report, resource_text = await pay_with_approval(client, workspace, payments)
    assert_paid_once(report, resource_text, payments)


@pytest.mark.process
async def test_over_streamable_http_an_agent_starts_a_goal_approves_its_payment_and_reads_a_report_of_one_payment(
    env, task_queue, home_store, workspace, tmp_path, payments
):
    async with running_worker(env, task_queue, home_store), http_server(env, tmp_path, task_queue) as url:
        async with Client(url, read_timeout_seconds=60) as client:
            report, resource_text = await pay_with_approval(client, workspace, payments)
    assert_paid_once(report, resource_text, payments)


@pytest.mark.process
async def test_a_retried_start_is_one_goal_and_a_retried_steer_one_inbox_row(
    env, task_queue, store, workspace, tmp_path
):
    request_id = f"s-{uuid.uuid4().hex[:8]}"
    start = {"goal": "wait for GO", "plan": {"steps": [gate()]}, "workspace": str(workspace), "request_id": request_id}
    async with running_worker(env, task_queue, store), http_server(env, tmp_path, task_queue) as url:
        async with Client(url, read_timeout_seconds=60) as client:
            first = await call(client, "start_goal", **start)
            again = await call(client, "start_goal", **start)
            goal_id = first["goal_id"]
            other_goal = await refusal(client, "start_goal", **{**start, "goal": "something else"})
            unnamed = await call(client, "start_goal", goal="wait for GO", plan={"steps": [gate()]},
                                 workspace=str(workspace))  # fmt: skip
            unnamed_again = await call(client, "start_goal", goal="wait for GO", plan={"steps": [gate()]},
                                       workspace=str(workspace), request_id=unnamed["request_id"])  # fmt: skip
            await status_until(client, goal_id, lambda s: "gate" in s["running"])
            steered = await call(client, "steer", goal_id=goal_id, text="be brief", request_id="st-1")
            retried = await call(client, "steer", goal_id=goal_id, text="be brief", request_id="st-1")
            reused = await refusal(client, "steer", goal_id=goal_id, text="be verbose", request_id="st-1")
            made = await call(client, "steer", goal_id=goal_id, text="no id given")
            inbox = await call(client, "goal_inbox", goal_id=goal_id)
            progress = await client.read_resource(f"perdure://goals/{goal_id}/progress")
            for gid in (goal_id, unnamed["goal_id"]):
                await call(client, "abort", goal_id=gid, request_id=f"stop-{gid}")
                await goal_result(env.client.get_workflow_handle(gid))
    assert first["started"] is True and again["started"] is False and again["goal_id"] == goal_id
    assert "already running with this spec" in again["text"]
    # The same request id with other content names the same goal, and is refused, as a message would be.
    assert f"goal {goal_id} is already running with a different spec" in other_goal
    # No request id given: the server made one, said so, and retrying with it names the same goal.
    assert unnamed["request_id_made"] is True and unnamed["request_id"].startswith("mcp-")
    assert unnamed_again["goal_id"] == unnamed["goal_id"] and unnamed_again["started"] is False
    assert steered["request_id"] == retried["request_id"] == "st-1" and retried["status"] == steered["status"]
    assert "already used for a different steer message" in reused
    assert made["request_id_made"] is True and made["request_id"].startswith("mcp-")
    assert inbox["source"] == "goal"
    assert [e["request_id"] for e in inbox["entries"]] == ["st-1", made["request_id"]]
    assert json.loads(progress.contents[0].text)["goal_id"] == goal_id


@pytest.mark.process
async def test_bad_arguments_unknown_goals_and_refused_messages_are_tool_errors_saying_what_was_wrong(
    env, task_queue, store, workspace, tmp_path
):
    async with running_worker(env, task_queue, store), stdio_server(env, tmp_path, task_queue) as client:
        waiting = await call(client, "start_goal", goal="wait", plan={"steps": [gate()]}, workspace=str(workspace))
        goal_id = waiting["goal_id"]
        await status_until(client, goal_id, lambda s: "gate" in s["running"])
        said = {
            "not parked": await refusal(client, "resume", goal_id=goal_id),
            "still running": await refusal(client, "goal_report", goal_id=goal_id),
            "unknown step": await refusal(client, "rewind", goal_id=goal_id, node="nope", why="wrong"),
            "wrong type": await refusal(client, "steer", goal_id="g-1", text=5),
            "missing": await refusal(client, "steer", goal_id="g-1"),
            "huge text": await refusal(client, "steer", goal_id="g-1", text="x" * 9_000),
            "huge goal": await refusal(client, "start_goal", goal="x" * 300_000),
            "bad request id": await refusal(client, "queue", goal_id="g-1", text="more", request_id="no spaces"),
            "bad goal id": await refusal(client, "goal_status", goal_id="../etc"),
            "no goal text": await refusal(client, "start_goal", workspace=str(workspace)),
            "bad plan": await refusal(client, "start_goal", goal="x", plan={"steps": [{"name": "Bad!"}]}),
            "unknown profile": await refusal(client, "start_goal", goal="x", profile="no-such-profile"),
            "unknown goal status": await refusal(client, "goal_status", goal_id="no-such-goal"),
            "unknown goal steer": await refusal(client, "steer", goal_id="no-such-goal", text="hello"),
            "unknown goal report": await refusal(client, "goal_report", goal_id="no-such-goal"),
            "unknown tool": await refusal(client, "dance", goal_id="g-1"),
            "unknown argument": await refusal(client, "approve", goal_id=goal_id, question_id="q1", approve=False),
            "no signal awaited": await refusal(client, "signal", goal_id=goal_id, name="ci-done"),
            "bad signal name": await refusal(client, "signal", goal_id=goal_id, name="ci done"),
            "two conditions": await refusal(
                client, "park", goal_id=goal_id, reason="r", until_file="READY", until_signal="ci-done"
            ),
        }
        await call(client, "park", goal_id=goal_id, reason="waiting for CI", until_signal="ci-done")
        parked = await status_until(client, goal_id, lambda s: s["parked"])
        signalled = await call(client, "signal", goal_id=goal_id, name="ci-done")
        await status_until(client, goal_id, lambda s: not s["parked"])
        with pytest.raises(MCPError) as unknown_resource:
            await client.read_resource("perdure://goals/no-such-goal/report")
        await call(client, "abort", goal_id=goal_id)
        await goal_result(env.client.get_workflow_handle(goal_id))
        said["ended"] = await refusal(client, "steer", goal_id=goal_id, text="still there?")
        still_serving = await client.list_tools()
    expected = {
        "not parked": "rejected: the goal is not parked (request id mcp-",
        "still running": "the goal is still running; its report is written when it ends",
        "unknown step": "rejected: unknown step 'nope' (steps: gate)",
        "ended": f"goal {goal_id} has finished (outcome aborted); see `perdure result {goal_id}`; it takes no more",
        "wrong type": "text: Input should be a valid string",
        "missing": "text: Field required",
        "huge text": "text: String should have at most 8000 characters",
        "huge goal": "goal: String should have at most 20000 characters",
        "bad request id": "request_id: String should match pattern",
        "bad goal id": "goal_id: String should match pattern",
        "no goal text": "give the goal text",
        "bad plan": "plan:",
        "unknown profile": "unknown model profile 'no-such-profile'",
        "unknown goal status": "no goal with id 'no-such-goal'",
        "unknown goal steer": "no goal with id 'no-such-goal'",
        "unknown goal report": "no goal with id 'no-such-goal'",
        "unknown tool": "Unknown tool: dance",
        "unknown argument": "approve: unknown argument 'approve'; it takes: goal_id, question_id, approved, text,",
        "no signal awaited": "rejected: the goal is not parked waiting for a signal (signal ci-done not used)",
        "bad signal name": "signal name 'ci done': a signal name is letters, digits",
        "two conditions": "a park waits for one condition",
    }
    for case, words in expected.items():
        assert words in said[case], (case, said[case])
    assert "until signal ci-done" in parked["pause_reason"] and signalled["status"] == "applied", signalled
    assert all("Traceback" not in text and len(text) < 2_000 for text in said.values()), said
    assert "no goal with id 'no-such-goal'" in str(unknown_resource.value)
    assert {t.name for t in still_serving.tools} == VERBS | READS


@pytest.mark.process
async def test_with_no_worker_a_start_warns_and_a_message_is_admitted_by_signal(env, task_queue, workspace, tmp_path):
    async with stdio_server(env, tmp_path, task_queue) as client:
        started = await call(client, "start_goal", goal="wait", plan={"steps": [gate()]}, workspace=str(workspace))
        goal_id = started["goal_id"]
        steered = await call(client, "steer", goal_id=goal_id, text="be brief", request_id="late-1")
        inbox = await call(client, "goal_inbox", goal_id=goal_id)
        unanswered = await refusal(client, "goal_status", goal_id=goal_id)
    await env.client.get_workflow_handle(goal_id).terminate("test over")
    assert started["started"] is True
    assert any(f"no worker polls task queue '{task_queue}'" in w for w in started["warnings"]), started
    assert (steered["status"], steered["via"]) == ("pending", "signal")
    assert "no worker answered" in steered["note"]
    assert inbox["source"] == "server history"
    assert [(m["request_id"], m["kind"], m["via"]) for m in inbox["admitted"]] == [("late-1", "steer", "signal")]
    assert "no worker runs the goal, so it cannot answer" in unanswered


@pytest.mark.process
async def test_with_temporal_unreachable_every_call_says_so_and_the_server_connects_once_it_is_up(
    env, tmp_path, task_queue
):
    closed_port, ui_port = free_ports(2)
    unreachable = {"PERDURE_TEMPORAL": f"127.0.0.1:{closed_port}"}
    async with stdio_server(env, tmp_path, task_queue, **unreachable) as client:
        listed = await client.list_tools()
        first = await refusal(client, "goal_status", goal_id="g-1")
        second = await refusal(client, "steer", goal_id="g-1", text="hello")
        server = await asyncio.to_thread(spawn_raw_server, closed_port, ui_port)
        try:
            after = await refusal(client, "goal_status", goal_id="g-1")
        finally:
            kill_raw(server)
    assert {t.name for t in listed.tools} == VERBS | READS
    for text in (first, second):
        assert f"cannot reach Temporal at 127.0.0.1:{closed_port}" in text and "Traceback" not in text
    assert "no goal with id 'g-1'" in after  # Temporal answered: the same server process connected


async def test_list_tools_shows_every_verb_with_its_schema_and_the_resources_as_templates():
    async with Client(build_server()) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        templates = {t.uri_template: t for t in (await client.list_resource_templates()).resource_templates}
    assert set(tools) == VERBS | READS
    for name, tool in tools.items():
        schema = tool.input_schema
        assert tool.description and schema["type"] == "object", name
        if name != "start_goal":
            assert schema["properties"]["goal_id"]["pattern"] and "goal_id" in schema["required"], name
        if name in VERBS:
            request_id = schema["properties"]["request_id"]
            assert "request_id" not in schema.get("required", []), name
            assert any("pattern" in option for option in request_id["anyOf"]), name
            assert tool.output_schema and "request_id_made" in tool.output_schema["properties"], name
    assert tools["steer"].input_schema["properties"]["text"]["maxLength"] == 8_000
    assert tools["approve"].input_schema["properties"]["approved"] == {
        "default": True, "description": "True to approve, false to refuse what the question proposes.",
        "title": "Approved", "type": "boolean",
    }  # fmt: skip
    assert set(tools["rewind"].input_schema["required"]) == {"goal_id", "node", "why"}
    assert "plan" in tools["start_goal"].input_schema["properties"]
    assert tools["goal_status"].annotations.read_only_hint is True
    assert tools["abort"].annotations.destructive_hint is True
    assert set(templates) == {"perdure://goals/{goal_id}/progress", "perdure://goals/{goal_id}/report"}
    assert templates["perdure://goals/{goal_id}/report"].mime_type == "text/markdown"


@pytest.mark.process
def test_perdure_mcp_on_a_port_in_use_is_a_one_line_error(env, tmp_path, task_queue):
    import socket

    from tests.subprocess_rig import perdure

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = perdure("mcp", "--http", str(port), env=user_env(env, tmp_path, task_queue), timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and f"cannot listen on 127.0.0.1:{port}" in result.stderr, result.stderr
