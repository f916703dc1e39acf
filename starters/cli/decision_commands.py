"""`perdure log GOAL`: a goal's decision log, every decision that shaped its work in order
(plans and what they replaced, steps dropped, gate verdicts, the model's stated reasons,
answers and who gave them, expiries, checks that voided work, rewinds, narrows, aborts).
Asks the one client (PerdureClient.decisions) and prints with starters/decision_view.py.
"""

from __future__ import annotations

from typing import Annotated

import typer

from perdure.starters.cli.terminal import console, err_console, run
from perdure.starters.client import PerdureClient
from perdure.starters.decision_view import print_decisions
from perdure.workflows.goal.contracts.decision_contracts import KINDS

app = typer.Typer()


@app.command("log")
def decision_log(
    goal_id: str,
    kind: Annotated[
        list[str] | None,
        typer.Option("--kind", help="Only decisions of this kind; repeatable (" + ", ".join(KINDS) + ")."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the log as JSON.")] = False,
) -> None:
    """Show a goal's decision log: what was decided, when, by whom, about which steps."""

    async def _log() -> None:
        client = await PerdureClient.connect()
        read = await client.decisions(goal_id)
        kinds = kind or []
        if as_json:
            shown = read.model_copy(update={"entries": read.of_kinds(kinds)})
            print(shown.model_dump_json(indent=1))
        else:
            print_decisions(console, read, kinds)
        if not read.entries and read.notes:
            # Nothing could be read (no worker and nothing carried yet): say so by the exit code too.
            if as_json:
                for note in read.notes:
                    err_console.print(note, markup=False)
            raise typer.Exit(1)

    run(_log, goal_id)
