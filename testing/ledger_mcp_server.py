"""A small MCP server for tests, on the official SDK's MCPServer (stdio), that writes
every tool call it receives to a ledger file (JSON lines), so a test counts calls where
they land, not where perdure thinks it sent them.

    python -m perdure.testing.ledger_mcp_server --ledger /tmp/ledger.jsonl [--hold /tmp/hold]

Each ledger line: the tool, its arguments, the effect key perdure sent in the request's
`_meta` (`perdure/effect_key`), the server's pid and a random id of its process (in a
sandbox's PID namespace every server is pid 2), and whether the variable named by
`--secret-env` reached this process (its value is written too, so a test can show it
arrived while the goal's history holds none of it); over streamable HTTP (`--http PORT`)
also the Authorization header it was sent. `slow_write` blocks after writing
its line while the `--hold` file exists: a crash test kills the worker meanwhile.
`run` runs a shell command where the server runs and answers what it printed, as a
server that reads whatever it can (the sandbox tests' probe). Without `--ledger` nothing
is written. A test double, never part of the runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

EFFECT_KEY_META = "perdure/effect_key"
PROCESS = uuid.uuid4().hex


def build(ledger: Path | None, hold: Path | None, secret_env: str | None) -> MCPServer:
    server = MCPServer("perdure-test")

    def record(tool: str, ctx: Context | None, **args: object) -> dict:
        meta = ctx.request_context.meta if ctx is not None else None
        key = meta.get(EFFECT_KEY_META) if isinstance(meta, dict) else getattr(meta, EFFECT_KEY_META, None)
        if key is None and meta is not None:
            key = (getattr(meta, "model_extra", None) or {}).get(EFFECT_KEY_META)
        entry = {"tool": tool, "args": args, "effect_key": key, "pid": os.getpid(), "process": PROCESS}
        entry["at"] = time.time()
        headers = ctx.headers if ctx is not None else None
        if headers is not None:  # streamable HTTP: what the client sent
            entry["authorization"] = headers.get("authorization")
        if secret_env:
            entry["secret"] = os.environ.get(secret_env)
        if ledger is not None:
            with ledger.open("a", encoding="utf-8") as out:
                out.write(json.dumps(entry) + "\n")
        return entry

    @server.tool(description="Echo the text back.")
    def echo(text: str, ctx: Context) -> str:
        record("echo", ctx, text=text)
        return f"echo: {text}"

    @server.tool(description="Add a note to the notebook (a remote write).")
    def add_note(title: str, body: str, ctx: Context) -> str:
        record("add_note", ctx, title=title, body=body)
        return f"note '{title}' added ({len(body)} characters)"

    @server.tool(description="Write slowly: records the call, then waits while the hold file exists.")
    async def slow_write(text: str, ctx: Context) -> str:
        record("slow_write", ctx, text=text)
        while hold is not None and hold.exists():
            await asyncio.sleep(0.05)
        return f"wrote {text}"

    @server.tool(description="Pay an amount (irreversible).")
    def pay(amount_cents: int, recipient: str, ctx: Context) -> str:
        record("pay", ctx, amount_cents=amount_cents, recipient=recipient)
        return f"paid {amount_cents} cents to {recipient}"

    @server.tool(description="Always fails, as a tool whose service refused the request.")
    def refuse(reason: str, ctx: Context) -> str:
        record("refuse", ctx, reason=reason)
        raise ValueError(f"refused: {reason}")

    @server.tool(description="Record the call, then exit without answering (a server that dies mid-call).")
    def die(text: str, ctx: Context) -> str:
        record("die", ctx, text=text)
        os._exit(1)

    @server.tool(description="Say whether the server was given its secret (and, carelessly, echo it).")
    def whoami(ctx: Context) -> str:
        entry = record("whoami", ctx)
        return f"secret present: {entry.get('secret') is not None}; value: {entry.get('secret')}"

    @server.tool(description="Run a shell command where the server runs; answer what it printed.")
    def run(command: str, ctx: Context) -> str:
        record("run", ctx, command=command)
        # stdin is the server's JSON-RPC pipe: the command must not read it.
        done = subprocess.run(
            ["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace"
        )
        if done.returncode != 0:
            # A ToolError's message reaches the client (any other exception's does not).
            raise ToolError(f"exit code {done.returncode}: {done.stdout}{done.stderr}")
        return done.stdout + done.stderr

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, default=None)
    parser.add_argument("--hold", type=Path, default=None)
    parser.add_argument("--secret-env", default=None)
    parser.add_argument("--fail-start", action="store_true", help="Exit at once, as a server that cannot start.")
    parser.add_argument("--http", type=int, default=None, metavar="PORT", help="Streamable HTTP on 127.0.0.1:PORT/mcp.")
    options = parser.parse_args(argv)
    if options.fail_start:
        print("perdure-test: cannot start (asked to fail)", file=sys.stderr)
        sys.exit(3)
    server = build(options.ledger, options.hold, options.secret_env)
    if options.http is not None:
        server.run("streamable-http", host="127.0.0.1", port=options.http)
    else:
        server.run()


def read_ledger(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


if __name__ == "__main__":
    main()
