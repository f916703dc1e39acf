"""How the user's router looks in a terminal: a routing decision as `perdure say` prints
it, and the router's messages, decisions and memory cards as `perdure inbox --router`
prints them. Rendering only; the router is asked through the client.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from perdure.starters.render import say as show
from perdure.workflows.goal.rules.memory_rules import CARD_QUESTION, offer_listing
from perdure.workflows.router.router_contracts import KeptMemories, RouterView, Routing


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
    """The goals' memory cards waiting for an answer, the ones answered lately, and the goals'
    questions whose deadline is near (their reminders)."""
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
    for reminder in view.reminders:
        show(
            console,
            f"[yellow]reminder[/yellow] goal [bold]{escape(reminder.goal_id)}[/bold] asks "
            f"{escape(reminder.question_id)}: {escape(reminder.title)} · unanswered, it expires "
            f"{reminder.deadline_at:%Y-%m-%d %H:%M:%S} UTC, then: {escape(reminder.on_expiry)}",
        )
        show(
            console,
            f"  answer with: perdure say --card {escape(reminder.goal_id)}:{escape(reminder.question_id)}="
            f"{'|'.join(reminder.options)}",
        )


def _kept(kept: KeptMemories) -> str:
    if not kept.promoted:
        return "nothing kept"
    where = f"project {kept.workspace}" if kept.scope == "project" else "everywhere"
    return f"kept {len(kept.promoted)} for {escape(where)} ({', '.join(kept.promoted.values())})"
