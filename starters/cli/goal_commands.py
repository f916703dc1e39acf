"""Goals: start one, follow it (`status`, `watch`, `ls`), read how it ended (`result`,
`history`), and the demo goal. Each command asks the one client (PerdureClient) and
prints with starters/render.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError

from perdure.starters import render
from perdure.starters.cli.terminal import UserError, console, err_console, key_values, refuse, run, start_or_show
from perdure.starters.client import PerdureClient, goal_reads, goal_specs
from perdure.starters.client.client_errors import BadPlanFile, EndedWithoutResult, GoalNotFound, StartRefused
from perdure.workers import deployment
from perdure.workflows.goal.contracts.goal_contracts import DEFAULT_MAX_TOKENS
from perdure.workflows.shared.host_workspaces import host_workspace

app = typer.Typer()


@app.command()
def start(
    goal: Annotated[str | None, typer.Argument(help="What the goal should achieve.")] = None,
    plan: Annotated[Path | None, typer.Option("--plan", help="Declarative plan file (YAML or JSON).")] = None,
    workspace: Annotated[
        str,
        typer.Option(
            help="Directory the tools work in, on the workers' machines; or HOST:NAME, a workspace a host holds "
            "(`perdure worker --host HOST --workspaces DIR`): its steps then run there only."
        ),
    ] = ".",
    profile: Annotated[str, typer.Option(help="Model profile name (see README).")] = "default",
    constraint: Annotated[
        list[str] | None,
        typer.Option(
            "--constraint",
            "-c",
            help="A rule every step must keep, in words the model reads, e.g. 'Do not modify notes/'; repeatable.",
        ),
    ] = None,
    tool: Annotated[
        list[str] | None,
        typer.Option(
            "--tool", help="Allowed tool; repeatable (default: the safe tools, plus those a plan file names)."
        ),
    ] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Token budget.")] = None,
    max_cost: Annotated[float | None, typer.Option(help="Cost budget in USD.")] = None,
    max_wall: Annotated[
        int | None,
        typer.Option(help="Wall-time budget in seconds of active time (parked and waiting for a person not counted)."),
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(
            help="Calendar deadline, an ISO 8601 time (2026-12-01T18:00, local time unless it has an offset): "
            "counts everything, parks included."
        ),
    ] = None,
    allow_network: Annotated[
        bool, typer.Option(help="Let shell commands use the network (they run without it by default).")
    ] = False,
    goal_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            help="Goal id (default: generated). Starting again with the same id and spec is a safe retry: "
            "it shows the goal already there.",
        ),
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Reuse the id of a finished goal for a new one (the old run stays in the server's history "
            "until its retention ends, but `perdure result ID` then shows the new goal).",
        ),
    ] = False,
    premise: Annotated[list[str] | None, typer.Option("--premise", help="KEY=VALUE; repeatable.")] = None,
    watch: Annotated[bool, typer.Option(help="Watch progress until the goal ends.")] = False,
    question_deadline: Annotated[
        str | None,
        typer.Option(help="How long each question waits for an answer, e.g. 10m, 2h, 2d (default 48h)."),
    ] = None,
    remind_before: Annotated[
        str | None, typer.Option(help="Remind this long before a question's deadline (default: a quarter of it).")
    ] = None,
    on_expiry: Annotated[
        str | None,
        typer.Option(
            help="What an unanswered question decides: deny, park or abort (default: deny a write, park otherwise)."
        ),
    ] = None,
    no_budget: Annotated[
        bool,
        typer.Option(
            "--no-budget",
            help=f"No token or cost limit (without --max-tokens or --max-cost a goal gets {DEFAULT_MAX_TOKENS:,} "
            "tokens).",
        ),
    ] = False,
) -> None:
    """Start a goal; print its id, its budget and its Temporal UI link."""
    premises = key_values(premise or [])
    plan_obj, extras = None, {}
    if plan is not None:
        try:
            plan_obj, extras = goal_specs.load_plan_file(plan, tool)
        except BadPlanFile as err:
            refuse(err)
    options = goal_specs.with_plan(
        plan_obj, extras, goal=goal, tools=tool, constraints=constraint or [], premises=premises
    )
    if not options.goal:
        err_console.print("[red]error:[/red] give the goal text, or a plan file with a 'goal:' field")
        raise typer.Exit(2)
    try:
        root = goal_specs.goal_workspace(workspace)
    except ValueError as err:
        refuse(err)
    if host_workspace(root) is None and not Path(root).is_dir():
        # Workers may run elsewhere (docker-compose); the tool activity checks it there.
        err_console.print(f"[yellow]warning:[/yellow] workspace {root} is not a directory on this machine")
    limits = {
        "max_tokens": max_tokens,
        "max_cost_usd": max_cost,
        "max_wall_seconds": max_wall,
        "deadline": _deadline(deadline),
    }
    try:
        deadlines = goal_specs.question_deadline_of(question_deadline, remind_before, on_expiry)
        spec, defaulted = goal_specs.spec_of(
            options,
            limits,
            no_budget=no_budget,
            profile=profile,
            workspace=root,
            allow_network=allow_network,
            question_deadline=deadlines,
        )
    except ValueError as err:
        refuse(err)
    gid = goal_id or goal_specs.new_goal_id(options.goal)
    try:
        goal_specs.check_goal_id(gid)
    except StartRefused as err:
        refuse(err)

    async def _start() -> None:
        client = await PerdureClient.connect()
        await start_or_show(client, spec, gid, replace)
        console.print(escape(goal_specs.budget_line(spec.budget, defaulted=defaulted)))
        if watch:
            await render.watch(client, gid, console)

    run(_start, gid)


def _deadline(text: str | None) -> datetime | None:
    """`--deadline`: an ISO 8601 time, local unless it names an offset; never in the past."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        example = "e.g. 2026-12-01T18:00"
        err_console.print(f"[red]error:[/red] --deadline '{escape(text)}' is not an ISO 8601 time ({example})")
        raise typer.Exit(2) from None
    when = when if when.utcoffset() is not None else when.astimezone()
    if when <= datetime.now(UTC):
        err_console.print(f"[red]error:[/red] --deadline {when.isoformat()} is in the past")
        raise typer.Exit(2)
    return when


