"""`perdure server …`: the embedded Temporal dev server (temporal-dev/): start it (or find
the one running), stop it with the demo's worker and page, say whether it runs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from perdure.runtime import settings
from perdure.starters.cli.terminal import console, fail

app = typer.Typer(help="The embedded Temporal dev server (temporal-dev/).", no_args_is_help=True)


@app.command("start")
def server_start(
    port: Annotated[int | None, typer.Option(help="Frontend port (default: from PERDURE_TEMPORAL, else 7233).")] = None,
    ui_port: Annotated[int | None, typer.Option(help="UI port (default: from PERDURE_UI, else 8233).")] = None,
) -> None:
    """Start the embedded dev server (reuses a running one)."""
    from perdure.starters import devserver

    default_port, default_ui_port = settings.dev_server_ports()
    port, ui_port = port or default_port, ui_port or default_ui_port
    try:
        server = devserver.start_dev_server(port=port, ui_port=ui_port)
    except RuntimeError as err:
        fail(err)
    verb = "already running" if server.reused else "started"
    owner = f"pid {server.pid}" if server.pid else "not started by perdure"
    console.print(f"Temporal dev server {verb} at {server.address} ({owner}); UI {server.ui_url or 'unknown'}")


@app.command("stop")
def server_stop() -> None:
    """Stop the embedded dev server, the demo worker and the demo's `perdure ui` (by pid only)."""
    from perdure.starters import devserver
    from perdure.starters.background import stop_worker

    if stop_worker(devserver.dev_dir() / "data"):
        console.print("demo worker stopped")
    if stop_worker(devserver.dev_dir() / "data", command="ui"):
        console.print("demo ui stopped")
    console.print("dev server stopped" if devserver.stop_dev_server() else "no dev server was running")


@app.command("status")
def server_status() -> None:
    """Show whether the embedded dev server runs."""
    from perdure.starters import devserver

    port, ui_port = settings.dev_server_ports()
    status = devserver.dev_server_status(port=port, ui_port=ui_port)
    if not status.running:
        console.print(f"no Temporal server answers on port {port}; start one with `perdure server start`")
        raise typer.Exit(1)
    owner = f"pid {status.pid}" if status.managed else "not started by perdure"
    console.print(f"Temporal server running at {status.address} ({owner}); UI {status.ui_url or 'unknown'}")
    if status.managed:
        console.print(f"database: {status.db}")
