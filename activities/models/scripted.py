"""A scripted model server: canned replies over the real OpenAI and Anthropic wire formats.

Owns the script format, request matching and the HTTP server that answers
`POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic) with
JSON shaped exactly like the real APIs, and the calls that run on their own and are
polled: OpenAI's Responses API (`POST /v1/responses`, with `background: true`;
`GET /v1/responses/{id}`; `POST /v1/responses/{id}/cancel`) and Anthropic's
Message Batches (`POST /v1/messages/batches`, `GET .../{id}`, `GET .../{id}/results`,
`POST .../{id}/cancel`), so offline runs and tests exercise the
real `openai` and `anthropic` clients, their error classes and our retry
mapping. It must stay deterministic and never call a real model; a request no
entry matches is a clear 400, never something a client would retry. It is a test
double, but not only for tests: the `scripted` model provider (`perdure demo`,
offline runs) starts one in the worker process, so it imports nothing from tests.

Script: `{"replies": [entry, ...]}`; the first unspent entry (file order) whose
`when` (a substring, or a list of substrings that must all occur, of any message,
system included) and `when_last` (substring of the last message) match wins.
With `policy: offline`, a chat-completions request no entry matches is answered by
the offline policy (`offline_reply`), which builds a deterministic reply from the
request itself, so any goal or plan runs offline; `steps` gives that policy a
step's tool arguments (`steps: {STEP: {TOOL: {arg: value}}}`). An entry replies with exactly one of `content`,
`json`, `tool_calls` or `status` (+ `body`, `headers`), or `tool_calls` with `content` (the
text a model writes beside its calls, as the real APIs carry it); `times` limits its uses;
`usage` overrides the chars/4 token estimate; `delay_s` makes the server wait that
long after logging the request before it answers (a slow model, or a window in
which a crash test kills the caller mid-call). A background response or a batch
stays in progress for `in_progress_polls` polls and `in_progress_s` seconds after it
was created, then ends as `background_status` says (a `status` entry ends a batch's
request errored). `requests()` lists the model requests (a background create is one;
polls are not), `handle_events()` the creates, polls, cancels and result reads of
handles. A request with `stream: true` (chat completions or messages) gets the same reply
as server-sent events in that API's streaming format, a word per chunk: `chunk_delay_s`
paces the chunks (a model writing slowly), `cut_after_chunks` drops the connection after
that many (a reply that breaks off). `requests_per_minute` (rate limit mode) answers a
model request past that many in a sliding minute with a 429 and `retry-after`, in the
API's own error body and rate-limit headers.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from perdure.testing.http import BackgroundHTTPServer, JSONHandler, serve_until_interrupted

log = structlog.get_logger(__name__)

Flavour = Literal["openai", "anthropic", "responses"]
NO_MATCH = "scripted server: no reply matches the request"
EXCERPT_CHARS = 2000
# The markers of activities/models/model_activities.py's prompts, spelled out here because
# this module must not import the activities (the scripted provider imports it).
PLANNER_MARK, STEP_MARK, AGENT_MARK, DRIFT_MARK = (
    "[PERDURE-PLANNER]",
    "[PERDURE-STEP]",
    "[PERDURE-AGENT]",
    "[PERDURE-DRIFT]",
)
# The tool an agent is offered to read compacted outputs; the policy never calls it.
COMPACTION_TOOL = "read_artifact"
OFFLINE_EXCERPT_CHARS = 80


class ScriptedToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] | str = Field(
        default_factory=dict, description="A dict (JSON-encoded on the wire) or a raw string sent verbatim."
    )

    def wire_arguments(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


class ScriptedUsage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)


class ScriptedReply(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, coerce_numbers_to_str=True)

    when: str | list[str] | None = None
    when_last: str | None = None
    times: int | None = Field(default=None, ge=1)
    content: str | None = None
    json_value: Any = Field(default=None, alias="json")
    tool_calls: list[ScriptedToolCall] | None = None
    status: int | None = Field(default=None, ge=400, le=599)
    body: dict[str, Any] | str | None = Field(default=None, description="Error body (dict verbatim) or message.")
    headers: dict[str, str] = Field(default_factory=dict)
    usage: ScriptedUsage | None = None
    delay_s: float = Field(default=0.0, ge=0, le=300)
    in_progress_polls: int = Field(default=0, ge=0, description="Background calls: polls answered in progress.")
    in_progress_s: float = Field(default=0.0, ge=0, le=3600, description="Background calls: seconds in progress.")
    background_status: Literal["completed", "failed", "incomplete"] = Field(
        default="completed", description="How a background response ends (incomplete: cut at max_output_tokens)."
    )
    chunk_delay_s: float = Field(default=0.0, ge=0, le=60, description="Streamed replies: the wait between chunks.")
    cut_after_chunks: int | None = Field(
        default=None, ge=0, description="Streamed replies: the connection drops after this many chunks."
    )
    stream_usage: bool = Field(
        default=True, description="Streamed chat completions: false ignores include_usage (no usage chunk)."
    )

    @model_validator(mode="after")
    def _one_kind_of_reply(self) -> ScriptedReply:
        kinds = [k for k in ("content", "json_value", "tool_calls", "status") if k in self.model_fields_set]
        if kinds == ["content", "tool_calls"]:
            kinds = ["tool_calls"]  # text beside tool calls, as a model may write it
        if len(kinds) != 1:
            named = ", ".join(k.removesuffix("_value") for k in kinds) or "none"
            raise ValueError(f"an entry needs exactly one of content, json, tool_calls, status (got: {named})")
        if self.body is not None and self.status is None:
            raise ValueError("body is only for error entries (with status)")
        return self

    def reply_text(self) -> str:
        if self.content is not None:
            return self.content
        if "json_value" in self.model_fields_set:
            return json.dumps(self.json_value)
        return ""


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replies: list[ScriptedReply] = Field(default_factory=list)
    policy: Literal["none", "offline"] = Field(
        default="none", description="offline: answer what no entry matches with `offline_reply`; none: a 400."
    )
    steps: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict, description="Offline policy: step name -> tool name -> the arguments to call it with."
    )
    requests_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="Rate limit mode: a model request past this many a minute (in a sliding `rate_window_s`, "
        "scaled) is answered 429 with Retry-After, as the real APIs answer it (`rate_limited()` counts them).",
    )
    rate_window_s: float = Field(
        default=60, gt=0, le=60, description="Rate limit mode: the sliding window; a shorter one lets a test be short."
    )


def load_script(source: Path | str | dict) -> Script:
    """A script from an in-memory dict or a .yaml/.yml/.json file."""
    if isinstance(source, dict):
        return Script.model_validate(source)
    path = Path(source)
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return Script.model_validate(data)


class SeenRequest(BaseModel):
    """What matching needs from a request, whichever wire format it came in."""

    flavour: Flavour
    model: str
    all_text: str
    last_text: str
    tools: list[str]
    json_mode: bool


def _parts_text(content: Any) -> str:
    """Text of an OpenAI content (string or parts) or an Anthropic content (string or blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_result":
            texts.append(_parts_text(block.get("content")))
        elif block.get("type") == "tool_use":
            texts.append(f"{block.get('name', '')} {json.dumps(block.get('input', {}))}")
        elif "text" in block:
            texts.append(str(block["text"]))
    return "\n".join(texts)


def seen_openai(body: dict) -> SeenRequest:
    messages = body.get("messages") or []
    texts = []
    for m in messages:
        texts.append(_parts_text(m.get("content")))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            texts.append(f"{fn.get('name', '')} {fn.get('arguments', '')}")
    response_format = body.get("response_format") or {}
    return SeenRequest(
        flavour="openai",
        model=str(body.get("model", "")),
        all_text="\n".join(texts),
        last_text=_parts_text(messages[-1].get("content")) if messages else "",
        tools=[t.get("function", {}).get("name", "") for t in body.get("tools") or []],
        json_mode=response_format.get("type") in ("json_object", "json_schema"),
    )


def seen_anthropic(body: dict) -> SeenRequest:
    messages = body.get("messages") or []
    texts = [_parts_text(body.get("system"))] + [_parts_text(m.get("content")) for m in messages]
    return SeenRequest(
        flavour="anthropic",
        model=str(body.get("model", "")),
        all_text="\n".join(texts),
        last_text=_parts_text(messages[-1].get("content")) if messages else "",
        tools=[t.get("name", "") for t in body.get("tools") or []],
        json_mode=False,
    )


def seen_responses(body: dict) -> SeenRequest:
    """A Responses API request: `instructions` and `input` items (messages, function calls and their outputs)."""
    items = body.get("input") or []
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    texts = [_parts_text(body.get("instructions"))]
    last = ""
    for item in items:
        if item.get("type") == "function_call":
            last = f"{item.get('name', '')} {item.get('arguments', '')}"
        elif item.get("type") == "function_call_output":
            last = str(item.get("output", ""))
        else:
            last = _parts_text(item.get("content"))
        texts.append(last)
    text_format = (body.get("text") or {}).get("format") or {}
    return SeenRequest(
        flavour="responses",
        model=str(body.get("model", "")),
        all_text="\n".join(texts),
        last_text=last,
        tools=[t.get("name", "") for t in body.get("tools") or []],
        json_mode=text_format.get("type") in ("json_object", "json_schema"),
    )


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_body(flavour: Flavour, status: int, message: str) -> dict:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    if flavour == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def openai_completion(n: int, seen: SeenRequest, entry: ScriptedReply, usage: ScriptedUsage) -> dict:
    text = entry.reply_text() if not entry.tool_calls else entry.content or None
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if entry.tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_scripted_{n}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.wire_arguments()},
            }
            for i, c in enumerate(entry.tool_calls)
        ]
    return {
        "id": f"chatcmpl-scripted-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": seen.model or "scripted",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if entry.tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }


