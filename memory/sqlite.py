"""The embedded memory store: one SQLite file (WAL, so several worker processes on one
machine share it) with an FTS5 index of the texts (porter stemming). The default under
PERDURE_HOME; memory/store.py says what every backend does."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from perdure.memory.store import MemoryStore, MemoryStoreError
from perdure.workflows.goal.contracts.memory_contracts import Layer, Memory

SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    id TEXT PRIMARY KEY,
    layer TEXT NOT NULL,
    scope TEXT NOT NULL,
    scope_key TEXT NOT NULL,
    source_kind TEXT NOT NULL,
    source_goal TEXT,
    source_node TEXT,
    source_path TEXT,
    source_digest TEXT,
    made_at TEXT NOT NULL,
    expires_at TEXT,
    status TEXT NOT NULL DEFAULT 'live',
    revoked_at TEXT,
    revoked_why TEXT,
    replaced_by TEXT,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS memories_goal ON memories (source_goal, source_node);
CREATE INDEX IF NOT EXISTS memories_scope ON memories (scope, scope_key);
CREATE INDEX IF NOT EXISTS memories_path ON memories (source_path);
CREATE TABLE IF NOT EXISTS derivations (
    child TEXT NOT NULL,
    parent TEXT NOT NULL,
    PRIMARY KEY (child, parent)
);
CREATE INDEX IF NOT EXISTS derivations_parent ON derivations (parent);
CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5(id UNINDEXED, text, tokenize='porter unicode61');
"""
COLUMNS = "id, status, revoked_at, revoked_why, replaced_by, data"


