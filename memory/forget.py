"""Forgetting: `perdure forget SOURCE_OR_MEMORY` revokes the memories that match, and,
transitively, everything derived from them; each derived memory is then re-made from
the sources it has left (memory/summaries.py: a model through a profile, or extraction;
a node's working set is re-listed) or dropped when none is left.

Order matters for the invariant that no live memory depends on a revoked one, with
writers running meanwhile: everything affected is revoked first (a write derived from
a memory that is no longer live is refused by every backend), found level by level
after the level above is revoked (a derivation written just before is found then), and
only after that are replacements written, each from live sources only.

A target is, in this order: a memory id (m-…); a goal id that memories came from; a
goal id and a step, GOAL/STEP; a file path (as given, or absolute) with or without
`@sha256:…` (then only memories read from that version of it); `file:` may prefix it.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, Field

from perdure.memory.store import MemoryStore, MemoryStoreError
from perdure.memory.summaries import Summarizer, summarizer_for
from perdure.workflows.goal.contracts.memory_contracts import MEMORY_ID, Memory, NewMemory

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class NothingToForget(MemoryStoreError):
    """The target matches no live memory."""


class Regenerated(BaseModel):
    old: str
    new: str
    text: str
    made_by: str | None = None
    sources: list[str] = Field(default_factory=list)


class ForgetReport(BaseModel):
    target: str
    matched: str = Field(description="What the target was read as: a memory, a goal, a step, a file.")
    revoked: list[Memory] = Field(default_factory=list, description="The memories that matched.")
    regenerated: list[Regenerated] = Field(default_factory=list)
    dropped: list[Memory] = Field(default_factory=list, description="Derived ones with no source left.")


def resolve(store: MemoryStore, target: str) -> tuple[str, list[Memory]]:
    """(what the target was read as, the memories it matches, any status)."""
    text = target.strip()
    if re.fullmatch(MEMORY_ID, text):
        found = store.get(text)
        if found is None:
            raise NothingToForget(f"no memory {text} in the store at {store.url}")
        return f"memory {text}", [found]
    if text.startswith("file:"):
        return _file(store, text.removeprefix("file:"))
    by_goal = store.by_source(goal=text)
    if by_goal:
        return f"goal {text}", by_goal
    goal, _, node = text.partition("/")
    if node:
        by_node = store.by_source(goal=goal, node=node)
        if by_node:
            return f"step '{node}' of goal {goal}", by_node
    return _file(store, text)


def _file(store: MemoryStore, text: str) -> tuple[str, list[Memory]]:
    path, _, digest = text.partition("@")
    if digest and not DIGEST.match(digest):
        raise NothingToForget(f"'{digest}' is not a file digest (sha256:<64 hex digits>)")
    paths = list(dict.fromkeys([path, str(Path(path).expanduser().absolute()), str(Path(path).expanduser().resolve())]))
    found = store.by_source(paths=paths, digest=digest or None)
    if not found:
        raise NothingToForget(
            f"nothing matches '{text}': it is not a memory id, a goal or a goal/step memories came from, "
            f"nor a file any memory was read from (store {store.url})"
        )
    return f"file {path}" + (f" at {digest[:19]}…" if digest else ""), found


async def forget(store: MemoryStore, target: str, now: datetime, profile: str | None = None) -> ForgetReport:
    matched, found = resolve(store, target)
    roots = [m for m in found if m.status == "live"]
    if not roots:
        raise NothingToForget(f"{matched}: its {len(found)} memories were forgotten already")
    why = f"forgotten by `perdure forget {target}`"
    store.revoke([m.id for m in roots], why, now)
    revoked = {m.id for m in roots}
    # Everything derived, level by level, each level revoked before the next is looked for.
    affected: list[Memory] = []
    level = [m.id for m in roots]
    while level:
        children = [c for c in store.children(level) if c.id not in revoked]
        if not children:
            break
        store.revoke([c.id for c in children], f"derived from a memory {why}", now)
        revoked |= {c.id for c in children}
        affected += children
        level = [c.id for c in children]
    report = ForgetReport(target=target, matched=matched, revoked=roots)
    replaced: dict[str, str] = {}
    for item in _in_derivation_order(affected):
        remaining = [replaced.get(p, p) for p in item.derived_from if p in replaced or p not in revoked]
        if not remaining:
            store.note_revocation(item.id, "dropped: every memory it was derived from was forgotten")
            report.dropped.append(item)
            continue
        sources = store.get_many(remaining)
        live = [sources[i] for i in remaining if i in sources and sources[i].status == "live"]
        if not live:
            store.note_revocation(item.id, "dropped: every memory it was derived from was forgotten")
            report.dropped.append(item)
            continue
        text, made_by = await _remake(item, live, profile)
        new = NewMemory(
            **item.model_dump(include={"layer", "kind", "source", "scope", "scope_key", "expires_at"}),
            text=text,
            derived_from=[m.id for m in live],
            made_at=now,
            made_by=made_by,
        )
        (new_id,), refused = store.write([new])
        if refused:
            store.note_revocation(item.id, "dropped: a source was forgotten while it was re-made")
            report.dropped.append(item)
            continue
        forgotten = [p for p in item.derived_from if p in revoked and p not in replaced]
        store.note_revocation(item.id, f"regenerated without {', '.join(forgotten) or 'its old sources'}", new_id)
        replaced[item.id] = new_id
        report.regenerated.append(
            Regenerated(old=item.id, new=new_id, text=text, made_by=made_by, sources=[m.id for m in live])
        )
    return report


def _in_derivation_order(items: list[Memory]) -> list[Memory]:
    """Each after the affected memories it was derived from, so a summary of a summary is
    re-made from the re-made one."""
    by_id = {m.id: m for m in items}
    done: dict[str, Memory] = {}

    def visit(memory: Memory, path: set[str]) -> None:
        if memory.id in done or memory.id in path:
            return
        for parent in memory.derived_from:
            if parent in by_id:
                visit(by_id[parent], path | {memory.id})
        done[memory.id] = memory

    for memory in items:
        visit(memory, set())
    return list(done.values())


async def _remake(item: Memory, sources: list[Memory], profile: str | None) -> tuple[str, str | None]:
    if item.kind == "attached":
        node = item.source.node or "?"
        return f"attached to step '{node}': " + ", ".join(m.id for m in sources), None
    summarizer: Summarizer = summarizer_for(profile, item.made_by)
    return await summarizer.summarize([m.text for m in sources]), summarizer.name
