"""The scripted model server, driven by the real openai and anthropic clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import openai
import pydantic
import pytest

from perdure.activities.models.scripted import NO_MATCH, ScriptedServer, load_script

SCRIPT = {
    "replies": [
        {"when": "PLANNER", "json": {"steps": [{"name": "a", "kind": "llm", "prompt": "p"}]}},
        {"when_last": "README says hello", "content": "the readme greets"},
        {"when_last": "read it", "tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]},
        {"when_last": "malformed", "tool_calls": [{"name": "write_file", "arguments": "{not json"}]},
        {"when_last": "twice", "content": "first answer", "times": 2},
        {"when_last": "twice", "content": "spent answer"},
        {"when_last": "count", "content": "counted", "usage": {"input_tokens": 11, "output_tokens": 7}},
        {"when_last": "hello", "content": "hi there"},
    ]
}


@pytest.fixture
def server():
    with ScriptedServer(SCRIPT) as s:
        yield s


def openai_client(server: ScriptedServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="unused", base_url=server.openai_base_url, max_retries=0)


def anthropic_client(server: ScriptedServer) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(api_key="unused", base_url=server.base_url, max_retries=0)


async def ask(server: ScriptedServer, *messages: dict, **params):
    return await openai_client(server).chat.completions.create(model="m", messages=list(messages), **params)


async def test_openai_content_reply(server):
    reply = await ask(server, {"role": "user", "content": "hello"})
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content == "hi there"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "m"


async def test_openai_json_reply_is_json_text(server):
    reply = await ask(
        server,
        {"role": "system", "content": "[PLANNER] reply with JSON"},
        {"role": "user", "content": "goal"},
        response_format={"type": "json_object"},
    )
    assert json.loads(reply.choices[0].message.content) == {"steps": [{"name": "a", "kind": "llm", "prompt": "p"}]}
    assert server.requests()[-1]["json_mode"] is True


async def test_openai_tool_calls_carry_json_arguments(server):
    reply = await ask(server, {"role": "user", "content": "please read it"})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "read_file"
    assert json.loads(call.function.arguments) == {"path": "README.md"}
    assert call.id.startswith("call_")


async def test_raw_string_arguments_are_sent_verbatim(server):
    reply = await ask(server, {"role": "user", "content": "malformed please"})
    assert reply.choices[0].message.tool_calls[0].function.arguments == "{not json"


async def test_times_spends_an_entry_then_the_next_match_wins(server):
    answers = [(await ask(server, {"role": "user", "content": "twice"})).choices[0].message.content for _ in range(3)]
    assert answers == ["first answer", "first answer", "spent answer"]
    assert [r["matched"] for r in server.requests()] == [4, 4, 5]


async def test_when_last_sees_the_tool_message_only(server):
    # "README says hello" is in an earlier user message, so only the tool result counts.
    history = [
        {"role": "user", "content": "read it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "README says hello"},
    ]
    reply = await ask(server, *history)
    assert reply.choices[0].message.content == "the readme greets"
    assert server.requests()[-1]["last_message"] == "README says hello"


async def test_when_matches_the_system_prompt(server):
    await ask(server, {"role": "system", "content": "I am the PLANNER"}, {"role": "user", "content": "hello"})
    assert server.requests()[-1]["matched"] == 0


async def test_unmatched_request_is_a_clear_400(server):
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(server, {"role": "user", "content": "something nobody scripted"})
    assert caught.value.status_code == 400
    assert NO_MATCH in caught.value.message
    assert "something nobody scripted" in caught.value.message
    assert server.requests()[-1]["matched"] is None
    assert server.requests()[-1]["status"] == 400


async def test_usage_is_scripted_or_estimated(server):
    scripted = await ask(server, {"role": "user", "content": "count"})
    assert (scripted.usage.prompt_tokens, scripted.usage.completion_tokens, scripted.usage.total_tokens) == (11, 7, 18)
    estimated = await ask(server, {"role": "user", "content": "hello" * 40})
    assert estimated.usage.prompt_tokens == 50
    assert estimated.usage.completion_tokens == max(1, len("hi there") // 4)


async def test_anthropic_text_reply(server):
    message = await anthropic_client(server).messages.create(
        model="claude-test", max_tokens=100, system="sys", messages=[{"role": "user", "content": "hello"}]
    )
    assert message.type == "message"
    assert message.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in message.content] == [("text", "hi there")]
    assert message.usage.input_tokens >= 1
    assert server.requests()[-1]["flavour"] == "anthropic"


async def test_anthropic_tool_use_and_tool_result(server):
    client = anthropic_client(server)
    tools = [{"name": "read_file", "description": "read", "input_schema": {"type": "object"}}]
    first = await client.messages.create(
        model="claude-test", max_tokens=100, tools=tools, messages=[{"role": "user", "content": "read it"}]
    )
    assert first.stop_reason == "tool_use"
    [use] = first.content
    assert (use.type, use.name, use.input) == ("tool_use", "read_file", {"path": "README.md"})
    second = await client.messages.create(
        model="claude-test",
        max_tokens=100,
        tools=tools,
        messages=[
            {"role": "user", "content": "read it"},
            {"role": "assistant", "content": [use.model_dump(include={"type", "id", "name", "input"})]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "README says hello"}],
            },
        ],
    )
    assert second.content[0].text == "the readme greets"
    assert server.requests()[-1]["tools"] == ["read_file"]


async def test_request_log_counts_and_reset_over_http(server):
    for _ in range(3):
        await ask(server, {"role": "user", "content": "hello"})
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        log = (await http.get("/_scripted/requests")).json()
        assert len(log) == 3
        assert log[0]["path"] == "/v1/chat/completions"
        assert log[0]["model"] == "m"
        await ask(server, {"role": "user", "content": "twice"})
        assert (await http.post("/_scripted/reset")).status_code == 200
    assert server.requests() == []
    # The reset also restored the spent counts.
    assert (await ask(server, {"role": "user", "content": "twice"})).choices[0].message.content == "first answer"


def test_script_files_yaml_and_json(tmp_path: Path):
    (tmp_path / "s.yaml").write_text("replies:\n  - status: 503\n    headers: {Retry-After: 3}\n  - json: [1, 2]\n")
    (tmp_path / "s.json").write_text(json.dumps({"replies": [{"content": "x", "when": "y"}]}))
    from_yaml = load_script(tmp_path / "s.yaml")
    assert from_yaml.replies[0].headers == {"Retry-After": "3"}
    assert from_yaml.replies[1].reply_text() == "[1, 2]"
    assert load_script(tmp_path / "s.json").replies[0].when == "y"


@pytest.mark.parametrize(
    "entry",
    [{"content": "a", "json": 1}, {"when": "x"}, {"content": "a", "body": "b"}, {"content": "a", "typo": 1}],
)
def test_bad_entries_are_rejected(entry):
    with pytest.raises(pydantic.ValidationError):
        load_script({"replies": [entry]})


@pytest.mark.process
def test_module_entry_point_serves_until_killed(tmp_path: Path):
    script = tmp_path / "s.yaml"
    script.write_text("replies:\n  - content: from the cli\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "perdure.activities.models.scripted", "--script", str(script)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[1],
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:")
        base = line.split()[2]
        reply = openai.OpenAI(api_key="unused", base_url=base + "/v1", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == "from the cli"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


# --- background responses and batches on the wire ------------------------------------


def test_background_response_wire_queued_in_progress_completed_and_cancel():
    import httpx

    script = {
        "replies": [{"content": "done", "in_progress_polls": 1, "usage": {"input_tokens": 3, "output_tokens": 2}}]
    }
    with ScriptedServer(script) as server, httpx.Client(base_url=server.openai_base_url) as http:
        created = http.post("/responses", json={"model": "m", "input": "hi", "background": True}).json()
        assert created["status"] == "queued" and created["usage"] is None
        polls = [http.get(f"/responses/{created['id']}").json() for _ in range(2)]
        assert [p["status"] for p in polls] == ["in_progress", "completed"]
        assert polls[1]["output"][0]["content"][0]["text"] == "done"
        assert polls[1]["usage"]["input_tokens"] == 3
        assert http.post(f"/responses/{created['id']}/cancel").json()["status"] == "cancelled"
        assert http.get("/responses/resp_nope").status_code == 404
        assert [e["action"] for e in server.handle_events()] == ["create", "poll", "poll", "cancel", "poll"]
        assert len(server.creates()) == 1 and len(server.requests()) == 1


def test_batch_wire_create_poll_and_jsonl_results():
    script = {"replies": [{"content": "batched", "in_progress_polls": 1}]}
    params = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    with ScriptedServer(script) as server, httpx.Client(base_url=server.anthropic_base_url) as http:
        request = {"custom_id": "c1", "params": params}
        batch = http.post("/v1/messages/batches", json={"requests": [request]}).json()
        assert batch["processing_status"] == "in_progress"
        assert http.get(f"/v1/messages/batches/{batch['id']}/results").status_code == 400  # not ended yet
        assert http.get(f"/v1/messages/batches/{batch['id']}").json()["processing_status"] == "in_progress"
        ended = http.get(f"/v1/messages/batches/{batch['id']}").json()
        assert ended["processing_status"] == "ended" and ended["request_counts"]["succeeded"] == 1
        (line,) = [json.loads(x) for x in http.get(ended["results_url"]).text.splitlines()]
        assert line["custom_id"] == "c1" and line["result"]["message"]["content"][0]["text"] == "batched"
