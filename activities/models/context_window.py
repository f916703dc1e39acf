"""Whether a model call fits its model's context window, judged before anything is sent.

A request the model cannot take is refused by the provider only after it was uploaded,
and some providers bill what they read of it; a 3 MB prompt must cost nothing. Every
model call of perdure's (steps, agent turns, the planner, drift checks, verification, the
router, the watchdog's judge) is measured here first: its prompt (messages, tool calls,
tool schemas) in characters, as tokens at CHARS_PER_TOKEN, plus the reply it allows. A
call over its profile's window (activities/models/profiles.py `ModelProfile.window`) leaves
as a non-retryable `ContextWindowExceeded` that names the call and the sizes; an agent
turn is compacted to fit first (activities/models/model_activities.py). A profile whose window
is unknown is not judged.

The estimate errs high on purpose: English prose runs about four characters a token on
these models' tokenizers, code and JSON nearer three. Counting three, a prompt judged to fit
does fit; one refused was at least about three quarters of the window (prose), and a
prompt that large is better compacted or split anyway.
"""

from __future__ import annotations

import json
import math

from temporalio.exceptions import ApplicationError

from perdure.activities.models.compaction import prompt_chars
from perdure.activities.models.profiles import ModelProfile
from perdure.activities.models.providers import ChatRequest, ChatTool

CHARS_PER_TOKEN = 3
CONTEXT_WINDOW_EXCEEDED = "ContextWindowExceeded"


def request_chars(request: ChatRequest) -> int:
    """The characters a request sends: message texts, tool calls and the tools' schemas."""
    return prompt_chars(request.messages) + tools_chars(request.tools)


def tools_chars(tools: list[ChatTool]) -> int:
    return sum(len(t.name) + len(t.description) + len(json.dumps(t.json_schema)) for t in tools)


def tokens_of(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


def reply_tokens(profile: ModelProfile, request: ChatRequest) -> int:
    return request.max_output_tokens or profile.max_output_tokens


def prompt_chars_allowed(profile: ModelProfile, reply: int) -> int | None:
    """The most characters a prompt may have so it and a reply of `reply` tokens fit, or None (no known window)."""
    window = profile.window()
    return None if window is None else max(0, window - reply) * CHARS_PER_TOKEN


def ensure_fits(profile: ModelProfile, request: ChatRequest, what: str) -> None:
    """Raise ContextWindowExceeded (non-retryable: the same call never fits) when `request`
    cannot fit the profile's context window; `what` names the call ('llm step summarise')."""
    window = profile.window()
    if window is None:
        return
    chars = request_chars(request)
    prompt, reply = tokens_of(chars), reply_tokens(profile, request)
    if prompt + reply <= window:
        return
    raise ApplicationError(
        f"{what}: not sent, it cannot fit the model's context window: its prompt is about {prompt:,} tokens "
        f"({chars:,} characters at {CHARS_PER_TOKEN} a token) and its reply may take {reply:,}, but {profile.model} "
        f"(profile '{profile.name}') takes {window:,} tokens in all",
        type=CONTEXT_WINDOW_EXCEEDED,
        non_retryable=True,
    )
