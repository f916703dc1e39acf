"""How goals look in a terminal: status tables, live progress, receipts, reports.

Presentation only; every fact comes from the server or the goal's query.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from temporalio.client import WorkflowExecutionDescription
from temporalio.service import RPCError

from perdure.runtime import settings
from perdure.starters import render_abort
from perdure.starters.client import PerdureClient
from perdure.starters.client.client_errors import EndedWithoutResult
from perdure.starters.client.goal_forks import GoalDiff, StepSide
from perdure.starters.client.goal_reads import PendingActivity, is_open, read_report
from perdure.starters.client.message_delivery import InboxResult
from perdure.workers.deployment import Pinning
from perdure.workflows.goal.contracts.goal_contracts import (
    AHEAD_INTRO,
    ForkOrigin,
    GoalResult,
    OwnCalls,
    ProgressSnapshot,
    QuestionView,
)
from perdure.workflows.goal.contracts.messages import InboxView, Receipt
from perdure.workflows.goal.rules.own_calls import own_call_lines, tool_spend
from perdure.workflows.goal.rules.question_deadline_rules import deadline_line
from perdure.workflows.shared import search_attributes as sa
from perdure.workflows.shared.durations import duration_text
from perdure.workflows.shared.statuses import IN_FLIGHT

STATUS_STYLE = {
    "succeeded": "green",
    "running": "cyan",
    "failed": "red",
    "abandoned": "yellow",
    "pending": "dim",
    "offline": "yellow",
}


def say(console: Console, *objects, **options) -> None:
    """Print with rich markup for perdure's own styling only: emoji codes and automatic
    highlighting stay off, so a model's or a user's `root:x:0:0` or `[1]` prints as written
    (their text goes in escaped, or as a rich Text, which takes no markup)."""
    console.print(*objects, emoji=False, highlight=False, **options)


# C0 controls but tab and newline, DEL and C1 controls: a terminal acts on them (an escape
# sequence can move the cursor, retitle the window, hide text), so tool output shows them as codes.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text from a tool, a model or a file, safe for a terminal: control characters as \\xNN."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def status_name(desc) -> str:
    return desc.status.name.title() if desc.status is not None else "Unknown"


def ran_as(placements: dict[str, str]) -> str:
    """'local' / 'activity' per tool, from the node's placement reasons."""
    return ", ".join(f"{tool}: {why.partition(':')[0].removesuffix(' activity')}" for tool, why in placements.items())


def node_note(node, hosts: list[str] = ()) -> str:
    """The output/error column: what a waiting node waits for (a device, or a host in `hosts`),
    else its error or output."""
    if node.waiting_for_device:
        return f"waiting for {machine(node.waiting_for_device, hosts)}"
    if getattr(node, "child", None) and not (node.error or node.preview):
        return f"runs as goal {node.child}"
    return node.error or node.preview


def machine(name: str, hosts: list[str] = ()) -> str:
    """`host h1` for a host holding the goal's workspace, else `device NAME`."""
    return f"{'host' if name in hosts else 'device'} {name}"


def print_children(
    console: Console, children: list[tuple[str, str, ProgressSnapshot | None]], parent: ProgressSnapshot
) -> None:
    """The subgoals under their steps: (step, child goal id, its snapshot or None when it
    cannot be read); then the parent's spend with what its running children have spent so
    far (a child's spend is charged to its parent when it settles)."""
    settled = {n.name for n in parent.nodes if n.status not in IN_FLIGHT}
    tokens, cost = parent.tokens, parent.cost_usd
    for step, child, snap in children:
        if snap is not None and step not in settled:
            tokens, cost = tokens + snap.tokens, cost + snap.cost_usd
        if snap is None:
            say(console, f"  └ {escape(step)} → {escape(child)} (cannot be read: closed or no worker)")
            continue
        say(
            console,
            f"  └ {escape(step)} → {escape(child)} · phase {snap.phase} · {snap.percent_done}% · "
            f"tokens {snap.tokens} · ${snap.cost_usd:.4f}",
        )
    if (tokens, cost) != (parent.tokens, parent.cost_usd) or any(s not in settled for s, _, _ in children):
        say(console, f"with running subgoals: tokens {tokens} · ${cost:.4f}")


