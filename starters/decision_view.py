"""How a goal's decision log looks in a terminal (`perdure log`): one row per decision, in
order, with what could not be read said after it. Presentation only: the entries come from
the client (starters/client/goal_decisions.py).
"""

from __future__ import annotations

from datetime import UTC

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from perdure.starters.client.goal_decisions import DecisionRead
from perdure.starters.render import printable, say

KIND_STYLE = {"plan": "green", "replan": "green", "drop": "yellow", "answer": "cyan", "expiry": "magenta"}


def print_decisions(console: Console, read: DecisionRead, kinds: list[str]) -> None:
    entries = read.of_kinds(kinds)
    which = f" of kind {', '.join(kinds)}: {len(entries)} shown" if kinds else ""
    say(console, f"decision log of {escape(read.goal_id)}: {read.count} decision(s){which} (read from {read.source})")
    if entries:
        table = Table("#", "at (UTC)", "kind", "who", "decision", "steps")
        for entry in entries:
            style = KIND_STYLE.get(entry.kind, "")
            table.add_row(
                str(entry.seq),
                f"{entry.at.astimezone(UTC):%Y-%m-%d %H:%M:%S}",
                Text(entry.kind, style=style),
                Text(printable(entry.who)),
                Text(printable(entry.text)),
                Text(printable(", ".join(entry.about))),
            )
        say(console, table)
    elif kinds and read.entries:
        present = sorted({e.kind for e in read.entries})
        say(console, f"no decision of kind {escape(', '.join(kinds))}; this log has: {escape(', '.join(present))}")
    for note in read.notes:
        say(console, f"[yellow]{escape(note)}[/yellow]")
