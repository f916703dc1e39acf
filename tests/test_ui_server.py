"""`perdure ui`'s HTTP API, served by uvicorn on a real port against a dev server and read
with httpx: a goal's events as server-sent events (resumable by Last-Event-ID), its
snapshot, and steering messages with the CLI's receipts; bad input gets a clear 4xx."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest

from perdure.starters.client import goal_reads, goal_starts, router_calls
from perdure.workflows.goal.contracts.goal_contracts import GOAL_MEMO
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.router.router_contracts import Say
from tests.builders import gate, openai_profile, spec
from tests.helpers import CHROMIUM, chromium, goal_result, running_worker, start, wait_until

READS = [
    {"name": f"read-{i}", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md", "max_bytes": 100 + i}}
    for i in range(3)
]


async def sse_events(url: str, headers: dict[str, str] | None = None) -> list[tuple[int, str, dict]]:
    """(id, event, data) of each server-sent event until the goal's end event."""
    found: list[tuple[int, str, dict]] = []
    fields: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=60) as http, http.stream("GET", url, headers=headers or {}) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith(":"):
                continue  # a keep-alive comment
            if line:
                key, _, value = line.partition(": ")
                fields[key] = value
                continue
            if "data" in fields:
                found.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
                if fields["event"] == "end":
                    return found
            fields = {}
    return found


@pytest.mark.slow
async def test_a_goals_events_arrive_as_server_sent_events_and_resume_from_the_last_event_id(
    env, task_queue, store, workspace, ui
):
    (workspace / "notes.md").write_text("a note\n")
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, READS, allowed_tools=["read_file"])
        events = await asyncio.wait_for(sse_events(f"{ui}/api/goals/{handle.id}/events"), 60)
        tail = await asyncio.wait_for(
            sse_events(f"{ui}/api/goals/{handle.id}/events", {"Last-Event-ID": str(events[2][0])}), 60
        )
    assert events[-1][1] == "end" and events[-1][2]["outcome"] == "succeeded"
    settled = {data["node"] for _, kind, data in events if kind == "node" and data["status"] == "succeeded"}
    assert settled == {"read-0", "read-1", "read-2"}
    assert [e[0] for e in tail] == [e[0] for e in events[3:]]  # exactly the rest, after the id it saw


@pytest.mark.slow
async def test_a_message_posted_as_json_gets_the_clis_receipt_and_bad_ones_a_clear_refusal(
    env, task_queue, store, workspace, ui
):
    async with running_worker(env, task_queue, store), httpx.AsyncClient(base_url=ui, timeout=30) as http:
        handle = await start(env, task_queue, workspace, [gate()], allowed_tools=["run_command"])
        await wait_until(handle, lambda s: "gate" in s.running)
        snapshot = (await http.get(f"/api/goals/{handle.id}")).json()
        assert snapshot["goal_id"] == handle.id and snapshot["phase"] == "running"
        steer = await http.post(f"/api/goals/{handle.id}/messages", json={"kind": "steer", "text": "be brief"})
        assert steer.status_code == 200, steer.text
        receipt = steer.json()
        assert receipt["kind"] == "steer" and receipt["status"] in ("applied", "pending") and receipt["request_id"]
        inbox = (await http.get(f"/api/goals/{handle.id}/inbox")).json()
        assert [e["request_id"] for e in inbox["entries"]] == [receipt["request_id"]]
        unknown_kind = await http.post(f"/api/goals/{handle.id}/messages", json={"kind": "dance"})
        not_json = await http.post(
            f"/api/goals/{handle.id}/messages", content=b"steer please", headers={"content-type": "application/json"}
        )
        plain_text = await http.post(f"/api/goals/{handle.id}/messages", content=b'{"kind": "steer", "text": "x"}')
        bad_offset = await http.get(f"/api/goals/{handle.id}/events?from=-3")
        missing = await http.get("/api/goals/no-such-goal")
        aborted = await http.post(f"/api/goals/{handle.id}/messages", json={"kind": "abort", "reason": "done"})
        assert aborted.status_code == 200 and aborted.json()["status"] in ("applied", "pending")
        result = await goal_result(handle)
        # A client that lost the answer retries the same message: it gets the receipt the goal left.
        again = {"kind": "abort", "reason": "done", "request_id": aborted.json()["request_id"]}
        retried = await http.post(f"/api/goals/{handle.id}/messages", json=again)
        late = await http.post(f"/api/goals/{handle.id}/messages", json={"kind": "steer", "text": "too late"})
    assert retried.status_code == 200, retried.text
    assert (retried.json()["request_id"], retried.json()["kind"]) == (aborted.json()["request_id"], "abort")
    assert late.status_code == 409 and "takes no more messages" in late.json()["error"]
    assert unknown_kind.status_code == 400 and "malformed message" in unknown_kind.json()["error"]
    assert not_json.status_code == 400 and "JSON object" in not_json.json()["error"]
    # Not JSON by its content type: refused, so another site's page cannot post without a preflight.
    assert plain_text.status_code == 415
    assert bad_offset.status_code == 400 and "whole number" in bad_offset.json()["error"]
    assert missing.status_code == 404 and missing.json() == {"error": "no such goal"}
    assert result.outcome == "aborted"


