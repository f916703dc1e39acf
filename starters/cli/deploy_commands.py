"""`perdure deploy …`: the person's view of the Worker Deployment the orchestrator's
workers belong to (PERDURE_DEPLOYMENT): which versions it has, which is current, which
open goals run on each, and making a version current by hand (a rollback, or a worker
started with `--no-promote`). The server calls are workers/deployment.py's; this module
only renders them.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from perdure.runtime.connect import connect
from perdure.starters.cli.terminal import console, run
from perdure.starters.client import PerdureClient
from perdure.workers import deployment

app = typer.Typer(
    help="Worker versions: which goals run on which build, and which build is current.", no_args_is_help=True
)

# Goal ids shown per version; the rest are counted.
GOALS_SHOWN = 10


def _goals(ids: list[str]) -> str:
    if not ids:
        return "no open goals"
    shown = ", ".join(ids[:GOALS_SHOWN]) + (f", … {len(ids) - GOALS_SHOWN} more" if len(ids) > GOALS_SHOWN else "")
    return f"{len(ids)} open goal{'s' if len(ids) != 1 else ''}: {shown}"


@app.command("status")
def status() -> None:
    """Each version of the deployment, whether it is current, and the open goals on it."""

    async def _status() -> None:
        found = await deployment.status(await connect())
        say = console.print
        if found.current is None and not found.versions:
            say(
                f"deployment {escape(found.name)}: no versioned worker has polled this server yet "
                "(`perdure worker` registers its version)"
            )
        else:
            say(f"deployment {escape(found.name)} · current version: {escape(found.current or 'none (unversioned)')}")
            for row in found.versions:
                say(f"  {escape(row.build_id)}  {row.status:<8}  {escape(_goals(row.goals))}")
        if found.unversioned_goals:
            say(f"  not on a version of it  {escape(_goals(found.unversioned_goals))}")

    run(_status)


@app.command("promote")
def promote(
    build_id: Annotated[str, typer.Argument(help="The build id to make current (see `perdure deploy status`).")],
) -> None:
    """Make a version current: new goals, and goals at their next run boundary, go to its workers."""

    async def _promote() -> None:
        version = deployment.worker_version(build_id)
        outcome = await deployment.promote(await connect(), version, wait_s=0)
        console.print(f"{escape(version.deployment_name)} {escape(build_id)}: {outcome}")

    run(_promote)


@app.command("move")
def move(
    goal_id: str,
    to: Annotated[str | None, typer.Option("--to", help="The build to move it to (default: the current one).")] = None,
) -> None:
    """Move a goal to another build now, not at its next run boundary (its old workers are gone).

    The new build replays the goal's current run on its code: safe when that code
    replays the run's history (the golden histories test this; see the README,
    "Changing workflow code safely")."""

    async def _move() -> None:
        client = await PerdureClient.connect()
        await client.describe(goal_id)
        outcome = await deployment.move(client.temporal, goal_id, to)
        console.print(f"goal {escape(goal_id)}: {escape(outcome)}")

    run(_move, goal_id)
