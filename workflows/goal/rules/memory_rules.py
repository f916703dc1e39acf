"""The goal's memory rules (issue 21, section 2), pure: what a settled step leaves as an
episodic memory (the reusability test), how long each kind keeps, what a step's recall
asks for, how attached memories and revocations read in a model's input, and the
end-of-goal card of semantic candidates. No I/O: the goal's memory room
(workflows/goal/goal_memory.py) calls these and the memory activities do the rest.

The end-of-goal card lists the candidates for semantic memory. A goal sends it to its
owner's router (`memory_offer`), which keeps it until a person answers it there (the
answers read by `chosen`).

The reusability test (what an episodic memory must pass to be written):
- a conclusion (`CONCLUSION: <claim> = true|false`) or a root cause (`ROOT CAUSE: …`) that
  a step which succeeded by its own work (an llm or agent step, not reused) states in its
  output: read from the whole output (the statement lines its activity returned,
  workflows/goal/rules/evidence.py), or from its preview for a result without those;
- its claim says something: at least REUSABLE_MIN_WORDS words of which at least two are
  not filler, at most 160 characters;
- it is not about one run: it names no goal id, temporary directory, timestamp or long
  hex id (those would mislead any later step);
- failed attempts pass always (a step that failed, its kind and its error: the next
  attempt must not repeat it), and so does a rejected path with a reason of at least
  REUSABLE_MIN_WORDS words (a person's rewind, the stall ladder's abandonment).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from perdure.workflows.goal.contracts.memory_contracts import (
    SHOWN_CHARS,
    MemoryKind,
    MemoryOffer,
    MemorySource,
    NewMemory,
    Recalled,
    Revocation,
    WrittenMemory,
)
from perdure.workflows.goal.contracts.state import GoalState, RejectedPath
from perdure.workflows.goal.rules.evidence import claim_key, read_statement_lines, read_statements
from perdure.workflows.shared.durations import duration_text

# How long each kind of memory keeps (its shelf life), from when it was made.
SHELF_LIFE: dict[str, timedelta] = {
    "conclusion": timedelta(days=90),
    "root_cause": timedelta(days=90),
    "failure": timedelta(days=30),
    "rejected": timedelta(days=90),
    "attached": timedelta(days=1),
    "summary": timedelta(days=365),
    "note": timedelta(days=365),
    "convention": timedelta(days=365),
    "preference": timedelta(days=365),
}
REUSABLE_MIN_WORDS = 3
MAX_CLAIM_CHARS = 160
MAX_CANDIDATES = 12
# The question id of the card a router holds: `perdure say --card GOAL:memory=CHOICE`.
CARD_QUESTION = "memory"
MAX_WRITTEN_KEPT = 200
MAX_USED_KEPT = 500
MAX_OUTBOX = 500

_FILLER = frozenset(
    "a an the is are was were be been it this that these those of to in on for and or not no yes "
    "done ok okay step steps output result results true false holds hold".split()
)
_ONE_RUN = re.compile(
    r"(goal-[0-9a-f]{6,}|/tmp/|/var/folders/|\b\d{4}-\d{2}-\d{2}[t ]\d{2}:\d{2}|\b[0-9a-f]{12,}\b)", re.IGNORECASE
)
_WORD = re.compile(r"[a-z0-9][a-z0-9_'-]*", re.IGNORECASE)


def expires(kind: MemoryKind, made_at: datetime) -> datetime:
    return made_at + SHELF_LIFE[kind]


def passes_reusability(claim: str, goal_id: str) -> bool:
    """Whether a stated conclusion or root cause is worth keeping for later steps."""
    if not claim or len(claim) > MAX_CLAIM_CHARS or goal_id in claim:
        return False
    words = _WORD.findall(claim.lower())
    if len(words) < REUSABLE_MIN_WORDS or len([w for w in words if w not in _FILLER]) < 2:
        return False
    return _ONE_RUN.search(claim) is None


def settled_memories(
    goal_id: str,
    name: str,
    kind: str,
    node_key: str | None,
    status: str,
    preview: str,
    error: str | None,
    now: datetime,
    statements: list[str] | None = None,
) -> list[NewMemory]:
    """What a settled step leaves: its reusable statements when it succeeded, its failure
    always when it failed (tool steps too). `statements`: the lines its activity read from
    the whole output; None (a result without them): read from the preview."""
    source = MemorySource(kind="node", goal=goal_id, node=name, node_key=node_key)
    if status == "failed":
        text = f"step '{name}' ({kind}) failed: {error or 'no error given'}"
        return [_episodic("failure", text[:600], source, goal_id, now)]
    if status != "succeeded" or kind not in ("llm", "agent"):
        return []
    conclusions, cause = read_statements(preview) if statements is None else read_statement_lines(statements)
    found = []
    for claim, holds in conclusions:
        if passes_reusability(claim, goal_id):
            said = "holds" if holds else "does not hold"
            found.append(_episodic("conclusion", f"{claim} ({said})", source, goal_id, now))
    if cause and passes_reusability(cause, goal_id):
        found.append(_episodic("root_cause", f"root cause found: {cause}", source, goal_id, now))
    return found


def rejected_memory(goal_id: str, path: RejectedPath, now: datetime) -> NewMemory | None:
    if len(_WORD.findall(path.why)) < REUSABLE_MIN_WORDS:
        return None
    source = MemorySource(kind="node", goal=goal_id, node=path.node)
    return _episodic("rejected", path.for_prompt()[:600], source, goal_id, now)


def _episodic(kind: MemoryKind, text: str, source: MemorySource, goal_id: str, now: datetime) -> NewMemory:
    return NewMemory(
        layer="episodic",
        kind=kind,
        text=text,
        source=source,
        scope="goal",
        scope_key=goal_id,
        made_at=now,
        expires_at=expires(kind, now),
    )


def written(memory: NewMemory, memory_id: str) -> WrittenMemory:
    """What the goal keeps of an episodic memory it wrote."""
    claim = holds = None
    if memory.kind == "conclusion":
        body, _, said = memory.text.rpartition(" (")
        claim, holds = claim_key(body), said.startswith("holds")
    return WrittenMemory(
        id=memory_id,
        kind=memory.kind,
        node=memory.source.node,
        node_key=memory.source.node_key,
        text=memory.text[:SHOWN_CHARS],
        claim=claim,
        holds=holds,
        expires_at=memory.expires_at,
    )


def recall_query(kind: str, name: str, prompt: str, needs: list[str], premises: dict[str, str]) -> str:
    """What a step's recall searches for: its kind, name, prompt, the steps it takes
    inputs from and the premises it runs under."""
    premise_text = " ".join(f"{k} {v}" for k, v in sorted(premises.items()))
    return " ".join(part for part in (kind, name.replace("-", " "), prompt, " ".join(needs), premise_text) if part)


# --- what a model's input shows -----------------------------------------------------------


def _age(made_at: datetime, now: datetime) -> str:
    return duration_text(max(0.0, (now - made_at).total_seconds()), days=True) + " old"


def _belongs(memory: Recalled, goal_id: str, workspace: str) -> str:
    if memory.scope == "goal":
        return "this goal" if memory.scope_key == goal_id else f"goal {memory.scope_key}"
    if memory.scope == "project":
        here = " (this workspace)" if memory.scope_key == workspace else ""
        return f"project {memory.scope_key}{here}: a convention of that project, not a general preference"
    return "global: a preference that holds everywhere"


def attached_block(memories: list[Recalled], goal_id: str, workspace: str, now: datetime) -> str:
    """The memories the scheduler attached to a step's model input, each with its source,
    its age and the goal or project it belongs to."""
    if not memories:
        return ""
    lines = [
        "Memories attached by the runtime (retrieved for this step from earlier work; each says which goal or "
        "project it belongs to, where it came from and how old it is; use what applies, and say so if one is wrong):"
    ]
    for m in memories:
        lines.append(
            f"- [{m.id} · {m.layer} {m.kind} · {_belongs(m, goal_id, workspace)} · source: {m.source} · "
            f"{_age(m.made_at, now)}] {m.text}"
        )
    return "\n".join(lines)


def revocations_block(revoked: list[Revocation], now: datetime) -> str:
    """What a model turn is told of memories this goal used that were forgotten since."""
    if not revoked:
        return ""
    lines = ["Memories revoked since this goal used them (a person forgot them; do not rely on what they said):"]
    for r in revoked:
        line = f"- {r.id}: revoked {_age(r.at, now).removesuffix(' old')} ago ({r.why})"
        if r.replaced_by:
            line += f"; replaced by {r.replaced_by}" + (f": {r.replacement}" if r.replacement else "")
        lines.append(line)
    return "\n".join(lines)


# --- the end-of-goal card ------------------------------------------------------------------


def candidates(state: GoalState) -> list[WrittenMemory]:
    """Semantic candidates: the goal's conclusions and root causes that are verified, that
    is, their step still stands (succeeded, not voided or run again since) and no other
    step of the goal concluded the opposite."""
    # Those still in the outbox have no id yet: the card's answer is resolved once it is written.
    waiting = [written(m, "") for m in state.memory.outbox]
    kept = [w for w in [*state.memory.written, *waiting] if w.kind in ("conclusion", "root_cause")]
    said: dict[str, set[bool]] = {}
    for w in kept:
        if w.claim is not None and w.holds is not None:
            said.setdefault(w.claim, set()).add(w.holds)
    found, seen = [], set()
    for w in kept:
        node = state.nodes.get(w.node or "")
        identity = (w.kind, w.node, w.node_key, w.text)
        if node is None or node.status != "succeeded" or node.key != w.node_key or identity in seen:
            continue
        if w.claim is not None and len(said.get(w.claim, set())) > 1:
            continue
        seen.add(identity)
        found.append(w)
    return found[:MAX_CANDIDATES]


def chosen(
    candidates: list[WrittenMemory], answer: str | None, text: str | None, known: list[WrittenMemory]
) -> tuple[list[str], str]:
    """(episodic ids to promote, scope) for the card's answer: project or global (all of
    them), choose with the numbers in `text` ("1 3", "global" among them for everywhere),
    anything else none. `known`: what the goal has written, where a candidate listed
    before it was written finds its id."""
    ids = {(w.kind, w.node, w.node_key, w.text): w.id for w in known}

    def id_of(candidate: WrittenMemory) -> str:
        return candidate.id or ids.get((candidate.kind, candidate.node, candidate.node_key, candidate.text), "")

    if answer in ("project", "global"):
        picked = list(candidates)
        scope = answer
    elif answer == "choose":
        words = (text or "").lower().replace(",", " ").split()
        numbers = [int(w) for w in words if w.isdigit()]
        picked = [candidates[i - 1] for i in dict.fromkeys(numbers) if 1 <= i <= len(candidates)]
        scope = "global" if "global" in words else "project"
    else:
        return [], "project"
    return [i for i in (id_of(c) for c in picked) if i], scope


def memory_offer(state: GoalState, goal_id: str, now: datetime, found: list[WrittenMemory]) -> MemoryOffer | None:
    """The card a goal sends its owner's router: the candidates that have a memory id (a
    candidate whose write failed has none and cannot be kept), kept until the last of
    their shelf lives ends; None when none has."""
    ids = {(w.kind, w.node, w.node_key, w.text): w for w in state.memory.written}
    offered = []
    for candidate in found:
        known = ids.get((candidate.kind, candidate.node, candidate.node_key, candidate.text))
        if candidate.id:
            offered.append(candidate)
        elif known is not None:
            offered.append(known)
    if not offered:
        return None
    ends = [c.expires_at or expires(c.kind, now) for c in offered]
    return MemoryOffer(
        goal_id=goal_id,
        workspace=state.spec.workspace,
        goal=state.spec.goal[:300],
        candidates=offered,
        offered_at=now,
        expires_at=max(ends),
    )


def offer_listing(offer: MemoryOffer) -> list[str]:
    """The card's candidates, numbered as `choose` counts them."""
    return [f"{i}. {w.text} (step '{w.node}')" for i, w in enumerate(offer.candidates, start=1)]
