"""`perdure watchdog …`: the client side of the watchdog's schedule, and how its
findings look in a terminal.

Status, pause, resume and run-now talk to the schedule; `report` reads the
watchdog's memory file in this machine's PERDURE_HOME (where the workers keep
it), and falls back to the result of the schedule's last run when there is no
file here. Holds no logic of the watchdog itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from datetime import UTC, datetime
from typing import Annotated, NoReturn

import typer
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

from perdure.activities.watchdog.watchdog_memory import (
    RuleError,
    change_rules,
    load_memory,
    load_rules,
    memory_path,
    parse_assignment,
    parse_scope,
    rules_path,
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
    """The memory file on this machine, or None when there is none here."""
    path = memory_path(settings.perdure_home(), task_queue)
    if not path.exists():
        return None, str(path)
    return load_memory(path)[0], str(path)


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
    _, made = change_rules(rules_path(settings.perdure_home(), settings.task_queue()), where, changes, user, now)
    return where, made


def _value(value: object) -> str:
    return "default" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def print_rules(console: Console, book: RuleBook, note: str | None, path: str, history: int) -> None:
    if note:
        console.print(f"[red]{escape(note)}[/red]")
    defaults = WatchdogRules()
    table = Table("rule", "default", *sorted(book.scopes, key=lambda s: (scope_rank(s), s)), title="watchdog rules")
    scopes = sorted(book.scopes, key=lambda s: (scope_rank(s), s))
    for rule in WatchdogRules.model_fields:
        table.add_row(rule, _value(getattr(defaults, rule)), *[_value(book.scopes[s].get(rule, "")) for s in scopes])
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
                _value(change.old),
                _value(change.new),
            )
        console.print(changes)


def add_commands(watchdog_app: typer.Typer, console: Console, err_console: Console) -> None:
    """The watchdog commands that need no server (the rule book); `perdure watchdog …`."""

    def refuse(err: Exception) -> NoReturn:
        err_console.print(f"[red]error:[/red] {escape(str(err))}", soft_wrap=True)
        raise typer.Exit(2) from None

    @watchdog_app.command("set")
    def watchdog_set(
        assignments: Annotated[list[str], typer.Argument(help="rule=value … (rule=default removes a setting)")],
        scope: Annotated[str | None, typer.Option("--for", help="tag=NAME or goal=ID (default: all goals)")] = None,
    ) -> None:
        """Change the watchdog's rules: kept across worker restarts, versioned, with who and when."""
        try:
            where, made = set_rules(assignments, scope, settings.user(), datetime.now(UTC))
        except (RuleError, OSError) as err:
            refuse(err)
        if not made:
            console.print(f"unchanged: {where} already has {', '.join(assignments)}")
        for change in made:
            console.print(
                f"v{change.version} · {change.scope} · {change.rule}: {_value(change.old)} -> {_value(change.new)}"
                f" · by {escape(change.user)}"
            )

    @watchdog_app.command("rules")
    def watchdog_rules(
        history: Annotated[int, typer.Option(help="Show this many latest changes.")] = 20,
    ) -> None:
        """The watchdog's rules per scope, and who changed what when."""
        path = rules_path(settings.perdure_home(), settings.task_queue())
        book, note = load_rules(path)
        print_rules(console, book, note, str(path), history)

    @watchdog_app.command("ask")
    def watchdog_ask(
        question: Annotated[str, typer.Argument(help="e.g. 'why is review-1 slow?'")],
        yes: Annotated[bool, typer.Option("--yes", help="Apply what it proposes.")] = False,
        no: Annotated[bool, typer.Option("--no", help="Never apply what it proposes.")] = False,
        profile: Annotated[str | None, typer.Option(help="Model profile (default: the judge_profile rule).")] = None,
    ) -> None:
        """Ask the watchdog about goals; it reads their progress and its history, and may propose a change."""
        from perdure.activities.models.profiles import load_model_config
        from perdure.runtime.connect import connect

        queue = settings.task_queue()
        book, _ = load_rules(rules_path(settings.perdure_home(), queue))
        chosen = profile or (book.scopes.get("all", {}).get("judge_profile")) or "default"
        try:
            config = load_model_config()
            asyncio.run(
                ask_watchdog(
                    console, question, config, str(chosen), AskTools(queue, connect), confirmer(yes, no, console)
                )
            )
        except typer.Exit:
            raise
        except Exception as err:  # everything printed, no traceback
            refuse(RuntimeError(f"{type(err).__name__}: {getattr(err, 'message', None) or err}"))


