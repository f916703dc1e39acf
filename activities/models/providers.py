"""A provider-neutral chat call, and the mapping of provider failures onto Temporal retries.

Owns the normalised message model (`ChatMessage`, `ChatRequest`, `ChatResponse`),
the translation to and from the OpenAI chat-completions and Anthropic messages
APIs, and `provider_for(profile)`, which for scripted profiles starts an
in-process `ScriptedServer` so offline runs still go through the real `openai`
client over HTTP. SDK retries are off: Temporal's retry policy owns retries, and
every failure leaves here as an `ApplicationError` with a deliberate
`non_retryable`. API keys are read from the environment at call time and must
never appear in a message, a log line or a return value.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from perdure.activities.client_pool import pooled
from perdure.activities.models.attempts import ModelAttemptState, ModelError
from perdure.activities.models.profiles import ModelProfile
from perdure.activities.models.timeouts import MIN_REPLY_WAIT_S, reply_timed_out, request_timeout
from perdure.workflows.goal.contracts.goal_contracts import Usage

# Servers such as Ollama or llama.cpp accept any key, but the SDKs insist on one.
NO_KEY = "unused"
# The error type of the scripted server's offline refusal (activities/models/scripted.py, spelled out
# there too: this module imports the scripted server only when a profile uses it).
OFFLINE_ERROR_TYPE = "perdure_offline"
# Handle kinds, as heartbeat details name them (activities/models/attempts.py).
RESPONSE_HANDLE = "openai-response"
BATCH_HANDLE = "anthropic-batch"
RESPONSE_WAITING = ("queued", "in_progress")
# The attempt's status once a streamed reply has begun: from then on the provider bills it.
STREAMING = "streaming the reply"
# The one request of a batch perdure submits.
BATCH_CUSTOM_ID = "perdure-call"
# A cancel sent as the activity is cancelled: short, it must not hold up the cancellation.
CANCEL_TIMEOUT_S = 10.0
JSON_ONLY = "Reply with a single JSON value only: no prose, no code fences."


if TYPE_CHECKING:
    from perdure.activities.models.scripted import ScriptedServer


class ChatToolCall(BaseModel):
    id: str
    name: str
    arguments: str = Field(description="JSON text exactly as the model wrote it.")


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ChatToolCall] = Field(default_factory=list, description="Assistant messages only.")
    tool_call_id: str | None = Field(default=None, description="Tool messages only.")


class ChatTool(BaseModel):
    name: str
    description: str
    json_schema: dict[str, Any]


class ChatRequest(BaseModel):
    messages: list[ChatMessage]
    tools: list[ChatTool] = Field(default_factory=list)
    json_mode: bool = False
    max_output_tokens: int | None = Field(default=None, description="None: the profile's limit.")


class ChatResponse(BaseModel):
    text: str
    tool_calls: list[ChatToolCall] = Field(default_factory=list)
    input_tokens: int
    output_tokens: int
    model: str
    usage_estimated: bool = Field(default=False, description="The provider reported no usage: chars / 4.")
    finish_reasons: list[str] = Field(
        default_factory=list,
        description="Why the model stopped, in the provider's words: chat completions' finish_reason "
        "(stop, length, tool_calls), Anthropic's stop_reason (end_turn, max_tokens, tool_use), a background "
        "response's status or its incomplete reason (completed, max_output_tokens).",
    )


class ChatProvider(Protocol):
    profile: ModelProfile

    async def chat(self, request: ChatRequest, attempt: ModelAttemptState | None = None) -> ChatResponse:
        """One call; `attempt` (the activity's) carries the deadline and a background call's handle."""
        ...


# --- clients --------------------------------------------------------------------


def pooled_client(kind: str, make: Callable[[], Any], api_key: str, base_url: str | None, timeout_s: float) -> Any:
    """One SDK client per provider, endpoint, key and timeout (activities/client_pool.py):
    a kept client skips ~60 ms of SSL set-up and reuses its connections. The key is
    looked up by digest; the client itself holds it, as any SDK client does."""
    return pooled((kind, base_url, hashlib.sha256(api_key.encode()).hexdigest(), timeout_s), make)


class SdkProvider:
    """What both SDK providers hold: the profile, the key read at call time and the endpoint."""

    def __init__(self, profile: ModelProfile, api_key: str, base_url: str | None) -> None:
        self.profile = profile
        self._api_key = api_key
        self._base_url = base_url

    def _client(self, kind: str, sdk_client: Callable[..., Any]) -> Any:
        """The pooled SDK client; its own retries are off because Temporal's retry policy owns them."""
        return pooled_client(
            kind,
            lambda: sdk_client(
                api_key=self._api_key, base_url=self._base_url, max_retries=0, timeout=self.profile.timeout_s
            ),
            self._api_key,
            self._base_url,
            self.profile.timeout_s,
        )


# --- OpenAI and compatible servers ---------------------------------------------


class OpenAIProvider(SdkProvider):
    async def chat(self, request: ChatRequest, attempt: ModelAttemptState | None = None) -> ChatResponse:
        attempt = attempt or ModelAttemptState("a model call", self.profile.name)
        # Imported here, like anthropic below (a worker whose profiles call it has it from
        # the start: `import_profiles_sdk`).
        import openai

        client = self._client("openai", openai.AsyncOpenAI)
        limit = request.max_output_tokens or self.profile.max_output_tokens
        resuming = attempt.handle is not None and attempt.handle.kind == RESPONSE_HANDLE
        if resuming or self.profile.background_for(limit):
            return await self._background(client, request, limit, attempt)
        params: dict[str, Any] = {
            "model": self.profile.model,
            "messages": [_openai_message(m) for m in request.messages],
        }
        # api.openai.com wants max_completion_tokens (reasoning models reject
        # max_tokens); compatible servers mostly still only know max_tokens.
        params["max_completion_tokens" if self._base_url is None else "max_tokens"] = limit
        if request.tools:
            params["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.json_schema},
                }
                for t in request.tools
            ]
        if request.json_mode:
            params["response_format"] = {"type": "json_object"}
        attempt.status = "waiting for the reply"
        if self.profile.stream:
            return await self._streamed(client, params, attempt)
        try:
            completion = await client.chat.completions.create(
                **params, timeout=request_timeout(self.profile, attempt.deadline)
            )
        except openai.APIError as err:
            raise model_error(err, self.profile, self._api_key) from None
        usage = completion.usage
        if not completion.choices:
            raise self._no_choices(usage)
        message = completion.choices[0].message
        calls = [
            ChatToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "")
            for c in message.tool_calls or []
            if getattr(c, "function", None) is not None
        ]
        return ChatResponse(
            text=message.content or "",
            tool_calls=calls,
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
            model=completion.model or self.profile.model,
            finish_reasons=[c.finish_reason for c in completion.choices if c.finish_reason],
        )

    async def _streamed(self, client: Any, params: dict[str, Any], attempt: ModelAttemptState) -> ChatResponse:
        """The reply read chunk by chunk (`stream=True`), its text passed on as it arrives;
        the usage comes in the last chunk (`include_usage`)."""
        texts: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        # Choice index -> its finish_reason, sent in the choice's last chunk.
        finished: dict[int, str] = {}
        usage, model, choices = None, None, False

        async def read() -> None:
            nonlocal usage, model, choices
            stream = await client.chat.completions.create(
                **params,
                stream=True,
                stream_options={"include_usage": True},
                timeout=request_timeout(self.profile, attempt.deadline),
            )
            attempt.status = STREAMING
            async for chunk in stream:
                model = chunk.model or model
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    choices = True
                    if choice.finish_reason:
                        finished[choice.index] = choice.finish_reason
                    delta = choice.delta
                    if delta.content:
                        texts.append(delta.content)
                        attempt.live(delta.content)
                    for part in delta.tool_calls or []:
                        call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                        call["id"] = part.id or call["id"]
                        if part.function is not None:
                            call["name"] += part.function.name or ""
                            call["arguments"] += part.function.arguments or ""

        await read_stream(read, self.profile, self._api_key, attempt)
        if not choices:
            raise self._no_choices(usage)
        text, tool_calls = "".join(texts), [ChatToolCall(**calls[i]) for i in sorted(calls)]
        finish_reasons = [finished[i] for i in sorted(finished)]
        if usage is None:
            # A compatible server that ignores include_usage: never charge a reply as free.
            sent = "".join(str(m.get("content") or "") for m in params["messages"])
            written = text + "".join(c.name + c.arguments for c in tool_calls)
            activity_log_warning("streamed reply without usage: estimated", self.profile.name)
            return ChatResponse(
                text=text,
                tool_calls=tool_calls,
                input_tokens=estimate_tokens(sent),
                output_tokens=estimate_tokens(written),
                model=model or self.profile.model,
                usage_estimated=True,
                finish_reasons=finish_reasons,
            )
        return ChatResponse(
            text=text,
            tool_calls=tool_calls,
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            model=model or self.profile.model,
            finish_reasons=finish_reasons,
        )

    def _no_choices(self, usage: Any) -> ModelError:
        return ModelError(
            f"model profile '{self.profile.name}': the reply has no choices",
            usage=self._usage(usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0),
            type="ModelRetryable",
            non_retryable=False,
        )

    async def _background(
        self, client: Any, request: ChatRequest, limit: int, attempt: ModelAttemptState
    ) -> ChatResponse:
        """A Responses API call with background=true: submitted once, its id beaten, then polled.
        An attempt that finds an id in the last heartbeat polls that response instead."""
        import openai

        response = None
        if attempt.handle is None or attempt.handle.kind != RESPONSE_HANDLE:
            params = _responses_params(self.profile, request, limit)
            try:
                response = await client.responses.create(
                    **params, background=True, store=True, timeout=request_timeout(self.profile, attempt.deadline)
                )
            except openai.APIError as err:
                raise model_error(err, self.profile, self._api_key) from None
            attempt.record_handle(RESPONSE_HANDLE, response.id)
        assert attempt.handle is not None
        handle = attempt.handle.id

        async def poll() -> Any:
            try:
                return await client.responses.retrieve(handle, timeout=request_timeout(self.profile, attempt.deadline))
            except openai.APIError as err:
                raise model_error(err, self.profile, self._api_key) from None

        async def cancel() -> None:
            await client.responses.cancel(handle, timeout=CANCEL_TIMEOUT_S)

        response = await _poll_until(
            self.profile,
            attempt,
            poll,
            cancel,
            response,
            waiting=lambda r: r.status in RESPONSE_WAITING,
            describe=lambda r: str(r.status),
        )
        attempt.handle_done()
        return self._from_response(response)

    def _from_response(self, response: Any) -> ChatResponse:
        usage = response.usage
        input_tokens = usage.input_tokens if usage else 0
        output_tokens = usage.output_tokens if usage else 0
        incomplete = getattr(response.incomplete_details, "reason", None)
        # A reply cut at max_output_tokens is returned as chat completions return one cut
        # at the limit; any other end is a failure whose usage is known.
        cut_at_limit = response.status == "incomplete" and incomplete == "max_output_tokens"
        if response.status != "completed" and not cut_at_limit:
            error = response.error
            reason = f"{error.code}: {error.message}" if error else (incomplete or "no reason given")
            rejected = response.status == "incomplete"  # e.g. content_filter: the same request ends the same way
            raise ModelError(
                _redact(
                    f"model profile '{self.profile.name}': background response {response.id} "
                    f"{response.status}: {reason}",
                    self._api_key,
                ),
                usage=self._usage(input_tokens, output_tokens),
                type="ModelRequestRejected" if rejected else "ModelRetryable",
                non_retryable=rejected,
            )
        texts, calls = [], []
        for item in response.output or []:
            if item.type == "message":
                texts += [part.text for part in item.content or [] if part.type == "output_text"]
            elif item.type == "function_call":
                calls.append(ChatToolCall(id=item.call_id, name=item.name, arguments=item.arguments or ""))
        return ChatResponse(
            text="".join(texts),
            tool_calls=calls,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            model=response.model or self.profile.model,
            # The Responses API has no finish reason: its status says it, or why it stopped short.
            finish_reasons=[incomplete if cut_at_limit else response.status],
        )

    def _usage(self, input_tokens: int, output_tokens: int) -> Usage:
        return Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=self.profile.cost_usd(input_tokens, output_tokens),
        )