@pytest.mark.slow
def test_perdure_ui_on_a_port_in_use_is_a_one_line_error(env, tmp_path):
    import socket

    from tests.subprocess_rig import perdure, user_env

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = perdure("ui", "--port", str(port), env=user_env(env, tmp_path, "tq-ui"), timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and f"cannot listen on 127.0.0.1:{port}" in result.stderr, result.stderr


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium (make installs it)")
@pytest.mark.slow
async def test_the_page_draws_a_finished_goals_graph_from_its_events_in_a_real_browser(
    env, task_queue, store, workspace, ui, tmp_path
):
    (workspace / "notes.md").write_text("a note\n")
    steps = [READS[0], {**READS[1], "needs": ["read-0"]}, {**READS[2], "needs": ["read-0"]}]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["read_file"])
        await handle.result()
        dom = await asyncio.to_thread(chromium, f"{ui}/goals/{handle.id}", tmp_path / "profile", "--dump-dom")
        listing = await asyncio.to_thread(chromium, f"{ui}/", tmp_path / "profile2", "--dump-dom")
    for name in ("read-0", "read-1", "read-2"):
        assert f'data-node="{name}" data-status="succeeded"' in dom, dom[-3000:]
    assert 'data-phase="finished"' in dom
    assert dom.count('class="edge"') == 2  # read-1 and read-2 need read-0
    assert f'href="/goals/{handle.id}"' in listing


@pytest.mark.slow
async def test_closed_event_streams_leave_the_goal_free_to_take_messages(env, task_queue, store, workspace, ui):
    async with running_worker(env, task_queue, store), httpx.AsyncClient(base_url=ui, timeout=30) as http:
        handle = await start(env, task_queue, workspace, [gate()], allowed_tools=["run_command"])
        await wait_until(handle, lambda s: "gate" in s.running)
        for _ in range(12):  # more than Temporal's ten in-flight updates of a workflow
            async with http.stream("GET", f"/api/goals/{handle.id}/events") as response:
                assert response.status_code == 200
                await response.aiter_lines().__anext__()
        answer = await http.post(f"/api/goals/{handle.id}/messages", json={"kind": "steer", "text": "still there?"})
        assert answer.status_code == 200, answer.text
        await http.post(f"/api/goals/{handle.id}/messages", json={"kind": "abort"})
        await goal_result(handle)