# --- `perdure watchdog ask`: a short conversation with the watchdog ---------------------
#
# A few turns of a text protocol rather than provider tool calls, so any profile (and the
# scripted server's `when` substrings) can drive it: each reply is one JSON object, a
# tool call {"tool": NAME, "goal": ID} or an answer {"answer": TEXT, "propose": {...}}.
# A proposal is applied only once the maintainer confirms it.

ASK_SYSTEM = (
    "You are perdure's watchdog, answering a maintainer. PERDURE-WATCHDOG-ASK. Reply with one JSON object only. "
    'To read: {"tool": "progress" | "pending" | "history" | "rules", "goal": "ID (progress, pending)"}. '
    'To finish: {"answer": "what you found", "propose": null | {"set": "rule=value", "for": "goal=ID|tag=NAME"} '
    '| {"nudge": "ID", "text": "message to the goal"}}.'
)
ASK_TURNS = 4
TOOL_RESULT_CHARS = 3000


class AskTools:
    """What `ask` may read: a goal's progress and pending activities (the server), the
    watchdog's memory (findings, incidents, verdicts) and its rule book (this machine)."""

    def __init__(self, task_queue: str, connect_fn) -> None:
        self.task_queue = task_queue
        self._connect = connect_fn
        self._client: Client | None = None

    async def client(self) -> Client:
        if self._client is None:
            self._client = await self._connect()
        return self._client

    async def call(self, tool: str, goal: str | None) -> str:
        if tool == "history":
            memory, path = read_memory(self.task_queue)
            if memory is None:
                return f"no watchdog memory at {path}"
            return memory.model_dump_json(include={"incidents", "goals", "verdicts", "sent", "judge_note"})
        if tool == "rules":
            return load_rules(rules_path(settings.perdure_home(), self.task_queue))[0].model_dump_json()
        if tool in ("progress", "pending") and goal:
            handle = (await self.client()).get_workflow_handle(goal)
            if tool == "progress":
                from perdure.workflows.goal.goal_workflow import GoalWorkflow

                snapshot = await handle.query(GoalWorkflow.progress)
                return snapshot.model_dump_json(
                    include={"phase", "running", "percent_done", "last_progress_at", "conclusions", "gate_log"}
                )
            from perdure.activities.watchdog.watchdog_visibility import pending_view

            desc = await handle.describe()
            return json.dumps(
                [pending_view(p).model_dump(mode="json") for p in desc.raw_description.pending_activities]
            )
        return f"unknown tool {tool!r} (or no goal given)"


async def ask_watchdog(
    console: Console,
    question: str,
    config,
    profile: str,
    tools: AskTools,
    confirm,
    turns: int = ASK_TURNS,
) -> dict | None:
    """The conversation; returns the applied proposal (None when nothing was applied)."""
    from perdure.activities.models.attempts import ModelAttemptState
    from perdure.activities.models.providers import ChatMessage, ChatRequest, provider_for

    chosen = config.resolve(profile)
    messages = [ChatMessage(role="system", content=ASK_SYSTEM), ChatMessage(role="user", content=question)]
    console.print(f"[bold]you[/bold]: {escape(question)}")
    for _ in range(turns):
        response = await provider_for(chosen).chat(
            ChatRequest(messages=messages, json_mode=True), ModelAttemptState("watchdog ask", chosen.name)
        )
        messages.append(ChatMessage(role="assistant", content=response.text))
        try:
            reply = json.loads(response.text)
            if not isinstance(reply, dict):
                raise ValueError
        except ValueError:
            console.print(f"[red]the model's reply was not a JSON object[/red]: {escape(response.text[:300])}")
            return None
        if "tool" in reply:
            tool, goal = str(reply["tool"]), reply.get("goal")
            console.print(f"[dim]watchdog reads {escape(tool)}{f' of {escape(str(goal))}' if goal else ''}[/dim]")
            try:
                result = await tools.call(tool, str(goal) if goal else None)
            except Exception as err:  # a tool that failed is told to the model, not raised
                result = f"{type(err).__name__}: {getattr(err, 'message', None) or err}"
            messages.append(ChatMessage(role="user", content=f"TOOL RESULT {tool}: {result[:TOOL_RESULT_CHARS]}"))
            continue
        console.print(f"[bold]watchdog[/bold]: {escape(str(reply.get('answer', '')))}")
        proposal = reply.get("propose")
        if not isinstance(proposal, dict):
            return None
        return await _offer(console, proposal, tools, confirm)
    console.print(f"[yellow]no answer within {turns} turns[/yellow]")
    return None


