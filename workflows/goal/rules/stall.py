"""Stall detection for `agent` nodes: judged by new information, never by elapsed time.

Owns how a step's outputs are normalised and fingerprinted, when a step counts
as adding nothing new, and the response ladder: remind the model what it
already tried -> tell it to switch tool or source -> ask a human -> abandon the
path. It also writes the texts the workflow sends to the model for the first
two rungs. The workflow keeps one `StallState` per running agent node (in its
state object) and acts on the `StallAction` returned.

A step's fingerprint is a bottom-k sketch: the smallest `MAX_SHINGLES` hashes
of the word 3-grams of its normalised outputs, stored as hex in one string. A
step is stale when less than `MIN_NOVELTY` of its fingerprint is absent from
the last `window` steps. Sketches make repeats exact and near-repeats close;
a step that only repeats part of a long earlier output can be judged new
(errs towards not stalling).

Pure: no I/O, clocks or randomness (hashes are sha256, not Python's salted
`hash`). Parked or waiting nodes are never judged: pass `parked=True`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, Field

StallRung = Literal["remind", "switch_tool", "ask_human", "abandon"]
LADDER: tuple[StallRung, ...] = ("remind", "switch_tool", "ask_human", "abandon")

DEFAULT_WINDOW = 6
DEFAULT_THRESHOLD = 3
# A step adding under 10% new shingles adds nothing: rephrased filler is not progress.
MIN_NOVELTY = 0.1
MAX_SHINGLES = 256
SHINGLE_WORDS = 3
MAX_TRIED_CALLS = 40
MAX_CALL_CHARS = 100

# Order matters: uuids and timestamps before the generic digit and hex rules eat their parts.
_VOLATILE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<id>"),
    (
        re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[t ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:z\b|[+-]\d{2}:?\d{2}\b)?)?"),
        "<time>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    (
        re.compile(
            r"\b\d+(?:\.\d+)?\s*(?:ms|µs|us|ns|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?)\b",
        ),
        "<dur>",
    ),
    # Hex ids: at least 7 characters mixing digits and a-f (so words like "deadbeef" or "facade" survive).
    (re.compile(r"\b(?:0x)?(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,}\b"), "<id>"),
    (re.compile(r"\d{6,}"), "<n>"),
)
_SPACE = re.compile(r"\s+")


class StallState(BaseModel):
    """Per agent node. `rung` counts ladder rungs already fired (0-4); it never goes back,
    so each rung fires at most once per node even when new information interrupts a stall."""

    recent: list[str] = Field(
        default_factory=list, description="Fingerprints of the last `window` steps, oldest first."
    )
    stale_steps: int = Field(default=0, ge=0, description="Consecutive stale steps since new information or a rung.")
    rung: int = Field(default=0, ge=0, le=len(LADDER))
    tried: list[str] = Field(default_factory=list, description="Calls made during the current stall, oldest first.")


class StallAction(BaseModel):
    kind: StallRung
    rung: int = Field(ge=1, le=len(LADDER), description="1 for remind ... 4 for abandon.")
    reason: str
    tried: list[str] = Field(default_factory=list)


def normalise_output(text: str) -> str:
    """Lower-case, volatile tokens (timestamps, uuids, hex ids, durations, long numbers) replaced by
    placeholders, whitespace collapsed: two runs of the same call normalise to the same text."""
    text = text.lower()
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    return _SPACE.sub(" ", text).strip()


def _shingles(text: str) -> set[str]:
    words = normalise_output(text).split()
    if not words:
        return set()
    if len(words) < SHINGLE_WORDS:
        return {" ".join(words)}
    return {" ".join(words[i : i + SHINGLE_WORDS]) for i in range(len(words) - SHINGLE_WORDS + 1)}


def fingerprint(outputs: Sequence[str]) -> str:
    """The step's bottom-k sketch: sorted, space-separated 8-hex-digit hashes ('' for no output)."""
    hashes: set[str] = set()
    for output in outputs:
        hashes.update(hashlib.sha256(s.encode()).hexdigest()[:8] for s in _shingles(output))
    return " ".join(sorted(hashes)[:MAX_SHINGLES])


def novelty(history: Sequence[str], new: str) -> float:
    """Fraction of fingerprint `new` absent from the fingerprints in `history` (0.0 for an empty step)."""
    new_hashes = set(new.split())
    if not new_hashes:
        return 0.0
    seen: set[str] = set()
    for earlier in history:
        seen.update(earlier.split())
    return len(new_hashes - seen) / len(new_hashes)


