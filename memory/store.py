"""The memory store: where it is (PERDURE_MEMORY_URL, else SQLite under PERDURE_HOME),
what every backend does the same way (ids, scrubbing, what may be written, recall),
and the primitives each backend (memory/sqlite.py, memory/postgres.py) implements.

Worker- and CLI-side only: it does I/O. The goal reaches it through the
`perdure.memory.*` activities (activities/goal/memory_activities.py); `perdure forget` and
`perdure memory` open it directly.

    PERDURE_MEMORY_URL   postgresql://user:pass@host/db (several hosts share memory), or
                         sqlite:///path/to/memory.sqlite3; unset: $PERDURE_HOME/memory/memory.sqlite3

Rules every backend keeps, in one transaction per write:
- a memory's id is derived from what it is (layer, kind, scope, source, text, sources),
  so a write is idempotent and a revoked memory is never written live again;
- a memory derived from one that is not live is refused: no live memory depends on a
  revoked one (the forget's invariant, tests/test_memory_store.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from abc import ABC, abstractmethod
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

from perdure.memory.secrets import scrub, worker_secrets
from perdure.runtime import settings
from perdure.workflows.goal.contracts.memory_contracts import MAX_TEXT, SHOWN_CHARS, Layer, Memory, NewMemory, Recalled

URL_ENV = "PERDURE_MEMORY_URL"
SQLITE_NAME = "memory.sqlite3"
MAX_TERMS = 24
_TERM = re.compile(r"[a-z0-9]{3,}")
# Words that would match almost any memory.
_STOP = frozenset(
    "the and for are was were this that these those with from into over under then than have has had not "
    "but all any can its it's you your our out use used using step steps kind llm agent tool prompt goal "
    "what when where which who how why does did done each make made more most other some such only also".split()
)


class MemoryStoreError(RuntimeError):
    """The store cannot be opened or used as configured; the message says which and why."""


class NoMemoryStore(MemoryStoreError):
    """No store exists yet where this machine looks for it."""


def store_url(home: Path | None = None) -> str:
    """The store's URL: PERDURE_MEMORY_URL, else the SQLite file under `home` (PERDURE_HOME)."""
    url = os.environ.get(URL_ENV, "").strip()
    if url:
        return url
    return f"sqlite://{((home or settings.perdure_home()) / 'memory' / SQLITE_NAME).absolute()}"


def shared() -> bool:
    """Whether PERDURE_MEMORY_URL names a server several hosts reach (PostgreSQL), rather than
    a SQLite file on this host."""
    return urlsplit(os.environ.get(URL_ENV, "").strip()).scheme in ("postgresql", "postgres")


def open_store(url: str | None = None, *, create: bool = True, home: Path | None = None) -> MemoryStore:
    """The store at `url` (default: `store_url(home)`). With `create=False` (the CLI's
    reads) a SQLite file that does not exist is NoMemoryStore, not an empty new store."""
    url = url or store_url(home)
    scheme = urlsplit(url).scheme
    if scheme in ("postgresql", "postgres"):
        from perdure.memory.postgres import PostgresStore

        return PostgresStore(url)
    if scheme == "sqlite":
        # As a file: URL reads: sqlite:///abs/path (sqlite:////abs/path too).
        rest = url[len("sqlite://") :]
        path = Path(rest[1:] if rest.startswith("//") else rest)
        if not rest.strip("/"):
            raise MemoryStoreError(
                f"{URL_ENV}={url}: a sqlite URL needs a file path, e.g. sqlite:///data/memory.sqlite3"
            )
        if not create and not path.is_file():
            raise NoMemoryStore(
                f"no memory store yet at {path} (a worker creates it when a goal first recalls or writes a memory)"
            )
        from perdure.memory.sqlite import SqliteStore

        return SqliteStore(path)
    raise MemoryStoreError(
        f"{URL_ENV}={url}: not a memory store URL; use postgresql://user:password@host/database or sqlite:///path"
    )


