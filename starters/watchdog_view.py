"""The client side of the watchdog's schedule and how its findings and rules look in a
terminal (the `perdure watchdog …` commands, starters/cli/watchdog_commands.py, use them).

Status, pause, resume and run-now talk to the schedule; `report` reads the
watchdog's memory file in this machine's PERDURE_HOME (where the workers keep
it), and falls back to the result of the schedule's last run when there is no
file here. Holds no logic of the watchdog itself.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from temporalio.client import (
    Client,
    ScheduleActionExecutionStartWorkflow,
    ScheduleDescription,
    ScheduleOverlapPolicy,
)
from temporalio.service import RPCError, RPCStatusCode

from perdure.activities.watchdog.watchdog_files import watchdog_files
from perdure.activities.watchdog.watchdog_memory import (
    RuleError,
    change_rules,
    parse_assignment,
    parse_memory,
    parse_scope,
)
from perdure.runtime import settings
from perdure.workers.watchdog_schedule import schedule_id
from perdure.workflows.watchdog.watchdog_contracts import (
    Finding,
    Incident,
    RuleBook,
    RuleChange,
    WatchdogMemory,
    WatchdogResult,
    WatchdogRules,
)
from perdure.workflows.watchdog.watchdog_rules import scope_rank, span

KIND_STYLE = {
    "healthy": "green",
    "parked": "dim",
    "waiting_device": "dim",
    "parked_past_expiry": "yellow",
    "needs_human": "yellow",
    "stalled": "yellow",
    "looping": "red",
    "step_failed": "red",
    "over_budget": "red",
    "failing": "red",
    "unreachable": "red",
    "unresponsive": "red",
    "spinning": "yellow",
    "drifting": "yellow",
    "stuck_on_person": "yellow",
    "judged_healthy": "green",
    "unjudged": "dim",
}


class WatchdogMissing(LookupError):
    """No schedule for this task queue: no worker has started with the watchdog on."""


async def describe(client: Client, task_queue: str) -> ScheduleDescription:
    try:
        return await client.get_schedule_handle(schedule_id(task_queue)).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise WatchdogMissing(
                f"no watchdog schedule '{schedule_id(task_queue)}' for task queue {task_queue}; "
                "a worker creates it when it starts (`perdure worker`), unless PERDURE_WATCHDOG_INTERVAL_S=0"
            ) from None
        raise


async def set_paused(client: Client, task_queue: str, paused: bool, note: str) -> None:
    """Pause or resume the schedule; WatchdogMissing when there is none to change."""
    await describe(client, task_queue)
    handle = client.get_schedule_handle(schedule_id(task_queue))
    await (handle.pause(note=note) if paused else handle.unpause(note=note))


def _run_ids(desc: ScheduleDescription) -> set[str]:
    runs = [a.action for a in desc.info.recent_actions] + list(desc.info.running_actions)
    return {r.workflow_id for r in runs if isinstance(r, ScheduleActionExecutionStartWorkflow)}


async def run_now(client: Client, task_queue: str, appear_s: float = 10) -> str | None:
    """Trigger a run and return its workflow id (None if it did not show up in time).
    BUFFER_ONE: a run already going finishes first; this one follows it."""
    before = _run_ids(await describe(client, task_queue))
    handle = client.get_schedule_handle(schedule_id(task_queue))
    await handle.trigger(overlap=ScheduleOverlapPolicy.BUFFER_ONE)
    deadline = time.monotonic() + appear_s
    while time.monotonic() < deadline:
        new = _run_ids(await handle.describe()) - before
        if new:
            return sorted(new)[-1]
        await asyncio.sleep(0.2)
    return None


async def run_result(client: Client, workflow_id: str, timeout_s: float) -> WatchdogResult:
    handle = client.get_workflow_handle(workflow_id, result_type=WatchdogResult)
    return await asyncio.wait_for(handle.result(), timeout_s)


async def last_run_result(client: Client, task_queue: str) -> tuple[str, WatchdogResult] | None:
    """The newest finished run's result, for machines without the memory file."""
    desc = await describe(client, task_queue)
    for action in reversed(desc.info.recent_actions):
        run = action.action
        if not isinstance(run, ScheduleActionExecutionStartWorkflow):
            continue
        handle = client.get_workflow_handle(run.workflow_id, result_type=WatchdogResult)
        try:
            if (await handle.describe()).close_time is None:
                continue
            return run.workflow_id, await asyncio.wait_for(handle.result(), 5)
        except Exception:  # an expired, failed or unreadable run: try an older one
            continue
    return None


