"""The `perdure` command line: the root typer app (`app`, from which the docs generate the
CLI reference) and the console script (`main`).

Where a command goes: a command is a function in the module of its group, registered on
that module's own `app = typer.Typer()` with `@app.command()`; a new group is a new
`<group>_commands.py` module added below in one line, merged at the top level
(`app.add_typer(module.app)`: `perdure start`) or nested under a name
(`app.add_typer(module.app, name="server")`: `perdure server start`). A command prints
through `terminal.console` and ends on an error with `terminal.refuse` or `terminal.run`;
what it asks of Temporal about goals goes through the one client
(`perdure.starters.client.PerdureClient`, shared with `perdure ui` and `perdure mcp`), and
how it looks in a terminal is starters/render.py's. No group module imports this one.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
import typer.core

from perdure.runtime import settings
from perdure.starters.cli import (
    decision_commands,
    deploy_commands,
    fork_commands,
    goal_commands,
    memory_commands,
    serve_commands,
    server_commands,
    steering_commands,
    watchdog_commands,
    worker_commands,
)
from perdure.starters.cli.terminal import console, refuse

app = typer.Typer(
    help="perdure: durable AI agents on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(goal_commands.app)
app.add_typer(decision_commands.app)  # `perdure log`
app.add_typer(steering_commands.app)
app.add_typer(fork_commands.app)
app.add_typer(worker_commands.app)
app.add_typer(serve_commands.app)
app.add_typer(server_commands.app, name="server")
app.add_typer(watchdog_commands.app, name="watchdog")
app.add_typer(memory_commands.app)  # `perdure forget`, and `perdure memory …` nested in it
app.add_typer(deploy_commands.app, name="deploy")


def _usage_name(argument: typer.core.TyperArgument) -> str:
    name = argument.display_name_raw.upper()
    name = name if argument.required else f"[{name}]"
    return name + ("..." if argument.nargs != 1 else "")


def _shown_type(option: typer.core.TyperOption, ctx: Any) -> str | None:
    return None if option.is_flag else _TYPED(option, ctx)


# typer 0.29's help writes a required argument `{goal_id}` and gives every flag a `<bool>`
# type; a user reads `GOAL_ID` and a flag alone, as in every other command-line tool.
_TYPED = typer.core.TyperOption.display_type_rich
typer.core.TyperArgument._usage_display_name = _usage_name
typer.core.TyperArgument._rich_display_name = lambda argument: _usage_name(argument).strip("[]")
typer.core.TyperOption.display_type_rich = _shown_type


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"perdure {version('perdure')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """perdure: durable AI agents on Temporal."""
    try:
        settings.check_home()
    except settings.HomeUnusable as err:
        refuse(err)


def main() -> None:
    # The SDK's native runtime can crash at interpreter exit (sdk-python #300)
    # after the command finished; flush and leave without running finalizers.
    code = 0
    try:
        app()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    # Spans and metrics of a command that set telemetry up (importing it costs a command that
    # did not a third of a second: temporalio's plugin and worker modules).
    telemetry = sys.modules.get("perdure.runtime.telemetry")
    if telemetry is not None:
        telemetry.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