class SqliteStore(MemoryStore):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.url = f"sqlite://{path}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # One connection, used from the activities' threads one at a time.
            self._db = sqlite3.connect(path, timeout=15, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA busy_timeout=15000")
            self._db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as err:
            raise MemoryStoreError(f"cannot open the memory store {path}: {err}") from None
        self._lock = threading.Lock()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as err:
                raise MemoryStoreError(f"memory store {self.path}: {err}") from None

    def _rows(self, sql: str, args: tuple | list = ()) -> list[Memory]:
        with self._lock:
            try:
                rows = self._db.execute(sql, args).fetchall()
            except sqlite3.Error as err:
                raise MemoryStoreError(f"memory store {self.path}: {err}") from None
        return [_memory(row) for row in rows]

    def _insert(self, memories: list[Memory]) -> list[str]:
        refused = []
        with self._tx() as db:
            for m in memories:
                row = db.execute("SELECT status FROM memories WHERE id = ?", (m.id,)).fetchone()
                if row is not None:
                    if row[0] != "live":
                        refused.append(m.id)
                    continue
                if m.derived_from:
                    marks = ",".join("?" * len(m.derived_from))
                    live = db.execute(
                        f"SELECT count(*) FROM memories WHERE status = 'live' AND id IN ({marks})", m.derived_from
                    ).fetchone()[0]
                    if live != len(m.derived_from):
                        refused.append(m.id)
                        continue
                source = m.source
                db.execute(
                    "INSERT INTO memories (id, layer, scope, scope_key, source_kind, source_goal, source_node, "
                    "source_path, source_digest, made_at, expires_at, data) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
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
                        m.made_at.isoformat(),
                        m.expires_at.isoformat() if m.expires_at else None,
                        m.model_dump_json(),
                    ),
                )
                db.executemany(
                    "INSERT OR IGNORE INTO derivations (child, parent) VALUES (?, ?)",
                    [(m.id, parent) for parent in m.derived_from],
                )
                if m.layer != "working":
                    db.execute("INSERT INTO memories_fts (id, text) VALUES (?, ?)", (m.id, m.text))
        return refused

    def _search(self, terms: list[str], goal_id: str, workspace: str, limit: int, now: datetime) -> list[Memory]:
        match = " OR ".join(f'"{t}"' for t in terms)
        return self._rows(
            f"SELECT {', '.join('m.' + c for c in COLUMNS.split(', '))} FROM memories_fts f "
            "JOIN memories m ON m.id = f.id WHERE memories_fts MATCH ? AND m.status = 'live' "
            "AND m.layer != 'working' AND (m.expires_at IS NULL OR m.expires_at > ?) "
            "AND ((m.scope = 'goal' AND m.scope_key = ?) OR (m.scope = 'project' AND m.scope_key = ?) "
            "OR m.scope = 'global') ORDER BY bm25(memories_fts), m.made_at DESC LIMIT ?",
            (match, now.isoformat(), goal_id, workspace, limit),
        )

    def get(self, memory_id: str) -> Memory | None:
        found = self._rows(f"SELECT {COLUMNS} FROM memories WHERE id = ?", (memory_id,))
        return found[0] if found else None

    def get_many(self, ids: list[str]) -> dict[str, Memory]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        return {m.id: m for m in self._rows(f"SELECT {COLUMNS} FROM memories WHERE id IN ({marks})", ids)}

    def listing(
        self, goal: str | None = None, layer: Layer | None = None, include_revoked: bool = False
    ) -> list[Memory]:
        where, args = [], []
        if goal is not None:
            where.append("(source_goal = ? OR (scope = 'goal' AND scope_key = ?))")
            args += [goal, goal]
        if layer is not None:
            where.append("layer = ?")
            args.append(layer)
        if not include_revoked:
            where.append("status = 'live'")
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return self._rows(f"SELECT {COLUMNS} FROM memories{clause} ORDER BY made_at DESC, id", args)

    def children(self, ids: list[str]) -> list[Memory]:
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        return self._rows(
            f"SELECT DISTINCT {', '.join('m.' + c for c in COLUMNS.split(', '))} FROM derivations d "
            f"JOIN memories m ON m.id = d.child WHERE d.parent IN ({marks}) AND m.status = 'live'",
            ids,
        )

    def revoke(self, ids: list[str], why: str, at: datetime) -> None:
        with self._tx() as db:
            for memory_id in ids:
                db.execute(
                    "UPDATE memories SET status = 'revoked', revoked_at = ?, revoked_why = ? "
                    "WHERE id = ? AND status = 'live'",
                    (at.isoformat(), why, memory_id),
                )
                db.execute("DELETE FROM memories_fts WHERE id = ?", (memory_id,))

    def note_revocation(self, memory_id: str, why: str, replaced_by: str | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE memories SET revoked_why = ?, replaced_by = ? WHERE id = ?", (why, replaced_by, memory_id)
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
            where.append("source_goal = ?")
            args.append(goal)
        if node is not None:
            where.append("source_node = ?")
            args.append(node)
        if paths:
            where.append(f"source_kind = 'file' AND source_path IN ({','.join('?' * len(paths))})")
            args += paths
        if digest is not None:
            where.append("source_digest = ?")
            args.append(digest)
        if not where:
            return []
        return self._rows(f"SELECT {COLUMNS} FROM memories WHERE {' AND '.join(where)} ORDER BY made_at, id", args)

    def drop_working(self, goal_id: str, nodes: list[str]) -> int:
        if not nodes:
            return 0
        marks = ",".join("?" * len(nodes))
        with self._tx() as db:
            ids = [
                r[0]
                for r in db.execute(
                    f"SELECT id FROM memories WHERE layer = 'working' AND source_goal = ? AND source_node IN ({marks})",
                    [goal_id, *nodes],
                ).fetchall()
            ]
            for memory_id in ids:
                db.execute("DELETE FROM derivations WHERE child = ? OR parent = ?", (memory_id, memory_id))
                db.execute("DELETE FROM memories WHERE id = ?", (memory_id,))
        return len(ids)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _memory(row: tuple) -> Memory:
    memory_id, status, revoked_at, revoked_why, replaced_by, data = row
    fields = json.loads(data)
    fields.update(
        id=memory_id,
        status=status,
        revoked_at=revoked_at,
        revoked_why=revoked_why,
        replaced_by=replaced_by,
    )
    return Memory.model_validate(fields)
