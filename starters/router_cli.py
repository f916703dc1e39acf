"""`perdure say` (one entry point for the user: the router decides which goal a message is
for) and `perdure inbox --router` (what it decided, and why, and the goals' memory cards it
holds for an answer: `perdure say --card GOAL:memory=CHOICE`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from temporalio.service import RPCError, RPCStatusCode

from perdure.runtime import settings
from perdure.starters import router_client
from perdure.starters.render import say as show
from perdure.starters.steer_client import new_request_id
from perdure.workflows.goal.rules.memory_rules import CARD_QUESTION, offer_listing
from perdure.workflows.router.router_contracts import CardAction, KeptMemories, Pick, RouterView, Routing, Say


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


def register(app: typer.Typer, run, connect, console: Console) -> None:
    """Add the router's commands to the CLI (starters/cli.py owns `run` and `connect`)."""

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
            request_id=request_id or new_request_id(),
            text=words,
            goal_id=goal,
            new=new,
            queue=queue,
            pick=picked,
            card=carded,
            workspace=str(workspace.expanduser().resolve()),
        )

        async def _say() -> None:
            client = await connect()
            user = settings.user()
            try:
                routing = await router_client.say(client, user, message, profile)
            except router_client.SayRefused as err:
                raise ValueError(f"the router refused the message: {err}") from None
            if routing is None:
                show(
                    console,
                    f"accepted as {escape(message.request_id)}; no worker decided in time, so it is routed when "
                    "a worker runs (a retry with the same --request-id is not routed twice): see "
                    "`perdure inbox --router`",
                )
                return
            print_routing(console, routing)
            if routing.status == "failed":
                raise typer.Exit(1)

        run(_say)


def show_router(run, connect, console: Console) -> None:
    async def _show() -> None:
        client = await connect()
        user = settings.user()
        try:
            view = await router_client.view(client, user)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise ValueError(f"{user} has no router yet: it starts with the first `perdure say`") from None
            raise ValueError(
                f"no worker answered the router's query ({err.message}); start one: perdure worker"
            ) from None
        print_router(console, view)

    run(_show)


def print_routing(console: Console, routing: Routing) -> None:
    """One decision, as `perdure say` prints it."""
    by = f"by {routing.by}" + (f", confidence {routing.confidence:.2f}" if routing.confidence is not None else "")
    reason = f": {escape(routing.reason)}" if routing.reason else ""
    if routing.status == "asked":
        show(console, f"[yellow]?[/yellow] {escape(routing.reply or '')}")
        show(console, f"  ({escape(routing.reason)})")
        show(
            console,
            f"  pick with: perdure say --pick {routing.request_id}=CHOICE  (one of: {', '.join(routing.choices)})",
        )
    elif routing.status == "failed":
        show(console, f"[red]not routed[/red]: {escape(routing.reason)}")
    elif routing.action == "answered":
        show(console, escape(routing.reply or ""))
        show(console, f"[dim](answered by the router {by}{reason})[/dim]")
    else:
        show(console, f"→ {routing.action} [bold]{escape(routing.goal_id or '')}[/bold] ({by}){reason}")
        if routing.reply:
            show(console, escape(routing.reply))


def print_router(console: Console, view: RouterView) -> None:
    show(
        console,
        f"router of {escape(view.user)} · {len(view.messages)} recent message(s) · {view.pending} waiting · "
        f"runs {view.runs} · tokens {view.tokens} · ${view.cost_usd:.4f}",
    )
    table = Table("at", "request id", "message", "decision", "by", "why", "weighed")
    for m in view.messages:
        decision = m.status if m.status in ("pending", "asked", "failed") else f"{m.action} {m.goal_id or ''}".strip()
        by = (m.by or "") + (f" {m.confidence:.2f}" if m.confidence is not None else "")
        table.add_row(
            f"{m.at:%m-%d %H:%M:%S}",
            Text(m.request_id),
            Text(m.text[:60]),
            Text(decision),
            Text(by),
            Text(m.reason[:80]),
            Text(", ".join(m.candidates[:5])),
        )
    show(console, table if view.messages else "no messages yet")
    for m in view.asked:
        show(console, f"[yellow]waiting for your pick[/yellow] {escape(m.request_id)}: {escape(m.reply or '')}")
    for refusal in view.refusals:
        show(console, f"[red]refused[/red] {refusal.at:%m-%d %H:%M:%S}: {escape(refusal.reason)}")
    print_cards(console, view)


def print_cards(console: Console, view: RouterView) -> None:
    """The goals' memory cards waiting for an answer, and the ones answered lately."""
    for card in view.cards:
        show(
            console,
            f"[yellow]memory card[/yellow] of goal [bold]{escape(card.goal_id)}[/bold] ({escape(card.goal[:80])}), "
            f"workspace {escape(card.workspace)}: {len(card.candidates)} verified conclusion(s) to keep across goals "
            f"(offered {card.offered_at:%m-%d %H:%M}, dropped unanswered on {card.expires_at:%Y-%m-%d})",
        )
        for line in offer_listing(card):
            show(console, f"  {escape(line)}")
        show(
            console,
            f"  keep with: perdure say --card {escape(card.goal_id)}:{CARD_QUESTION}={'|'.join(card.choices)}"
            '  (choose: the numbers as the text, e.g. "1 3", and "global" for everywhere)',
        )
    for kept in view.kept:
        show(console, f"[dim]memory card of {escape(kept.goal_id)} answered {escape(kept.answer)}: {_kept(kept)}[/dim]")


def _kept(kept: KeptMemories) -> str:
    if not kept.promoted:
        return "nothing kept"
    where = f"project {kept.workspace}" if kept.scope == "project" else "everywhere"
    return f"kept {len(kept.promoted)} for {escape(where)} ({', '.join(kept.promoted.values())})"