def print_pinning(console: Console, pinned: Pinning | None, snap: ProgressSnapshot | None) -> None:
    """Which worker version runs the goal's current run, when it is not the current version:
    only a worker of that build takes its tasks until its next run boundary."""
    if pinned is None or pinned.build_id == pinned.current:
        return
    current = pinned.current or "none"
    if snap is None:
        say(
            console,
            f"[yellow]the goal's run is pinned to build {escape(pinned.build_id)} of deployment "
            f"{escape(pinned.deployment)} (current: {escape(current)}): it waits for a worker of build "
            f"{escape(pinned.build_id)}[/yellow] (start one from that code: `perdure worker --build-id "
            f"{escape(pinned.build_id)}`)",
        )
        return
    say(
        console,
        f"runs on build {escape(pinned.build_id)} (current: {escape(current)}); it moves to the current build "
        "at its next run boundary",
    )


def print_status(
    console: Console, desc: WorkflowExecutionDescription, snap: ProgressSnapshot | None, why: bool = False
) -> None:
    say(console, f"[bold]{desc.id}[/bold] · {status_name(desc)} · started {desc.start_time:%Y-%m-%d %H:%M:%S}")
    say(console, f"UI: {settings.goal_ui_link(desc.id)} · steps: {settings.goal_ui_link(desc.id, desc.run_id)}")
    if snap is None:
        return
    say(
        console,
        f"phase [bold]{snap.phase}[/bold] · {snap.percent_done}% · plan v{snap.plan_version} · run {snap.runs} · "
        f"tokens {snap.tokens} · ${snap.cost_usd:.4f}{tool_spend(snap.tool_cost_usd)} · "
        f"{snap.model_calls} model / {snap.tool_calls} tool calls",
    )
    if snap.forked_from is not None:
        say(console, escape(fork_line(snap.forked_from)))
    print_own_calls(console, snap.own_calls)
    if snap.failed_attempts:
        estimated = f", ${snap.estimated_cost_usd:.4f} of the cost estimated" if snap.estimated_cost_usd else ""
        say(console, f"[dim]{snap.failed_attempts} failed model attempt(s) charged{estimated}[/dim]")
    if snap.lost_attempts:
        say(console, f"[dim]{snap.lost_attempts} attempt(s) lost to worker deaths, retried[/dim]")
    for dimension, fraction in snap.budget.items():
        label = BUDGET_LABELS.get(dimension, dimension)
        say(console, f"budget {label:<13} {budget_bar(fraction)} {fraction:>4.0%}{_budget_note(dimension, snap)}")
    if snap.degraded:
        say(console, "[yellow]running degraded: past the soft budget gate[/yellow]")
    if snap.eta:
        say(console, f"ETA: {snap.eta}")
    table = Table("step", "kind", "status", "key", "ran as", "output / error")
    # Work of earlier plan versions that the current plan left out, after the current steps.
    for node in [*snap.nodes, *snap.earlier]:
        style = STATUS_STYLE.get(node.status, "")
        # A wait step holds its timer as a parked node: it is waiting for its time, not for a person.
        status = "waiting" if node.kind == "wait" and node.status == "parked" else node.status
        table.add_row(
            Text(node.name if node.plan_version is None else f"{node.name} (plan v{node.plan_version})"),
            node.kind,
            f"[{style}]{status}[/{style}]" if style else status,
            (node.key or "").removeprefix("node:")[:12],
            Text(ran_as(node.placements)),
            Text(printable(node_note(node, snap.hosts))),
        )
    say(console, table)
    if snap.unlisted:
        counts = " · ".join(f"{status} {n}" for status, n in sorted(snap.counts.items()))
        say(console, f"[dim]{snap.unlisted} more steps not listed (in flight, next and latest are): {counts}[/dim]")
    for node_name, device in sorted(snap.waiting_for_devices.items()):
        seen = snap.devices.get(device, "not heard of yet")
        waited = escape(machine(device, snap.hosts))
        say(console, f"[yellow]waiting for {waited}:[/yellow] {escape(node_name)} ({escape(seen)})")
    if why:
        for node in snap.nodes:
            for tool, reason in node.placements.items():
                say(console, f"[dim]{escape(node.name)} · {tool}[/dim] {escape(reason)}")
            for decision in node.held_back:
                say(console, f"[dim]{escape(node.name)} · order[/dim] {escape(decision)}")
            if node.read_at is not None:
                age = duration_text((datetime.now(UTC) - node.read_at).total_seconds(), days=True)
                say(console, f"[dim]{escape(node.name)} · read[/dim] {age} ago (checked again after a long wait)")
    stale = [n for n in snap.nodes if n.read_at is not None and n.status == "succeeded"]
    if stale and not why:
        oldest = min(stale, key=lambda n: n.read_at)
        age = duration_text((datetime.now(UTC) - oldest.read_at).total_seconds(), days=True)
        reads = f"{len(stale)} finished steps read files"
        say(console, f"[dim]oldest read: {escape(oldest.name)}, {age} ago ({reads})[/dim]")
    if snap.parked:
        say(console, f"[yellow]parked:[/yellow] {escape(snap.pause_reason or '')}")
    if snap.abort is not None:
        render_abort.print_abort(console, snap.abort)
    if snap.premises:
        say(console, "premises: " + escape(", ".join(f"{k}={v}" for k, v in sorted(snap.premises.items()))))
    print_questions(console, snap)
    for conclusion in snap.conclusions:
        say(console, f"[dim]concluded[/dim] {escape(conclusion)}")
    for entry in snap.gate_log[-5:]:
        say(console, f"[dim]gate[/dim] {escape(entry)}")
    if snap.failure:
        say(console, f"[red]failure:[/red] {escape(snap.failure)}")