def memory_id(memory: NewMemory) -> str:
    identity = [
        memory.layer,
        memory.kind,
        memory.scope,
        memory.scope_key,
        memory.source.model_dump(mode="json"),
        memory.text,
        sorted(memory.derived_from),
    ]
    return "m-" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


def query_terms(text: str) -> list[str]:
    """The words a recall searches for: lower-case, three characters or more, no filler."""
    seen: dict[str, None] = {}
    for word in _TERM.findall(text.lower()):
        if word not in _STOP:
            seen.setdefault(word, None)
    return list(seen)[:MAX_TERMS]


def recalled(memory: Memory) -> Recalled:
    text = memory.text if len(memory.text) <= SHOWN_CHARS else memory.text[:SHOWN_CHARS] + " …"
    return Recalled(
        id=memory.id,
        layer=memory.layer,
        kind=memory.kind,
        text=text,
        scope=memory.scope,
        scope_key=memory.scope_key,
        source=memory.source.label(),
        made_at=memory.made_at,
    )


class MemoryStore(ABC):
    """One backend. Its primitives are synchronous (activities run them in a thread)."""

    url: str

    def __init__(self) -> None:
        self._secrets = worker_secrets()

    # --- what every backend does the same way ------------------------------------------

    def prepare(self, new: NewMemory) -> Memory:
        """The memory as stored: scrubbed of secrets, clipped, with its id."""
        text, redacted = scrub(new.text, self._secrets)
        text = text.strip()[:MAX_TEXT] or "(empty)"
        clean = new.model_copy(update={"text": text, "derived_from": sorted(set(new.derived_from))})
        return Memory(**clean.model_dump(), id=memory_id(clean), redacted=redacted)

    def write(self, memories: list[NewMemory]) -> tuple[list[str], list[str]]:
        """(the id of each, in order; those refused: revoked before, or derived from a
        memory that is not live). A memory already stored live is not written again."""
        prepared = [self.prepare(m) for m in memories]
        refused = self._insert(prepared)
        return [m.id for m in prepared], refused

    def recall(self, query: str, goal_id: str, workspace: str, limit: int, now: datetime) -> list[Memory]:
        """The live, unexpired memories of this goal, this workspace and global ones that
        match the query best (never working memories: they are a node's own)."""
        terms = query_terms(query)
        if not terms:
            return []
        return self._search(terms, goal_id, workspace, limit, now)

    # --- each backend's primitives -------------------------------------------------------

    @abstractmethod
    def _insert(self, memories: list[Memory]) -> list[str]:
        """Insert in one transaction; return the ids refused (see `write`)."""

    @abstractmethod
    def _search(self, terms: list[str], goal_id: str, workspace: str, limit: int, now: datetime) -> list[Memory]: ...

    @abstractmethod
    def get(self, memory_id: str) -> Memory | None: ...

    @abstractmethod
    def get_many(self, ids: list[str]) -> dict[str, Memory]: ...

    @abstractmethod
    def listing(
        self, goal: str | None = None, layer: Layer | None = None, include_revoked: bool = False
    ) -> list[Memory]:
        """Newest first; `goal`: made by that goal or scoped to it."""

    @abstractmethod
    def children(self, ids: list[str]) -> list[Memory]:
        """The live memories derived directly from any of `ids`."""

    @abstractmethod
    def revoke(self, ids: list[str], why: str, at: datetime) -> None:
        """Mark these revoked (those already revoked keep their first revocation)."""

    @abstractmethod
    def note_revocation(self, memory_id: str, why: str, replaced_by: str | None = None) -> None:
        """Say how a revoked memory ended: regenerated as `replaced_by`, or dropped."""

    @abstractmethod
    def by_source(
        self,
        *,
        goal: str | None = None,
        node: str | None = None,
        paths: list[str] | None = None,
        digest: str | None = None,
    ) -> list[Memory]:
        """Memories (any status) from this source: a goal (and a step of it) or a file."""

    @abstractmethod
    def drop_working(self, goal_id: str, nodes: list[str]) -> int:
        """Delete the working memories of these nodes of this goal; how many went."""

    @abstractmethod
    def close(self) -> None: ...
