"""The goal's decision log: one ordered record, per goal, of every decision that shaped
its work (a plan adopted and what it replaced, steps dropped, a gate's verdict, the
model's stated reasons, an answer and who gave it, an expiry, a check that voided work,
a rewind, a narrow, an abort), apart from the raw trace (the history, the event stream).

Pure: the entries, the part of it the goal's state carries, and the rules that bound it.
The state keeps the latest `kept` entries and the count of all; once `kept` plus half as
many have gathered, the oldest go to the artifact store as one chunk (an activity writes
it: workflows/goal/decision_log.py), the state keeping the chunk's ref, so continue-as-new
carries little however long the goal runs. A reader (`perdure log`, the page: the client's
starters/client/goal_decisions.py) joins the chunks and the recent entries back in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from perdure.workflows.shared.contracts import ArtifactRef

# The query that answers the log (workflows/goal/goal_workflow.py); a worker answers it.
DECISIONS_QUERY = "decisions"

# What each kind of entry records; a kind is free text (a new decision needs no entry
# here), these are the ones perdure writes.
KINDS = {
    "plan": "a plan version adopted, what it replaced and why",
    "drop": "steps a plan version left out, and why",
    "gate": "a gate's verdict: budget, density, risk order, a refused call, a stall rung",
    "reason": "the model's stated reason: a plan's rationale, an agent's choice of tools",
    "answer": "a person's answer to a question, and who gave it",
    "expiry": "a question that expired, and the outcome declared for it",
    "verify": "a check of finished work after a wait: what it voided",
    "replan": "a re-plan: on evidence, after a drift check, for queued work",
    "rewind": "a step rewound by a person, what was voided",
    "narrow": "premises changed by a person, what was voided",
    "park": "the goal parked or resumed",
    "abort": "an abort, requested or forced by a budget",
    "steer": "guidance a person gave the model",
    "run": "a new run of the goal (continue-as-new)",
    "end": "how the goal ended",
}
# Who decided: the model, a rule of the runtime, a deadline that passed, or a person (their name).
MODEL, RULE, EXPIRED, PLAN_FILE, USER = "model", "rule", "expired", "plan file", "user"

MAX_TEXT = 600
MAX_ABOUT = 20
DEFAULT_KEPT = 100


class Decision(BaseModel):
    seq: int = Field(ge=1, description="1 for the goal's first decision, then one more each, across runs.")
    at: datetime
    kind: str = Field(max_length=32)
    text: str
    who: str = Field(description="model, rule, expired, plan file, or the name of the person who decided.")
    about: list[str] = Field(default_factory=list, description="The steps it is about.")


class DecisionChunk(BaseModel):
    """Entries `first`..`last` (by seq), stored as one JSON array in the artifact store."""

    first: int
    last: int
    ref: ArtifactRef


class DecisionLog(BaseModel):
    """What the goal's state carries of its log: the latest entries and the refs of the rest."""

    count: int = Field(default=0, description="Decisions recorded so far, stored ones included.")
    recent: list[Decision] = Field(default_factory=list, description="The latest entries, oldest first.")
    chunks: list[DecisionChunk] = Field(default_factory=list, description="Older entries, oldest chunk first.")


class WriteDecisionsInput(BaseModel):
    goal_id: str
    entries: list[Decision]


def record(log: DecisionLog, at: datetime, kind: str, text: str, who: str, about: Iterable[str] = ()) -> Decision:
    """Add one entry at the end of the log; a long text or step list is cut, never the log grown."""
    names = list(dict.fromkeys(about))
    if len(names) > MAX_ABOUT:
        names = [*names[: MAX_ABOUT - 1], f"(and {len(names) - MAX_ABOUT + 1} more)"]
    text = text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"
    log.count += 1
    entry = Decision(seq=log.count, at=at, kind=kind[:32], text=text, who=who[:64], about=names)
    log.recent.append(entry)
    return entry


def sender(by: str | None) -> str:
    """Who decided by a message: the sender it names, else "user"."""
    return by or USER


def chunk_due(log: DecisionLog, kept: int) -> list[Decision]:
    """The entries to store as a chunk now (all but the latest `kept`), once `kept` and half
    as many again have gathered; else none. Half as many: a chunk every kept/2 decisions."""
    if len(log.recent) < kept + max(kept // 2, 1):
        return []
    return log.recent[: len(log.recent) - kept]


def stored(log: DecisionLog, entries: Sequence[Decision], ref: ArtifactRef) -> None:
    """`entries` (the oldest of `recent`) are in the artifact store under `ref`: the state keeps the ref."""
    first, last = entries[0].seq, entries[-1].seq
    log.chunks.append(DecisionChunk(first=first, last=last, ref=ref))
    log.recent = [e for e in log.recent if e.seq > last]


def gaps(entries: Sequence[Decision], count: int) -> list[tuple[int, int]]:
    """The seq ranges (first, last) of the log's `count` entries that `entries` lacks."""
    missing, expected = [], 1
    for entry in entries:
        if entry.seq > expected:
            missing.append((expected, entry.seq - 1))
        expected = max(expected, entry.seq + 1)
    if expected <= count:
        missing.append((expected, count))
    return missing