def print_own_calls(console: Console, own_calls: dict[str, OwnCalls]) -> None:
    """perdure's own model calls (planning, drift checks, ...), a line per kind: in the totals above."""
    for line in own_call_lines(own_calls):
        say(console, Text(f"perdure's own calls · {line}", style="dim"))


def fork_line(origin: ForkOrigin) -> str:
    changes = ", ".join(f"{k}={v}" for k, v in origin.changes.items()) or "none"
    return f"forked from {origin.goal_id} at step {origin.node}: {origin.why} · changes: {changes}"


# What each budget dimension is called where a person reads it.
BUDGET_LABELS = {"tokens": "tokens", "cost_usd": "cost", "wall_seconds": "active time", "calendar_seconds": "deadline"}


def _budget_note(dimension: str, snap: ProgressSnapshot) -> str:
    """The time budgets say what they count: active time so far, and when the deadline is."""
    if dimension == "wall_seconds":
        return f" · {duration_text(snap.active_seconds)} active (parked, waiting for a person or a device not counted)"
    if dimension == "calendar_seconds" and snap.deadline is not None:
        return f" · due {snap.deadline.astimezone(UTC):%Y-%m-%d %H:%M} UTC (parks included)"
    return ""


def budget_bar(fraction: float, width: int = 20) -> str:
    filled = min(width, round(fraction * width))
    colour = "red" if fraction >= 1 else "yellow" if fraction >= 0.7 else "green"
    return f"[{colour}]{'█' * filled}[/{colour}]{'░' * (width - filled)}"


def print_activities(console: Console, pending: list[PendingActivity]) -> None:
    """What each running activity is for and what it last reported (its heartbeat)."""
    for activity in pending:
        details = f" · {printable(activity.heartbeat[:160])}" if activity.heartbeat else ""
        failure = f" · last failure: {printable(activity.failure)}" if activity.failure else ""
        line = f"{printable(activity.summary)} · attempt {activity.attempt}{details}{failure}"
        say(console, Text.assemble(("activity ", "dim"), line))