def anthropic_message(n: int, seen: SeenRequest, entry: ScriptedReply, usage: ScriptedUsage) -> dict:
    content: list[dict] = []
    if entry.reply_text():
        content.append({"type": "text", "text": entry.reply_text()})
    for i, call in enumerate(entry.tool_calls or []):
        content.append(
            {"type": "tool_use", "id": f"toolu_scripted_{n}_{i}", "name": call.name, "input": _tool_input(call)}
        )
    return {
        "id": f"msg_scripted_{n}",
        "type": "message",
        "role": "assistant",
        "model": seen.model or "scripted",
        "content": content,
        "stop_reason": "tool_use" if entry.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
    }


def _tool_input(call: ScriptedToolCall) -> dict:
    # Anthropic's wire format carries `input` as an object, so raw (possibly
    # malformed) argument text can only travel wrapped.
    if isinstance(call.arguments, dict):
        return call.arguments
    try:
        value = json.loads(call.arguments)
    except ValueError:
        return {"raw": call.arguments}
    return value if isinstance(value, dict) else {"raw": call.arguments}


def _words(text: str) -> list[str]:
    """The text in the pieces a streamed reply sends it in: a word with its trailing space."""
    return re.findall(r"\s*\S+\s*", text) or ([text] if text else [])


def openai_stream(completion: dict, include_usage: bool) -> list[tuple[str | None, Any]]:
    """A chat completion as the `chat.completion.chunk` events of a streamed one."""
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: dict, finish: str | None = None) -> tuple[None, dict]:
        return None, {
            "id": completion["id"],
            "object": "chat.completion.chunk",
            "created": completion["created"],
            "model": completion["model"],
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": word}) for word in _words(message.get("content") or "")]
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        head = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": function["name"], "arguments": ""},
        }
        events.append(chunk({"tool_calls": [head]}))
        events += [
            chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]})
            for part in _words(function["arguments"])
        ]
    events.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        events.append((None, {**chunk({})[1], "choices": [], "usage": completion["usage"]}))
    events.append((None, "[DONE]"))
    return events


