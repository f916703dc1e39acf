"""Forks: start a new goal from another's plan that reuses its finished work (`fork`),
and compare two goals step by step (`diff`). The original is only read.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from perdure.starters import render
from perdure.starters.cli.terminal import console, fail, key_values, refuse, run, start_or_show
from perdure.starters.client import PerdureClient, goal_forks
from perdure.starters.client.client_errors import NoAnswer, StartRefused
from perdure.starters.client.goal_specs import check_goal_id
from perdure.workflows.goal.rules.forking import ForkPoint

app = typer.Typer()


@app.command()
def fork(
    goal_id: str,
    node: Annotated[str, typer.Argument(help="The step from which the new goal runs anew.")],
    why: Annotated[str, typer.Option("--why", help="Why fork (recorded on the new goal).")],
    set_premise: Annotated[
        list[str] | None,
        typer.Option("--set", help="PREMISE=VALUE for the new goal; repeatable. Steps it voids run anew."),
    ] = None,
    profile: Annotated[
        str | None, typer.Option(help="Model profile of the new goal (default: the original's).")
    ] = None,
    new_id: Annotated[
        str | None, typer.Option("--id", help="The new goal's id (default: GOAL_ID-fork-XXXXXX).")
    ] = None,
) -> None:
    """Start a new goal from GOAL's plan that reuses its finished work before NODE and runs NODE on anew.
    GOAL is only read (a worker answers the read, also for a finished goal)."""
    premises = key_values(set_premise or [])
    gid = new_id or goal_forks.fork_id(goal_id)
    try:
        check_goal_id(gid)
    except StartRefused as err:
        refuse(err)

    async def _fork() -> None:
        client = await PerdureClient.connect()
        try:
            point = await client.fork_point(goal_id, node, premises)
        except NoAnswer as err:
            fail(err)
        spec = goal_forks.fork_spec(point, goal_id, node, why, premises, profile)
        await start_or_show(client, spec, gid, False)
        changes = ", ".join(f"{k}={v}" for k, v in spec.forked_from.changes.items()) if spec.forked_from else ""
        console.print(f"forked from {escape(goal_id)} at {escape(node)}" + (f" · {escape(changes)}" if changes else ""))
        print_fork_plan(console, goal_id, point)

    run(_fork)


def print_fork_plan(console: Console, goal_id: str, point: ForkPoint) -> None:
    """Which steps the fork takes as done and which it runs, and why."""
    for warning in point.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    reused = ", ".join(point.reused) or "none"
    console.print(f"reused from {escape(goal_id)} ({len(point.reused)}): {escape(reused)}")
    console.print(f"run anew ({len(point.rerun)}):")
    for name, why in point.rerun.items():
        console.print(f"  {escape(name)}: {escape(why)}")


@app.command("diff")
def diff_goals(
    goal_a: str,
    goal_b: str,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Compare two goals step by step (a goal and its fork): status, output digest, reused or run, tokens, cost."""

    async def _diff() -> None:
        client = await PerdureClient.connect()
        try:
            a, b = await asyncio.gather(client.fork_side(goal_a), client.fork_side(goal_b))
        except NoAnswer as err:
            fail(err)
        compared = goal_forks.diff_goals(a, b)
        if as_json:
            print(compared.model_dump_json(indent=2))
        else:
            render.print_diff(console, compared)

    run(_diff)
