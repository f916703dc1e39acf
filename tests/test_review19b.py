"""Review of issue 19's live output and page (review19b): an Anthropic error event in the
middle of a streamed reply is retried as the broken-off reply it is, a node run again
after a rewind shows its own live text, and POST /api/goals refuses a workspace with no
home and a plan whose constraints are one string with a 400."""

from __future__ import annotations

import asyncio
import json
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from perdure.activities.models.attempts import ModelAttemptState, ModelError
from perdure.activities.models.profiles import ModelProfile
from perdure.activities.models.providers import ChatMessage, ChatRequest, provider_for
from perdure.testing.http import BackgroundHTTPServer
from perdure.workflows.goal.contracts.events import GoalView, NodeChanged, TokenDelta, reduce
from perdure.workflows.goal.contracts.messages import Rewind
from tests.builders import gate, llm
from tests.helpers import events_until_end, live_goal_profile, running_worker, start, statuses, submit, wait_until

SECRET = "sk-review19b-SECRET"
TEXT_BLOCK = {"type": "text", "text": ""}
HELLO = {"type": "text_delta", "text": "Hello "}


class _OverloadedMidStream(BaseHTTPRequestHandler):
    """Anthropic's messages API as it answers when it is overloaded after the reply began:
    HTTP 200, a few events of the reply, then an `error` event (overloaded_error)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.owner.requests += 1  # type: ignore[attr-defined]
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        }
        events = [
            ("message_start", {"type": "message_start", "message": message}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": TEXT_BLOCK}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": HELLO}),
            ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ]
        body = b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class OverloadedServer(BackgroundHTTPServer):
    handler = _OverloadedMidStream

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0


async def test_an_anthropic_error_event_mid_stream_is_retried_with_its_cost_unknown_not_refused(monkeypatch):
    monkeypatch.setenv("PERDURE_REVIEW_KEY", SECRET)
    with OverloadedServer() as server:
        profile = ModelProfile(
            name="claude",
            provider="anthropic",
            model="claude-test",
            base_url=server.base_url,
            api_key_env="PERDURE_REVIEW_KEY",
        )
        attempt = ModelAttemptState("a test", profile.name)
        pieces: list[str] = []
        attempt.on_text = pieces.append
        with pytest.raises(ModelError) as raised:
            await provider_for(profile).chat(ChatRequest(messages=[ChatMessage(role="user", content="hi")]), attempt)
    error = raised.value
    assert server.requests == 1 and pieces == ["Hello "], "the reply had begun"
    # Unstreamed, an overloaded API answers 529 and the call is retried; streamed, the same
    # overload arrives inside a 200 and must not become a non-retryable rejection.
    assert error.type == "ModelRetryable" and not error.non_retryable, error.message
    assert error.billed_unknown and "Overloaded" in error.message and SECRET not in error.message


def view_before_settling_again(events: list, node: str) -> GoalView:
    """The view just before `node` succeeds for the second time (its run after a rewind)."""
    view, settled = GoalView(), 0
    for event in events:
        if isinstance(event, NodeChanged) and event.node == node and event.status == "succeeded":
            settled += 1
            if settled == 2:
                return view
        reduce(view, event)
    raise AssertionError(f"{node} did not succeed twice")


@pytest.mark.slow
async def test_a_node_run_again_after_a_rewind_shows_its_own_live_text(env, task_queue, store, workspace, scripted):
    first = " ".join(f"first{i}" for i in range(24))
    again = " ".join(f"again{i}" for i in range(24))
    server = scripted(
        {
            "replies": [
                {"when": "Do talk", "content": first, "chunk_delay_s": 0.08, "times": 1},
                {"when": "Do talk", "content": again, "chunk_delay_s": 0.08},
            ]
        }
    )
    async with running_worker(env, task_queue, store, live_goal_profile(server)):
        handle = await start(env, task_queue, workspace, [llm("talk"), gate()])
        await wait_until(handle, lambda s: statuses(s)["talk"] == "succeeded", timeout_s=60)
        receipt = await submit(handle, Rewind(request_id="rw-1", node="talk", why="say it again"))
        await wait_until(handle, lambda s: statuses(s)["talk"] == "succeeded" and s.plan_version > 1, timeout_s=60)
        (workspace / "GO").touch()
        events = await asyncio.wait_for(events_until_end(env, handle.id), 60)
        result = await handle.result()
    assert receipt.status == "applied"
    rerun = [e.text for e in events if isinstance(e, TokenDelta) and "again" in e.text]
    assert rerun, "the second run's text was sent while it was written"
    live = view_before_settling_again(events, "talk").live.get("talk")
    assert live is not None and live.text, "a consumer shows the second run's text as it is written"
    assert again.startswith(live.text) and live.text.startswith(rerun[0])
    assert result.outcome == "succeeded" and store.get_text(result.outputs["talk"]) == again


async def test_a_start_with_a_workspace_under_a_home_this_machine_does_not_know_is_a_400_not_a_500(ui):
    async with httpx.AsyncClient(base_url=ui, timeout=30) as http:
        no_home = await http.post("/api/goals", json={"goal": "x", "workspace": "~no-such-user-review19b/w"})
    assert no_home.status_code == 400 and "workspace" in no_home.json()["error"], no_home.text


async def test_a_plans_constraints_given_as_one_string_are_refused_not_taken_letter_by_letter(workspace, ui):
    step = {"name": "a", "kind": "llm", "prompt": "Say hi."}
    plan = {"steps": [step], "constraints": "be brief"}
    async with httpx.AsyncClient(base_url=ui, timeout=30) as http:
        one_string = await http.post("/api/goals", json={"goal": "x", "workspace": str(workspace), "plan": plan})
    assert one_string.status_code == 400, one_string.text
    assert "'constraints' must be a list" in one_string.json()["error"]