def anthropic_stream(message: dict) -> list[tuple[str | None, Any]]:
    """A message as the named events of a streamed one (message_start ... message_stop)."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[tuple[str | None, Any]] = [("message_start", {"type": "message_start", "message": start})]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            opened = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": word} for word in _words(block["text"])]
        else:
            opened = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": part} for part in _words(json.dumps(block["input"]))]
        events.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": opened}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}) for d in deltas]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append(
        ("message_delta", {"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage["output_tokens"]}})
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def responses_object(job: Job, status: str) -> dict:
    """A Responses API `response` in `status`; output and usage once it has ended."""
    entry, usage = job.entry, job.usage
    ended = status in ("completed", "incomplete", "failed")
    output: list[dict] = []
    if status in ("completed", "incomplete"):
        if entry.reply_text():
            text = entry.reply_text()
            output.append(
                {
                    "type": "message",
                    "id": f"msg_scripted_{job.n}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        for i, call in enumerate(entry.tool_calls or []):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_scripted_{job.n}_{i}",
                    "call_id": f"call_scripted_{job.n}_{i}",
                    "name": call.name,
                    "arguments": call.wire_arguments(),
                    "status": "completed",
                }
            )
    return {
        "id": job.id,
        "object": "response",
        "created_at": int(job.created),
        "status": status,
        "background": True,
        "model": job.seen.model or "scripted",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": {"code": "server_error", "message": "scripted failure"} if status == "failed" else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "usage": (
            {
                "input_tokens": usage.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.input_tokens + usage.output_tokens,
            }
            if ended
            else None
        ),
    }


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def batch_object(job: Job, status: str, results_url: str) -> dict:
    """A Message Batch of one request in `status` (in_progress, canceling, ended)."""
    ended = status == "ended"
    outcome = job.batch_outcome() if ended else None
    counts = {"processing": 0 if ended else 1, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    if outcome:
        counts[outcome] = 1
    return {
        "id": job.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": counts,
        "created_at": _iso(job.created),
        "expires_at": _iso(job.created + timedelta(days=1).total_seconds()),
        "ended_at": _iso(time.time()) if ended else None,
        "cancel_initiated_at": _iso(time.time()) if job.cancelled else None,
        "archived_at": None,
        "results_url": results_url if ended else None,
    }


@dataclass
class Job:
    """A background response or a batch: the entry it answers with, and how long it runs."""

    kind: Literal["response", "batch"]
    id: str
    n: int
    entry: ScriptedReply
    seen: SeenRequest
    usage: ScriptedUsage
    polls_left: int
    ready_at: float
    created: float
    custom_id: str = ""
    cancelled: bool = False

    def status(self, poll: bool) -> str:
        """The status now; a poll spends one of the scripted in-progress polls."""
        running = self.polls_left > 0 or time.monotonic() < self.ready_at
        if poll and self.polls_left > 0:
            self.polls_left -= 1
        if self.kind == "batch":
            return "ended" if not running or self.cancelled else "in_progress"
        if self.cancelled:
            return "cancelled"
        return ("queued" if not poll else "in_progress") if running else self.entry.background_status

    def batch_outcome(self) -> str:
        if self.cancelled:
            return "canceled"
        return "errored" if self.entry.status else "succeeded"

    def batch_result(self) -> dict:
        outcome = self.batch_outcome()
        if outcome == "succeeded":
            result: dict = {
                "type": "succeeded",
                "message": anthropic_message(self.n, self.seen, self.entry, self.usage),
            }
        elif outcome == "errored":
            text = self.entry.body if isinstance(self.entry.body, str) else f"scripted error {self.entry.status}"
            kind = _ERROR_TYPES.get(self.entry.status or 500, "api_error")
            result = {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": text}}}
        else:
            result = {"type": outcome}
        return {"custom_id": self.custom_id, "result": result}


# --- the offline policy: a reply derived from the request, for any plan ----------

# A step's verify question (activities/goal/recheck.py's marker, spelled out as above).
VERIFY_MARK = "[PERDURE-VERIFY]"
# The router's prompts (activities/router/router_activities.py): its choice of a goal, its quick answer.
ROUTER_MARK, ROUTER_ANSWER_MARK = "[PERDURE-ROUTER]", "[PERDURE-ROUTER-ANSWER]"
# The watchdog's judge (activities/watchdog/watchdog_model.py) and a planner call that revises a running
# plan (activities/models/model_activities.py's revision_block), spelled out as above.
JUDGE_MARK = "PERDURE-WATCHDOG-JUDGE"
REVISION_MARK = "Revise the current plan."
# The error type of the policy's refusal to plan a goal's text: activities/models/providers.py
# reads it as "no model ran", not as a request the caller got wrong.
OFFLINE_ERROR_TYPE = "perdure_offline"
OFFLINE_MODEL = (
    "the model profile is perdure's offline stand-in (what 'default' is when the worker has no "
    "OPENAI_API_KEY, ANTHROPIC_API_KEY or OPENAI_BASE_URL)"
)
NO_PLAN_OFFLINE = (
    f"no model ran: {OFFLINE_MODEL}, which cannot plan a goal from its text, so nothing was done toward this "
    "goal. Set a model key where the worker runs and restart it, or start the goal with a plan file "
    "(perdure start --plan FILE), which runs offline."
)
NO_ANSWER_OFFLINE = (
    f"[offline] no model ran: {OFFLINE_MODEL}, so this question was not answered. "
    "Set a model key where the worker runs and restart it to get answers."
)
NO_JUDGEMENT_OFFLINE = {
    "verdict": "healthy",
    "reason": f"offline: no model judged this goal ({OFFLINE_MODEL}); the rules' finding stands",
    "confidence": 0,
}
# Words a message starts with when it asks rather than tells (the router answers it lightly);
# not "do" or "have", which start orders as often ("do a review of …").
QUESTION_WORDS = frozenset(
    "what which who whom whose when where why how is are am was were does did can could should would will".split()
)


def offline_reply(body: dict, steps: dict[str, dict[str, dict[str, Any]]]) -> ScriptedReply | None:
    """What the offline policy answers a chat-completions request, or None when it is no perdure call.

    planner: a goal's text is refused with an error of type OFFLINE_ERROR_TYPE saying that no
    model ran and nothing was done (a canned plan would pass for work); a revision of a running
    plan (queued work) gets one llm step that works toward the goal text. drift check: on track.
    verify question: HOLDS (offline, nothing new is known, so the step's work is kept).
    router: a question is a light request, answered by saying no model ran; anything else goes
    to the candidate goal whose text shares the most words with it (at least two), else a new
    goal. watchdog judge: healthy at confidence 0, saying no model judged (no action follows).
    llm step: a short text naming the step, its prompt and its inputs. agent step: each offered
    tool once, one per turn in the order offered, with the arguments `steps[STEP][TOOL]` gives,
    else arguments built from the tool's JSON schema (`schema_arguments`); then a final answer
    naming what each call returned.
    """
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    system = "\n".join(_parts_text(m.get("content")) for m in messages if m.get("role") == "system")
    users = [_parts_text(m.get("content")) for m in messages if m.get("role") == "user"]
    first_user = users[0] if users else ""
    if PLANNER_MARK in system:
        if REVISION_MARK not in first_user:
            refusal = {"message": NO_PLAN_OFFLINE, "type": OFFLINE_ERROR_TYPE, "param": None, "code": None}
            return ScriptedReply(status=400, body={"error": refusal})
        goal = _section(first_user, "Goal:") or "the goal"
        prompt = f"Work toward this goal and report what you did and found: {goal}"
        return ScriptedReply(json={"steps": [{"name": "answer", "kind": "llm", "prompt": prompt}]})
    if DRIFT_MARK in system:
        return ScriptedReply(json={"on_track": True, "reason": "offline policy: the plan is followed as written"})
    if VERIFY_MARK in system:
        return ScriptedReply(content="HOLDS\noffline policy: nothing new is known offline")
    if ROUTER_ANSWER_MARK in system:
        return ScriptedReply(content=NO_ANSWER_OFFLINE)
    if JUDGE_MARK in system:
        return ScriptedReply(json=NO_JUDGEMENT_OFFLINE)
    if ROUTER_MARK in system:
        return ScriptedReply(json=_offline_route(first_user))
    if STEP_MARK in system:
        return ScriptedReply(content=_step_summary(first_user))
    if AGENT_MARK in system:
        return _agent_reply(messages, body.get("tools") or [], first_user, steps)
    return None


def _offline_route(message: str) -> dict[str, Any]:
    """The router's choice offline: a question is answered lightly (a goal made from it would
    do nothing offline); anything else goes to the goal sharing the most words with it."""
    said = _section(message, "Message:")
    if is_question(said):
        return {"target": "answer", "mode": "steer", "confidence": 0.8, "reason": "offline policy: a question"}
    listed = message.partition("Candidates:\n")[2].split("\n\nRecent:", 1)[0]
    try:
        candidates = json.loads(listed)
    except ValueError:
        candidates = []
    words = set(re.findall(r"[a-z]{3,}", said.lower()))
    best, overlap = "new", 1
    for candidate in candidates if isinstance(candidates, list) else []:
        shared = len(words & set(re.findall(r"[a-z]{3,}", str(candidate.get("goal", "")).lower())))
        if shared > overlap:
            best, overlap = str(candidate.get("id")), shared
    reason = "offline policy: " + ("no goal shares enough words" if best == "new" else f"{overlap} words shared")
    return {"target": best, "mode": "steer", "confidence": 0.8, "reason": reason}


def is_question(text: str) -> bool:
    """Whether a message asks rather than tells: it ends with a question mark or starts with
    a question word ("what …", "can you …")."""
    words = re.findall(r"[a-z']+", text.lower())
    return text.rstrip().endswith("?") or bool(words and words[0] in QUESTION_WORDS)


def _section(text: str, heading: str) -> str:
    """The paragraph after `heading` (e.g. the goal text after "Goal:")."""
    _, found, rest = text.partition(heading)
    return rest.strip().split("\n\n")[0].strip() if found else ""


_INPUT = re.compile(r"--- input from step '([^']+)' ---\n(.*?)\n--- end of input from step '\1' ---", re.DOTALL)


def _step_parts(message: str) -> tuple[str, str, list[tuple[str, str]]]:
    """(step name, prompt, [(input step, input text)]) of a step's first user message."""
    head, _, rest = message.partition("\n\n")
    name = head.removeprefix("step: ").strip() if head.startswith("step: ") else "?"
    prompt = rest.split("\n\n--- input from step", 1)[0].strip()
    return name, prompt, _INPUT.findall(message)


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= OFFLINE_EXCERPT_CHARS else flat[: OFFLINE_EXCERPT_CHARS - 1] + "…"


