"""Context compaction for agent turns: which finished work units a prompt may shorten, and how they read.

An agent node's transcript grows by one work unit per turn (the assistant's
message with its tool calls, plus the results of those calls) and every turn
re-sends all of it. When the prompt a turn would send passes the goal's
threshold, the oldest finished, successful units before the current stage (the
last `keep_last` units) become one line each: turn, calls with an argument
preview, the start of each output and the digest of the output as the model saw
it. Everything else is sent verbatim: the head (system prompt with constraints
and goal; the step message with its inputs, premises, guidance and rejected
paths), every later user message (new guidance, runtime notes), every unit with
a failed or unanswered call, and the current stage, whose last unit holds this
turn's tool results.

Only the prompt is compacted. The stored transcript stays whole, so each turn
compacts afresh from the full record and nothing is lost; the activity puts the
compacted outputs in the artifact store so their digests resolve.

Deterministic on purpose, with no model call: it costs nothing, the same
transcript always gives the same prompt (a retried activity sends what the
first attempt sent, and prompt-cache prefixes stay stable from turn to turn),
and tests can assert on it exactly. A model-written summary could later replace
`unit_line`. Pure: functions over `ChatMessage` lists. It must not do I/O or
call a model, and must never shorten anything but a finished, successful unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from perdure.activities.artifacts import preview
from perdure.activities.models.providers import ChatMessage
from perdure.workflows.shared.canonical import sha256_digest

KEEP_LAST_UNITS = 2
# How model_activities renders a failed call's result, and a result that has no
# call id; compaction reads the transcript by these, so both modules use them.
ERROR_PREFIX = "ERROR: "
RESULT_PREFIX = "Result of tool "
COMPACTED_HEADER = (
    "[compacted by the runtime] Earlier turns that succeeded, one line each: the turn, each call with "
    "its arguments, the start of its output and the artifact digest of the output in full "
    "(the read_artifact tool returns it). "
    "Failed attempts and the latest turns are shown in full."
)
ARGS_PREVIEW_CHARS = 80
OUTPUT_PREVIEW_CHARS = 80
SAID_PREVIEW_CHARS = 80


@dataclass(frozen=True)
class WorkUnit:
    """One turn in a transcript: messages[start] is its assistant message, messages[start+1:end] its results."""

    turn: int
    start: int
    end: int
    calls: int
    answered: bool
    failed: bool

    @property
    def finished(self) -> bool:
        return self.calls > 0 and self.answered


@dataclass(frozen=True)
class CompactedPrompt:
    messages: list[ChatMessage]
    turns: list[int]
    chars_before: int
    chars_after: int
    archived: list[str]
    """The result texts that now appear only as a digest; the caller stores them so the digests resolve."""


def prompt_chars(messages: list[ChatMessage]) -> int:
    """What a prompt costs to send, in characters: message texts plus tool-call names and arguments."""
    return sum(len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls) for m in messages)


def is_failure(message: ChatMessage) -> bool:
    """Whether a tool-result message reports a failed (or never run) call."""
    text = message.content
    if message.role == "user" and text.startswith(RESULT_PREFIX):
        text = text.partition("\n")[2]
    return text.startswith(ERROR_PREFIX.rstrip())


def _is_result(message: ChatMessage, call_ids: set[str]) -> bool:
    if message.role == "tool":
        return message.tool_call_id in call_ids
    return message.role == "user" and message.content.startswith(RESULT_PREFIX)


def work_units(messages: list[ChatMessage]) -> list[WorkUnit]:
    """The turns of a transcript, in order; turn n is the n-th assistant message."""
    units = []
    i = 0
    while i < len(messages):
        if messages[i].role != "assistant":
            i += 1
            continue
        call_ids = {c.id for c in messages[i].tool_calls}
        end = i + 1
        while end < len(messages) and call_ids and _is_result(messages[end], call_ids):
            end += 1
        results = messages[i + 1 : end]
        answered = call_ids <= {m.tool_call_id for m in results if m.role == "tool"}
        units.append(
            WorkUnit(
                turn=len(units) + 1,
                start=i,
                end=end,
                calls=len(call_ids),
                answered=answered,
                failed=any(is_failure(m) for m in results),
            )
        )
        i = end
    return units


def result_texts(messages: list[ChatMessage], unit: WorkUnit) -> list[tuple[str | None, str]]:
    """(call id, output text as the model saw it) for each result of a unit, in order."""
    texts = []
    for m in messages[unit.start + 1 : unit.end]:
        if m.role == "tool":
            texts.append((m.tool_call_id, m.content))
        else:
            texts.append((None, m.content.partition("\n")[2]))
    return texts


def unit_line(messages: list[ChatMessage], unit: WorkUnit) -> str:
    """The one line a compacted unit becomes."""
    assistant = messages[unit.start]
    by_call = {call_id: text for call_id, text in result_texts(messages, unit) if call_id is not None}
    parts = []
    for call in assistant.tool_calls:
        output = _output(by_call[call.id]) if call.id in by_call else "(no result)"
        parts.append(f"{call.name} {preview(call.arguments or '{}', ARGS_PREVIEW_CHARS)} → {output}")
    for m in messages[unit.start + 1 : unit.end]:
        if m.role == "user":
            name, _, text = m.content.removeprefix(RESULT_PREFIX).partition("\n")
            parts.append(f"{name.rstrip(':')} → {_output(text)}")
    said = f' (said: "{preview(assistant.content, SAID_PREVIEW_CHARS)}")' if assistant.content.strip() else ""
    return f"- turn {unit.turn}{said}: " + "; ".join(parts)


def _output(text: str) -> str:
    digest = sha256_digest(text.encode("utf-8"))
    return f'{len(text):,} chars "{preview(text, OUTPUT_PREVIEW_CHARS)}" [{digest}]'


def compactable(messages: list[ChatMessage], keep_last: int = KEEP_LAST_UNITS) -> list[tuple[WorkUnit, str]]:
    """Units that may become a line, oldest first, with their lines: finished, no failed call,
    before the current stage (the last `keep_last` units, at least one), and longer verbatim."""
    units = work_units(messages)[: -max(1, keep_last)]
    candidates = [(u, unit_line(messages, u)) for u in units if u.finished and not u.failed]
    return [(u, line) for u, line in candidates if len(line) + 1 < prompt_chars(messages[u.start : u.end])]


def render(messages: list[ChatMessage], lines: dict[int, tuple[WorkUnit, str]]) -> list[ChatMessage]:
    """The prompt with each unit in `lines` (by start index) replaced by its line; adjacent
    lines share one runtime message."""
    out: list[ChatMessage] = []
    run: list[str] = []
    i = 0
    while i < len(messages):
        if i in lines:
            unit, line = lines[i]
            run.append(line)
            i = unit.end
            continue
        if run:
            out.append(ChatMessage(role="user", content="\n".join([COMPACTED_HEADER, *run])))
            run = []
        out.append(messages[i])
        i += 1
    if run:
        out.append(ChatMessage(role="user", content="\n".join([COMPACTED_HEADER, *run])))
    return out


def compact_prompt(
    messages: list[ChatMessage], threshold: int | None, keep_last: int = KEEP_LAST_UNITS
) -> CompactedPrompt | None:
    """The prompt to send instead of `messages`, or None when it fits `threshold` (None: never compact)
    or compacting would not shorten it. Oldest units go first, only as many as it takes to fit."""
    before = prompt_chars(messages)
    if threshold is None or before <= threshold:
        return None
    chosen: dict[int, tuple[WorkUnit, str]] = {}
    compacted, after = messages, before
    for unit, line in compactable(messages, keep_last):
        chosen[unit.start] = (unit, line)
        compacted = render(messages, chosen)
        after = prompt_chars(compacted)
        if after <= threshold:
            break
    if not chosen or after >= before:
        return None
    units = [unit for unit, _ in chosen.values()]
    return CompactedPrompt(
        messages=compacted,
        turns=[u.turn for u in units],
        chars_before=before,
        chars_after=after,
        archived=[text for u in units for _, text in result_texts(messages, u)],
    )
