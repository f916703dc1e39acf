"""`perdure watchdog …`: the watchdog's rule book (`set`, `rules`), a conversation with it
(`ask`), and its schedule, one per task queue, created by the workers (`status`, `pause`,
`resume`, `run-now`, `report`).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape

from perdure.activities.watchdog.watchdog_files import watchdog_files
from perdure.activities.watchdog.watchdog_memory import load_rules
from perdure.runtime import settings
from perdure.runtime.connect import connect
from perdure.starters import watchdog_view
from perdure.starters.cli.terminal import UserError, console, refuse, run
from perdure.starters.client import PerdureClient
from perdure.starters.watchdog_ask import AskTools, ask_watchdog, confirmer
from perdure.starters.watchdog_view import print_rules, rule_value, set_rules

app = typer.Typer(help="The watchdog: a schedule that judges open goals and intervenes.", no_args_is_help=True)


@app.command("set")
def watchdog_set(
    assignments: Annotated[list[str], typer.Argument(help="rule=value … (rule=default removes a setting)")],
    scope: Annotated[str | None, typer.Option("--for", help="tag=NAME or goal=ID (default: all goals)")] = None,
) -> None:
    """Change the watchdog's rules: kept across worker restarts, versioned, with who and when."""
    try:
        where, made = set_rules(assignments, scope, settings.user(), datetime.now(UTC))
    except (ValueError, OSError, RuntimeError) as err:  # a bad rule (RuleError), a store it cannot use
        refuse(err, soft_wrap=True)
    if not made:
        console.print(f"unchanged: {where} already has {', '.join(assignments)}")
    for change in made:
        console.print(
            f"v{change.version} · {change.scope} · {change.rule}: {rule_value(change.old)} -> {rule_value(change.new)}"
            f" · by {escape(change.user)}"
        )


@app.command("rules")
def watchdog_rules(
    history: Annotated[int, typer.Option(help="Show this many latest changes.")] = 20,
) -> None:
    """The watchdog's rules per scope, and who changed what when."""
    try:
        kept = watchdog_files().rules(settings.task_queue())
        book, note = load_rules(kept)
    except (ValueError, RuntimeError) as err:  # a store setting or a store perdure cannot use
        refuse(err)
    print_rules(console, book, note, kept.where, history)


@app.command("ask")
def watchdog_ask(
    question: Annotated[str, typer.Argument(help="e.g. 'why is review-1 slow?'")],
    yes: Annotated[bool, typer.Option("--yes", help="Apply what it proposes.")] = False,
    no: Annotated[bool, typer.Option("--no", help="Never apply what it proposes.")] = False,
    profile: Annotated[str | None, typer.Option(help="Model profile (default: the judge_profile rule).")] = None,
) -> None:
    """Ask the watchdog about goals; it reads their progress and its history, and may propose a change."""
    from perdure.activities.models.profiles import load_model_config

    queue = settings.task_queue()
    try:
        book, _ = load_rules(watchdog_files().rules(queue))
        chosen = profile or (book.scopes.get("all", {}).get("judge_profile")) or "default"
        config = load_model_config()
        asyncio.run(
            ask_watchdog(
                console,
                question,
                config,
                str(chosen),
                AskTools(queue, PerdureClient.connect),
                confirmer(yes, no, console),
            )
        )
    except typer.Exit:
        raise
    except Exception as err:  # everything printed, no traceback
        refuse(RuntimeError(f"{type(err).__name__}: {getattr(err, 'message', None) or err}"), soft_wrap=True)


@app.command("status")
def watchdog_status() -> None:
    """The schedule: interval, paused or not, last and next run."""

    async def _status() -> None:
        client = await connect()
        queue = settings.task_queue()
        watchdog_view.print_status(console, await watchdog_view.describe(client, queue), queue)

    run(_status)


@app.command("pause")
def watchdog_pause(note: Annotated[str, typer.Option(help="Why (shown in status).")] = "paused from the CLI") -> None:
    """Stop scheduling runs (goals are left alone meanwhile)."""
    _set_watchdog_paused(True, note)


@app.command("resume")
def watchdog_resume(note: Annotated[str, typer.Option(help="Shown in status.")] = "resumed from the CLI") -> None:
    """Schedule runs again."""
    _set_watchdog_paused(False, note)


def _set_watchdog_paused(paused: bool, note: str) -> None:
    async def _switch() -> None:
        await watchdog_view.set_paused(await connect(), settings.task_queue(), paused, note)
        console.print("watchdog paused" if paused else "watchdog resumed")

    run(_switch)


@app.command("run-now")
def watchdog_run_now(
    wait: Annotated[bool, typer.Option(help="Wait for the run and print what it found.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the run.")] = 120,
) -> None:
    """Run the watchdog once now (after a run already going, if any)."""

    async def _run_now() -> None:
        client = await connect()
        workflow_id = await watchdog_view.run_now(client, settings.task_queue())
        if workflow_id is None:
            raise UserError("the run was triggered but has not started yet; check `perdure watchdog status`")
        console.print(f"watchdog run {workflow_id} started · UI: {settings.goal_ui_link(workflow_id)}")
        if wait:
            try:
                result = await watchdog_view.run_result(client, workflow_id, timeout)
            except TimeoutError:
                raise UserError(f"no result within {timeout:g} s; is a worker running (`perdure worker`)?") from None
            watchdog_view.print_result(console, workflow_id, result)

    run(_run_now)


@app.command("report")
def watchdog_report(
    show_all: Annotated[bool, typer.Option("--all", help="Include healthy goals.")] = False,
) -> None:
    """Open incidents and the latest findings per goal."""
    queue = settings.task_queue()
    try:
        memory, path = watchdog_view.read_memory(queue)
    except (ValueError, OSError, RuntimeError) as err:  # a store setting or a store perdure cannot use
        refuse(err)
    if memory is not None:
        watchdog_view.print_report(console, memory, path, show_all)
        return

    async def _from_last_run() -> None:
        console.print(f"[dim]no watchdog memory at {escape(path)}; showing the schedule's last finished run[/dim]")
        last = await watchdog_view.last_run_result(await connect(), queue)
        if last is None:
            raise UserError("the watchdog has not finished a run yet")
        watchdog_view.print_result(console, *last)

    run(_from_last_run)