def _step_summary(message: str) -> str:
    name, prompt, inputs = _step_parts(message)
    named = "; ".join(f"{step} ({len(text)} chars: {_excerpt(text)!r})" for step, text in inputs) or "none"
    return f"[offline] step {name}: {_excerpt(prompt)}\ninputs: {named}"


def _agent_reply(
    messages: list[dict], tools: list[dict], first_user: str, steps: dict[str, dict[str, dict[str, Any]]]
) -> ScriptedReply:
    name, prompt, _ = _step_parts(first_user)
    called: dict[str, str] = {}  # call id -> tool name, in call order
    for m in messages:
        for call in m.get("tool_calls") or []:
            called[str(call.get("id"))] = str((call.get("function") or {}).get("name", ""))
    returned = {str(m.get("tool_call_id")): _parts_text(m.get("content")) for m in messages if m.get("role") == "tool"}
    offered = [t.get("function") or {} for t in tools if isinstance(t, dict)]
    for tool in offered:
        tool_name = str(tool.get("name", ""))
        if tool_name and tool_name != COMPACTION_TOOL and tool_name not in called.values():
            arguments = (steps.get(name) or {}).get(tool_name)
            if arguments is None:
                arguments = schema_arguments(tool.get("parameters") or {}, name, prompt, str(tool.get("description")))
            return ScriptedReply(tool_calls=[ScriptedToolCall(name=tool_name, arguments=arguments)])
    results = "; ".join(f"{tool} returned {_excerpt(returned.get(i, '(no result)'))!r}" for i, tool in called.items())
    return ScriptedReply(content=f"[offline] step {name} done: {results or 'no tools were called'}")


