"""Provider calls over the real SDKs, and how their failures map onto Temporal retries."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from temporalio.exceptions import ApplicationError

from perdure.activities.models.profiles import ModelProfile
from perdure.activities.models.providers import (
    AnthropicProvider,
    ChatMessage,
    ChatRequest,
    ChatTool,
    ChatToolCall,
    OpenAIProvider,
    _anthropic_messages,
    provider_for,
    retry_after,
    scripted_server,
)
from perdure.activities.models.scripted import ScriptedServer

SECRET = "sk-test-SECRET123"

SCRIPT = {
    "replies": [
        {"when_last": "server error", "status": 500, "headers": {"Retry-After": "3"}},
        {"when_last": "rate limited", "status": 429, "body": "slow down please"},
        {"when_last": "bad request", "status": 400, "body": "max_tokens is too large"},
        {"when_last": "timeout", "status": 408},
        {"when_last": "conflict", "status": 409},
        {"when_last": "forbidden", "status": 403, "body": f"key {SECRET} may not do this"},
        {"when_last": "use a tool", "tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]},
        {"when_last": "hello", "content": "hi", "usage": {"input_tokens": 12, "output_tokens": 3}},
        {"when_last": "cut short", "content": "a reply cut at", "background_status": "incomplete"},
    ]
}


@pytest.fixture(scope="module")
def server():
    with ScriptedServer(SCRIPT) as s:
        yield s


@pytest.fixture(autouse=True)
def fake_key(monkeypatch):
    monkeypatch.setenv("PERDURE_TEST_KEY", SECRET)


def openai_profile(base_url: str, **extra) -> ModelProfile:
    return ModelProfile(
        name="test-openai",
        provider="openai",
        model="gpt-test",
        base_url=base_url,
        api_key_env="PERDURE_TEST_KEY",
        **extra,
    )


def anthropic_profile(base_url: str, **extra) -> ModelProfile:
    return ModelProfile(
        name="test-claude",
        provider="anthropic",
        model="claude-test",
        base_url=base_url,
        api_key_env="PERDURE_TEST_KEY",
        **extra,
    )


def ask(text: str) -> ChatRequest:
    return ChatRequest(messages=[ChatMessage(role="system", content="sys"), ChatMessage(role="user", content=text)])


async def failure(provider, text: str) -> ApplicationError:
    with pytest.raises(ApplicationError) as caught:
        await provider.chat(ask(text))
    return caught.value


@pytest.fixture(params=["openai", "anthropic"])
def provider(request, server):
    if request.param == "openai":
        return provider_for(openai_profile(server.openai_base_url))
    return provider_for(anthropic_profile(server.base_url))


async def test_500_with_retry_after_is_retryable_after_that_delay(provider):
    err = await failure(provider, "server error")
    assert err.type == "ModelRetryable"
    assert err.non_retryable is False
    assert err.next_retry_delay == timedelta(seconds=3)
    assert "HTTP 500" in err.message


async def test_429_is_retryable_with_the_provider_message(provider):
    err = await failure(provider, "rate limited")
    assert (err.type, err.non_retryable, err.next_retry_delay) == ("ModelRetryable", False, None)
    assert "slow down please" in err.message


@pytest.mark.parametrize("text", ["timeout", "conflict"])
async def test_408_and_409_are_retryable(provider, text):
    err = await failure(provider, text)
    assert (err.type, err.non_retryable) == ("ModelRetryable", False)


async def test_400_is_not_retryable_and_says_why(provider):
    err = await failure(provider, "bad request")
    assert (err.type, err.non_retryable) == ("ModelRequestRejected", True)
    assert "HTTP 400" in err.message
    assert "max_tokens is too large" in err.message
    assert "test-" in err.message  # names the profile


async def test_unmatched_script_is_a_non_retryable_rejection(provider):
    err = await failure(provider, "nobody scripted this")
    assert err.non_retryable is True
    assert "no reply matches" in err.message


async def test_no_api_key_in_error_text(provider):
    err = await failure(provider, "forbidden")
    assert err.non_retryable is True
    assert SECRET not in err.message
    assert SECRET not in str(err)
    assert "[redacted]" in err.message


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("flavour", ["openai", "anthropic"])
async def test_connection_refused_is_retryable_unavailable(flavour):
    base = f"http://127.0.0.1:{closed_port()}"
    profile = openai_profile(base + "/v1") if flavour == "openai" else anthropic_profile(base)
    err = await failure(provider_for(profile), "hello")
    assert (err.type, err.non_retryable) == ("ModelUnavailable", False)
    assert base in err.message
    assert SECRET not in str(err)


async def test_openai_reply_normalised(server):
    response = await provider_for(openai_profile(server.openai_base_url)).chat(ask("hello"))
    assert (response.text, response.input_tokens, response.output_tokens, response.model) == ("hi", 12, 3, "gpt-test")
    calls = (await provider_for(openai_profile(server.openai_base_url)).chat(ask("use a tool"))).tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("list_dir", {"path": "."})]


async def test_anthropic_reply_normalised(server):
    provider = provider_for(anthropic_profile(server.base_url))
    assert isinstance(provider, AnthropicProvider)
    response = await provider.chat(ask("hello"))
    assert (response.text, response.input_tokens, response.output_tokens, response.model) == (
        "hi",
        12,
        3,
        "claude-test",
    )


MODES = {
    "sync": {"stream": False},
    "streamed": {"stream": True},
    "background": {"mode": "background", "poll_interval_s": 0.05},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("flavour", "reply", "tool_call"),
    [
        ("openai", ["stop"], ["tool_calls"]),
        ("anthropic", ["end_turn"], ["tool_use"]),
    ],
)
async def test_the_finish_reason_is_read_off_each_provider_and_mode(server, flavour, reply, tool_call, mode):
    if flavour == "openai":
        provider = provider_for(openai_profile(server.openai_base_url, **MODES[mode]))
    else:
        provider = provider_for(anthropic_profile(server.base_url, **MODES[mode]))
    if flavour == "openai" and mode == "background":
        # The Responses API has no finish reason: its status is what says how it ended.
        reply = tool_call = ["completed"]
    assert (await provider.chat(ask("hello"))).finish_reasons == reply
    assert (await provider.chat(ask("use a tool"))).finish_reasons == tool_call


async def test_a_background_response_cut_at_its_limit_says_so(server):
    provider = provider_for(openai_profile(server.openai_base_url, **MODES["background"]))
    response = await provider.chat(ask("cut short"))
    assert (response.text, response.finish_reasons) == ("a reply cut at", ["max_output_tokens"])


async def test_tools_and_json_mode_reach_the_wire(server):
    tool = ChatTool(name="list_dir", description="list", json_schema={"type": "object", "properties": {}})
    request = ask("use a tool").model_copy(update={"tools": [tool], "json_mode": True})
    await provider_for(openai_profile(server.openai_base_url)).chat(request)
    logged = server.requests()[-1]
    assert (logged["tools"], logged["json_mode"]) == (["list_dir"], True)


async def test_compatible_server_without_key_still_works(server, monkeypatch):
    monkeypatch.delenv("PERDURE_TEST_KEY")
    response = await provider_for(openai_profile(server.openai_base_url)).chat(ask("hello"))
    assert response.text == "hi"


def test_missing_key_for_the_real_api_is_a_clear_non_retryable_error(monkeypatch):
    monkeypatch.delenv("PERDURE_TEST_KEY")
    profile = ModelProfile(name="real", provider="openai", model="gpt-4o-mini", api_key_env="PERDURE_TEST_KEY")
    with pytest.raises(ApplicationError) as caught:
        provider_for(profile)
    assert (caught.value.type, caught.value.non_retryable) == ("ModelCredentialsMissing", True)
    assert "PERDURE_TEST_KEY" in caught.value.message


async def test_scripted_profile_runs_one_in_process_server_per_script(tmp_path):
    script = tmp_path / "s.yaml"
    script.write_text("replies:\n  - content: offline\n")
    profile = ModelProfile(name="scripted", provider="scripted", model="scripted", script=str(script))
    provider = provider_for(profile)
    assert isinstance(provider, OpenAIProvider)
    assert (await provider.chat(ask("anything"))).text == "offline"
    assert scripted_server(str(script)) is scripted_server(str(tmp_path / "." / "s.yaml"))
    assert len(scripted_server(str(script)).requests()) == 1


def test_retry_after_forms():
    assert retry_after({"retry-after": "2.5"}) == timedelta(seconds=2.5)
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == timedelta(milliseconds=1500)
    assert retry_after({}) is None
    assert retry_after({"retry-after": "soon"}) is None
    later = datetime.now(UTC) + timedelta(seconds=60)
    delay = retry_after({"retry-after": format_datetime(later, usegmt=True)})
    assert timedelta(seconds=55) < delay <= timedelta(seconds=60)


def test_anthropic_messages_pair_tool_results_and_flatten_without_tools():
    messages = [
        ChatMessage(role="system", content="sys"),
        ChatMessage(role="user", content="go"),
        ChatMessage(
            role="assistant",
            content="looking",
            tool_calls=[
                ChatToolCall(id="t1", name="read_file", arguments='{"path": "a"}'),
                ChatToolCall(id="t2", name="list_dir", arguments=""),
            ],
        ),
        ChatMessage(role="tool", tool_call_id="t1", content="A"),
        ChatMessage(role="tool", tool_call_id="t2", content="B"),
        ChatMessage(role="user", content="last turn"),
    ]
    structured = _anthropic_messages(messages, structured_tools=True)
    assert [m["role"] for m in structured] == ["user", "assistant", "user"]
    assert [b["type"] for b in structured[1]["content"]] == ["text", "tool_use", "tool_use"]
    assert structured[1]["content"][1]["input"] == {"path": "a"}
    assert [b["type"] for b in structured[2]["content"]] == ["tool_result", "tool_result", "text"]
    flat = _anthropic_messages(messages, structured_tools=False)
    assert {b["type"] for m in flat for b in m["content"]} == {"text"}
    assert "[result of tool call t1]\nA" in [b["text"] for b in flat[2]["content"]]


@pytest.mark.parametrize("flavour", ["openai", "anthropic"])
async def test_calls_reuse_one_client_and_its_connection(flavour):
    # Building a client loads an SSL context (~60 ms), and a new connection is a new
    # handshake with a real API: a worker keeps one client per endpoint and key.
    with ScriptedServer(SCRIPT) as fresh:
        profile = openai_profile(fresh.openai_base_url) if flavour == "openai" else anthropic_profile(fresh.base_url)
        for _ in range(3):
            assert (await provider_for(profile).chat(ask("hello"))).text == "hi"
        assert len(fresh.requests()) == 3 and fresh.connections == 1
        # Another key is another client.
        other = profile.model_copy(update={"api_key_env": "PERDURE_OTHER_KEY"})
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PERDURE_OTHER_KEY", "sk-other")
            await provider_for(other).chat(ask("hello"))
        assert fresh.connections == 2


def sdks_loaded(probe: str) -> str:
    """Which model SDKs a fresh interpreter (as `perdure` is) has after running `probe`."""
    code = f"import sys\n{probe}\nprint(sorted({{'openai', 'anthropic'}} & set(sys.modules)))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout


@pytest.mark.slow
def test_the_worker_and_the_cli_load_no_model_sdk_until_a_profile_calls_one():
    # openai is ~13 MB of a worker's memory and ~0.3 s of every CLI command's start
    # (its whole typed API surface); anthropic more.
    assert sdks_loaded("import perdure.workers.orchestrator, perdure.starters.cli").strip() == "[]"


@pytest.mark.slow
def test_a_worker_whose_profiles_call_openai_loads_it_with_its_start_up_heap():
    # Loaded before the worker freezes its start-up heap (workers/heap.py), not at the first call.
    probe = (
        "from perdure.activities.models.profiles import ModelProfile\n"
        "from perdure.activities.models.providers import import_profiles_sdk\n"
        "import_profiles_sdk([ModelProfile(name='c', provider='anthropic', model='m')])\n"
        "print(sorted({'openai', 'anthropic'} & set(sys.modules)))\n"
        "import_profiles_sdk([ModelProfile(name='s', provider='scripted', model='m', script='s.yaml')])"
    )
    assert sdks_loaded(probe).split() == ["[]", "['openai']"]