def _openai_message(m: ChatMessage) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        return {
            "role": "assistant",
            "content": m.content or None,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ],
        }
    return {"role": m.role, "content": m.content}


def _responses_params(profile: ModelProfile, request: ChatRequest, limit: int) -> dict[str, Any]:
    """A Responses API request: system messages become `instructions`, tool calls and their
    results `function_call` and `function_call_output` items."""
    items: list[dict[str, Any]] = []
    for m in request.messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            items.append({"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content})
            continue
        if m.content or m.role == "user":
            items.append({"role": m.role, "content": m.content})
        for c in m.tool_calls:
            items.append({"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments})
    params: dict[str, Any] = {"model": profile.model, "input": items, "max_output_tokens": limit}
    if system := "\n\n".join(m.content for m in request.messages if m.role == "system"):
        params["instructions"] = system
    if request.tools:
        params["tools"] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.json_schema,
                "strict": False,
            }
            for t in request.tools
        ]
    if request.json_mode:
        params["text"] = {"format": {"type": "json_object"}}
    return params


async def _poll_until(
    profile: ModelProfile,
    attempt: ModelAttemptState,
    poll: Callable[[], Awaitable[Any]],
    cancel: Callable[[], Awaitable[None]],
    current: Any,
    *,
    waiting: Callable[[Any], bool],
    describe: Callable[[Any], str],
) -> Any:
    """Poll a background call until it leaves its waiting states. Each poll beats (the
    handle stays in the details); cancelling the activity (an abort) cancels the call at
    the provider. Near the attempt's end the attempt ends ModelStillRunning and the next
    one polls the same call, or, on the last attempt, the call is cancelled and its cost
    is unknown."""
    try:
        while current is None or waiting(current):
            if current is not None:
                attempt.status = describe(current)
                attempt.beat()
                if attempt.seconds_left() < profile.poll_interval_s + 1:
                    await _still_running(profile, attempt, cancel)
                await asyncio.sleep(profile.poll_interval_s)
            current = await poll()
    except asyncio.CancelledError:
        await _cancel_quietly(cancel)
        raise
    return current


async def _still_running(profile: ModelProfile, attempt: ModelAttemptState, cancel: Callable[[], Awaitable[None]]):
    assert attempt.handle is not None
    where = f"model profile '{profile.name}': background call {attempt.handle.id}"
    if attempt.last_attempt:
        await _cancel_quietly(cancel)
        raise ModelError(
            f"{where} still running on the last attempt: cancelled",
            billed_unknown=True,
            type="ModelStillRunning",
            non_retryable=True,
        )
    raise ApplicationError(
        f"{where} still running at the end of attempt {attempt.attempt}; the next attempt polls it",
        type="ModelStillRunning",
        non_retryable=False,
        next_retry_delay=timedelta(seconds=profile.poll_interval_s),
    )


async def _cancel_quietly(cancel: Callable[[], Awaitable[None]]) -> None:
    """Best effort: the activity ends either way, and a call left running only costs."""
    try:
        await asyncio.wait_for(cancel(), CANCEL_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001 - a failed cancel must not mask why the activity ends
        log_cancel_failure(err)


def estimate_tokens(text: str) -> int:
    """About four characters a token: what a reply without reported usage is charged."""
    return (len(text) + 3) // 4


def activity_log_warning(message: str, profile: str) -> None:
    if activity.in_activity():
        activity.logger.warning(message, extra={"profile": profile})


def log_cancel_failure(err: Exception) -> None:
    if activity.in_activity():
        activity.logger.warning("cancelling a background model call failed", extra={"error": type(err).__name__})


# --- Anthropic -------------------------------------------------------------------


class AnthropicProvider(SdkProvider):
    async def chat(self, request: ChatRequest, attempt: ModelAttemptState | None = None) -> ChatResponse:
        attempt = attempt or ModelAttemptState("a model call", self.profile.name)
        params = self._params(request)
        # Imported here: the anthropic package costs ~3 s of worker start-up, paid
        # only by workers that use an Anthropic profile.
        import anthropic

        client = self._client("anthropic", anthropic.AsyncAnthropic)
        resuming = attempt.handle is not None and attempt.handle.kind == BATCH_HANDLE
        if resuming or self.profile.background_for(params["max_tokens"]):
            return await self._batch(client, params, attempt)
        attempt.status = "waiting for the reply"
        if self.profile.stream:
            return await self._streamed(client, params, attempt)
        try:
            message = await client.messages.create(**params, timeout=request_timeout(self.profile, attempt.deadline))
        except anthropic.APIError as err:
            raise model_error(err, self.profile, self._api_key) from None
        return self._normalised(message)

    async def _streamed(self, client: Any, params: dict[str, Any], attempt: ModelAttemptState) -> ChatResponse:
        """The reply read as the SDK's message stream, its text passed on as it arrives."""
        final: list[Any] = []

        async def read() -> None:
            timeout = request_timeout(self.profile, attempt.deadline)
            async with client.messages.stream(**params, timeout=timeout) as stream:
                attempt.status = STREAMING
                async for event in stream:
                    if event.type == "text":
                        attempt.live(event.text)
                final.append(await stream.get_final_message())

        await read_stream(read, self.profile, self._api_key, attempt)
        return self._normalised(final[0])

    def _params(self, request: ChatRequest) -> dict[str, Any]:
        system = "\n\n".join(m.content for m in request.messages if m.role == "system")
        if request.json_mode:
            system = f"{system}\n\n{JSON_ONLY}".strip()
        params: dict[str, Any] = {
            "model": self.profile.model,
            "max_tokens": request.max_output_tokens or self.profile.max_output_tokens,
            "messages": _anthropic_messages(request.messages, structured_tools=bool(request.tools)),
        }
        if system:
            # The system prompt holds the stable parts (constraints, tools), so it
            # is the prefix worth caching across a goal's calls.
            params["system"] = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
        if request.tools:
            params["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.json_schema} for t in request.tools
            ]
        return params

    async def _batch(self, client: Any, params: dict[str, Any], attempt: ModelAttemptState) -> ChatResponse:
        """A Message Batch of this one request: created once, its id beaten, polled until it
        has ended, then its one result read. An attempt that finds an id resumes that batch."""
        import anthropic

        batch = None
        if attempt.handle is None or attempt.handle.kind != BATCH_HANDLE:
            try:
                batch = await client.messages.batches.create(
                    requests=[{"custom_id": BATCH_CUSTOM_ID, "params": params}],
                    timeout=request_timeout(self.profile, attempt.deadline),
                )
            except anthropic.APIError as err:
                raise model_error(err, self.profile, self._api_key) from None
            attempt.record_handle(BATCH_HANDLE, batch.id)
        assert attempt.handle is not None
        handle = attempt.handle.id

        async def poll() -> Any:
            try:
                return await client.messages.batches.retrieve(
                    handle, timeout=request_timeout(self.profile, attempt.deadline)
                )
            except anthropic.APIError as err:
                raise model_error(err, self.profile, self._api_key) from None

        async def cancel() -> None:
            await client.messages.batches.cancel(handle, timeout=CANCEL_TIMEOUT_S)

        await _poll_until(
            self.profile,
            attempt,
            poll,
            cancel,
            batch,
            waiting=lambda b: b.processing_status != "ended",
            describe=lambda b: f"batch {b.processing_status}",
        )
        try:
            results = [r async for r in await client.messages.batches.results(handle)]
        except anthropic.APIError as err:
            raise model_error(err, self.profile, self._api_key) from None
        attempt.handle_done()
        result = next((r.result for r in results if r.custom_id == BATCH_CUSTOM_ID), None)
        where = f"model profile '{self.profile.name}': batch {handle}"
        if result is None:
            raise ModelError(f"{where} ended without a result", billed_unknown=True, type="ModelRetryable")
        if result.type == "succeeded":
            return self._normalised(result.message)
        if result.type == "errored":
            error = getattr(result.error, "error", None)
            kind = getattr(error, "type", "api_error")
            message = _redact(f"{where}: {kind}: {getattr(error, 'message', '')}", self._api_key)
            # The request's own fault fails again; anything else may pass on a new batch.
            rejected = kind == "invalid_request_error"
            failure = "ModelRequestRejected" if rejected else "ModelRetryable"
            raise ModelError(message, type=failure, non_retryable=rejected)
        # canceled or expired: never processed, never billed.
        raise ModelError(f"{where}: the request was {result.type}", type="ModelRetryable")

    def _normalised(self, message: Any) -> ChatResponse:
        texts, calls = [], []
        for block in message.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                calls.append(ChatToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input)))
        usage = message.usage
        # Cached prompt tokens are reported apart from input_tokens; count them
        # all at the input price so budgets never under-count.
        input_tokens = (
            usage.input_tokens + (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)
        )
        return ChatResponse(
            text="".join(texts),
            tool_calls=calls,
            input_tokens=input_tokens,
            output_tokens=usage.output_tokens,
            model=message.model or self.profile.model,
            finish_reasons=[message.stop_reason] if message.stop_reason else [],
        )


def _anthropic_messages(messages: list[ChatMessage], structured_tools: bool) -> list[dict[str, Any]]:
    """Alternating user/assistant messages; tool results become user tool_result blocks.

    Without tools on offer, earlier tool calls and results are rendered as text,
    because tool_use/tool_result blocks need tool definitions in the request.
    """
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if m.role == "system":
            continue
        if m.role == "user":
            add("user", [{"type": "text", "text": m.content}] if m.content else [])
        elif m.role == "tool" and structured_tools:
            add("user", [{"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}])
        elif m.role == "tool":
            add("user", [{"type": "text", "text": f"[result of tool call {m.tool_call_id}]\n{m.content}"}])
        else:
            blocks = [{"type": "text", "text": m.content}] if m.content else []
            for c in m.tool_calls:
                if structured_tools:
                    blocks.append(
                        {"type": "tool_use", "id": c.id, "name": c.name, "input": _arguments_object(c.arguments)}
                    )
                else:
                    blocks.append({"type": "text", "text": f"[tool call {c.id}: {c.name} {c.arguments}]"})
            add("assistant", blocks)
    # A tool_result block must come before any text in its user message.
    for message in out:
        if message["role"] == "user":
            message["content"].sort(key=lambda b: b["type"] != "tool_result")
    return out


def _arguments_object(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {"raw": arguments}
    return value if isinstance(value, dict) else {"raw": arguments}


# --- errors ------------------------------------------------------------------------


def model_error(err: Exception, profile: ModelProfile, api_key: str | None = None) -> ModelError:
    """The ApplicationError Temporal should see for a failed provider call, with what it cost.

    408, 409, 429 and 5xx retry (after Retry-After when given); other 4xx are
    the request's fault and do not; unreachable servers retry. A timeout before the
    provider accepted the request retries; one while waiting for the reply does not:
    the provider took the request and bills it, and the wait was already as long as
    the attempt allows (activities/models/timeouts.py), so a re-send would pay again
    for the same outcome. Usage in an error body is kept on the error. The scripted
    server's offline refusal (no model ran) is `ModelOffline`, in its own words.
    """
    where = f"model profile '{profile.name}' ({profile.provider}, {profile.model})"
    status = getattr(err, "status_code", None)
    if isinstance(status, int):
        response = getattr(err, "response", None)
        body = getattr(err, "body", None)
        reason = _redact(_provider_message(body) or str(err), api_key)
        if _provider_error_type(body) == OFFLINE_ERROR_TYPE:
            return ModelError(reason, type="ModelOffline", non_retryable=True)
        message = f"{where}: HTTP {status}: {reason}"
        usage = _error_usage(body, profile) or _error_usage(_response_json(response), profile)
        if status in (408, 409, 429) or status >= 500:
            delay = retry_after(response.headers) if response is not None else None
            return ModelError(message, usage=usage, type="ModelRetryable", non_retryable=False, next_retry_delay=delay)
        return ModelError(message, usage=usage, type="ModelRequestRejected", non_retryable=True)
    if isinstance(err, _connection_errors()) and reply_timed_out(err):
        return _reply_timed_out(profile, api_key)
    if isinstance(err, _connection_errors()):
        cause = f" ({err.__cause__})" if err.__cause__ else ""
        target = profile.base_url or "the provider's API"
        message = _redact(f"{where}: cannot reach {target}: {err}{cause}", api_key)
        return ModelError(message, type="ModelUnavailable", non_retryable=False)
    # Anything else (e.g. a reply that does not fit the schema) is treated as transient;
    # a reply arrived, so it may be billed.
    return ModelError(
        _redact(f"{where}: {type(err).__name__}: {err}", api_key), billed_unknown=True, type="ModelRetryable"
    )


async def read_stream(
    read: Callable[[], Awaitable[None]], profile: ModelProfile, api_key: str, attempt: ModelAttemptState
) -> None:
    """Read a streamed reply to its end within the attempt. Until the reply has begun
    (`attempt.status` is STREAMING) a failure is the provider's error as ever
    (`model_error`). Once it has begun the provider has the request and bills it: a reply
    that breaks off is retried with its cost unknown; one still being written when the
    attempt's time is up is not retried, as a reply that never came in time is not."""
    try:
        async with asyncio.timeout(max(MIN_REPLY_WAIT_S, attempt.seconds_left())):
            await read()
    except TimeoutError:
        raise _reply_timed_out(profile, api_key) from None
    except Exception as err:
        status = getattr(err, "status_code", None)
        # An error event inside the stream (Anthropic's overloaded_error mid-reply) comes as a
        # status error carrying the stream's own 200: the reply broke off, it was not refused.
        if attempt.status != STREAMING or (isinstance(status, int) and status >= 300):
            raise model_error(err, profile, api_key) from None
        if isinstance(err, _connection_errors()) and reply_timed_out(err):
            raise _reply_timed_out(profile, api_key) from None
        reason = err.__cause__ or err
        raise ModelError(
            _redact(
                f"model profile '{profile.name}' ({profile.provider}, {profile.model}): the reply broke off: "
                f"{type(reason).__name__}: {reason}",
                api_key,
            ),
            billed_unknown=True,
            type="ModelRetryable",
            non_retryable=False,
        ) from None


def _reply_timed_out(profile: ModelProfile, api_key: str | None) -> ModelError:
    where = f"model profile '{profile.name}' ({profile.provider}, {profile.model})"
    return ModelError(
        _redact(
            f"{where}: no reply within this attempt's time; the provider may bill the request all the same. "
            'For calls this long set mode = "background" on the profile',
            api_key,
        ),
        billed_unknown=True,
        type="ModelReplyTimedOut",
        non_retryable=True,
    )


def _response_json(response: Any) -> object:
    """The whole error body (the OpenAI SDK keeps only its `error` member as `body`)."""
    try:
        return response.json() if response is not None else None
    except (ValueError, AttributeError, RuntimeError):
        return None


def _error_usage(body: object, profile: ModelProfile) -> Usage | None:
    """Usage an error body reports (either provider's field names), else None."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    try:
        input_tokens = int(usage.get("input_tokens", usage.get("prompt_tokens", 0)))
        output_tokens = int(usage.get("output_tokens", usage.get("completion_tokens", 0)))
    except (TypeError, ValueError):
        return None
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=profile.cost_usd(input_tokens, output_tokens),
    )


def _connection_errors() -> tuple[type[BaseException], ...]:
    # Only an SDK that is imported can have raised one.
    return tuple(sdk.APIConnectionError for name in ("openai", "anthropic") if (sdk := sys.modules.get(name)))


def _provider_error_type(body: object) -> str | None:
    """The `type` of an error body: the OpenAI client's (the inner error object) or the raw one."""
    if not isinstance(body, dict):
        return None
    inner = body.get("error")
    return str((inner if isinstance(inner, dict) else body).get("type") or "") or None


def _provider_message(body: object) -> str | None:
    if not isinstance(body, dict):
        return str(body)[:1000] if body else None
    inner = body.get("error")
    if isinstance(inner, dict) and inner.get("message"):
        return str(inner["message"])
    return str(body["message"]) if body.get("message") else None


def retry_after(headers: Any) -> timedelta | None:
    """The server's requested wait: `retry-after-ms`, `retry-after` seconds or an HTTP-date."""
    if headers is None:
        return None
    if ms := headers.get("retry-after-ms"):
        try:
            return timedelta(milliseconds=max(0.0, float(ms)))
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return timedelta(seconds=max(0.0, float(value)))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return timedelta(seconds=max(0.0, when.timestamp() - time.time()))


def _redact(text: str, secret: str | None) -> str:
    # Defence in depth: SDK errors should not echo keys, but a misbehaving
    # proxy could put the Authorization header into an error body.
    if secret and secret != NO_KEY and len(secret) >= 6:
        return text.replace(secret, "[redacted]")
    return text


# --- choosing a provider --------------------------------------------------------------


# ScriptedServer is imported at first use: a worker with no scripted profile never loads
# the scripted server (its YAML and HTTP parts).
_scripted_servers: dict[str, ScriptedServer] = {}
_scripted_lock = threading.Lock()


def scripted_server(script: str) -> ScriptedServer:
    """The one in-process server for this script path, started on first use."""
    key = str(Path(script).resolve())
    with _scripted_lock:
        server = _scripted_servers.get(key)
        if server is None:
            from perdure.activities.models.scripted import ScriptedServer

            server = ScriptedServer(Path(key)).start()
            _scripted_servers[key] = server
        return server


def import_profiles_sdk(profiles: Iterable[ModelProfile]) -> None:
    """Import openai now when a profile calls it (openai-compatible or scripted): ~13 MB and
    ~45,000 objects (its whole typed API surface), which a worker whose profiles call no
    such model never loads, and which one that does should load before it freezes its
    start-up heap (workers/heap.py) rather than at its first call, where every later full
    collection would walk them. anthropic stays imported at its first call (~3 s)."""
    if any(p.provider in ("openai", "scripted") for p in profiles):
        import openai  # noqa: F401 - imported for its side effect on the heap


def provider_for(profile: ModelProfile) -> ChatProvider:
    """A provider for one call; reads the key from the environment now, never stores it elsewhere."""
    if profile.provider == "scripted":
        if not profile.script:
            raise ApplicationError(
                f"model profile '{profile.name}' is scripted but names no script file",
                type="ModelProfileInvalid",
                non_retryable=True,
            )
        return OpenAIProvider(profile, api_key=NO_KEY, base_url=scripted_server(profile.script).openai_base_url)
    api_key = os.environ.get(profile.api_key_env) if profile.api_key_env else None
    if not api_key and profile.base_url is None:
        raise ApplicationError(
            f"model profile '{profile.name}' needs an API key: set {profile.api_key_env or 'api_key_env'} "
            "in the worker's environment",
            type="ModelCredentialsMissing",
            non_retryable=True,
        )
    if profile.provider == "anthropic":
        return AnthropicProvider(profile, api_key=api_key or NO_KEY, base_url=profile.base_url)
    return OpenAIProvider(profile, api_key=api_key or NO_KEY, base_url=profile.base_url)