_PATH_IN_PROMPT = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.[A-Za-z0-9]{1,8})(?![\w/-])")


def schema_arguments(schema: dict, step: str, prompt: str = "", description: str = "") -> dict[str, Any]:
    """Arguments for a tool built from its JSON schema: required fields only, simple values.

    A `path` is the first file name the step's prompt mentions for a tool that only reads
    (its description says "risk: read"), else `offline-STEP.md`, so the policy never writes
    over a file of the user's. `content`, `body`, `text` and `message` say which step wrote
    them; `command` is `echo offline STEP`; other strings are "offline"; an enum takes its
    first value, numbers their minimum (else 1), booleans false, lists and objects empty.
    """
    properties = schema.get("properties") or {}
    reads = "risk: read" in description
    mentioned = _PATH_IN_PROMPT.findall(prompt) if reads else []
    arguments: dict[str, Any] = {}
    for field in schema.get("required") or []:
        spec = properties.get(field) or {}
        options = [o for o in spec.get("anyOf") or [spec] if isinstance(o, dict) and o.get("type") != "null"]
        spec = options[0] if options else spec
        kind = spec.get("type", "string")
        if "enum" in spec:
            arguments[field] = spec["enum"][0]
        elif "const" in spec:
            arguments[field] = spec["const"]
        elif kind == "string":
            arguments[field] = _string_argument(field, step, mentioned)
        elif kind in ("integer", "number"):
            arguments[field] = spec.get("minimum", 1)
        elif kind == "boolean":
            arguments[field] = False
        elif kind == "array":
            arguments[field] = []
        else:
            arguments[field] = {}
    return arguments