def read_memory(task_queue: str) -> tuple[WatchdogMemory | None, str]:
    """The watchdog's memory where the workers keep it (beside an object store's artifacts,
    else under PERDURE_HOME), or None when there is none; and where that is."""
    kept = watchdog_files().memory(task_queue)
    raw = kept.read()
    return (None if raw is None else parse_memory(raw, kept.where)[0]), kept.where


# --- rendering ----------------------------------------------------------------------


def _ago(moment: datetime | None) -> str:
    if moment is None:
        return "never"
    return f"{span(max(0.0, (datetime.now(UTC) - moment).total_seconds()))} ago"


def print_status(console: Console, desc: ScheduleDescription, task_queue: str) -> None:
    schedule, info = desc.schedule, desc.info
    every = ", ".join(span(i.every.total_seconds()) for i in schedule.spec.intervals) or "no interval"
    state = "[yellow]paused[/yellow]" if schedule.state.paused else "[green]active[/green]"
    console.print(f"[bold]{desc.id}[/bold] · {state} · every {every} · watches task queue {escape(task_queue)}")
    if schedule.state.note:
        console.print(f"note: {escape(schedule.state.note)}")
    console.print(
        f"runs: {info.num_actions} · skipped (overlap): {info.num_actions_skipped_overlap} · "
        f"created {info.created_at:%Y-%m-%d %H:%M:%S} UTC"
    )
    for running in info.running_actions:
        if isinstance(running, ScheduleActionExecutionStartWorkflow):
            console.print(f"running now: {running.workflow_id}")
    if info.recent_actions:
        last = info.recent_actions[-1]
        wid = last.action.workflow_id if isinstance(last.action, ScheduleActionExecutionStartWorkflow) else "?"
        console.print(f"last run: {wid} · started {_ago(last.started_at)}")
    if info.next_action_times and not schedule.state.paused:
        console.print(f"next run: {info.next_action_times[0]:%Y-%m-%d %H:%M:%S} UTC")
    console.print(f"UI: {settings.ui_base()}/namespaces/{settings.namespace()}/schedules/{desc.id}")


def _kind(kind: str) -> str:
    style = KIND_STYLE.get(kind, "")
    label = kind.replace("_", " ")
    return f"[{style}]{label}[/{style}]" if style else label


def print_incidents(console: Console, incidents: list[Incident], title: str) -> None:
    if not incidents:
        return
    table = Table("incident", "opened", "checks", "detail" if title == "open" else "resolution", title=title)
    for incident in incidents:
        if incident.resolved_at is None:
            last = incident.detail
        else:
            last = f"{incident.resolution} ({_ago(incident.resolved_at)})"
        table.add_row(
            escape(incident.id), f"{incident.opened_at:%Y-%m-%d %H:%M:%S}", str(incident.checks), escape(last)
        )
    console.print(table)


def print_findings(console: Console, findings: list[Finding], show_healthy: bool, goals: int) -> None:
    shown = [f for f in findings if show_healthy or f.kind != "healthy"]
    if not shown:
        console.print("[green]every goal is healthy[/green]" if goals else "no open goals")
        return
    table = Table("goal", "finding", "detail")
    for finding in shown:
        table.add_row(escape(finding.goal_id), _kind(finding.kind), escape(finding.detail))
    console.print(table)


def print_result(console: Console, workflow_id: str, result: WatchdogResult) -> None:
    counts = " · ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in result.counts.items()) or "no goals"
    console.print(f"[bold]{workflow_id}[/bold] · {result.goals} goal(s) · scan {result.scan_seconds:.2f} s · {counts}")
    for rid in result.sent:
        console.print(f"sent {escape(rid)}")
    for failure in result.failed:
        console.print(f"[red]not sent[/red] {escape(failure)}")
    print_incidents(console, result.open_incidents, "open")
    print_incidents(console, result.resolved_incidents, "resolved by this run")
    print_findings(console, result.findings, show_healthy=False, goals=result.goals)


