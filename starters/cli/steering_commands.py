"""Steering goals: every message a person sends a goal (`steer`, `queue`, `answer`,
`approve`, `park`, `resume`, `narrow`, `rewind`, `abort`), what it asks (`questions`),
what it received (`inbox`), and `say`, which lets the user's router decide which goal a message is for. Every message
carries a request id; a retry with the same id is the same message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from perdure.runtime import settings
from perdure.starters import render, render_abort, router_view
from perdure.starters.cli.terminal import UserError, console, err_console, key_values, refuse, run
from perdure.starters.client import PerdureClient, goal_reads
from perdure.starters.client.client_errors import MessageRejected, SayRefused
from perdure.workflows.goal.contracts.messages import (
    Abort,
    Answer,
    Approve,
    Narrow,
    Park,
    Queue,
    Resume,
    Rewind,
    Signal,
    Steer,
)
from perdure.workflows.goal.contracts.plan import describe_validation_error
from perdure.workflows.router.router_contracts import CardAction, Pick, Say

app = typer.Typer()

RequestId = Annotated[
    str | None, typer.Option("--request-id", help="Idempotency id; reuse it to retry the same message safely.")
]


def _send(
    goal_id: str,
    message_type: type,
    request_id: str | None,
    then: Callable[[PerdureClient, str], Awaitable[None]] | None = None,
    **fields: Any,
) -> None:
    """Send the message and print its receipt; `then(client, goal_id)` once it is applied."""
    rid = request_id or PerdureClient.new_request_id()
    try:
        message = message_type(request_id=rid, **fields)
    except ValidationError as err:
        err_console.print(f"[red]error:[/red] {describe_validation_error(err)}")
        raise typer.Exit(2) from None

    async def _go() -> None:
        client = await PerdureClient.connect()
        try:
            delivery = await client.send(goal_id, message)
        except MessageRejected as err:
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
        if then is not None and receipt.status == "applied":
            await then(client, goal_id)

    run(_go, goal_id)


@app.command()
def steer(goal_id: str, text: str, request_id: RequestId = None) -> None:
    """Guide the goal; applied at the next model turn and kept from then on."""
    _send(goal_id, Steer, request_id, text=text)


@app.command()
def queue(goal_id: str, text: str, request_id: RequestId = None) -> None:
    """Queue follow-up work, planned when the current work is done."""
    _send(goal_id, Queue, request_id, text=text)


@app.command()
def answer(
    goal_id: str,
    question_id: str,
    choice: str,
    text: Annotated[str | None, typer.Option(help="A note with the answer.")] = None,
    steps: Annotated[
        str | None,
        typer.Option(
            help="approve_some / refuse_some on an approvals-ahead card: the steps it picks, comma-separated."
        ),
    ] = None,
    request_id: RequestId = None,
) -> None:
    """Answer a question the goal asked (see `perdure status`)."""
    picked = [s.strip() for s in (steps or "").split(",") if s.strip()]
    _send(goal_id, Answer, request_id, question_id=question_id, choice=choice, text=text, steps=picked)


@app.command()
def questions(goal_id: str) -> None:
    """The goal's open questions: options, recommendation, deadline and what each decides if
    nobody answers by then; and those their deadline decided."""

    async def _questions() -> None:
        client = await PerdureClient.connect()
        desc = await client.describe(goal_id)
        failure = await client.stuck(desc)
        if failure is not None:
            # A query would wait for a task that cannot run: say what the worker said, as status does.
            render.print_stuck(console, goal_id, failure)
            return
        try:
            snapshot = await client.progress(goal_id)
        except (RPCError, WorkflowQueryFailedError) as err:
            unread = "its open questions cannot be read until a worker answers"
            console.print(f"[yellow]{escape(goal_reads.unanswered_text(desc, err, instead=unread))}[/yellow]")
            return
        if not snapshot.questions:
            console.print("no open questions")
        render.print_questions(console, snapshot)

    run(_questions, goal_id)


@app.command()
def approve(
    goal_id: str,
    question_id: str,
    reject: Annotated[bool, typer.Option("--reject", help="Refuse instead of approving.")] = False,
    text: Annotated[str | None, typer.Option(help="Why.")] = None,
    request_id: RequestId = None,
) -> None:
    """Approve (or --reject) what a confirmation question proposes."""
    _send(goal_id, Approve, request_id, question_id=question_id, approved=not reject, text=text)


@app.command()
def park(
    goal_id: str,
    reason: Annotated[str, typer.Option(help="What the goal waits for.")],
    until: Annotated[datetime | None, typer.Option(help="Wake at this UTC time (ISO 8601).")] = None,
    expiry_hours: Annotated[float, typer.Option(help="Ask again after this long.")] = 48,
    until_file: Annotated[
        str | None, typer.Option(help="Resume once this path (relative to the goal's workspace) exists.")
    ] = None,
    until_command: Annotated[
        str | None, typer.Option(help="Resume once this command, sandboxed in the workspace, exits 0.")
    ] = None,
    until_signal: Annotated[str | None, typer.Option(help="Resume once `perdure signal GOAL NAME` sends it.")] = None,
    poll_first_s: Annotated[float, typer.Option(help="First wait between checks (it doubles).")] = 2,
    poll_max_s: Annotated[float, typer.Option(help="Longest wait between checks.")] = 300,
    request_id: RequestId = None,
) -> None:
    """Pause dispatching until resume, --until a time, or a condition (a file, a command, a
    signal); no stall checks while parked."""
    wake = until.replace(tzinfo=UTC) if until and until.tzinfo is None else until
    _send(
        goal_id,
        Park,
        request_id,
        reason=reason,
        until=wake,
        expiry_hours=expiry_hours,
        until_file=until_file,
        until_command=until_command,
        until_signal=until_signal,
        poll_first_s=poll_first_s,
        poll_max_s=poll_max_s,
    )


@app.command()
def signal(goal_id: str, name: str, request_id: RequestId = None) -> None:
    """Send a named signal: it ends a park that waits for it (park --until-signal NAME)."""
    _send(goal_id, Signal, request_id, name=name)


@app.command()
def resume(goal_id: str, request_id: RequestId = None) -> None:
    """Resume a parked goal."""
    _send(goal_id, Resume, request_id)


@app.command()
def narrow(
    goal_id: str,
    premises: Annotated[list[str], typer.Argument(help="KEY=VALUE, e.g. scope=module_a")],
    why: Annotated[str | None, typer.Option(help="Why the requirement changed.")] = None,
    request_id: RequestId = None,
) -> None:
    """Change premises: void the work they invalidate, keep the rest."""
    _send(goal_id, Narrow, request_id, premises=key_values(premises), why=why)


@app.command()
def rewind(
    goal_id: str,
    node: str,
    why: Annotated[str, typer.Option(help="What was wrong; the model is shown it.")],
    request_id: RequestId = None,
) -> None:
    """Void a step and what depends on it, and record why it was wrong."""
    _send(goal_id, Rewind, request_id, node=node, why=why)


@app.command()
def abort(
    goal_id: str,
    reason: Annotated[str, typer.Option(help="Why.")] = "aborted by the user",
    rollback: Annotated[bool, typer.Option(help="Run registered compensations, newest first.")] = False,
    request_id: RequestId = None,
) -> None:
    """Stop dispatching and finish with the report and the unfinished list."""
    _send(goal_id, Abort, request_id, then=_abort_under_way, reason=reason, rollback=rollback)


async def _abort_under_way(client: PerdureClient, goal_id: str) -> None:
    """An applied abort is requested, not done: say what it still waits for (writes on their
    way, subgoals, compensations) and how to watch it, or that it is achieved."""
    try:
        abort = (await client.progress(goal_id)).abort
    except (RPCError, WorkflowQueryFailedError):
        abort = None
    if abort is None:
        console.print(f"abort requested; {render_abort.watch_hint(goal_id)}", highlight=False)
        return
    render_abort.print_abort(console, abort)
    if abort.stage == "requested":
        console.print(render_abort.watch_hint(goal_id), highlight=False)


@app.command("inbox")
def show_inbox(
    goal_id: Annotated[str | None, typer.Argument(help="The goal (or --router).")] = None,
    router: Annotated[bool, typer.Option("--router", help="Your router's messages and routing decisions.")] = False,
) -> None:
    """Every message sent to a goal and its receipt (with --router: what the router decided, and why)."""
    if router:
        return _show_router()
    if goal_id is None:
        refuse(UserError("name a goal (perdure inbox GOAL_ID), or --router for your router's messages"))

    async def _inbox() -> None:
        found = await (await PerdureClient.connect()).messages(goal_id)
        if found.source == "goal":
            render.print_inbox(console, found)
            return
        # No worker answered the query: the history still holds every message admitted.
        console.print("[yellow]no worker answered the inbox query; what the server holds:[/yellow]")
        render.print_admitted(console, found.admitted)

    run(_inbox, goal_id)


def _show_router() -> None:
    async def _show() -> None:
        client = await PerdureClient.connect()
        try:
            view = await client.router()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise ValueError(
                    f"{settings.user()} has no router yet: it starts with the first `perdure say`"
                ) from None
            raise ValueError(
                f"no worker answered the router's query ({err.message}); start one: perdure worker"
            ) from None
        router_view.print_router(console, view)

    run(_show)


@app.command("say")
def say_command(
    text: Annotated[str, typer.Argument(help="What you want, in your words.")] = "",
    goal: Annotated[str | None, typer.Option("--goal", help="Send it to this goal (no routing).")] = None,
    new: Annotated[bool, typer.Option("--new", help="Start a new goal with it.")] = False,
    queue: Annotated[bool, typer.Option("--queue", help="To a goal: as follow-up work, not guidance.")] = False,
    pick: Annotated[
        str | None, typer.Option("--pick", help="Answer the router's question: REQUEST_ID=GOAL|new|answer.")
    ] = None,
    card: Annotated[
        str | None,
        typer.Option(
            "--card",
            help="Answer a goal's question card: GOAL:QUESTION=CHOICE; a memory card the router holds: "
            'GOAL:memory=project|global|skip|choose (choose: the numbers as the text, e.g. "1 3").',
        ),
    ] = None,
    workspace: Annotated[Path, typer.Option(help="Where a new goal works.")] = Path("."),
    profile: Annotated[str, typer.Option(help="The router's model profile (its first start only).")] = "default",
    request_id: Annotated[str | None, typer.Option(help="Request id (a retry reuses it).")] = None,
) -> None:
    """Send a message; the router decides which goal it is for (or answers it itself)."""
    picked = _pick(pick) if pick else None
    carded = _card(card) if card else None
    words = text.strip() or (f"pick {picked.choice}" if picked else f"answer {carded.choice}" if carded else "")
    if not words:
        raise typer.BadParameter('say what you want: perdure say "make the poster a bit warmer"')
    message = Say(
        request_id=request_id or PerdureClient.new_request_id(),
        text=words,
        goal_id=goal,
        new=new,
        queue=queue,
        pick=picked,
        card=carded,
        workspace=str(workspace.expanduser().resolve()),
    )

    async def _say() -> None:
        client = await PerdureClient.connect()
        try:
            routing = await client.say(message, profile)
        except SayRefused as err:
            raise ValueError(f"the router refused the message: {err}") from None
        if routing is None:
            render.say(
                console,
                f"accepted as {escape(message.request_id)}; no worker decided in time, so it is routed when "
                "a worker runs (a retry with the same --request-id is not routed twice): see "
                "`perdure inbox --router`",
            )
            return
        router_view.print_routing(console, routing)
        if routing.status == "failed":
            raise typer.Exit(1)

    run(_say)


def _pick(value: str) -> Pick:
    request_id, sep, choice = value.partition("=")
    if not sep or not request_id or not choice:
        raise typer.BadParameter("expected REQUEST_ID=CHOICE, e.g. --pick cli-1a2b=poster-1")
    return Pick(request_id=request_id, choice=choice)


def _card(value: str) -> CardAction:
    goal, sep, rest = value.partition(":")
    question, sep2, choice = rest.partition("=")
    if not (sep and sep2 and goal and question and choice):
        raise typer.BadParameter("expected GOAL:QUESTION=CHOICE, e.g. --card poster-1:q1=approve")
    return CardAction(goal_id=goal, question_id=question, choice=choice)
