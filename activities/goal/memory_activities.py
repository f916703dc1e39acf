"""The `perdure.memory.*` activities: the goal's reads and writes of the memory store
(memory/store.py), so its history records which memory ids each step was given.

recall       writes what the goal had waiting, drops working memories that are to go,
             finds the few memories relevant to a step (this goal's, this workspace's,
             global ones), records them as the step's working memory, and says which of
             the ids the goal used before are revoked;
revocations  the same without a step to recall for (a later turn of an agent);
record       writes only (what is left at the end of a goal);
promote      makes what a person confirmed at the end of a goal semantic memories.

The store is opened once per worker, on first use; its calls are blocking and run in a
thread. A store that cannot be reached fails the call as retryable; the goal goes on
without memory once the retries are spent (workflows/goal/goal_memory.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from perdure.memory.store import MemoryStore, MemoryStoreError, open_store, recalled
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.memory_contracts import (
    SHOWN_CHARS,
    MemorySource,
    NewMemory,
    PromoteInput,
    PromoteResult,
    RecallInput,
    RecallResult,
    RecordInput,
    RecordResult,
    Revocation,
    RevocationsInput,
    RevocationsResult,
)
from perdure.workflows.goal.rules.memory_rules import SHELF_LIFE, expires


class MemoryActivities:
    """Register with a Worker as `activities=MemoryActivities(home=...).activities()`."""

    def __init__(self, home: Path | None = None, url: str | None = None) -> None:
        self._home = home
        self._url = url
        self._store: MemoryStore | None = None
        self._opening = threading.Lock()

    def activities(self) -> list[Callable[..., Any]]:
        return [self.recall, self.revocations, self.record, self.promote]

    def store(self) -> MemoryStore:
        with self._opening:
            if self._store is None:
                self._store = open_store(self._url, home=self._home)
            return self._store

    async def _run(self, fn: Callable[[MemoryStore], Any]) -> Any:
        def call() -> Any:
            return fn(self.store())

        try:
            return await asyncio.to_thread(call)
        except MemoryStoreError as err:
            raise ApplicationError(str(err), type="MemoryStoreUnavailable") from None

    @activity.defn(name=Activities.MEMORY_RECALL)
    async def recall(self, input: RecallInput) -> RecallResult:
        def work(store: MemoryStore) -> RecallResult:
            recorded = _record(store, input.record)
            found = store.recall(input.query, input.goal_id, input.workspace, input.limit, input.at)
            working = None
            if found:
                attached = NewMemory(
                    layer="working",
                    kind="attached",
                    text=f"attached to step '{input.node}': " + ", ".join(m.id for m in found),
                    source=MemorySource(kind="node", goal=input.goal_id, node=input.node, node_key=input.node_key),
                    scope="goal",
                    scope_key=input.goal_id,
                    derived_from=[m.id for m in found],
                    made_at=input.at,
                    expires_at=expires("attached", input.at),
                )
                (working,), refused = store.write([attached])
                working = None if refused else working
            return RecallResult(
                memories=[recalled(m) for m in found],
                working=working,
                revoked=_revoked(store, input.check),
                recorded=recorded,
            )

        result = await self._run(work)
        activity.logger.info("memory recalled", extra={"node": input.node, "ids": [m.id for m in result.memories]})
        return result

    @activity.defn(name=Activities.MEMORY_REVOCATIONS)
    async def revocations(self, input: RevocationsInput) -> RevocationsResult:
        def work(store: MemoryStore) -> RevocationsResult:
            recorded = _record(store, input.record)
            return RevocationsResult(revoked=_revoked(store, input.ids), recorded=recorded)

        return await self._run(work)

    @activity.defn(name=Activities.MEMORY_RECORD)
    async def record(self, input: RecordInput) -> RecordResult:
        result = await self._run(lambda store: _record(store, input))
        assert result is not None
        return result

    @activity.defn(name=Activities.MEMORY_PROMOTE)
    async def promote(self, input: PromoteInput) -> PromoteResult:
        def work(store: MemoryStore) -> PromoteResult:
            found = store.get_many(input.ids)
            result = PromoteResult()
            for memory_id in input.ids:
                episodic = found.get(memory_id)
                if episodic is None or episodic.status != "live" or episodic.source.goal != input.goal_id:
                    result.refused.append(memory_id)
                    continue
                kind = "convention" if input.scope == "project" else "preference"
                semantic = NewMemory(
                    layer="semantic",
                    kind=kind,
                    text=episodic.text,
                    source=episodic.source,
                    scope=input.scope,
                    scope_key=input.workspace if input.scope == "project" else "",
                    derived_from=[episodic.id],
                    made_at=input.at,
                    expires_at=input.at + SHELF_LIFE[kind],
                )
                (semantic_id,), refused = store.write([semantic])
                if refused:
                    result.refused.append(memory_id)
                else:
                    result.promoted[memory_id] = semantic_id
            return result

        return await self._run(work)


def _record(store: MemoryStore, record: RecordInput | None) -> RecordResult | None:
    if record is None:
        return None
    ids, refused = store.write(record.memories) if record.memories else ([], [])
    dropped = store.drop_working(record.goal_id, record.drop_working_of)
    return RecordResult(ids=ids, refused=refused, dropped=dropped)


def _revoked(store: MemoryStore, ids: list[str]) -> list[Revocation]:
    found = store.get_many(ids)
    gone = [m for m in found.values() if m.status != "live"]
    replacements = store.get_many([m.replaced_by for m in gone if m.replaced_by])
    revoked = []
    for memory in gone:
        replacement = replacements.get(memory.replaced_by or "")
        live = replacement is not None and replacement.status == "live"
        revoked.append(
            Revocation(
                id=memory.id,
                why=memory.revoked_why or "revoked",
                at=memory.revoked_at or datetime.fromtimestamp(0, UTC),
                replaced_by=replacement.id if live else None,
                replacement=replacement.text[:SHOWN_CHARS] if live else None,
            )
        )
    return sorted(revoked, key=lambda r: r.id)