def print_report(console: Console, memory: WatchdogMemory, path: str, show_healthy: bool) -> None:
    run = memory.last_run
    if run is None:
        console.print(f"the watchdog has not finished a run yet ({escape(path)})")
        return
    counts = " · ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in run.counts.items()) or "no goals"
    console.print(f"last run [bold]{run.run_id}[/bold] {_ago(run.at)} · {run.goals} goal(s) · {counts}")
    console.print(f"[dim]memory: {escape(path)}[/dim]")
    opened = memory.open_incidents()
    console.print(f"open incidents: {len(opened)}" if opened else "[green]no open incidents[/green]")
    print_incidents(console, opened, "open")
    resolved = [i for i in memory.incidents if i.resolved_at is not None][-5:]
    print_incidents(console, resolved, "recently resolved")
    findings = [f for goal in memory.goals.values() for f in goal.findings]
    print_findings(console, findings, show_healthy, goals=len(memory.goals))
    if memory.judge_note:
        console.print(f"[yellow]rules only:[/yellow] {escape(memory.judge_note)}")
    if memory.verdicts:
        table = Table("goal", "episode", "verdict", "confidence", "reason", "when", title="model verdicts")
        for verdict in list(memory.verdicts.values())[-20:]:
            label = verdict.verdict.replace("_", " ") if verdict.verdict else "[red]malformed: no action[/red]"
            reason = verdict.reason if verdict.verdict else verdict.malformed or ""
            table.add_row(
                escape(verdict.goal_id),
                verdict.episode,
                label,
                f"{verdict.confidence:.0%}",
                escape(reason),
                _ago(verdict.at),
            )
        console.print(table)
        usage = " · ".join(
            f"{day}: {calls} call(s), {tokens} token(s)" for day, (calls, tokens) in memory.judge_usage.items()
        )
        if usage:
            console.print(f"[dim]watchdog model spend {usage}[/dim]")
    if memory.sent:
        table = Table("request id", "goal", "action", "sent", title="interventions sent (open goals)")
        for rid, sent in memory.sent.items():
            table.add_row(escape(rid), escape(sent.goal_id), sent.action, _ago(sent.sent_at))
        console.print(table)


# --- the rule book: `perdure watchdog set` and `perdure watchdog rules` ---------------


def set_rules(assignments: list[str], scope: str | None, user: str, now: datetime) -> tuple[str, list[RuleChange]]:
    """Validate every assignment first, then change the rule book once; RuleError on any bad one."""
    where = parse_scope(scope)
    if not assignments:
        raise RuleError("nothing to set: give rule=value, e.g. stall_after_s=3600")
    changes = [parse_assignment(a) for a in assignments]
    _, made = change_rules(watchdog_files().rules(settings.task_queue()), where, changes, user, now)
    return where, made


def rule_value(value: object) -> str:
    return "default" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def print_rules(console: Console, book: RuleBook, note: str | None, path: str, history: int) -> None:
    if note:
        console.print(f"[red]{escape(note)}[/red]")
    defaults = WatchdogRules()
    table = Table("rule", "default", *sorted(book.scopes, key=lambda s: (scope_rank(s), s)), title="watchdog rules")
    scopes = sorted(book.scopes, key=lambda s: (scope_rank(s), s))
    for rule in WatchdogRules.model_fields:
        table.add_row(
            rule, rule_value(getattr(defaults, rule)), *[rule_value(book.scopes[s].get(rule, "")) for s in scopes]
        )
    console.print(table)
    console.print(f"[dim]version {book.version} · {escape(path)}[/dim]")
    if book.history:
        changes = Table("version", "when (UTC)", "who", "for", "rule", "from", "to", title="changes")
        for change in book.history[-history:]:
            changes.add_row(
                str(change.version),
                f"{change.at:%Y-%m-%d %H:%M:%S}",
                escape(change.user),
                escape(change.scope),
                change.rule,
                rule_value(change.old),
                rule_value(change.new),
            )
        console.print(changes)