async def listed(http: httpx.AsyncClient, params: dict, until, timeout_s: float = 20) -> list[dict]:
    """The goal list for `params`, polled until `until(rows)` holds (visibility lags a little)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        response = await http.get("/api/goals", params=params)
        assert response.status_code == 200, response.text
        rows = response.json()
        if until(rows) or asyncio.get_running_loop().time() > deadline:
            return rows
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_the_goal_list_filters_as_perdure_ls_and_lists_a_goal_waiting_on_a_person_first(
    env, task_queue, store, workspace, ui
):
    async with running_worker(env, task_queue, store), httpx.AsyncClient(base_url=ui, timeout=30) as http:
        older = await start(env, task_queue, workspace, [gate()], allowed_tools=["run_command"])
        await wait_until(older, lambda s: "gate" in s.running)
        parked = await http.post(f"/api/goals/{older.id}/messages", json={"kind": "park", "reason": "ask the owner"})
        assert parked.json()["status"] == "applied", parked.text
        newer = await start(env, task_queue, workspace, [gate()], allowed_tools=["run_command"])
        await wait_until(newer, lambda s: "gate" in s.running)
        ours = {"query": f"WorkflowId = '{older.id}' OR WorkflowId = '{newer.id}'"}
        rows = await listed(http, ours, lambda rows: len(rows) == 2 and rows[0]["waiting_on_you"] == "parked")
        only_parked = await listed(http, {**ours, "parked": "1"}, lambda rows: len(rows) == 1)
        completed = await http.get("/api/goals", params={**ours, "status": "completed"})
        bad_status = await http.get("/api/goals", params={"status": "Sleeping"})
        bad_phase = await http.get("/api/goals", params={"phase": "dreaming"})
        bad_flag = await http.get("/api/goals", params={"parked": "maybe"})
        bad_query = await http.get("/api/goals", params={"query": "WorkflowId = = 'x'"})
        for handle in (older, newer):
            await http.post(f"/api/goals/{handle.id}/messages", json={"kind": "abort"})
            await goal_result(handle)
        ended = await listed(http, ours, lambda rows: all(r["outcome"] for r in rows))
    # The parked goal is older, and still listed first: newest-first would put it second.
    assert [r["id"] for r in rows] == [older.id, newer.id], rows
    assert rows[0]["phase"] == "parked" and rows[1]["waiting_on_you"] is None and rows[1]["status"] == "RUNNING"
    assert [r["id"] for r in only_parked] == [older.id]
    assert completed.status_code == 200 and completed.json() == []
    assert bad_status.status_code == 400 and "Running" in bad_status.json()["error"]
    assert bad_phase.status_code == 400 and "awaiting_human" in bad_phase.json()["error"]
    assert bad_flag.status_code == 400 and "1 or 0" in bad_flag.json()["error"]
    assert bad_query.status_code == 400 and "visibility query" in bad_query.json()["error"]
    assert {r["outcome"] for r in ended} == {"aborted"} and all(r["waiting_on_you"] is None for r in ended)


@pytest.mark.slow
async def test_the_goal_list_names_each_goal_by_its_text_from_the_memo_it_started_with(
    env, task_queue, store, workspace, ui, scripted, monkeypatch
):
    monkeypatch.setenv("PERDURE_TASK_QUEUE", task_queue)
    user = f"u{uuid.uuid4().hex[:8]}"
    server = scripted({"replies": [], "policy": "offline"})
    waits = spec(workspace, goal="Tidy the release notes", plan={"steps": [gate()]})
    async with (
        running_worker(env, task_queue, store, openai_profile(server)),
        httpx.AsyncClient(base_url=ui, timeout=30) as http,
    ):
        by_cli = await goal_starts.start_goal(env.client, waits, f"cli-{task_queue}")
        new = Say(request_id="r-new", text="Compose a haiku about penguins", workspace=str(workspace), new=True)
        routed = await router_calls.say(env.client, user, new, profile="test")  # a goal-… id of the router's
        # Started without the memo (as before it existed): named by its static summary.
        older = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=waits.model_copy(update={"goal": "Summarise the notes"})),
            id=f"old-{task_queue}",
            task_queue=task_queue,
            static_summary="Summarise the notes",
        )
        ids = [by_cli.id, routed.goal_id, older.id]
        query = " OR ".join(f"WorkflowId = '{i}'" for i in ids)
        rows = await listed(http, {"query": query}, lambda rows: len(rows) == 3)
        memos = {wf.id: await wf.memo() async for wf in env.client.list_workflows(query)}
        for handle in (by_cli, older):
            await http.post(f"/api/goals/{handle.id}/messages", json={"kind": "abort"})
            await goal_reads.result(env.client, handle.id)
    assert {r["id"]: r["goal"] for r in rows} == {
        by_cli.id: "Tidy the release notes",
        routed.goal_id: "Compose a haiku about penguins",
        older.id: "Summarise the notes",
    }
    # The listing itself carries the text of the goals started since: no call per goal.
    assert memos[by_cli.id][GOAL_MEMO] == "Tidy the release notes"
    assert memos[routed.goal_id][GOAL_MEMO] == "Compose a haiku about penguins"
    assert GOAL_MEMO not in memos[older.id]


@pytest.mark.slow
async def test_a_goal_started_by_posting_json_is_the_clis_start_and_bad_starts_are_clear_refusals(
    env, task_queue, store, workspace, ui, monkeypatch
):
    monkeypatch.setenv("PERDURE_TASK_QUEUE", task_queue)
    waiting = {"goal": "wait for GO", "plan": {"steps": [gate()]}, "workspace": str(workspace), "request_id": "r-wait"}
    async with running_worker(env, task_queue, store), httpx.AsyncClient(base_url=ui, timeout=30) as http:
        first = await http.post("/api/goals", json=waiting)
        again = await http.post("/api/goals", json=waiting)  # a retried request: the same goal
        assert first.status_code == 201, first.text
        goal_id = first.json()["goal_id"]
        other_spec = await http.post("/api/goals", json={**waiting, "goal": "something else", "id": goal_id})
        unfinished = await http.get(f"/api/goals/{goal_id}/report")
        refusals = {
            "not json": await http.post("/api/goals", content=b"{", headers={"content-type": "application/json"}),
            "empty": await http.post("/api/goals", content=b"", headers={"content-type": "application/json"}),
            "array": await http.post("/api/goals", json=["goal"]),
            "unknown field": await http.post("/api/goals", json={"goal": "x", "colour": "red"}),
            "wrong type": await http.post("/api/goals", json={"goal": 5}),
            "no goal": await http.post("/api/goals", json={"workspace": str(workspace)}),
            "bad plan": await http.post("/api/goals", json={"goal": "x", "plan": {"steps": [{"name": "Bad!"}]}}),
            "bad id": await http.post("/api/goals", json={"goal": "x", "id": "../etc"}),
            "past deadline": await http.post("/api/goals", json={"goal": "x", "deadline": "2001-01-01T00:00"}),
            "huge": await http.post("/api/goals", json={"goal": "x" * 300_000}),
            "plain text": await http.post("/api/goals", content=b'{"goal": "x"}'),
            "unknown profile": await http.post("/api/goals", json={"goal": "x", "profile": "no-such-profile"}),
        }
        await http.post(f"/api/goals/{goal_id}/messages", json={"kind": "abort"})
        await goal_result(env.client.get_workflow_handle(goal_id))
        after_end = await http.post("/api/goals", json=waiting)
    assert first.json()["started"] is True and first.json()["page"] == f"/goals/{goal_id}"
    assert again.status_code == 200 and again.json()["goal_id"] == goal_id and again.json()["started"] is False
    assert "already running with this spec" in again.json()["text"]
    assert other_spec.status_code == 409 and "already running with a different spec" in other_spec.json()["error"]
    assert unfinished.status_code == 409 and "still running" in unfinished.json()["error"]
    statuses = {name: (r.status_code, r.json()["error"]) for name, r in refusals.items()}
    expected = {
        "not json": (400, "JSON object"),
        "empty": (400, "empty"),
        "array": (400, "JSON object"),
        "unknown field": (400, "colour"),
        "wrong type": (400, "goal"),
        "no goal": (400, "give the goal text"),
        "bad plan": (400, "plan:"),
        "bad id": (400, "not allowed"),
        "past deadline": (400, "in the past"),
        "huge": (413, "at most"),
        "plain text": (415, "JSON"),
        "unknown profile": (422, "no-such-profile"),
    }
    for name, (status, words) in expected.items():
        assert statuses[name][0] == status and words in statuses[name][1], (name, statuses[name])
    # A start repeated after the goal ended: the CLI's answer, nothing new started.
    assert after_end.status_code == 200 and after_end.json()["started"] is False
    assert "outcome aborted" in after_end.json()["text"] and "nothing new started" in after_end.json()["text"]


async def test_a_closed_goals_report_is_served_with_its_outcome(
    env, task_queue, store, workspace, ui, tmp_path, monkeypatch
):
    monkeypatch.setenv("PERDURE_HOME", str(tmp_path))  # the client reads the store the worker wrote
    (workspace / "notes.md").write_text("a note\n")
    async with running_worker(env, task_queue, store), httpx.AsyncClient(base_url=ui, timeout=30) as http:
        handle = await start(env, task_queue, workspace, READS[:2], allowed_tools=["read_file"])
        result = await handle.result()
        served = await http.get(f"/api/goals/{handle.id}/report")
        missing = await http.get("/api/goals/no-such-goal/report")
    assert served.status_code == 200, served.text
    body = served.json()
    assert body["outcome"] == "succeeded" == result.outcome
    assert body["report"] == store.get_text(result.report)  # the full report, not the excerpt
    assert "read-0" in body["report"] and "read-1" in body["report"]
    assert missing.status_code == 404