def print_questions(console: Console, snap: ProgressSnapshot) -> None:
    for q in snap.questions:
        console.rule(f"[bold]needs you[/bold] · {q.id}: {escape(q.title)}")
        say(console, f"done: {escape(q.done)}")
        if q.ahead:
            # An approvals-ahead card: a line per step (its text says the same in one line).
            say(console, f"stuck: {escape(AHEAD_INTRO)}:")
            for entry in q.ahead:
                say(console, f"  · {escape(entry.line())}")
        else:
            say(console, f"stuck: {escape(q.stuck)}")
        for option in q.options:
            cost = f" ({option['cost']})" if option.get("cost") else ""
            say(console, f"  [bold]{option['id']}[/bold]: {escape(option['label'] + cost)}")
        say(console, f"recommended: {escape(q.recommendation)}")
        print_deadline(console, q)
        say(console, f"answer with: perdure answer {snap.goal_id} {q.id} <option>")
        if q.ahead:
            say(console, f"  or name steps: perdure answer {snap.goal_id} {q.id} approve_some --steps STEP,STEP")
    for line in snap.expired_questions:
        say(console, f"[yellow]expired[/yellow] {escape(line)}")


def print_deadline(console: Console, question: QuestionView) -> None:
    """When a question expires and what it decides then; a reminder sent is said loud."""
    line = deadline_line(question, datetime.now(UTC))
    colour = "yellow" if question.reminded_at or question.expired_at else "dim"
    label = "reminder" if question.reminded_at and not question.expired_at else "deadline"
    say(console, f"[{colour}]{label}:[/{colour}] {escape(line)}")


def print_receipt(console: Console, receipt: Receipt) -> None:
    colour = {"applied": "green", "pending": "cyan", "rejected": "red"}[receipt.status]
    say(console, f"{receipt.kind} {escape(receipt.request_id)}: [{colour}]{receipt.status}[/{colour}]")
    if receipt.note:
        say(console, escape(receipt.note))
    for key in ("void", "kept", "to_confirm"):
        if key in receipt.detail:
            say(console, f"  {key}: {escape(', '.join(receipt.detail[key])) or '—'}")


def print_inbox(console: Console, view: InboxView | InboxResult) -> None:
    table = Table("request id", "kind", "status", "note")
    for entry in view.entries:
        table.add_row(Text(entry.request_id), entry.kind, entry.status, Text(entry.note or ""))
    say(console, table if view.entries else "no messages")
    for refusal in view.refused:
        say(console, f"[red]refused[/red] {escape(refusal.request_id or '(no id)')}: {escape(refusal.reason)}")


def print_admitted(console: Console, messages: list) -> None:
    """What the server holds for a goal no worker answers for: the messages in its history, unjudged."""
    if not messages:
        say(console, "the server holds no message for this goal")
        return
    say(console, f"the server holds {len(messages)} message(s), judged in this order once a worker runs the goal:")
    table = Table("request id", "kind", "sent as", "at")
    for message in messages:
        at = f"{message.at:%Y-%m-%d %H:%M:%S}" if message.at else ""
        table.add_row(Text(message.request_id), Text(message.kind), message.via, at)
    say(console, table)


def print_refusals(console: Console, goal_id: str, snapshot: ProgressSnapshot) -> None:
    """The latest messages the goal refused at the door, for `perdure status` (the snapshot
    carries them: one query of a busy goal, not two)."""
    for refusal in snapshot.refused:
        say(console, f"[red]refused[/red] {escape(refusal.request_id or '(no id)')}: {escape(refusal.reason)}")
    if snapshot.refused_count > len(snapshot.refused):
        earlier = snapshot.refused_count - len(snapshot.refused)
        say(console, f"[dim]{earlier} earlier refusal(s): perdure inbox {goal_id}[/dim]")