def _string_argument(field: str, step: str, mentioned: list[str]) -> str:
    if field == "path":
        return mentioned[0] if mentioned else f"offline-{step}.md"
    if field in ("content", "body", "text", "message"):
        return f"Written offline by step {step}.\n"
    if field == "command":
        return f"echo offline {step}"
    return "offline"


class ScriptedServer(BackgroundHTTPServer):
    """The script served over HTTP from a daemon thread.

    `base_url` is the server root WITHOUT `/v1`; `anthropic_base_url` is the same
    root (what `anthropic.AsyncAnthropic` takes) and `openai_base_url` is
    `base_url + "/v1"` (what `openai.AsyncOpenAI` takes).
    """

    thread_name = "scripted-model"

    @property
    def handler(self) -> type[BaseHTTPRequestHandler]:  # defined below this class
        return _Handler

    def __init__(self, script: Path | str | dict, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.script = load_script(script)
        self._lock = threading.Lock()
        self._uses = [0] * len(self.script.replies)
        self._log: list[dict] = []
        self._jobs: dict[str, Job] = {}
        self._handle_log: list[dict] = []
        self._served = 0
        self.connections = 0
        # Rate limit mode: when the requests of the last minute were accepted, and the 429s sent.
        self._accepted: list[float] = []
        self._limited = 0
        # Replies waiting out their delay_s now, and the most there ever were at once.
        self._in_flight = 0
        self.max_in_flight = 0
        # The entry each handler thread answered last (for how to stream it).
        self._taken = threading.local()

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.base_url

    def requests(self) -> list[dict]:
        with self._lock:
            return [dict(r) for r in self._log]

    def reset(self) -> None:
        with self._lock:
            self._uses = [0] * len(self.script.replies)
            self._log = []
            self._jobs = {}
            self._handle_log = []
            self._accepted = []
            self._limited = 0

    def rate_limited(self) -> int:
        """How many model requests rate limit mode answered 429."""
        with self._lock:
            return self._limited

    def _over_limit(self, flavour: Flavour, path: str, seen: SeenRequest) -> tuple[int, dict, dict[str, str]] | None:
        """Rate limit mode: the 429 for a request past the limit (a sliding minute), else None."""
        per_minute = self.script.requests_per_minute
        if per_minute is None:
            return None
        window = self.script.rate_window_s
        limit = max(1, int(per_minute * window / 60))
        with self._lock:
            now = time.monotonic()
            self._accepted = [at for at in self._accepted if at > now - window]
            if len(self._accepted) < limit:
                self._accepted.append(now)
                return None
            self._limited += 1
            wait = max(1, int(self._accepted[0] + window - now + 0.999))
            self._log.append(
                {"path": path, "flavour": flavour, "model": seen.model, "matched": None, "status": 429}
                | {"last_message": seen.last_text[:EXCERPT_CHARS], "tools": seen.tools, "has_tools": bool(seen.tools)}
                | {"json_mode": seen.json_mode, "arrived": now}
            )
        wire: Flavour = "openai" if flavour == "responses" else flavour
        if wire == "anthropic":
            headers = {
                "anthropic-ratelimit-requests-limit": str(per_minute),
                "anthropic-ratelimit-requests-remaining": "0",
            }
            message = f"Number of requests has exceeded your per-minute rate limit ({per_minute} requests/min)"
        else:
            headers = {"x-ratelimit-limit-requests": str(per_minute), "x-ratelimit-remaining-requests": "0"}
            message = f"Rate limit reached for requests per min (RPM): Limit {per_minute}, Used {per_minute}"
        body = error_body(wire, 429, message)
        if wire == "openai":
            body["error"] |= {"type": "requests", "code": "rate_limit_exceeded"}
        return 429, body, headers | {"retry-after": str(wait)}

    def count_connection(self) -> None:
        with self._lock:
            self.connections += 1

    def respond(self, flavour: Flavour, path: str, body: dict) -> tuple[int, dict, dict[str, str]]:
        """Status, JSON body and extra headers for one request; records it in the log."""
        seen = {"openai": seen_openai, "anthropic": seen_anthropic, "responses": seen_responses}[flavour](body)
        if limited := self._over_limit(flavour, path, seen):
            return limited
        fallback = offline_reply(body, self.script.steps) if self.script.policy == "offline" else None
        n, entry = self._take(flavour, path, seen, fallback if flavour == "openai" else None)
        if entry is None or entry.status:
            return self._error(flavour, path, seen, entry)
        usage = self._usage(seen, entry)
        if flavour == "responses":
            job = self._job("response", f"resp_scripted_{n}", n, entry, seen, usage)
            if body.get("background"):
                return 200, responses_object(job, "queued"), entry.headers
            return 200, responses_object(job, entry.background_status), entry.headers
        make = openai_completion if flavour == "openai" else anthropic_message
        return 200, make(n, seen, entry, usage), entry.headers

    def last_entry(self) -> ScriptedReply | None:
        """The entry this thread's latest request was answered with."""
        return getattr(self._taken, "entry", None)

    def create_batch(self, path: str, body: dict) -> tuple[int, dict]:
        """A Message Batch of exactly one request (what perdure sends); its entry is matched now."""
        requests = body.get("requests") or []
        if len(requests) != 1 or not isinstance(requests[0], dict):
            return 400, error_body("anthropic", 400, "scripted server: a batch must hold exactly one request")
        seen = seen_anthropic(requests[0].get("params") or {})
        n, entry = self._take("anthropic", path, seen)
        if entry is None:
            return self._error("anthropic", path, seen, entry)[:2]
        job = self._job("batch", f"msgbatch_scripted_{n}", n, entry, seen, self._usage(seen, entry))
        job.custom_id = str(requests[0].get("custom_id", ""))
        return 200, batch_object(job, "in_progress", self._results_url(job))

    def handle_request(self, kind: str, handle: str, action: str) -> tuple[int, Any]:
        """A poll, a cancel or a results read of a background response or batch."""
        with self._lock:
            job = self._jobs.get(handle)
            if job is None or job.kind != kind:
                self._handle_log.append({"handle": handle, "action": action, "status": 404})
                flavour: Flavour = "responses" if kind == "response" else "anthropic"
                return 404, error_body(flavour, 404, f"scripted server: no {kind} {handle}")
            if action == "cancel":
                job.cancelled = True
            status = job.status(poll=action == "poll")
            self._handle_log.append({"handle": handle, "action": action, "status": status})
        if kind == "response":
            return 200, responses_object(job, status)
        if action == "results":
            if status != "ended":
                return 400, error_body("anthropic", 400, f"scripted server: batch {handle} has not ended")
            return 200, job.batch_result()
        return 200, batch_object(job, "canceling" if action == "cancel" else status, self._results_url(job))

    def handle_events(self) -> list[dict]:
        """Creates, polls, cancels and result reads of background responses and batches, in order."""
        with self._lock:
            return [dict(e) for e in self._handle_log]

    def creates(self) -> list[dict]:
        """The background responses and batches created."""
        return [e for e in self.handle_events() if e["action"] == "create"]

    def _take(
        self, flavour: Flavour, path: str, seen: SeenRequest, fallback: ScriptedReply | None = None
    ) -> tuple[int, ScriptedReply | None]:
        """Match, spend and log one model request (the `fallback` reply, logged as matched
        "offline", when no entry matches); then wait the entry's delay_s, outside the lock."""
        with self._lock:
            self._served += 1
            n = self._served
            index = self._match(seen)
            if index is not None:
                self._uses[index] += 1
            entry = self.script.replies[index] if index is not None else fallback
            status = entry.status if entry and entry.status else (200 if entry else 400)
            self._log.append(
                {
                    "path": path,
                    "flavour": flavour,
                    "model": seen.model,
                    "matched": index if index is not None or entry is None else "offline",
                    "status": status,
                    "last_message": seen.last_text[:EXCERPT_CHARS],
                    "tools": seen.tools,
                    "has_tools": bool(seen.tools),
                    "json_mode": seen.json_mode,
                    "arrived": time.monotonic(),
                }
            )
        self._taken.entry = entry
        if entry is not None and entry.delay_s:
            # Outside the lock, after logging: the request is visible as arrived while the reply waits.
            with self._lock:
                self._in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self._in_flight)
            time.sleep(entry.delay_s)
            with self._lock:
                self._in_flight -= 1
        return n, entry

    def _error(
        self, flavour: Flavour, path: str, seen: SeenRequest, entry: ScriptedReply | None
    ) -> tuple[int, dict, dict[str, str]]:
        wire: Flavour = "openai" if flavour == "responses" else flavour
        if entry is None:
            excerpt = " ".join(seen.last_text.split())[:300]
            log.warning("scripted.no_match", path=path, last_message=excerpt)
            return 400, error_body(wire, 400, f"{NO_MATCH}; last message: {excerpt!r}"), {}
        assert entry.status is not None
        if isinstance(entry.body, dict):
            return entry.status, entry.body, entry.headers
        message = entry.body or f"scripted error {entry.status}"
        return entry.status, error_body(wire, entry.status, message), entry.headers

    @staticmethod
    def _usage(seen: SeenRequest, entry: ScriptedReply) -> ScriptedUsage:
        return entry.usage or ScriptedUsage(
            input_tokens=_estimate_tokens(seen.all_text),
            output_tokens=_estimate_tokens(
                entry.reply_text() + "".join(c.name + c.wire_arguments() for c in entry.tool_calls or [])
            ),
        )

    def _job(self, kind: Literal["response", "batch"], job_id: str, n: int, entry: ScriptedReply, seen, usage) -> Job:
        job = Job(
            kind=kind,
            id=job_id,
            n=n,
            entry=entry,
            seen=seen,
            usage=usage,
            polls_left=entry.in_progress_polls,
            ready_at=time.monotonic() + entry.in_progress_s,
            created=time.time(),
        )
        with self._lock:
            self._jobs[job_id] = job
            self._handle_log.append({"handle": job_id, "action": "create", "status": "in_progress"})
        return job

    def _results_url(self, job: Job) -> str:
        return f"{self.anthropic_base_url}/v1/messages/batches/{job.id}/results"

    def _match(self, seen: SeenRequest) -> int | None:
        for i, entry in enumerate(self.script.replies):
            if entry.times is not None and self._uses[i] >= entry.times:
                continue
            wanted = [entry.when] if isinstance(entry.when, str) else entry.when or []
            if any(part not in seen.all_text for part in wanted):
                continue
            if entry.when_last is not None and entry.when_last not in seen.last_text:
                continue
            return i
        return None


