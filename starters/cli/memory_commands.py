"""`perdure forget` and `perdure memory …`: the person's side of the memory store
(memory/): forget a memory or a source of memories (and what was derived from them),
list and show memories with their sources, add a note, summarise memories.

Reads this machine's store (PERDURE_MEMORY_URL, else PERDURE_HOME's SQLite file, where
the workers keep it). Every error is one line and exit code 2, never a traceback. Holds
no memory logic: forgetting is memory/forget.py, summaries memory/summaries.py.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from perdure.memory.store import MemoryStore, MemoryStoreError, open_store
from perdure.starters.cli.terminal import console, refuse
from perdure.workflows.goal.contracts.memory_contracts import Memory, MemorySource, NewMemory
from perdure.workflows.goal.rules.memory_rules import SHELF_LIFE
from perdure.workflows.shared.durations import duration_text

if TYPE_CHECKING:
    from perdure.memory.forget import ForgetReport

app = typer.Typer()
# `perdure memory …`, nested in this group beside `perdure forget`.
memory_app = typer.Typer(help="The memory store: list, show, add and summarise memories.", no_args_is_help=True)
app.add_typer(memory_app, name="memory")

LAYERS = ("working", "episodic", "semantic")
TEXT_CHARS = 90


def _with_store(work: Callable[[MemoryStore], Any], create: bool = False) -> Any:
    """Run `work` on this machine's store; a store problem is the command's one-line error."""
    store = None
    try:
        store = open_store(create=create)
        return work(store)
    except (MemoryStoreError, ValueError, OSError) as err:
        refuse(err)
    finally:
        if store is not None:
            store.close()


def _age(memory: Memory, now: datetime) -> str:
    return duration_text(max(0.0, (now - memory.made_at).total_seconds()), days=True)


def _clip(text: str, chars: int = TEXT_CHARS) -> str:
    one = " ".join(text.split())
    return one if len(one) <= chars else one[: chars - 1] + "…"


def _state(memory: Memory, now: datetime) -> str:
    if memory.status == "revoked":
        return "revoked"
    return "expired" if memory.expired(now) else "live"


def _line(memory: Memory) -> str:
    return f'{memory.id}  {memory.layer} {memory.kind} · {memory.where()} · "{escape(_clip(memory.text))}"'


@app.command("forget")
def forget_command(
    target: Annotated[
        str,
        typer.Argument(help="A memory id (m-…), a goal id, GOAL/STEP, or a file path (optionally @sha256:…)."),
    ],
    profile: Annotated[
        str | None,
        typer.Option(
            help="Model profile that re-makes derived summaries (default: PERDURE_MEMORY_PROFILE, "
            "else the profile that made each, else extraction)."
        ),
    ] = None,
) -> None:
    """Revoke matching memories and everything derived from them; derived ones are re-made or dropped."""

    from perdure.memory.forget import forget  # the summariser's model clients: only here

    def work(store: MemoryStore) -> ForgetReport:
        return asyncio.run(forget(store, target, datetime.now(UTC), profile))

    report: ForgetReport = _with_store(work)
    console.print(f"forgot {escape(report.matched)}")
    console.print(f"revoked ({len(report.revoked)}):")
    for memory in report.revoked:
        console.print(f"  {_line(memory)}")
    console.print(f"regenerated ({len(report.regenerated)}):")
    for item in report.regenerated:
        made = f"made by {item.made_by}, " if item.made_by else ""
        console.print(
            f'  {item.old} -> {item.new}  "{escape(_clip(item.text))}" ({made}from {", ".join(item.sources)})'
        )
    console.print(f"dropped ({len(report.dropped)}):" + ("" if report.dropped else " none"))
    for memory in report.dropped:
        console.print(f"  {_line(memory)}")


@memory_app.command("list")
def list_command(
    goal: Annotated[str | None, typer.Option(help="Only memories made by or scoped to this goal.")] = None,
    layer: Annotated[str | None, typer.Option(help="working, episodic or semantic.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Revoked memories too.")] = False,
) -> None:
    """List memories, newest first: id, layer and kind, where it applies, age, source, text."""
    if layer is not None and layer not in LAYERS:
        refuse(ValueError(f"unknown layer '{layer}'; one of {', '.join(LAYERS)}"))
    memories: list[Memory] = _with_store(lambda store: store.listing(goal, layer, include_revoked=all_))  # type: ignore[arg-type]
    now = datetime.now(UTC)
    if not memories:
        console.print(
            "no memories" + (f" of goal {escape(goal)}" if goal else "") + (f" in layer {layer}" if layer else "")
        )
        return
    table = Table(box=None, pad_edge=False)
    for column in ("id", "layer", "kind", "scope", "age", "status", "source", "text"):
        table.add_column(column)
    for m in memories:
        table.add_row(
            m.id,
            m.layer,
            m.kind,
            escape(m.where()),
            _age(m, now),
            _state(m, now),
            escape(m.source.label()),
            escape(_clip(m.text, 60)),
        )
    console.print(table)


@memory_app.command("show")
def show_command(memory_id: Annotated[str, typer.Argument(help="A memory id (m-…).")]) -> None:
    """One memory: its text, source, age, shelf life, scope, and its derivation tree."""

    def work(store: MemoryStore) -> list[str]:
        memory = store.get(memory_id)
        if memory is None:
            raise MemoryStoreError(f"no memory {memory_id} in the store at {store.url}")
        now = datetime.now(UTC)
        lines = [
            f"{memory.id}  {memory.layer} {memory.kind} ({_state(memory, now)})",
            f"text: {memory.text}",
            f"source: {memory.source.label()}",
            f"made: {memory.made_at:%Y-%m-%d %H:%M} UTC ({_age(memory, now)} ago)"
            + (f" by {memory.made_by}" if memory.made_by else ""),
            "keeps until: " + (f"{memory.expires_at:%Y-%m-%d %H:%M} UTC" if memory.expires_at else "no expiry"),
            f"applies to: {memory.where()}",
        ]
        if memory.redacted:
            lines.append(f"secrets redacted before storing: {memory.redacted}")
        if memory.status == "revoked":
            lines.append(f"revoked: {memory.revoked_at:%Y-%m-%d %H:%M} UTC, {memory.revoked_why}")
            if memory.replaced_by:
                lines.append(f"replaced by: {memory.replaced_by}")
        lines.append("derived from:" + ("" if memory.derived_from else " nothing (an original)"))
        lines += _tree(store, memory.derived_from, "  ", set(), up=True)
        derived = store.children([memory.id])
        lines.append("derived into:" + ("" if derived else " nothing live"))
        lines += _tree(store, [m.id for m in derived], "  ", set(), up=False)
        return lines

    for line in _with_store(work):
        console.print(escape(line))


def _tree(store: MemoryStore, ids: list[str], indent: str, seen: set[str], *, up: bool) -> list[str]:
    lines = []
    found = store.get_many(ids)
    for memory_id in ids:
        memory = found.get(memory_id)
        if memory is None:
            lines.append(f"{indent}{memory_id} (gone)")
            continue
        lines.append(
            f"{indent}{memory.id} {memory.kind} [{memory.status}] {_clip(memory.text, 70)} ({memory.source.label()})"
        )
        if memory.id in seen:
            continue
        seen.add(memory.id)
        nxt = memory.derived_from if up else [m.id for m in store.children([memory.id])]
        lines += _tree(store, nxt, indent + "  ", seen, up=up)
    return lines


@memory_app.command("add")
def add_command(
    text: Annotated[str, typer.Argument(help="What to remember.")],
    scope: Annotated[str, typer.Option(help="project (the workspace) or global.")] = "project",
    workspace: Annotated[Path, typer.Option(help="The project it belongs to (scope project).")] = Path("."),
    file: Annotated[Path | None, typer.Option(help="The file it was read from (its digest is kept).")] = None,
    days: Annotated[float | None, typer.Option(help="Shelf life in days (default 365).")] = None,
) -> None:
    """Remember a note (a semantic memory a person wrote), with its source."""
    if scope not in ("project", "global"):
        refuse(ValueError(f"unknown scope '{scope}'; project or global"))
    now = datetime.now(UTC)
    source = MemorySource(kind="person")
    if file is not None:
        path = file.expanduser().absolute()
        try:
            digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as err:
            refuse(ValueError(f"cannot read {path}: {err.strerror or err}"))
        source = MemorySource(kind="file", path=str(path), digest=digest)
    new = NewMemory(
        layer="semantic",
        kind="note",
        text=text,
        source=source,
        scope=scope,  # type: ignore[arg-type]
        scope_key=str(workspace.expanduser().absolute()) if scope == "project" else "",
        made_at=now,
        expires_at=now + (timedelta(days=days) if days else SHELF_LIFE["note"]),
    )

    def work(store: MemoryStore) -> Memory:
        (memory_id,), refused = store.write([new])
        if refused:
            raise MemoryStoreError(f"{memory_id} was forgotten before: it is not remembered again from this source")
        memory = store.get(memory_id)
        assert memory is not None
        return memory

    memory: Memory = _with_store(work, create=True)
    redacted = f" ({memory.redacted} secret(s) redacted)" if memory.redacted else ""
    console.print(f"remembered {memory.id} · {escape(memory.where())} · {escape(memory.source.label())}{redacted}")


@memory_app.command("summarize")
def summarize_command(
    ids: Annotated[list[str], typer.Argument(help="The memories to summarise (m-…).")],
    profile: Annotated[
        str | None, typer.Option(help="Model profile that writes the summary (default: PERDURE_MEMORY_PROFILE).")
    ] = None,
) -> None:
    """Derive one summary from memories; it records what it was derived from."""

    from perdure.memory.summaries import summarize, summarizer_for

    def work(store: MemoryStore) -> Memory:
        summary, _ = asyncio.run(summarize(store, ids, summarizer_for(profile), datetime.now(UTC)))
        return summary

    summary: Memory = _with_store(work, create=True)
    console.print(
        f"summary {summary.id} (made by {summary.made_by}, from {', '.join(summary.derived_from)}): "
        f'"{escape(_clip(summary.text, 200))}"'
    )
