"""The `perdure` command line: start, watch and inspect goals; run workers and
the embedded server. User-facing output goes through rich; goal logic stays in
the workflow and the client helpers in `perdure.starters.goals`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import typer.core
from rich.markup import escape
from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError

from perdure.activities.tools.catalogue import DEFAULT_TOOLS
from perdure.runtime import settings, telemetry
from perdure.runtime.connect import ServerUnavailable, connect
from perdure.starters import deploy_cli, goals, memory_cli, render, router_cli
from perdure.starters import start_checks as capabilities
from perdure.starters import watchdog_cli as wd
from perdure.starters.consoles import cli_console
from perdure.workers import deployment
from perdure.workflows.devices.device_contracts import LEASE_S
from perdure.workflows.goal.contracts.plan import describe_validation_error
from perdure.workflows.shared.contracts import DEFAULT_MAX_TOKENS

app = typer.Typer(
    help="perdure: durable AI agents on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
server_app = typer.Typer(help="The embedded Temporal dev server (temporal-dev/).", no_args_is_help=True)
app.add_typer(server_app, name="server")
watchdog_app = typer.Typer(help="The watchdog: a schedule that judges open goals and intervenes.", no_args_is_help=True)
app.add_typer(watchdog_app, name="watchdog")
# `perdure forget` and `perdure memory …` (starters/memory_cli.py).
app.add_typer(memory_cli.app)
app.add_typer(deploy_cli.app, name="deploy")


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

console = cli_console()
err_console = cli_console(stderr=True)


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


class UserError(Exception):
    """An error the user can fix; printed without a traceback."""


def refuse(err: Exception) -> NoReturn:
    """Say what was wrong with the command in one line and end it with exit code 2."""
    # Escaped: error texts quote files and TOML, whose [brackets] rich would take for markup.
    err_console.print(f"[red]error:[/red] {escape(str(err))}")
    raise typer.Exit(2) from None


def run(coro_fn: Callable[[], Awaitable[Any]], goal_id: str | None = None) -> Any:
    try:
        return asyncio.run(coro_fn())
    except typer.Exit:
        raise  # a command that already said what happened (typer.Exit is a RuntimeError)
    except (
        ServerUnavailable,
        settings.TemporalConfigError,
        goals.GoalNotFound,
        goals.BadPlanFile,
        wd.WatchdogMissing,
        UserError,
        ValueError,
        RuntimeError,
    ) as err:
        refuse(err)
    except RPCError as err:
        if goal_id is not None and _FINISHED in err.message.lower():
            # The goal closed between our look and the call: say so in perdure's words.
            err_console.print(f"[red]error:[/red] {escape(asyncio.run(_finished_text(goal_id)))}")
            raise typer.Exit(2) from None
        err_console.print(f"[red]error from Temporal:[/red] {escape(err.message)}")
        raise typer.Exit(1) from None


# What the server says of a call to a closed workflow (a signal, an update, a cancel).
_FINISHED = "workflow execution already completed"


async def _finished_text(goal_id: str) -> str:
    client = await connect()
    return await goals.finished_text(client, await goals.describe(client, goal_id))


@app.command()
def start(
    goal: Annotated[str | None, typer.Argument(help="What the goal should achieve.")] = None,
    plan: Annotated[Path | None, typer.Option("--plan", help="Declarative plan file (YAML or JSON).")] = None,
    workspace: Annotated[Path, typer.Option(help="Directory the tools work in.")] = Path("."),
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
    allowed = tool or list(DEFAULT_TOOLS)
    constraints = list(constraint or [])
    premises = _key_values(premise or [])
    plan_obj = None
    settings_in_plan: dict[str, Any] = {}
    if plan is not None:
        try:
            plan_obj, extras = goals.load_plan_file(plan, tool)
            if not tool:
                # Tools named in a plan file are allowed by writing them there.
                allowed = sorted(set(allowed) | set(goals.plan_tools(plan_obj)))
        except goals.BadPlanFile as err:
            refuse(err)
        goal = goal or extras.get("goal")
        constraints = constraints or list(extras.get("constraints") or [])
        premises = {**(extras.get("premises") or {}), **premises}
        settings_in_plan = {k: extras[k] for k in goals.SPEC_FIELDS_IN_PLAN if k in extras}
    if not goal:
        err_console.print("[red]error:[/red] give the goal text, or a plan file with a 'goal:' field")
        raise typer.Exit(2)
    root = workspace.expanduser().resolve()
    if not root.is_dir():
        # Workers may run elsewhere (docker-compose); the tool activity checks it there.
        err_console.print(f"[yellow]warning:[/yellow] workspace {root} is not a directory on this machine")
    limits = {
        "max_tokens": max_tokens,
        "max_cost_usd": max_cost,
        "max_wall_seconds": max_wall,
        "deadline": _deadline(deadline),
    }
    try:
        budget = goals.with_default_budget(limits, no_budget)
        spec = goals.build_spec(
            goal=goal,
            plan=plan_obj,
            constraints=constraints,
            budget=budget,
            model_profile=profile,
            allowed_tools=allowed,
            workspace=str(root),
            premises=premises,
            allow_network=allow_network,
            **settings_in_plan,
        )
    except ValueError as err:
        refuse(err)
    gid = goal_id or render.new_goal_id(goal)
    try:
        goals.check_goal_id(gid)
    except goals.StartRefused as err:
        refuse(err)

    async def _start() -> None:
        client = await connect()
        await capabilities.check_start(client, spec)
        await _start_or_show(client, spec, gid, replace)
        console.print(escape(goals.budget_line(spec.budget, defaulted=budget != limits)))
        if watch:
            await render.watch(client, gid, console)

    run(_start, gid)


async def _start_or_show(client: Any, spec: Any, gid: str, replace: bool) -> None:
    """Start the goal, or show the one already under `gid` (goals.start_or_existing decides,
    as it does for the web UI's POST /api/goals)."""
    try:
        answer = await goals.start_or_existing(client, spec, gid, replace)
    except goals.StartRefused as err:
        raise UserError(str(err)) from None
    console.print(escape(answer.text))
    console.print(f"UI: {settings.goal_ui_link(gid)}")


async def _children(client: Any, snapshot: Any) -> list[tuple[str, str, Any]]:
    """Each subgoal step's child goal with its snapshot (None when it cannot be read)."""
    found = []
    for node in snapshot.nodes:
        if node.child:
            try:
                child = await goals.progress(client, node.child)
            except (RPCError, WorkflowQueryFailedError, goals.GoalNotFound):
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
        from perdure.starters import steer_client as steering

        client = await connect()
        desc = await goals.describe(client, goal_id)
        failure = await goals.workflow_task_failure(client, desc)
        if failure is not None:
            # A query would wait for a task that cannot run; say what the worker said instead.
            render.print_status(console, desc, None)
            render.print_stuck(console, goal_id, failure)
            render.print_activities(console, await goals.pending_activities(client, desc))
            return
        snapshot = None
        try:
            snapshot = await goals.progress(client, goal_id)
        except RPCError as err:
            console.print(f"[yellow]{escape(goals.unanswered_text(desc, err))}[/yellow]")
        render.print_status(console, desc, snapshot, why=why)
        ended = None if snapshot is not None or goals.is_open(desc) else await goals.published_ending(client, desc)
        if ended is not None:
            render.print_published(console, goal_id, ended)
        render.print_pinning(console, await deployment.pinning(client, desc) if goals.is_open(desc) else None, snapshot)
        if snapshot is not None:
            render.print_children(console, await _children(client, snapshot), snapshot)
            render.print_refusals(console, goal_id, await steering.inbox(client, goal_id))
        render.print_activities(console, await goals.pending_activities(client, desc))

    run(_status)


@app.command()
def watch(goal_id: str) -> None:
    """Show live progress until the goal ends, then its result."""

    async def _watch() -> None:
        client = await connect()
        await goals.describe(client, goal_id)
        await render.watch(client, goal_id, console)

    run(_watch, goal_id)


@app.command("ls")
def list_goals(
    status: Annotated[
        str | None, typer.Option(help="Temporal status: " + ", ".join(goals.EXECUTION_STATUSES) + ".")
    ] = None,
    phase: Annotated[str | None, typer.Option(help="Goal phase: " + ", ".join(goals.PHASES) + ".")] = None,
    needs_human: Annotated[bool, typer.Option("--needs-human", help="Only goals waiting for an answer.")] = False,
    parked: Annotated[bool, typer.Option("--parked", help="Only parked goals.")] = False,
    limit: Annotated[int, typer.Option(help="At most this many goals.")] = 50,
) -> None:
    """List goals, newest first, filtered by their search attributes."""

    try:
        filters = goals.list_filters(status=status, phase=phase, needs_human=needs_human, parked=parked)
    except ValueError as err:
        refuse(err)

    async def _ls() -> None:
        client = await connect()
        listed = await goals.list_goals(client, " AND ".join(filters) or None, limit)
        outcomes = await goals.outcomes(client, listed)
        render.print_goal_list(console, listed, outcomes, filtered=bool(filters))

    run(_ls)


@app.command()
def result(goal_id: str) -> None:
    """Print a finished goal's report (waits if it is still running)."""

    async def _result() -> None:
        client = await connect()
        desc = await goals.describe(client, goal_id)
        if goals.is_open(desc):
            console.print("[dim]goal still running; waiting for it to end (Ctrl-C to stop waiting)…[/dim]")
        try:
            render.print_result(console, await goals.result(client, goal_id))
        except goals.EndedWithoutResult as ended:
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
        client = await connect()
        await goals.describe(client, goal_id)
        hist = await client.get_workflow_handle(goal_id).fetch_history()
        codec = client.data_converter.payload_codec
        if codec is not None and not encoded:
            from temporalio.api.history.v1 import History
            from temporalio.client import WorkflowHistory

            from perdure.runtime.codec import decode_history

            plain = await decode_history(History(events=hist.events), codec)
            hist = WorkflowHistory(hist.workflow_id, list(plain.events))
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(hist.to_json(), encoding="utf-8")
        except OSError as err:
            raise UserError(f"cannot write {out}: {err.strerror}") from None
        how = "" if codec is None else " (encoded, as the server holds them)" if encoded else " (payloads decrypted)"
        console.print(f"wrote {len(hist.events)} events to {out}{how}")

    run(_history)


# --- steering: every message carries a request id; a retry with the same id is the same message ---

RequestId = Annotated[
    str | None, typer.Option("--request-id", help="Idempotency id; reuse it to retry the same message safely.")
]


def _send(goal_id: str, message_type: type, request_id: str | None, **fields: Any) -> None:
    from pydantic import ValidationError

    from perdure.starters import steer_client as steering

    rid = request_id or steering.new_request_id()
    try:
        message = message_type(request_id=rid, **fields)
    except ValidationError as err:
        err_console.print(f"[red]error:[/red] {describe_validation_error(err)}")
        raise typer.Exit(2) from None

    async def _go() -> None:
        client = await connect()
        try:
            delivery = await steering.deliver(client, goal_id, message)
        except steering.MessageRejected as err:
            err_console.print(f"[red]rejected:[/red] {escape(str(err))}")
            raise typer.Exit(2) from None
        if delivery.stuck is not None:
            err_console.print(f"[red]goal {goal_id} is stuck:[/red] its workflow task fails, the worker said:")
            err_console.print(f"  {escape(delivery.stuck)}")
            err_console.print(
                f"{message.kind} stored by the server (request id {rid}); it is applied once a worker can run "
                "the goal again."
            )
            err_console.print(escape(render.stuck_advice(goal_id)))
            raise typer.Exit(1)
        receipt = delivery.receipt
        if receipt is None:
            console.print(
                f"{message.kind} accepted by the server (request id {rid}); no worker answered yet, so the goal "
                "judges it in the order it was sent when one does. Check its receipt with `perdure inbox`."
            )
            return
        if receipt.status == "rejected":
            # Admitted, then judged in its turn: it could not apply (the note says why).
            err_console.print(f"[red]rejected:[/red] {escape(receipt.note or 'no reason given')}")
            raise typer.Exit(2)
        render.print_receipt(console, receipt)

    run(_go, goal_id)


@app.command()
def steer(goal_id: str, text: str, request_id: RequestId = None) -> None:
    """Guide the goal; applied at the next model turn and kept from then on."""
    from perdure.workflows.goal.contracts.messages import Steer

    _send(goal_id, Steer, request_id, text=text)


@app.command()
def queue(goal_id: str, text: str, request_id: RequestId = None) -> None:
    """Queue follow-up work, planned when the current work is done."""
    from perdure.workflows.goal.contracts.messages import Queue

    _send(goal_id, Queue, request_id, text=text)


@app.command()
def answer(
    goal_id: str,
    question_id: str,
    choice: str,
    text: Annotated[str | None, typer.Option(help="A note with the answer.")] = None,
    request_id: RequestId = None,
) -> None:
    """Answer a question the goal asked (see `perdure status`)."""
    from perdure.workflows.goal.contracts.messages import Answer

    _send(goal_id, Answer, request_id, question_id=question_id, choice=choice, text=text)


@app.command()
def approve(
    goal_id: str,
    question_id: str,
    reject: Annotated[bool, typer.Option("--reject", help="Refuse instead of approving.")] = False,
    text: Annotated[str | None, typer.Option(help="Why.")] = None,
    request_id: RequestId = None,
) -> None:
    """Approve (or --reject) what a confirmation question proposes."""
    from perdure.workflows.goal.contracts.messages import Approve

    _send(goal_id, Approve, request_id, question_id=question_id, approved=not reject, text=text)


@app.command()
def park(
    goal_id: str,
    reason: Annotated[str, typer.Option(help="What the goal waits for.")],
    until: Annotated[datetime | None, typer.Option(help="Wake at this UTC time (ISO 8601).")] = None,
    expiry_hours: Annotated[float, typer.Option(help="Ask again after this long.")] = 48,
    request_id: RequestId = None,
) -> None:
    """Pause dispatching until resume (or --until); no stall checks while parked."""
    from perdure.workflows.goal.contracts.messages import Park

    wake = until.replace(tzinfo=UTC) if until and until.tzinfo is None else until
    _send(goal_id, Park, request_id, reason=reason, until=wake, expiry_hours=expiry_hours)


@app.command()
def resume(goal_id: str, request_id: RequestId = None) -> None:
    """Resume a parked goal."""
    from perdure.workflows.goal.contracts.messages import Resume

    _send(goal_id, Resume, request_id)


@app.command()
def narrow(
    goal_id: str,
    premises: Annotated[list[str], typer.Argument(help="KEY=VALUE, e.g. scope=module_a")],
    why: Annotated[str | None, typer.Option(help="Why the requirement changed.")] = None,
    request_id: RequestId = None,
) -> None:
    """Change premises: void the work they invalidate, keep the rest."""
    from perdure.workflows.goal.contracts.messages import Narrow

    _send(goal_id, Narrow, request_id, premises=_key_values(premises), why=why)


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


def _key_values(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            err_console.print(f"[red]error:[/red] '{item}' is not KEY=VALUE")
            raise typer.Exit(2)
        pairs[key] = value
    return pairs


@app.command()
def rewind(
    goal_id: str,
    node: str,
    why: Annotated[str, typer.Option(help="What was wrong; the model is shown it.")],
    request_id: RequestId = None,
) -> None:
    """Void a step and what depends on it, and record why it was wrong."""
    from perdure.workflows.goal.contracts.messages import Rewind

    _send(goal_id, Rewind, request_id, node=node, why=why)


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
    from perdure.starters import fork as forking

    premises = _key_values(set_premise or [])
    gid = new_id or forking.fork_id(goal_id)
    try:
        goals.check_goal_id(gid)
    except goals.StartRefused as err:
        refuse(err)

    async def _fork() -> None:
        client = await connect()
        try:
            point = await forking.read_fork_point(client, goal_id, node, premises)
        except forking.NoAnswer as err:
            err_console.print(f"[red]error:[/red] {escape(str(err))}")
            raise typer.Exit(1) from None
        spec = forking.fork_spec(point, goal_id, node, why, premises, profile)
        await capabilities.check_start(client, spec)
        await _start_or_show(client, spec, gid, False)
        changes = ", ".join(f"{k}={v}" for k, v in spec.forked_from.changes.items()) if spec.forked_from else ""
        console.print(f"forked from {escape(goal_id)} at {escape(node)}" + (f" · {escape(changes)}" if changes else ""))
        forking.print_fork_plan(console, goal_id, point)

    run(_fork)


@app.command("diff")
def diff_goals(
    goal_a: str,
    goal_b: str,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Compare two goals step by step (a goal and its fork): status, output digest, reused or run, tokens, cost."""
    from perdure.starters import fork as forking

    async def _diff() -> None:
        client = await connect()
        try:
            a, b = await asyncio.gather(forking.read_side(client, goal_a), forking.read_side(client, goal_b))
        except forking.NoAnswer as err:
            err_console.print(f"[red]error:[/red] {escape(str(err))}")
            raise typer.Exit(1) from None
        compared = forking.diff_goals(a, b)
        if as_json:
            print(compared.model_dump_json(indent=2))
        else:
            render.print_diff(console, compared)

    run(_diff)


@app.command()
def abort(
    goal_id: str,
    reason: Annotated[str, typer.Option(help="Why.")] = "aborted by the user",
    rollback: Annotated[bool, typer.Option(help="Run registered compensations, newest first.")] = False,
    request_id: RequestId = None,
) -> None:
    """Stop dispatching and finish with the report and the unfinished list."""
    from perdure.workflows.goal.contracts.messages import Abort

    _send(goal_id, Abort, request_id, reason=reason, rollback=rollback)


@app.command("inbox")
def show_inbox(
    goal_id: Annotated[str | None, typer.Argument(help="The goal (or --router).")] = None,
    router: Annotated[bool, typer.Option("--router", help="Your router's messages and routing decisions.")] = False,
) -> None:
    """Every message sent to a goal and its receipt (with --router: what the router decided, and why)."""
    from perdure.starters import steer_client as steering

    if router:
        return router_cli.show_router(run, connect, console)
    if goal_id is None:
        refuse(UserError("name a goal (perdure inbox GOAL_ID), or --router for your router's messages"))

    async def _inbox() -> None:
        client = await connect()
        await goals.describe(client, goal_id)
        try:
            view = await steering.inbox(client, goal_id)
        except RPCError:
            # No worker answered the query: the history still holds every message admitted.
            console.print("[yellow]no worker answered the inbox query; what the server holds:[/yellow]")
            render.print_admitted(console, await steering.admitted(client, goal_id))
            return
        render.print_inbox(console, view)

    run(_inbox, goal_id)


@app.command()
def worker(
    build_id: Annotated[
        str | None,
        typer.Option("--build-id", help="This worker's version (default: a digest of perdure's own code)."),
    ] = None,
    no_promote: Annotated[
        bool,
        typer.Option("--no-promote", help="Do not make a new version current; `perdure deploy promote` does it."),
    ] = False,
    unversioned: Annotated[
        bool, typer.Option("--unversioned", help="Run outside Worker Deployments (goals are not pinned).")
    ] = False,
) -> None:
    """Run an orchestrator worker (goal workflows, model and tool activities).

    It is a version of the Worker Deployment PERDURE_DEPLOYMENT (default
    "perdure"): goals stay on the version that started them and move to the
    current one at their next run boundary. A build that was never current
    becomes current once it polls.

    It reads PERDURE_TEMPORAL (server address; else TEMPORAL_ADDRESS or a
    Temporal profile), PERDURE_NAMESPACE, PERDURE_TASK_QUEUE, PERDURE_DEPLOYMENT,
    PERDURE_WORKFLOW_CACHE (goal runs kept in memory, default 1000),
    PERDURE_CONFIG (model profiles, default PERDURE_HOME/config.toml),
    PERDURE_HOME (artifacts, default ~/.perdure), PERDURE_UI, PERDURE_PAYLOAD_KEYS
    or PERDURE_PAYLOAD_KEY_FILE (payload encryption), the model providers' keys
    the profiles name (e.g. OPENAI_API_KEY, ANTHROPIC_API_KEY) and the
    OpenTelemetry OTEL_* variables (traces and metrics; README, Observability)."""
    from perdure.activities.mcp.mcp_calls import McpServers
    from perdure.activities.mcp.mcp_config import load_mcp_servers
    from perdure.workers.deployment import worker_version
    from perdure.workers.orchestrator import configure_logging, run_orchestrator

    if unversioned and (build_id is not None or no_promote):
        refuse(UserError("--unversioned takes no --build-id or --no-promote"))
    try:
        version = None if unversioned else worker_version(build_id)
    except ValueError as err:
        refuse(err)
    configure_logging()

    async def _worker() -> None:
        # config.toml's MCP servers are checked before anything connects: a table that
        # cannot be used is one line, and no worker starts.
        servers = McpServers(load_mcp_servers())
        await run_orchestrator(await connect(worker=True), version=version, promote=not no_promote, mcp_servers=servers)

    try:
        run(_worker)
    except KeyboardInterrupt:
        pass


@app.command()
def device(
    name: Annotated[str, typer.Option("--name", help="The device's name (lower-case letters, digits, '-').")],
    root: Annotated[Path, typer.Option("--root", help="The directory its tools work in; nothing outside it.")],
    tools: Annotated[
        str | None,
        typer.Option("--tools", help="Tools it offers, comma-separated (default: all device tools)."),
    ] = None,
    network: Annotated[bool, typer.Option("--network", help="Let its shell commands use the network.")] = False,
    approve: Annotated[
        list[str] | None,
        typer.Option(
            "--approve",
            help="TOOL=RULE, when a call needs a person's approval: always, never or risk>=local-write "
            "(the default); TOOL may be *; repeatable.",
        ),
    ] = None,
    lease_s: Annotated[
        float, typer.Option("--lease-s", help="Seconds without a heartbeat before it counts as offline.")
    ] = LEASE_S,
    scratch: Annotated[
        Path | None,
        typer.Option("--scratch", help="Scratch directory (default PERDURE_HOME/devices/NAME/scratch)."),
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Take the name over from a daemon online with another root.")
    ] = False,
) -> None:
    """Run a device daemon: this machine runs goals' file, command and git steps inside --root.

    It connects out to Temporal as `perdure worker` does (PERDURE_TEMPORAL, a Temporal
    profile, PERDURE_NAMESPACE, PERDURE_TASK_QUEUE of the workers), keeps no goal state,
    and runs until Ctrl-C."""
    from perdure.runtime.connect import connect as connect_client
    from perdure.workers.device import DeviceConfigError, device_config, parse_approval, parse_tools, run_device
    from perdure.workers.orchestrator import configure_logging

    try:
        config = device_config(
            name=name,
            root=root,
            tools=parse_tools(tools),
            network=network,
            approval=parse_approval(approve or []),
            lease_s=lease_s,
            scratch=scratch,
            replace=replace,
        )
    except DeviceConfigError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(1) from None
    configure_logging()

    def online(config: Any, session: Any) -> None:
        console.print(
            f"device [bold]{config.name}[/bold] online · session {session.generation} · root {escape(str(config.root))}"
            f" · tools {', '.join(sorted(config.tools))}" + (" · network" if config.network else "")
        )

    async def _device() -> None:
        client = await connect_client(payload_store=False, worker=True)
        await run_device(
            client,
            name=config.name,
            root=config.root,
            tools=config.tools,
            network=config.network,
            approval=config.approval,
            lease_s=config.lease_s,
            scratch=config.scratch,
            replace=config.replace,
            task_queue=settings.task_queue(),
            on_online=online,
        )

    try:
        asyncio.run(_device())
    except KeyboardInterrupt:
        pass  # Ctrl-C before the daemon was online: nothing to stop
    except (settings.TemporalConfigError, DeviceConfigError, RuntimeError, ValueError) as err:
        # RuntimeError: the server unreachable (ServerUnavailable), the registry refusing (DeviceRefused);
        # ValueError: payload keys or payload store settings that cannot be used.
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(1) from None
    except RPCError as err:
        err_console.print(f"[red]error from Temporal:[/red] {escape(err.message)}")
        raise typer.Exit(1) from None


@app.command()
def devices(
    as_json: Annotated[bool, typer.Option("--json", help="Print the listing as JSON.")] = False,
) -> None:
    """List the devices: online or offline, since when, last seen, tools, running steps."""
    from perdure.starters import devices_cli as listing

    async def _devices() -> None:
        view = await listing.device_views(await connect())
        if as_json:
            print(listing.devices_json(view))
        else:
            listing.print_devices(console, view)

    try:
        asyncio.run(_devices())
    except (ServerUnavailable, settings.TemporalConfigError, listing.RegistryUnanswered, ValueError) as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(1) from None
    except RPCError as err:
        err_console.print(f"[red]error from Temporal:[/red] {escape(err.message)}")
        raise typer.Exit(1) from None


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
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(1) from None
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


@app.command()
def demo() -> None:
    """Run the demo goal end to end on the embedded server."""
    from perdure.starters.demo import run_demo

    run(lambda: run_demo(console))


app.command("profiles")(capabilities.profiles)


# --- the watchdog: one schedule per task queue, created by the workers ---------------


wd.add_commands(watchdog_app, console, err_console)


@watchdog_app.command("status")
def watchdog_status() -> None:
    """The schedule: interval, paused or not, last and next run."""

    async def _status() -> None:
        client = await connect()
        queue = settings.task_queue()
        wd.print_status(console, await wd.describe(client, queue), queue)

    run(_status)


@watchdog_app.command("pause")
def watchdog_pause(note: Annotated[str, typer.Option(help="Why (shown in status).")] = "paused from the CLI") -> None:
    """Stop scheduling runs (goals are left alone meanwhile)."""
    _set_watchdog_paused(True, note)


@watchdog_app.command("resume")
def watchdog_resume(note: Annotated[str, typer.Option(help="Shown in status.")] = "resumed from the CLI") -> None:
    """Schedule runs again."""
    _set_watchdog_paused(False, note)


def _set_watchdog_paused(paused: bool, note: str) -> None:
    async def _switch() -> None:
        await wd.set_paused(await connect(), settings.task_queue(), paused, note)
        console.print("watchdog paused" if paused else "watchdog resumed")

    run(_switch)


@watchdog_app.command("run-now")
def watchdog_run_now(
    wait: Annotated[bool, typer.Option(help="Wait for the run and print what it found.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the run.")] = 120,
) -> None:
    """Run the watchdog once now (after a run already going, if any)."""

    async def _run_now() -> None:
        client = await connect()
        workflow_id = await wd.run_now(client, settings.task_queue())
        if workflow_id is None:
            raise UserError("the run was triggered but has not started yet; check `perdure watchdog status`")
        console.print(f"watchdog run {workflow_id} started · UI: {settings.goal_ui_link(workflow_id)}")
        if wait:
            try:
                result = await wd.run_result(client, workflow_id, timeout)
            except TimeoutError:
                raise UserError(f"no result within {timeout:g} s; is a worker running (`perdure worker`)?") from None
            wd.print_result(console, workflow_id, result)

    run(_run_now)


@watchdog_app.command("report")
def watchdog_report(
    show_all: Annotated[bool, typer.Option("--all", help="Include healthy goals.")] = False,
) -> None:
    """Open incidents and the latest findings per goal."""
    queue = settings.task_queue()
    memory, path = wd.read_memory(queue)
    if memory is not None:
        wd.print_report(console, memory, path, show_all)
        return

    async def _from_last_run() -> None:
        console.print(f"[dim]no watchdog memory at {escape(path)}; showing the schedule's last finished run[/dim]")
        last = await wd.last_run_result(await connect(), queue)
        if last is None:
            raise UserError("the watchdog has not finished a run yet")
        wd.print_result(console, *last)

    run(_from_last_run)


@server_app.command("start")
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
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(1) from None
    verb = "already running" if server.reused else "started"
    owner = f"pid {server.pid}" if server.pid else "not started by perdure"
    console.print(f"Temporal dev server {verb} at {server.address} ({owner}); UI {server.ui_url or 'unknown'}")


@server_app.command("stop")
def server_stop() -> None:
    """Stop the embedded dev server, the demo worker and the demo's `perdure ui` (by pid only)."""
    from perdure.starters import devserver
    from perdure.starters.background import stop_worker

    if stop_worker(devserver.dev_dir() / "data"):
        console.print("demo worker stopped")
    if stop_worker(devserver.dev_dir() / "data", command="ui"):
        console.print("demo ui stopped")
    console.print("dev server stopped" if devserver.stop_dev_server() else "no dev server was running")


@server_app.command("status")
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


def main() -> None:
    # The SDK's native runtime can crash at interpreter exit (sdk-python #300)
    # after the command finished; flush and leave without running finalizers.
    code = 0
    try:
        app()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    telemetry.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


router_cli.register(app, run, connect, console)
