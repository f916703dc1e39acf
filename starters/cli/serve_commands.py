"""Serving perdure to other programs: the web UI's HTTP server (`ui`), the MCP server
(`mcp`) and Temporal's remote codec for the payload keys (`codec-server`). Each binds
its port itself, so a port in use is the command's one-line error.
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

import typer
from rich.markup import escape

from perdure.runtime import settings
from perdure.runtime.connect import ServerUnavailable, connect
from perdure.starters.cli.terminal import UserError, console, err_console, fail, refuse

app = typer.Typer()


def _check_stores() -> None:
    """Reach the artifact and payload stores before serving: a store the pages or the tools
    would read and cannot is one line now, not an error on every request."""
    from perdure.activities.artifacts import checked_stores

    try:
        checked_stores()
    except (ValueError, RuntimeError) as err:  # a setting, or ObjectStoreUnavailable
        refuse(err)


@app.command()
def ui(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8234,
) -> None:
    """Serve the goals over HTTP: each goal's events as server-sent events, and a JSON API
    to read goals and send them messages (starters/ui_server.py lists the routes)."""
    import socket

    import uvicorn

    from perdure.starters.ui_server import build_app

    _check_stores()

    async def _serve(sock: socket.socket) -> None:
        client = await connect()
        console.print(f"perdure ui on http://{host}:{port} (events: /api/goals/GOAL_ID/events)")
        # Requests must name this server (DNS rebinding); listening on every address, any name.
        hosts = ["*"] if host in ("0.0.0.0", "::") else [host, "127.0.0.1", "localhost"]
        config = uvicorn.Config(build_app(client, hosts), log_level="warning")
        await uvicorn.Server(config).serve(sockets=[sock])

    try:
        # Bound here, not by uvicorn: a port in use is then this command's one-line error.
        sock = socket.create_server((host, port))
        asyncio.run(_serve(sock))
    except KeyboardInterrupt:
        pass
    except (ServerUnavailable, settings.TemporalConfigError, ValueError) as err:
        fail(err)
    except (OSError, OverflowError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        err_console.print(f"[red]error:[/red] cannot listen on {host}:{port}: {escape(reason)}")
        raise typer.Exit(1) from None


@app.command()
def mcp(
    http: Annotated[
        int | None, typer.Option("--http", metavar="PORT", help="Serve streamable HTTP on this port (at /mcp).")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on with --http (loopback unless you mean it).")] = (
        "127.0.0.1"
    ),
) -> None:
    """Serve perdure to MCP clients (agents, IDEs): start, steer and answer goals, read progress and reports.

    Over stdio by default (the client starts `perdure mcp`); with --http PORT, over streamable HTTP."""
    from perdure.starters.mcp_server import build_server

    _check_stores()
    server = build_server()
    if http is None:
        # stdout is the protocol's channel: nothing else may print there.
        asyncio.run(server.run_stdio_async())
        return
    import socket

    import uvicorn

    try:
        # Bound here, not by uvicorn: a port in use is then this command's one-line error.
        sock = socket.create_server((host, http))
    except (OSError, OverflowError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        err_console.print(f"[red]error:[/red] cannot listen on {host}:{http}: {escape(reason)}")
        raise typer.Exit(1) from None
    # The SDK guards a loopback host against DNS rebinding (Host and Origin checked).
    app = server.streamable_http_app(host=host)
    console.print(f"perdure mcp on http://{host}:{http}/mcp (streamable HTTP)")
    try:
        asyncio.run(uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass


@app.command("codec-server")
def codec_server(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8081,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback unless you mean it).")] = "127.0.0.1",
    ui_origin: Annotated[
        list[str] | None,
        typer.Option("--ui-origin", help="Origin of a Temporal UI that may call it (repeatable; default PERDURE_UI)."),
    ] = None,
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", help="Namespace to serve (repeatable; default the configured one)."),
    ] = None,
) -> None:
    """Serve Temporal's remote codec protocol (POST /decode, /encode) with the payload keys, for the
    Temporal UI (`--ui-codec-endpoint`) and `temporal --codec-endpoint`. A bearer token is required
    when PERDURE_CODEC_TOKEN is set."""
    from perdure.runtime.codec import KEY_FILE_ENV, KEYS_ENV, keyring_from_env
    from perdure.starters.codec_server import TOKEN_ENV, CodecServer, CodecServerConfig, origin_of, ui_origins

    try:
        keyring = keyring_from_env()
        if keyring is None:
            raise UserError(f"no payload keys: set {KEYS_ENV} or {KEY_FILE_ENV} as the workers have them")
        config = CodecServerConfig(
            host=host,
            port=port,
            origins=tuple(origin_of(o) for o in ui_origin) if ui_origin else ui_origins(settings.ui_base()),
            namespaces=tuple(namespace or [settings.namespace()]),
            token=os.environ.get(TOKEN_ENV) or None,
        )
        server = CodecServer(keyring, config)
    except (UserError, ValueError, settings.TemporalConfigError, OSError) as err:
        refuse(err)
    console.print(
        f"codec server at {server.url} · keys {', '.join(keyring.key_ids)} (newest {keyring.newest}) · "
        f"CORS for {', '.join(config.origins)} · namespace {', '.join(config.namespaces)} · "
        + ("bearer token required" if config.token else f"no token ({TOKEN_ENV} unset)")
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
