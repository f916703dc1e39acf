"""A scripted model server: canned replies over the real OpenAI and Anthropic wire formats.

Owns the script format, request matching and the HTTP server that answers
`POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic) with
JSON shaped exactly like the real APIs, so offline runs and tests exercise the
real `openai` and `anthropic` clients, their error classes and our retry
mapping. It must stay deterministic and never call a real model; a request no
entry matches is a clear 400, never something a client would retry. It is a test
double, but not only for tests: the `scripted` model provider (`perdure demo`,
offline runs) starts one in the worker process, so it imports nothing from tests.

Script: `{"replies": [entry, ...]}`; the first unspent entry (file order) whose
`when` (substring of any message, system included) and `when_last` (substring of
the last message) match wins. An entry replies with exactly one of `content`,
`json`, `tool_calls` or `status` (+ `body`, `headers`); `times` limits its uses;
`usage` overrides the chars/4 token estimate; `delay_s` makes the server wait that
long after logging the request before it answers (a slow model, or a window in
which a crash test kills the caller mid-call).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from testing.http import BackgroundHTTPServer, JSONHandler, serve_until_interrupted

log = structlog.get_logger(__name__)

Flavour = Literal["openai", "anthropic"]
NO_MATCH = "scripted server: no reply matches the request"
EXCERPT_CHARS = 2000


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

    when: str | None = None
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

    @model_validator(mode="after")
    def _one_kind_of_reply(self) -> ScriptedReply:
        kinds = [k for k in ("content", "json_value", "tool_calls", "status") if k in self.model_fields_set]
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

    replies: list[ScriptedReply]


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
    message: dict[str, Any] = {"role": "assistant", "content": entry.reply_text() if not entry.tool_calls else None}
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
        self._served = 0
        self.connections = 0

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

    def count_connection(self) -> None:
        with self._lock:
            self.connections += 1

    def respond(self, flavour: Flavour, path: str, body: dict) -> tuple[int, dict, dict[str, str]]:
        """Status, JSON body and extra headers for one request; records it in the log."""
        seen = seen_openai(body) if flavour == "openai" else seen_anthropic(body)
        with self._lock:
            self._served += 1
            n = self._served
            index = self._match(seen)
            if index is not None:
                self._uses[index] += 1
            entry = self.script.replies[index] if index is not None else None
            status = entry.status if entry and entry.status else (200 if entry else 400)
            self._log.append(
                {
                    "path": path,
                    "flavour": flavour,
                    "model": seen.model,
                    "matched": index,
                    "status": status,
                    "last_message": seen.last_text[:EXCERPT_CHARS],
                    "tools": seen.tools,
                    "has_tools": bool(seen.tools),
                    "json_mode": seen.json_mode,
                }
            )
        if entry is not None and entry.delay_s:
            # Outside the lock, after logging: the request is visible as arrived while the reply waits.
            time.sleep(entry.delay_s)
        if entry is None:
            excerpt = " ".join(seen.last_text.split())[:300]
            log.warning("scripted.no_match", path=path, last_message=excerpt)
            return 400, error_body(flavour, 400, f"{NO_MATCH}; last message: {excerpt!r}"), {}
        if entry.status:
            if isinstance(entry.body, dict):
                return entry.status, entry.body, entry.headers
            message = entry.body or f"scripted error {entry.status}"
            return entry.status, error_body(flavour, entry.status, message), entry.headers
        usage = entry.usage or ScriptedUsage(
            input_tokens=_estimate_tokens(seen.all_text),
            output_tokens=_estimate_tokens(
                entry.reply_text() + "".join(c.name + c.wire_arguments() for c in entry.tool_calls or [])
            ),
        )
        make = openai_completion if flavour == "openai" else anthropic_message
        return 200, make(n, seen, entry, usage), entry.headers

    def _match(self, seen: SeenRequest) -> int | None:
        for i, entry in enumerate(self.script.replies):
            if entry.times is not None and self._uses[i] >= entry.times:
                continue
            if entry.when is not None and entry.when not in seen.all_text:
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
        if urlsplit(self.path).path.rstrip("/") == "/_scripted/requests":
            self.send_json(200, self.scripted.requests())
        else:
            self.send_json(404, {"error": {"message": f"no such path: {self.path}", "type": "not_found_error"}})

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/_scripted/reset":
            self.scripted.reset()
            self.send_json(200, {"reset": True})
            return
        flavour: Flavour
        if path.endswith("/chat/completions"):
            flavour = "openai"
        elif path.endswith("/messages"):
            flavour = "anthropic"
        else:
            self.send_json(404, {"error": {"message": f"no such path: {path}", "type": "not_found_error"}})
            return
        try:
            body = json.loads(self.read_body() or b"{}")
        except ValueError as err:
            self.send_json(400, error_body(flavour, 400, f"scripted server: request body is not JSON: {err}"))
            return
        self.send_json(*self.scripted.respond(flavour, path, body))


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
