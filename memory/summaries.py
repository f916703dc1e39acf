"""Derived memories: a summary made from other memories, by a model call through a
profile when one is configured (`--profile`, PERDURE_MEMORY_PROFILE, or the profile that
made the summary before), else by extracting the sources' texts. The same maker
re-makes a summary when a forget takes one of its sources away (memory/forget.py)."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Protocol

from perdure.activities.models.profiles import ModelConfig, ModelConfigInvalid, UnknownModelProfile, load_model_config
from perdure.activities.models.providers import ChatMessage, ChatRequest, provider_for
from perdure.memory.store import MemoryStore, MemoryStoreError
from perdure.workflows.goal.contracts.memory_contracts import Memory, MemorySource, NewMemory, Scope

PROFILE_ENV = "PERDURE_MEMORY_PROFILE"
SUMMARY_MARKER = "PERDURE-MEMORY-SUMMARY"
EXTRACT = "extract"
EXTRACT_CHARS = 600
SCOPE_ORDER = {"goal": 0, "project": 1, "global": 2}


class Summarizer(Protocol):
    name: str

    async def summarize(self, texts: list[str]) -> str: ...


class ExtractSummarizer:
    """No model: the sources' texts, joined and clipped."""

    name = EXTRACT

    async def summarize(self, texts: list[str]) -> str:
        joined = "; ".join(t.strip() for t in texts if t.strip())
        return joined if len(joined) <= EXTRACT_CHARS else joined[:EXTRACT_CHARS] + " …"


class ModelSummarizer:
    """One model call through a profile (its key is read by the provider, never here)."""

    def __init__(self, config: ModelConfig, profile: str) -> None:
        self._profile = config.resolve(profile)
        self.name = profile

    async def summarize(self, texts: list[str]) -> str:
        listing = "\n".join(f"- {t}" for t in texts)
        request = ChatRequest(
            messages=[
                ChatMessage(
                    role="system",
                    content=f"[{SUMMARY_MARKER}]\nYou condense remembered facts into one short memory. Keep only "
                    "what the facts below say; add nothing; one or two sentences.",
                ),
                ChatMessage(role="user", content=f"Facts to condense:\n{listing}"),
            ]
        )
        try:
            response = await provider_for(self._profile).chat(request)
        except Exception as err:  # noqa: BLE001 - whatever the provider raised, one line for the user
            raise MemoryStoreError(f"profile {self.name} could not summarize: {str(err)[:300]}") from None
        return response.text.strip() or await ExtractSummarizer().summarize(texts)


def summarizer_for(profile: str | None, made_by: str | None = None) -> Summarizer:
    """`profile`, else PERDURE_MEMORY_PROFILE, else the one that made it before (if it is
    still configured), else extraction. A profile asked for by name must exist."""
    chosen = profile or os.environ.get(PROFILE_ENV) or None
    if chosen:
        try:
            return ModelSummarizer(load_model_config(), chosen)
        except (UnknownModelProfile, ModelConfigInvalid) as err:
            raise MemoryStoreError(str(err)) from None
    if made_by and made_by != EXTRACT:
        try:
            return ModelSummarizer(load_model_config(), made_by)
        except (UnknownModelProfile, ModelConfigInvalid):
            pass
    return ExtractSummarizer()


async def summarize(
    store: MemoryStore, ids: list[str], summarizer: Summarizer, now: datetime
) -> tuple[Memory, list[Memory]]:
    """A summary of these live memories, written derived from them: (it, its sources).
    Its scope is the narrowest of theirs (a goal's memory never leaks into a global one)."""
    found = store.get_many(ids)
    missing = [i for i in ids if i not in found]
    if missing:
        raise MemoryStoreError(f"no memory {', '.join(missing)} in the store at {store.url}")
    sources = [found[i] for i in dict.fromkeys(ids)]
    gone = [m.id for m in sources if m.status != "live"]
    if gone:
        raise MemoryStoreError(f"{', '.join(gone)} revoked: a summary is made from live memories only")
    if any(m.layer == "working" for m in sources):
        raise MemoryStoreError("working memories belong to one step and are not summarized")
    narrowest = min(SCOPE_ORDER[m.scope] for m in sources)
    keys = {m.scope_key for m in sources if SCOPE_ORDER[m.scope] == narrowest}
    if len(keys) > 1:
        raise MemoryStoreError(f"these memories belong to different {sources[0].scope}s: {', '.join(sorted(keys))}")
    scope: Scope = next(m.scope for m in sources if SCOPE_ORDER[m.scope] == narrowest)
    text = await summarizer.summarize([m.text for m in sources])
    new = NewMemory(
        layer="semantic" if all(m.layer == "semantic" for m in sources) else "episodic",
        kind="summary",
        text=text,
        # Made by whoever summarised: the goal all its sources came from, else a person.
        source=_maker(sources),
        scope=scope,
        scope_key=keys.pop(),
        derived_from=[m.id for m in sources],
        made_at=now,
        expires_at=None,
        made_by=summarizer.name,
    )
    (summary_id,), refused = store.write([new])
    if refused:
        raise MemoryStoreError(f"a source of {summary_id} was revoked meanwhile: no summary written")
    summary = store.get(summary_id)
    assert summary is not None
    return summary, sources


def _maker(sources: list[Memory]) -> MemorySource:
    goals = {m.source.goal for m in sources}
    goal = goals.pop() if len(goals) == 1 else None
    return MemorySource(kind="goal", goal=goal) if goal else MemorySource(kind="person")