def stuck_advice(goal_id: str) -> str:
    return (
        "what you can do: fix what the message names and restart the worker (`perdure worker`); if it names "
        "newer code, run a worker with that perdure version. The goal then carries on from where it stopped, "
        "with every message sent meanwhile. To end it now, without a report: "
        f"temporal workflow terminate --workflow-id {goal_id}"
    )


def print_stuck(console: Console, goal_id: str, failure: str) -> None:
    """A goal whose workflow task keeps failing: what the worker said, and what to do."""
    say(
        console,
        "[red]stuck:[/red] every workflow task of this goal fails, so it decides nothing and answers no query. "
        "The worker said:",
    )
    say(console, f"  {escape(failure)}")
    say(console, escape(stuck_advice(goal_id)))


def print_goal_list(
    console: Console, executions: list, outcomes: dict[str, str] | None = None, filtered: bool = False
) -> None:
    """One row per goal; a closed goal's outcome beside its status, so a partial or aborted
    goal does not read as a good one."""
    outcomes = outcomes or {}
    table = Table("goal", "status", "outcome", "phase", "done", "cost", "started")
    for wf in executions:
        attrs = wf.typed_search_attributes
        percent = attrs.get(sa.PERCENT_DONE)
        cost = attrs.get(sa.COST_USD)
        outcome = outcomes.get(wf.id, "")
        style = OUTCOME_STYLE.get(outcome, "")
        table.add_row(
            Text(wf.id),
            status_name(wf),
            Text(outcome, style=style),
            attrs.get(sa.GOAL_STATUS) or "",
            f"{percent}%" if percent is not None else "",
            f"${cost:.4f}" if cost is not None else "",
            f"{wf.start_time:%Y-%m-%d %H:%M:%S}",
        )
    if executions:
        say(console, table)
        say(console, f"[dim]in the UI, goals only: {settings.goals_ui_link()}[/dim]")
    else:
        say(console, "no goals match these filters" if filtered else "no goals yet")


OUTCOME_STYLE = {"succeeded": "green", "partial": "yellow", "failed": "red", "aborted": "red"}


def print_result(console: Console, result: GoalResult) -> None:
    """Every outcome the goal can return, with its reason, the unfinished list and the report."""
    print_ending(console, result)
    # Imported here: markdown-it and its renderers are ~4 MB that `perdure worker`, which
    # shares this module's imports, never uses.
    from rich.markdown import Markdown

    say(console, Markdown(read_report(result)))


def print_published(console: Console, goal_id: str, ended: GoalResult | EndedWithoutResult) -> None:
    """`perdure status` of a finished goal no worker answered for: how it ended, as its result
    (in the close event) says; no worker is needed to read it."""
    if isinstance(ended, EndedWithoutResult):
        print_no_result(console, goal_id, ended)
        return
    print_ending(console, ended)
    if ended.failed_steps:
        say(console, Text(f"failed steps: {', '.join(ended.failed_steps)}"))
    say(console, f"[dim]the report: perdure result {escape(goal_id)}[/dim]")


def print_ending(console: Console, result: GoalResult) -> None:
    colour = OUTCOME_STYLE.get(result.outcome, "")
    say(
        console,
        Text.assemble(
            "outcome: ",
            (result.outcome, colour),
            f" · tokens {result.tokens} · ${result.cost_usd:.4f}{tool_spend(result.tool_cost_usd)}",
        ),
    )
    print_own_calls(console, result.own_calls)
    if result.failure:
        say(console, Text.assemble(("reason: ", "red"), result.failure))
    if result.unfinished:
        say(console, Text(f"unfinished ({len(result.unfinished)}):", style="bold"))
        for line in result.unfinished:
            say(console, Text(f"  {line}"))


