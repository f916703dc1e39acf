"""The shared memory store: PostgreSQL (psycopg 3) when several hosts share memory
(PERDURE_MEMORY_URL=postgresql://…; docker-compose runs one). Full text search through a
generated tsvector column (english configuration) and a GIN index; memory/store.py says
what every backend does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.types.json import Jsonb

from perdure.memory.store import MemoryStore, MemoryStoreError
from perdure.workflows.goal.contracts.memory_contracts import Layer, Memory

SCHEMA = """
CREATE TABLE IF NOT EXISTS perdure_memories (
    id TEXT PRIMARY KEY,
    layer TEXT NOT NULL,
    scope TEXT NOT NULL,
    scope_key TEXT NOT NULL,
    source_kind TEXT NOT NULL,
    source_goal TEXT,
    source_node TEXT,
    source_path TEXT,
    source_digest TEXT,
    made_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ,
    status TEXT NOT NULL DEFAULT 'live',
    revoked_at TIMESTAMPTZ,
    revoked_why TEXT,
    replaced_by TEXT,
    text TEXT NOT NULL,
    data JSONB NOT NULL,
    tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
);
CREATE INDEX IF NOT EXISTS perdure_memories_tsv ON perdure_memories USING GIN (tsv);
CREATE INDEX IF NOT EXISTS perdure_memories_goal ON perdure_memories (source_goal, source_node);
CREATE INDEX IF NOT EXISTS perdure_memories_scope ON perdure_memories (scope, scope_key);
CREATE INDEX IF NOT EXISTS perdure_memories_path ON perdure_memories (source_path);
CREATE TABLE IF NOT EXISTS perdure_memory_derivations (
    child TEXT NOT NULL,
    parent TEXT NOT NULL,
    PRIMARY KEY (child, parent)
);
CREATE INDEX IF NOT EXISTS perdure_memory_derivations_parent ON perdure_memory_derivations (parent);
"""
COLUMNS = "m.id, m.status, m.revoked_at, m.revoked_why, m.replaced_by, m.data"
# Two processes creating the schema at once would race on CREATE ... IF NOT EXISTS.
SCHEMA_LOCK = 72_210_021


def shown_url(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class PostgresStore(MemoryStore):
    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = shown_url(url)
        try:
            self._db = psycopg.connect(url, autocommit=True, connect_timeout=10)
            with self._db.transaction():
                self._db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                self._db.execute(SCHEMA)
        except psycopg.Error as err:
            raise MemoryStoreError(f"cannot open the memory store {self.url}: {_one_line(err)}") from None
        self._lock = threading.Lock()

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection]:
        with self._lock:
            try:
                with self._db.transaction():
                    yield self._db
            except psycopg.Error as err:
                raise MemoryStoreError(f"memory store {self.url}: {_one_line(err)}") from None

    def _rows(self, sql: str, args: tuple | list = ()) -> list[Memory]:
        with self._lock:
            try:
                rows = self._db.execute(sql, args).fetchall()
            except psycopg.Error as err:
                raise MemoryStoreError(f"memory store {self.url}: {_one_line(err)}") from None
        return [_memory(row) for row in rows]

    def _insert(self, memories: list[Memory]) -> list[str]:
        refused = []
        with self._tx() as db:
            for m in memories:
                row = db.execute("SELECT status FROM perdure_memories WHERE id = %s", (m.id,)).fetchone()
                if row is not None:
                    if row[0] != "live":
                        refused.append(m.id)
                    continue
                if m.derived_from:
                    # Locked: a forget revoking a source meanwhile waits for this write, or this for it.
                    live = db.execute(
                        "SELECT id FROM perdure_memories WHERE status = 'live' AND id = ANY(%s) FOR SHARE",
                        (m.derived_from,),
                    ).fetchall()
                    if len(live) != len(m.derived_from):
                        refused.append(m.id)
                        continue
                source = m.source
                db.execute(
                    "INSERT INTO perdure_memories (id, layer, scope, scope_key, source_kind, source_goal, "
                    "source_node, source_path, source_digest, made_at, expires_at, text, data) "
                    "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (id) DO NOTHING",
                    (
                        m.id,
                        m.layer,
                        m.scope,
                        m.scope_key,
                        source.kind,
                        source.goal,
                        source.node,
                        source.path,
                        source.digest,
                        m.made_at,
                        m.expires_at,
                        m.text if m.layer != "working" else "",
                        Jsonb(m.model_dump(mode="json")),
                    ),
                )
                for parent in m.derived_from:
                    db.execute(
                        "INSERT INTO perdure_memory_derivations (child, parent) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                        (m.id, parent),
                    )
        return refused

    def _search(self, terms: list[str], goal_id: str, workspace: str, limit: int, now: datetime) -> list[Memory]:
        query = " | ".join(terms)
        return self._rows(
            f"SELECT {COLUMNS} FROM perdure_memories m, to_tsquery('english', %s) q "
            "WHERE m.tsv @@ q AND m.status = 'live' AND m.layer != 'working' "
            "AND (m.expires_at IS NULL OR m.expires_at > %s) "
            "AND ((m.scope = 'goal' AND m.scope_key = %s) OR (m.scope = 'project' AND m.scope_key = %s) "
            "OR m.scope = 'global') ORDER BY ts_rank(m.tsv, q) DESC, m.made_at DESC LIMIT %s",
            (query, now, goal_id, workspace, limit),
        )

    def get(self, memory_id: str) -> Memory | None:
        found = self._rows(f"SELECT {COLUMNS} FROM perdure_memories m WHERE m.id = %s", (memory_id,))
        return found[0] if found else None

    def get_many(self, ids: list[str]) -> dict[str, Memory]:
        if not ids:
            return {}
        rows = self._rows(f"SELECT {COLUMNS} FROM perdure_memories m WHERE m.id = ANY(%s)", (ids,))
        return {m.id: m for m in rows}

    def listing(
        self, goal: str | None = None, layer: Layer | None = None, include_revoked: bool = False
    ) -> list[Memory]:
        where, args = [], []
        if goal is not None:
            where.append("(m.source_goal = %s OR (m.scope = 'goal' AND m.scope_key = %s))")
            args += [goal, goal]
        if layer is not None:
            where.append("m.layer = %s")
            args.append(layer)
        if not include_revoked:
            where.append("m.status = 'live'")
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return self._rows(f"SELECT {COLUMNS} FROM perdure_memories m{clause} ORDER BY m.made_at DESC, m.id", args)

    def children(self, ids: list[str]) -> list[Memory]:
        if not ids:
            return []
        return self._rows(
            f"SELECT DISTINCT {COLUMNS} FROM perdure_memory_derivations d "
            "JOIN perdure_memories m ON m.id = d.child WHERE d.parent = ANY(%s) AND m.status = 'live'",
            (ids,),
        )

    def revoke(self, ids: list[str], why: str, at: datetime) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE perdure_memories SET status = 'revoked', revoked_at = %s, revoked_why = %s "
                "WHERE id = ANY(%s) AND status = 'live'",
                (at, why, ids),
            )

    def note_revocation(self, memory_id: str, why: str, replaced_by: str | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE perdure_memories SET revoked_why = %s, replaced_by = %s WHERE id = %s",
                (why, replaced_by, memory_id),
            )

    def by_source(
        self,
        *,
        goal: str | None = None,
        node: str | None = None,
        paths: list[str] | None = None,
        digest: str | None = None,
    ) -> list[Memory]:
        where, args = [], []
        if goal is not None:
            where.append("m.source_goal = %s")
            args.append(goal)
        if node is not None:
            where.append("m.source_node = %s")
            args.append(node)
        if paths:
            where.append("m.source_kind = 'file' AND m.source_path = ANY(%s)")
            args.append(paths)
        if digest is not None:
            where.append("m.source_digest = %s")
            args.append(digest)
        if not where:
            return []
        return self._rows(
            f"SELECT {COLUMNS} FROM perdure_memories m WHERE {' AND '.join(where)} ORDER BY m.made_at, m.id", args
        )

    def drop_working(self, goal_id: str, nodes: list[str]) -> int:
        if not nodes:
            return 0
        with self._tx() as db:
            ids = [
                r[0]
                for r in db.execute(
                    "DELETE FROM perdure_memories WHERE layer = 'working' AND source_goal = %s "
                    "AND source_node = ANY(%s) RETURNING id",
                    (goal_id, nodes),
                ).fetchall()
            ]
            if ids:
                db.execute(
                    "DELETE FROM perdure_memory_derivations WHERE child = ANY(%s) OR parent = ANY(%s)", (ids, ids)
                )
        return len(ids)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _memory(row: tuple) -> Memory:
    memory_id, status, revoked_at, revoked_why, replaced_by, data = row
    fields = dict(data)
    fields.update(
        id=memory_id,
        status=status,
        revoked_at=revoked_at,
        revoked_why=revoked_why,
        replaced_by=replaced_by,
    )
    return Memory.model_validate(fields)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())[:500]
