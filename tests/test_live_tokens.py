"""Live model output: a streamed reply's text reaches the goal's event stream while it is
written, in both wire formats, through the real SDK clients and a dev server; a retried
attempt voids what the attempt before it showed; the node's output is still its
activity's result; and nobody else can publish on the goal's stream."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime

import pytest
from temporalio.contrib.workflow_streams import PublishEntry, PublishInput
from temporalio.converter import DataConverter

from perdure.activities.models.attempts import ModelAttemptState, ModelError
from perdure.activities.models.providers import ChatMessage, ChatRequest, ChatTool, provider_for
from perdure.workflows.goal.contracts.events import (
    EVENTS_TOPIC,
    TOKENS_TOPIC,
    GoalView,
    NodeChanged,
    TokenDelta,
    TokenRetry,
    reduce,
)
from perdure.workflows.goal.contracts.messages import Abort
from tests.builders import agent, gate, llm, scripted_profile
from tests.helpers import (
    calls_for,
    events_until_end,
    goal_result,
    live_goal_profile,
    running_worker,
    start,
    stream_events,
    submit,
    wait_until,
)

WORDS = " ".join(f"word{i}" for i in range(24))
TOOL = ChatTool(name="read_file", description="Read a file.", json_schema={"type": "object"})


def request(text: str, tools: bool = False) -> ChatRequest:
    return ChatRequest(messages=[ChatMessage(role="user", content=text)], tools=[TOOL] if tools else [])


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_streamed_reply_is_the_same_reply_as_an_unstreamed_one_and_its_text_arrives_in_pieces(
    scripted, provider
):
    server = scripted(
        {
            "replies": [
                {"when": "talk", "content": WORDS, "usage": {"input_tokens": 11, "output_tokens": 24}},
                {"when": "call", "tool_calls": [{"name": "read_file", "arguments": {"path": "a b.md"}}]},
            ]
        }
    )
    streamed = scripted_profile(server, provider)
    unstreamed = streamed.model_copy(update={"stream": False, "name": "plain"})
    pieces: list[str] = []
    attempt = ModelAttemptState("a test", streamed.name)
    attempt.on_text = pieces.append
    for text, tools in (("talk", False), ("call", True)):
        got = await provider_for(streamed).chat(request(text, tools), attempt)
        server.reset()
        want = await provider_for(unstreamed).chat(request(text, tools))
        server.reset()
        no_ids = {"tool_calls": {"__all__": {"id"}}}  # call ids count the server's requests
        assert got.model_dump(exclude=no_ids) == want.model_dump(exclude=no_ids)
        assert all(call.id for call in got.tool_calls)
    assert len(pieces) == 24 and "".join(pieces) == WORDS
    assert got.tool_calls[0].name == "read_file" and json.loads(got.tool_calls[0].arguments) == {"path": "a b.md"}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_reply_that_breaks_off_mid_stream_is_retried_with_its_cost_unknown(scripted, provider):
    server = scripted({"replies": [{"when": "talk", "content": WORDS, "cut_after_chunks": 5}]})
    attempt = ModelAttemptState("a test", "test")
    pieces: list[str] = []
    attempt.on_text = pieces.append
    with pytest.raises(ModelError) as raised:
        await provider_for(scripted_profile(server, provider)).chat(request("talk"), attempt)
    error = raised.value
    assert error.type == "ModelRetryable" and not error.non_retryable and error.billed_unknown
    assert "broke off" in error.message and pieces  # it had begun: the provider has the request


def view_before_settling(events: list, node: str) -> GoalView:
    view = GoalView()
    for event in events:
        if isinstance(event, NodeChanged) and event.node == node and event.status == "succeeded":
            return view
        reduce(view, event)
    raise AssertionError(f"{node} never succeeded")


@pytest.mark.slow
async def test_a_slow_reply_is_seen_word_by_word_before_its_node_succeeds_and_the_output_is_the_result(
    env, task_queue, store, workspace, scripted
):
    server = scripted({"replies": [{"when": "Do talk", "content": WORDS, "chunk_delay_s": 0.08}]})
    async with running_worker(env, task_queue, store, live_goal_profile(server)):
        handle = await start(env, task_queue, workspace, [llm("talk")])
        events = await asyncio.wait_for(events_until_end(env, handle.id), 60)
        result = await handle.result()
    deltas = [e for e in events if isinstance(e, TokenDelta)]
    assert len(deltas) >= 3, "a 2 s reply sent every 0.3 s arrives in several pieces"
    assert [d.seq for d in deltas] == list(range(len(deltas))) and {d.attempt for d in deltas} == {1}
    live = view_before_settling(events, "talk").live["talk"]
    assert WORDS.startswith(live.text) and live.text, "pieces in order, the last one left to the output"
    assert result.outcome == "succeeded" and store.get_text(result.outputs["talk"]) == WORDS
    settled = GoalView()
    for event in events:
        reduce(settled, event)
    assert "talk" not in settled.live  # once settled, the output is the node's


@pytest.mark.slow
async def test_a_retried_call_marks_the_retry_and_the_view_shows_only_the_new_attempts_text(
    env, task_queue, store, workspace, scripted
):
    cut = {"when": "Do talk", "content": "lost " * 30, "chunk_delay_s": 0.05, "cut_after_chunks": 20, "times": 1}
    server = scripted({"replies": [cut, {"when": "Do talk", "content": WORDS, "chunk_delay_s": 0.05}]})
    async with running_worker(env, task_queue, store, live_goal_profile(server, 0.2)):
        handle = await start(env, task_queue, workspace, [llm("talk")])
        events = await asyncio.wait_for(events_until_end(env, handle.id), 60)
        result = await handle.result()
    first = [e for e in events if isinstance(e, TokenDelta) and e.attempt == 1]
    markers = [e for e in events if isinstance(e, TokenRetry)]
    assert first and "lost" in first[0].text, "the broken attempt's text was shown while it ran"
    assert [(m.node, m.attempt) for m in markers] == [("talk", 2)]
    assert events.index(markers[0]) > events.index(first[-1])
    live = view_before_settling(events, "talk").live["talk"]
    assert live.attempt == 2 and live.text and WORDS.startswith(live.text) and "lost" not in live.text
    assert store.get_text(result.outputs["talk"]) == WORDS


def publish(topic: str, value: object, publisher: str, sequence: int) -> PublishInput:
    payload = DataConverter.default.payload_converter.to_payloads([value])[0]
    data = base64.b64encode(payload.SerializeToString()).decode()
    return PublishInput(items=[PublishEntry(topic=topic, data=data)], publisher_id=publisher, sequence=sequence)


async def test_nobody_can_publish_goal_events_or_live_text_for_a_node_that_is_not_running(
    env, task_queue, store, workspace
):
    now = datetime.now(UTC).isoformat()
    forged_node = {"type": "node", "id": "forged", "at": now, "node": "gate", "kind": "tool", "status": "succeeded"}
    delta = {"type": "tokens", "id": "t", "at": now, "node": "gate", "seq": 0, "text": "hi"}
    later = {"name": "later", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md"}, "needs": ["gate"]}
    (workspace / "notes.md").write_text("a note\n")
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, [gate(), later], allowed_tools=["run_command", "read_file"])
        await wait_until(handle, lambda s: "gate" in s.running)
        signal = "__temporal_workflow_stream_publish"
        await handle.signal(signal, publish(EVENTS_TOPIC, forged_node, "forger", 1))  # goal events: only the goal
        await handle.signal(signal, publish(TOKENS_TOPIC, {**delta, "node": "later"}, "forger", 2))  # not running
        await handle.signal(signal, publish(TOKENS_TOPIC, {**delta, "seq": -1}, "forger", 3))  # wrong shape
        await handle.signal(signal, publish(TOKENS_TOPIC, {**delta, "text": "x" * 20_000}, "forger", 4))  # huge
        await handle.signal(signal, publish(TOKENS_TOPIC, delta, "forger", 5))  # well formed, gate is running
        await handle.signal(signal, publish(TOKENS_TOPIC, delta, "forger", 5))  # the same batch again
        await handle.signal(signal, PublishInput(items=[PublishEntry(topic=TOKENS_TOPIC, data="%%")], sequence=6))
        (workspace / "GO").write_text("")
        events = await asyncio.wait_for(events_until_end(env, handle.id), 60)
        result = await handle.result()
    assert result.outcome == "succeeded"  # no workflow task failed on any of them
    assert not [e for e in events if e.id == "forged"]
    assert [(e.node, e.text) for e in events if isinstance(e, TokenDelta)] == [("gate", "hi")]


@pytest.mark.slow
async def test_an_abort_while_a_reply_streams_cancels_the_call_at_once_and_sends_it_only_once(
    env, task_queue, store, workspace, scripted
):
    slow = " ".join(f"w{i}" for i in range(200))
    server = scripted({"replies": [{"when": "Do talk", "content": slow, "chunk_delay_s": 0.1}]})
    async with running_worker(env, task_queue, store, live_goal_profile(server, 0.2)):
        handle = await start(env, task_queue, workspace, [llm("talk")])
        async for _, event in stream_events(env, handle.id):
            if isinstance(event, TokenDelta):
                await submit(handle, Abort(request_id="stop-1", reason="changed my mind"))
                break
        result = await asyncio.wait_for(goal_result(handle), 15)  # the 20 s reply is not waited for
        events = await asyncio.wait_for(events_until_end(env, handle.id), 15)
    assert result.outcome == "aborted"
    assert len(calls_for(server, "talk")) == 1
    talk = [e for e in events if isinstance(e, NodeChanged) and e.node == "talk"]
    assert talk[-1].status != "running"


@pytest.mark.slow
async def test_an_agents_turn_is_shown_whole_under_its_turn_number(env, task_queue, store, workspace, scripted):
    server = scripted({"replies": [{"when": "Look around", "content": WORDS, "chunk_delay_s": 0.08}]})
    async with running_worker(env, task_queue, store, live_goal_profile(server)):
        handle = await start(env, task_queue, workspace, [agent("scout", "Look around.", ["read_file"])])
        events = await asyncio.wait_for(events_until_end(env, handle.id), 60)
        result = await handle.result()
    deltas = [e for e in events if isinstance(e, TokenDelta)]
    assert deltas and {(d.node, d.turn) for d in deltas} == {("scout", 1)}
    live = view_before_settling(events, "scout").live["scout"]
    assert live.turn == 1 and live.text == WORDS  # a turn's last piece is sent: its text stays whole
    assert result.outcome == "succeeded"


@pytest.mark.slow
async def test_live_text_crosses_continue_as_new_without_its_text(env, task_queue, store, workspace, scripted):
    """The carried log keeps every delta's place and id but not its text: nothing runs a
    model call across the boundary, and 2,000 deltas of text would outgrow the run's input."""
    server = scripted({"replies": [{"when": "Do talk", "content": WORDS, "chunk_delay_s": 0.08}]})
    (workspace / "notes.md").write_text("a note\n")
    # Reads as activities after the reply, enough events for the run to reach its limit after it.
    after = [
        {"name": f"after{i}", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md", "max_bytes": 100 + i}}
        | {"needs": [f"after{i - 1}" if i else "talk"]}
        for i in range(6)
    ]
    async with running_worker(env, task_queue, store, live_goal_profile(server)):
        handle = await start(
            env,
            task_queue,
            workspace,
            [llm("talk"), *after],
            allowed_tools=["read_file"],
            continue_as_new_after_events=50,
            local_activities_up_to_s=0,
        )
        result = await asyncio.wait_for(handle.result(), 60)
        events = await asyncio.wait_for(events_until_end(env, handle.id), 30)  # the last run's log
        runs = (await handle.describe()).run_id != handle.result_run_id
    deltas = [e for e in events if isinstance(e, TokenDelta)]
    assert result.outcome == "succeeded" and runs, "the goal continued as new after the reply"
    assert deltas and all(d.text == "" for d in deltas)
    assert [d.seq for d in deltas] == list(range(len(deltas)))


async def test_a_streamed_reply_from_a_server_that_reports_no_usage_is_charged_an_estimate_not_zero(scripted):
    server = scripted({"replies": [{"when": "talk", "content": WORDS, "stream_usage": False}]})
    reply = await provider_for(scripted_profile(server)).chat(request("talk"))
    assert reply.usage_estimated and reply.output_tokens == (len(WORDS) + 3) // 4 and reply.input_tokens > 0