class _Handler(JSONHandler):
    @property
    def scripted(self) -> ScriptedServer:
        return self.server.owner  # type: ignore[attr-defined]

    def handle(self) -> None:
        """One TCP connection, which may carry many requests."""
        self.scripted.count_connection()
        super().handle()

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/_scripted/requests":
            self.send_json(200, self.scripted.requests())
        elif match := _RESPONSE_PATH.fullmatch(path):
            self.send_json(*self.scripted.handle_request("response", match["id"], "poll"))
        elif match := _BATCH_PATH.fullmatch(path):
            action = "results" if match["action"] == "/results" else "poll"
            status, body = self.scripted.handle_request("batch", match["id"], action)
            if action == "results" and status == 200:
                self._send_jsonl([body])
            else:
                self.send_json(status, body)
        else:
            self._not_found(path)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/_scripted/reset":
            self.scripted.reset()
            self.send_json(200, {"reset": True})
            return
        if (match := _RESPONSE_PATH.fullmatch(path)) and match["action"] == "/cancel":
            self.send_json(*self.scripted.handle_request("response", match["id"], "cancel"))
            return
        if (match := _BATCH_PATH.fullmatch(path)) and match["action"] == "/cancel":
            self.send_json(*self.scripted.handle_request("batch", match["id"], "cancel"))
            return
        flavour: Flavour
        if path.endswith("/chat/completions"):
            flavour = "openai"
        elif path.endswith("/messages/batches"):
            flavour = "anthropic"
        elif path.endswith("/messages"):
            flavour = "anthropic"
        elif path.endswith("/responses"):
            flavour = "responses"
        else:
            self._not_found(path)
            return
        try:
            body = json.loads(self.read_body() or b"{}")
        except ValueError as err:
            wire: Flavour = "openai" if flavour == "responses" else flavour
            self.send_json(400, error_body(wire, 400, f"scripted server: request body is not JSON: {err}"))
            return
        if path.endswith("/messages/batches"):
            self.send_json(*self.scripted.create_batch(path, body))
            return
        status, reply, headers = self.scripted.respond(flavour, path, body)
        if status == 200 and body.get("stream") is True and flavour != "responses":
            options = body.get("stream_options") or {}
            entry = self.scripted.last_entry()
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            include_usage = include_usage and (entry is None or entry.stream_usage)
            events = openai_stream(reply, include_usage) if flavour == "openai" else anthropic_stream(reply)
            self._send_events(events, entry, headers)
            return
        self.send_json(status, reply, headers)

    def _send_events(
        self, events: list[tuple[str | None, Any]], entry: ScriptedReply | None, headers: dict[str, str]
    ) -> None:
        """Server-sent events in chunked transfer encoding (the connection stays open for the
        next request), paced and cut as the entry says."""
        delay = entry.chunk_delay_s if entry else 0.0
        cut = entry.cut_after_chunks if entry else None
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            for i, (name, data) in enumerate(events):
                if cut is not None and i >= cut:
                    # Mid-reply: no terminating chunk, the connection just goes.
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if i and delay:
                    time.sleep(delay)
                text = (
                    f"event: {name}\n" if name else ""
                ) + f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
                raw = text.encode("utf-8")
                self.wfile.write(f"{len(raw):X}\r\n".encode() + raw + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, OSError):
            # The caller went away mid-reply (a crash test, an abort): what it asked for is recorded.
            self.close_connection = True

    def _not_found(self, path: str) -> None:
        self.send_json(404, {"error": {"message": f"no such path: {path}", "type": "not_found_error"}})

    def _send_jsonl(self, lines: list[dict]) -> None:
        data = "".join(json.dumps(line) + "\n" for line in lines).encode("utf-8")
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/binary")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass


_RESPONSE_PATH = re.compile(r".*/responses/(?P<id>[^/]+)(?P<action>/cancel)?")
_BATCH_PATH = re.compile(r".*/messages/batches/(?P<id>[^/]+)(?P<action>/cancel|/results)?")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a scripted model over the OpenAI and Anthropic wire formats.")
    parser.add_argument("--script", required=True, type=Path, help="YAML or JSON script file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    server = ScriptedServer(args.script, host=args.host, port=args.port).start()
    print(f"listening on {server.base_url} (OpenAI clients: {server.openai_base_url})", flush=True)
    serve_until_interrupted(server)


if __name__ == "__main__":
    main()