async def _offer(console: Console, proposal: dict, tools: AskTools, confirm) -> dict | None:
    if "set" in proposal:
        scope = proposal.get("for")
        what = f"perdure watchdog set {proposal['set']}" + (f" --for {scope}" if scope else "")
        try:
            where = parse_scope(scope)
            change = parse_assignment(str(proposal["set"]))
        except RuleError as err:
            console.print(f"[red]proposal refused[/red]: {escape(str(err))}")
            return None
    elif "nudge" in proposal:
        where, change = str(proposal["nudge"]), None
        refused = await _nudge_refused(where, proposal, tools)
        if refused is not None:
            console.print(f"[red]proposal refused[/red]: {escape(refused)}")
            return None
        what = f"nudge {where}: {_nudge_text(proposal)}"
    else:
        console.print("[red]proposal refused[/red]: neither a rule change nor a nudge")
        return None
    console.print(f"proposed: {escape(what)}")
    if not confirm(what):
        console.print("not applied")
        return None
    if change is not None:
        path = rules_path(settings.perdure_home(), tools.task_queue)
        _, made = change_rules(path, where, [change], settings.user(), datetime.now(UTC))
        console.print(
            "applied: " + ("; ".join(f"v{c.version} {c.scope} {c.rule}={_value(c.new)}" for c in made) or "unchanged")
        )
    else:
        from perdure.workflows.goal.contracts.messages import Steer
        from perdure.workflows.goal.goal_workflow import GoalWorkflow

        text = _nudge_text(proposal)
        rid = "wd-ask-" + hashlib.sha256(f"{where}\n{text}".encode()).hexdigest()[:16]
        handle = (await tools.client()).get_workflow_handle(where)
        inbox = await handle.query(GoalWorkflow.inbox)
        if any(entry.request_id == rid for entry in inbox.entries):
            console.print(f"already delivered: nudge {escape(where)} ({rid}); nothing sent again")
            return proposal
        await handle.signal(GoalWorkflow.message_signal, Steer(request_id=rid, text=text).model_dump(mode="json"))
        console.print(f"applied: nudge {escape(where)} ({rid})")
    return proposal


def _nudge_text(proposal: dict) -> str:
    """The steer a nudge proposal sends: its text, or the default one (shown before it is confirmed)."""
    return str(proposal.get("text") or "[watchdog] a maintainer asks you to change approach")


async def _nudge_refused(goal_id: str, proposal: dict, tools: AskTools) -> str | None:
    """Why a nudge cannot be sent (checked before the maintainer is asked), or None."""
    from perdure.workflows.goal.contracts.messages import Steer
    from perdure.workflows.shared.contracts import GOAL_WORKFLOW

    try:
        Steer(request_id="wd-ask-check", text=_nudge_text(proposal))
    except ValueError as err:
        return f"the nudge's text is not a message a goal takes: {str(err).splitlines()[-1][:200]}"
    try:
        desc = await (await tools.client()).get_workflow_handle(goal_id).describe()
    except RPCError as err:
        return f"no goal {goal_id!r}: {err.message}"
    if desc.workflow_type != GOAL_WORKFLOW:
        return f"{goal_id!r} is a {desc.workflow_type} workflow, not a goal"
    if desc.status is not None and desc.status.name != "RUNNING":
        return f"goal {goal_id!r} is {desc.status.name.lower()}: it takes no messages"
    return None


def confirmer(yes: bool, no: bool, console: Console):
    """--yes applies, --no never does; otherwise ask on a terminal and never apply without one."""

    def confirm(what: str) -> bool:
        if yes:
            return True
        if no or not sys.stdin.isatty():
            if not no:
                console.print("[dim]not a terminal and neither --yes nor --no: nothing is applied[/dim]")
            return False
        return typer.confirm(f"apply {what}?", default=False)

    return confirm