def describe_call(tool: str, args: Mapping[str, object] | str | None = None) -> str:
    """A compact, stable text for one call, e.g. 'read_file(path="src/a.py")', at most MAX_CALL_CHARS."""
    if args is None:
        inner = ""
    elif isinstance(args, str):
        inner = args
    else:
        inner = ", ".join(
            f"{k}={json.dumps(args[k], sort_keys=True, ensure_ascii=False, default=str)}" for k in sorted(args)
        )
    text = _SPACE.sub(" ", f"{tool}({inner})")
    return text if len(text) <= MAX_CALL_CHARS else text[: MAX_CALL_CHARS - 2] + "…)"


def _tally(tried: Sequence[str]) -> list[str]:
    counts: dict[str, int] = {}
    for call in tried:
        counts[call] = counts.get(call, 0) + 1
    return [f"{call} ×{n}" if n > 1 else call for call, n in counts.items()]


def _tools(tried: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(call.split("(", 1)[0].strip() for call in tried))


def remind_message(tried: Sequence[str], stale_steps: int) -> str:
    """What the model is told on the first rung: its recent steps added nothing, and what it already tried."""
    lines = [f"Your last {stale_steps} steps added no new information."]
    if tried:
        lines.append("You already tried:")
        lines.extend(f"- {call}" for call in _tally(tried))
        lines.append("Repeating these will return the same results.")
    lines.append("Use what you already have to answer, or try a genuinely different approach.")
    return "\n".join(lines)


def switch_tool_message(tried: Sequence[str], available_tools: Sequence[str]) -> str:
    """Second rung: stop using the tools that returned nothing new; the others, if any, are named."""
    used = _tools(tried)
    others = [t for t in available_tools if t not in used]
    lines = ["Still no new information after the reminder."]
    if used:
        lines.append(f"Stop using {', '.join(used)} the same way; it keeps returning what you already have.")
    if others:
        lines.append(f"Switch to a different tool or source: {', '.join(others)}.")
    else:
        lines.append("Switch to a different source or different arguments.")
    lines.append("If nothing can help, answer with what you have and say what is missing.")
    return "\n".join(lines)


def ask_human_message(step: str, tried: Sequence[str]) -> str:
    """Third rung: the question put to a human, with what the agent already tried."""
    lines = [f"Step '{step}' is making no progress: its recent steps add no new information."]
    if tried:
        lines.append("It already tried: " + "; ".join(_tally(tried)) + ".")
    lines.append("How should it proceed (a hint, a different source, or abandon the step)?")
    return "\n".join(lines)


def observe_step(
    state: StallState,
    outputs: list[str],
    window: int = DEFAULT_WINDOW,
    threshold: int = DEFAULT_THRESHOLD,
    *,
    calls: Sequence[str] = (),
    parked: bool = False,
    min_novelty: float = MIN_NOVELTY,
) -> tuple[StallState, StallAction | None]:
    """Judge one finished step (its tool and model outputs, and the calls it made, see `describe_call`).

    A stale step (novelty below `min_novelty` against the last `window`
    steps; an empty step is stale) adds one to `stale_steps`; a step with new
    information resets `stale_steps` and `tried` but not `rung`. When
    `stale_steps` reaches `threshold`, the next rung fires and `stale_steps`
    restarts, so each rung needs `threshold` more consecutive stale steps.
    After `abandon` nothing more fires. A parked or waiting node is returned
    unchanged. The input state is not modified.
    """
    if window < 1 or threshold < 1:
        raise ValueError("window and threshold must be at least 1")
    if parked:
        return state, None
    printed = fingerprint(outputs)
    recent = state.recent[-window:]
    stale = novelty(recent, printed) < min_novelty
    recent = (recent + [printed])[-window:]
    if not stale:
        return StallState(recent=recent, stale_steps=0, rung=state.rung, tried=[]), None

    stale_steps = state.stale_steps + 1
    tried = (state.tried + list(calls))[-MAX_TRIED_CALLS:]
    if stale_steps < threshold or state.rung >= len(LADDER):
        return StallState(recent=recent, stale_steps=stale_steps, rung=state.rung, tried=tried), None

    kind = LADDER[state.rung]
    action = StallAction(
        kind=kind,
        rung=state.rung + 1,
        reason=f"{stale_steps} consecutive steps added no new information; "
        f"stall response {state.rung + 1} of {len(LADDER)}: {kind.replace('_', ' ')}",
        tried=list(tried),
    )
    return StallState(recent=recent, stale_steps=0, rung=state.rung + 1, tried=tried), action