def print_diff(console: Console, diff: GoalDiff) -> None:
    """`perdure diff`: a row per step, what differs in red; a reused step is the same work,
    its goal paid nothing for it."""
    for label, goal, origin in (("A", diff.a, diff.a_forked_from), ("B", diff.b, diff.b_forked_from)):
        said = f" ({fork_line(origin)})" if origin is not None else ""
        say(console, Text(f"{label}: {goal}{said}"))

    def side(step: StepSide | None) -> str:
        if step is None:
            return "—"
        style = STATUS_STYLE.get(step.status, "")
        status = f"[{style}]{step.status}[/{style}]" if style else step.status
        return f"{status} · {'reused' if step.reused else 'run'}"

    def cost(step: StepSide | None) -> str:
        return "—" if step is None else f"{step.tokens} · ${step.cost_usd:.4f}"

    table = Table("step", "A", "B", "output", "A tokens · cost", "B tokens · cost", "Δ cost", "differs")
    for step in diff.steps:
        if step.a is None or step.b is None:
            output = "—"
        else:
            output = "same" if step.a.output == step.b.output else "[red]differs[/red]"
        table.add_row(
            Text(step.name),
            side(step.a),
            side(step.b),
            output,
            cost(step.a),
            cost(step.b),
            _usd_delta(step.cost_delta_usd)
            + (" (reused)" if step.a and step.b and (step.a.reused or step.b.reused) else ""),
            f"[red]{escape(', '.join(step.differs))}[/red]" if step.differs else "[green]same[/green]",
        )
    say(console, table)
    tokens, usd = diff.tokens, diff.cost_usd
    say(
        console,
        f"total: A {tokens.a} tokens · ${usd.a:.4f} · B {tokens.b} tokens · ${usd.b:.4f} · "
        f"Δ {tokens.delta:+} tokens · {_usd_delta(usd.delta)}",
    )
    say(console, f"same ({len(diff.same)}): {escape(', '.join(diff.same) or '—')}")
    say(console, f"differ ({len(diff.differing)}): {escape(', '.join(diff.differing) or '—')}")


def _usd_delta(delta: float) -> str:
    return f"{'-' if delta < 0 else '+'}${abs(delta):.4f}"


def print_no_result(console: Console, goal_id: str, ended: EndedWithoutResult) -> None:
    """A goal that ended with no report: terminated, timed out, cancelled, or failed outside the goal."""
    say(console, Text.assemble(("goal ended without a result: ", "red"), str(ended)))
    say(
        console,
        Text(f"what the server holds: perdure status {goal_id}; the history: perdure history {goal_id} --out F"),
    )


async def watch(client: PerdureClient, goal_id: str, console: Console, poll_s: float = 0.5) -> GoalResult | None:
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("starting", total=100)
        while True:
            desc = await client.describe(goal_id)
            if not is_open(desc):
                # The last frame says how it ended, not the phase seen one poll before.
                try:
                    final = (await client.progress(goal_id, timeout_s=3)).phase
                except RPCError:
                    final = status_name(desc).lower()
                bar.update(task, completed=100, description=final)
                break
            try:
                snap = await client.progress(goal_id, timeout_s=3)
                running = ", ".join(snap.running) or "—"
                extras = [f"{k} {v:.0%}" for k, v in snap.budget.items()]
                if snap.eta:
                    extras.append(f"ETA {snap.eta}")
                if snap.questions:
                    extras.append(f"needs you: {len(snap.questions)} question(s)")
                tail = f" · {' · '.join(extras)}" if extras else ""
                bar.update(task, completed=snap.percent_done, description=f"{snap.phase} · running: {running}{tail}")
            except RPCError:
                failure = await client.stuck(desc)
                waiting = f"stuck: {failure[:100]} (perdure status {goal_id})" if failure else "waiting for a worker"
                bar.update(task, description=escape(waiting))
            await asyncio.sleep(poll_s)
    try:
        result = await client.result(goal_id)
    except EndedWithoutResult as ended:
        print_no_result(console, goal_id, ended)
        return None
    print_result(console, result)
    return result