async def _children(client: PerdureClient, snapshot: Any) -> list[tuple[str, str, Any]]:
    """Each subgoal step's child goal with its snapshot (None when it cannot be read)."""
    found = []
    for node in snapshot.nodes:
        if node.child:
            try:
                child = await client.progress(node.child)
            except (RPCError, WorkflowQueryFailedError, GoalNotFound):
                child = None
            found.append((node.name, node.child, child))
    return found


@app.command()
def status(
    goal_id: str,
    why: Annotated[
        bool,
        typer.Option(
            "--why", help="Say where each step's tool calls ran and why, what held it back, how old its reads are."
        ),
    ] = False,
) -> None:
    """Show a goal's progress snapshot."""

    async def _status() -> None:
        client = await PerdureClient.connect()
        desc = await client.describe(goal_id)
        failure = await client.stuck(desc)
        if failure is not None:
            # A query would wait for a task that cannot run; say what the worker said instead.
            render.print_status(console, desc, None)
            render.print_stuck(console, goal_id, failure)
            render.print_activities(console, await client.pending_activities(desc))
            return
        snapshot = None
        is_open = goal_reads.is_open(desc)
        # One query: a running goal answers it between its workflow tasks (on a busy
        # 100,000-step goal a second query, for the refusals now in the snapshot, waited for
        # another task: 1.3-4.5 s against 0.04-0.5 s alone).
        try:
            snapshot = await client.progress(goal_id)
        except (RPCError, WorkflowQueryFailedError) as err:
            console.print(f"[yellow]{escape(goal_reads.unanswered_text(desc, err))}[/yellow]")
        render.print_status(console, desc, snapshot, why=why)
        ended = None if snapshot is not None or is_open else await client.published_ending(desc)
        if ended is not None:
            render.print_published(console, goal_id, ended)
        render.print_pinning(console, await deployment.pinning(client.temporal, desc) if is_open else None, snapshot)
        if snapshot is not None:
            render.print_children(console, await _children(client, snapshot), snapshot)
            render.print_refusals(console, goal_id, snapshot)
        render.print_activities(console, await client.pending_activities(desc))

    run(_status)


@app.command()
def watch(goal_id: str) -> None:
    """Show live progress until the goal ends, then its result."""

    async def _watch() -> None:
        client = await PerdureClient.connect()
        await client.describe(goal_id)
        await render.watch(client, goal_id, console)

    run(_watch, goal_id)


@app.command("ls")
def list_goals(
    status: Annotated[
        str | None, typer.Option(help="Temporal status: " + ", ".join(goal_reads.EXECUTION_STATUSES) + ".")
    ] = None,
    phase: Annotated[str | None, typer.Option(help="Goal phase: " + ", ".join(goal_reads.PHASES) + ".")] = None,
    needs_human: Annotated[bool, typer.Option("--needs-human", help="Only goals waiting for an answer.")] = False,
    parked: Annotated[bool, typer.Option("--parked", help="Only parked goals.")] = False,
    limit: Annotated[int, typer.Option(help="At most this many goals.")] = 50,
) -> None:
    """List goals, newest first, filtered by their search attributes."""

    try:
        filters = goal_reads.list_filters(status=status, phase=phase, needs_human=needs_human, parked=parked)
    except ValueError as err:
        refuse(err)

    async def _ls() -> None:
        client = await PerdureClient.connect()
        listed = await client.list_goals(" AND ".join(filters) or None, limit)
        outcomes = await client.outcomes(listed)
        render.print_goal_list(console, listed, outcomes, filtered=bool(filters))

    run(_ls)


@app.command()
def result(goal_id: str) -> None:
    """Print a finished goal's report (waits if it is still running)."""

    async def _result() -> None:
        client = await PerdureClient.connect()
        desc = await client.describe(goal_id)
        if goal_reads.is_open(desc):
            console.print("[dim]goal still running; waiting for it to end (Ctrl-C to stop waiting)…[/dim]")
        try:
            render.print_result(console, await client.result(goal_id))
        except EndedWithoutResult as ended:
            render.print_no_result(console, goal_id, ended)
            raise typer.Exit(1) from None

    run(_result, goal_id)


@app.command()
def history(
    goal_id: str,
    out: Annotated[Path, typer.Option("--out", help="File to write the history JSON to.")],
    encoded: Annotated[
        bool, typer.Option("--encoded", help="Write payloads as the server holds them (encrypted, if keys are on).")
    ] = False,
) -> None:
    """Export a goal's event history as JSON (for replay tests), its payloads decrypted unless --encoded."""

    async def _history() -> None:
        client = await PerdureClient.connect()
        hist = await client.history(goal_id, encoded=encoded)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(hist.to_json(), encoding="utf-8")
        except OSError as err:
            raise UserError(f"cannot write {out}: {err.strerror}") from None
        codec = client.temporal.data_converter.payload_codec
        how = "" if codec is None else " (encoded, as the server holds them)" if encoded else " (payloads decrypted)"
        console.print(f"wrote {len(hist.events)} events to {out}{how}")

    run(_history)


@app.command()
def demo() -> None:
    """Run the demo goal end to end on the embedded server."""
    from perdure.starters.demo import run_demo

    run(lambda: run_demo(console))
