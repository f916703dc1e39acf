"""The memory store (memory/), one suite for both backends: SQLite with FTS5 (the
embedded default) and PostgreSQL 15 (a throwaway cluster in a temp dir, started once per
session from the binaries in /usr/local/bin). Writes are idempotent and scrubbed of
secrets, recall is scoped (this goal, this workspace, global) and skips what is revoked,
expired or working, working memories go on compaction, a forget revokes transitively and
re-makes or drops what was derived; and the property: after any sequence of writes,
derivations and forgets, no live memory depends, however indirectly, on a revoked one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from perdure.memory.forget import NothingToForget, forget
from perdure.memory.store import MemoryStore, MemoryStoreError, NoMemoryStore, open_store
from perdure.memory.summaries import ExtractSummarizer, summarize
from perdure.workflows.goal.contracts.memory_contracts import MemorySource, NewMemory

PG_BIN = Path("/usr/local/bin")
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
WS = "/srv/poster"


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL 15 cluster in a temp dir, for this session only (fsync off). As root,
    the server runs as the `postgres` user, which refuses to run as root."""
    root = Path(tempfile.mkdtemp(prefix="perdure-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"
    subprocess.run(
        [*run_as, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "perdure", "--no-sync", "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    options = f"-k {root} -p {port} -h 127.0.0.1 -c fsync=off -c synchronous_commit=off"
    subprocess.run(
        [*run_as, str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-o", options, "-w", "start"],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://perdure@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*run_as, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(root, ignore_errors=True)


def _fresh_postgres(url: str) -> str:
    """A database of its own per test, so tests do not see each other's memories."""
    import psycopg

    name = f"t{os.urandom(6).hex()}"
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path) -> Iterator[MemoryStore]:
    if request.param == "sqlite":
        opened = open_store(f"sqlite://{tmp_path / 'memory.sqlite3'}")
    else:
        opened = open_store(_fresh_postgres(request.getfixturevalue("postgres_url")))
    yield opened
    opened.close()


def memory(text: str, *, scope="project", key=WS, layer="semantic", kind="note", **source) -> NewMemory:
    return NewMemory(
        layer=layer,
        kind=kind,
        text=text,
        source=MemorySource(**(source or {"kind": "person"})),
        scope=scope,
        scope_key=key if scope != "global" else "",
        made_at=NOW,
        expires_at=NOW + timedelta(days=30),
    )


def from_file(text: str, path: str, digit: str) -> NewMemory:
    source = MemorySource(kind="file", path=path, digest="sha256:" + digit * 64)
    return memory(text).model_copy(update={"source": source})


@pytest.mark.slow
def test_a_write_is_idempotent_and_a_revoked_memory_is_never_written_live_again(store):
    new = memory("titles are set in a warm serif font")
    (first,), _ = store.write([new])
    (again,), refused = store.write([new])
    assert first == again and refused == [] and len(store.listing()) == 1
    store.revoke([first], "forgotten", NOW)
    (_,), refused = store.write([new])
    assert refused == [first] and store.get(first).status == "revoked"


def test_secrets_the_scrubber_knows_are_redacted_before_storing(store, monkeypatch, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[credentials.POSTER_API]\nhosts = ["api.example.com"]\n')
    monkeypatch.setenv("PERDURE_CONFIG", str(config))
    monkeypatch.setenv("POSTER_API", "s3cr3t-value-of-the-poster-api")
    worker = open_store(store.url)  # a store reads the worker's secrets as it opens
    try:
        text = "used s3cr3t-value-of-the-poster-api, token: abcdefghijklmnop1234 and sk-proj-abcdefghijklmnopqrstu"
        (memory_id,), _ = worker.write([memory(text)])
        stored = worker.get(memory_id)
    finally:
        worker.close()
    assert "s3cr3t" not in stored.text and "abcdefghijklmnop1234" not in stored.text and "sk-proj" not in stored.text
    assert stored.text.count("[redacted]") == 3 and stored.redacted == 3


def test_recall_is_scoped_to_the_goal_the_workspace_and_global_and_skips_what_is_not_live(store):
    ids, _ = store.write(
        [
            memory("poster colours: a blue colour scheme"),
            memory("poster colours: warm orange accents", scope="global"),
            memory("poster colours for goal g1 only", scope="goal", key="g1", layer="episodic", kind="conclusion"),
            memory("poster colours of another project", key="/srv/other"),
            memory("poster colours of goal g2", scope="goal", key="g2", layer="episodic", kind="conclusion"),
            memory("poster colours attached", scope="goal", key="g1", layer="working", kind="attached"),
            memory("poster colours that expired").model_copy(update={"expires_at": NOW - timedelta(days=1)}),
            memory("poster colours revoked"),
        ]
    )
    store.revoke([ids[7]], "forgotten", NOW)
    found = {m.id for m in store.recall("design the poster colours", "g1", WS, 5, NOW)}
    assert found == {ids[0], ids[1], ids[2]}
    assert len(store.recall("poster colours", "g1", WS, 2, NOW)) == 2
    assert store.recall("nothing about that at all", "g1", WS, 5, NOW) == []


def test_working_memories_go_when_their_step_is_compacted(store):
    (source,), _ = store.write([memory("exports need a byte order mark")])
    working = NewMemory(
        layer="working",
        kind="attached",
        text="attached to step 'export': " + source,
        source=MemorySource(kind="node", goal="g1", node="export"),
        scope="goal",
        scope_key="g1",
        derived_from=[source],
        made_at=NOW,
    )
    (working_id,), _ = store.write([working])
    assert [m.id for m in store.children([source])] == [working_id]
    assert store.drop_working("g1", ["other-step"]) == 0
    assert store.drop_working("g1", ["export"]) == 1
    assert store.get(working_id) is None and store.children([source]) == []


def test_a_derivation_from_a_revoked_memory_is_refused(store):
    (source,), _ = store.write([memory("the client prefers matte paper")])
    store.revoke([source], "forgotten", NOW)
    derived = memory("summary of matte paper", kind="summary").model_copy(update={"derived_from": [source]})
    (derived_id,), refused = store.write([derived])
    assert refused == [derived_id] and store.get(derived_id) is None


async def test_a_forget_goes_through_two_derived_summaries_and_drops_what_has_no_source_left(store):
    (blue, serif, matte), _ = store.write(
        [
            from_file("the poster uses a blue colour scheme", "/srv/poster/colours.md", "a"),
            memory("titles are set in a warm serif font"),
            memory("the client prefers matte paper"),
        ]
    )
    first, _ = await summarize(store, [blue, serif], ExtractSummarizer(), NOW)
    second, _ = await summarize(store, [first.id, matte], ExtractSummarizer(), NOW)
    only_blue, _ = await summarize(store, [blue], ExtractSummarizer(), NOW)
    report = await forget(store, "/srv/poster/colours.md@sha256:" + "a" * 64, NOW)

    assert [m.id for m in report.revoked] == [blue]
    assert [(r.old, r.sources) for r in report.regenerated][0] == (first.id, [serif])
    remade_first = report.regenerated[0].new
    assert report.regenerated[1].old == second.id and set(report.regenerated[1].sources) == {remade_first, matte}
    assert [m.id for m in report.dropped] == [only_blue.id]
    live = {m.id: m for m in store.listing()}
    assert set(live) == {serif, matte, remade_first, report.regenerated[1].new}
    assert "blue" not in " ".join(m.text for m in live.values())
    assert store.get(first.id).replaced_by == remade_first
    with pytest.raises(NothingToForget, match="forgotten already"):
        await forget(store, "/srv/poster/colours.md", NOW)


def test_open_store_says_what_is_wrong_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(NoMemoryStore, match="no memory store yet at"):
        open_store(f"sqlite://{tmp_path / 'none.sqlite3'}", create=False)
    with pytest.raises(MemoryStoreError, match="not a memory store URL"):
        open_store("mysql://somewhere/db")
    with pytest.raises(MemoryStoreError, match="cannot open the memory store postgresql://u:\\*\\*\\*@127.0.0.1:1/db"):
        open_store("postgresql://u:hunter2@127.0.0.1:1/db")


# --- the property -------------------------------------------------------------------------

WORDS = ["blue", "serif", "matte", "poster", "caption", "orange", "print", "proof"]


class ForgetMachine(RuleBasedStateMachine):
    """Writes (from a few goals and files), summaries of live memories, forgets of a
    memory, a goal or a file, in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.store: MemoryStore = ForgetMachine.open()
        self.n = 0

    # Set by the test: a fresh, empty store for each example.
    open = staticmethod(lambda: None)

    @rule(word=st.sampled_from(WORDS), goal=st.sampled_from(["g1", "g2"]), file=st.booleans())
    def write(self, word: str, goal: str, file: bool) -> None:
        self.n += 1
        text = f"{word} note {self.n}"
        source = MemorySource(kind="node", goal=goal, node=f"s{self.n % 3}")
        self.store.write(
            [from_file(text, f"/srv/{word}.md", "b") if file else memory(text).model_copy(update={"source": source})]
        )

    @rule(data=st.data())
    def derive(self, data) -> None:
        live = [m.id for m in self.store.listing() if m.layer != "working"]
        if not live:
            return
        picked = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=3, unique=True))
        try:
            asyncio.run(summarize(self.store, picked, ExtractSummarizer(), NOW))
        except MemoryStoreError as err:
            # The same summary again, of sources a forget revoked it from: refused, rightly.
            assert "revoked meanwhile" in str(err)

    @rule(data=st.data())
    def forget_something(self, data) -> None:
        everything = self.store.listing(include_revoked=True)
        if not everything:
            return
        m = data.draw(st.sampled_from(everything))
        choices = [m.id]
        if m.source.goal:
            choices.append(m.source.goal)
        if m.source.path:
            choices.append(m.source.path)
        target = data.draw(st.sampled_from(choices))
        try:
            asyncio.run(forget(self.store, target, NOW))
        except NothingToForget:
            pass

    @invariant()
    def no_live_memory_depends_on_a_revoked_one(self) -> None:
        everything = {m.id: m for m in self.store.listing(include_revoked=True)}
        for m in everything.values():
            if m.status != "live":
                continue
            stack, seen = list(m.derived_from), set()
            while stack:
                parent = stack.pop()
                if parent in seen:
                    continue
                seen.add(parent)
                assert parent in everything and everything[parent].status == "live", (m.id, parent)
                stack += everything[parent].derived_from

    def teardown(self) -> None:
        self.store.close()


# A few seconds per backend (25 sequences of up to 25 steps): left out of `make test-fast`.
@pytest.mark.process
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_no_live_memory_ever_depends_on_a_revoked_one(backend, tmp_path, request):
    examples = iter(range(10_000))
    if backend == "sqlite":
        ForgetMachine.open = staticmethod(lambda: open_store(f"sqlite://{tmp_path / f'p{next(examples)}.sqlite3'}"))
    else:
        url = _fresh_postgres(request.getfixturevalue("postgres_url"))

        def emptied() -> MemoryStore:
            opened = open_store(url)
            opened._db.execute("TRUNCATE perdure_memories, perdure_memory_derivations")
            return opened

        ForgetMachine.open = staticmethod(emptied)
    runner = ForgetMachine.TestCase
    runner.settings = settings(
        max_examples=25, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
    )
    runner().runTest()
