"""What every command of the CLI shares: the consoles it prints through, how a command
ends when something is wrong (one line and an exit code, never a traceback), how a start
is shown (`start` and `fork`), and the KEY=VALUE arguments several commands take. No
command is defined here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import typer
from rich.markup import escape
from temporalio.service import RPCError

from perdure.runtime import settings
from perdure.runtime.connect import ServerUnavailable
from perdure.runtime.converter import store_failure_in
from perdure.starters.client import PerdureClient
from perdure.starters.client.client_errors import BadPlanFile, GoalNotFound, StartRefused
from perdure.starters.consoles import cli_console
from perdure.starters.watchdog_view import WatchdogMissing
from perdure.workflows.goal.contracts.goal_contracts import GoalSpec

console = cli_console()
err_console = cli_console(stderr=True)


class UserError(Exception):
    """An error the user can fix; printed without a traceback."""


def refuse(err: Exception, soft_wrap: bool | None = None) -> NoReturn:
    """Say what was wrong with the command in one line and end it with exit code 2."""
    # Escaped: error texts quote files and TOML, whose [brackets] rich would take for markup.
    err_console.print(f"[red]error:[/red] {escape(str(err))}", soft_wrap=soft_wrap)
    raise typer.Exit(2) from None


def fail(err: Exception, code: int = 1) -> NoReturn:
    """End the command on `err` in one line with exit `code`; Temporal's own errors say so."""
    if isinstance(err, RPCError):
        err_console.print(f"[red]error from Temporal:[/red] {escape(err.message)}")
    else:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
    raise typer.Exit(code) from None


def run(coro_fn: Callable[[], Awaitable[Any]], goal_id: str | None = None) -> Any:
    """Run a command's coroutine; what the user can act on ends it in one line."""
    try:
        return asyncio.run(coro_fn())
    except typer.Exit:
        raise  # a command that already said what happened (typer.Exit is a RuntimeError)
    except (
        ServerUnavailable,
        settings.TemporalConfigError,
        GoalNotFound,
        BadPlanFile,
        WatchdogMissing,
        UserError,
        ValueError,
        RuntimeError,
    ) as err:
        # The object store's own words, not the SDK's wrapper of a payload read that failed.
        refuse(store_failure_in(err) or err)
    except RPCError as err:
        if goal_id is not None and _FINISHED in err.message.lower():
            # The goal closed between our look and the call: say so in perdure's words.
            err_console.print(f"[red]error:[/red] {escape(asyncio.run(_finished_text(goal_id)))}")
            raise typer.Exit(2) from None
        fail(err)


# What the server says of a call to a closed workflow (a signal, an update, a cancel).
_FINISHED = "workflow execution already completed"


async def _finished_text(goal_id: str) -> str:
    return await (await PerdureClient.connect()).finished_text(goal_id)


async def start_or_show(client: PerdureClient, spec: GoalSpec, gid: str, replace: bool) -> None:
    """Start the goal, or show the one already under `gid` (the client decides, as it does
    for the web UI's POST /api/goals); what could not be checked first is a warning."""
    try:
        answer = await client.start_spec(spec, gid, replace=replace)
    except StartRefused as err:
        raise UserError(str(err)) from None
    for warning in answer.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    console.print(escape(answer.text))
    console.print(f"UI: {settings.goal_ui_link(gid)}")


def key_values(items: list[str]) -> dict[str, str]:
    """KEY=VALUE arguments (premises), or the command ends saying which one is not."""
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            err_console.print(f"[red]error:[/red] '{item}' is not KEY=VALUE")
            raise typer.Exit(2)
        pairs[key] = value
    return pairs
