"""`perdure watchdog ask`: a short conversation between a maintainer and the watchdog,
which may read goals' progress and pending activities (the server), its own memory and
rule book (this machine), and propose a rule change or a nudge, applied only once the
maintainer confirms it. A nudge is a steer, sent as any steering message is (the client).
"""

from __future__ import annotations

import hashlib
import json
import sys
from datetime import UTC, datetime

import typer
from rich.console import Console
from rich.markup import escape

from perdure.activities.watchdog.watchdog_files import watchdog_files
from perdure.activities.watchdog.watchdog_memory import (
    RuleError,
    change_rules,
    load_rules,
    parse_assignment,
    parse_scope,
)
from perdure.runtime import settings
from perdure.starters.client import PerdureClient
from perdure.starters.client.client_errors import GoalNotFound
from perdure.starters.watchdog_view import read_memory, rule_value
from perdure.workflows.goal.contracts.goal_contracts import GOAL_WORKFLOW
from perdure.workflows.goal.contracts.messages import Steer

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
        self._client: PerdureClient | None = None

    async def client(self) -> PerdureClient:
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
            return load_rules(watchdog_files().rules(self.task_queue))[0].model_dump_json()
        if tool == "progress" and goal:
            snapshot = await (await self.client()).progress(goal)
            return snapshot.model_dump_json(
                include={"phase", "running", "percent_done", "last_progress_at", "conclusions", "gate_log"}
            )
        if tool == "pending" and goal:
            from perdure.activities.watchdog.watchdog_visibility import pending_view

            desc = await (await self.client()).describe(goal)
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
        kept = watchdog_files().rules(tools.task_queue)
        _, made = change_rules(kept, where, [change], settings.user(), datetime.now(UTC))
        console.print(
            "applied: "
            + ("; ".join(f"v{c.version} {c.scope} {c.rule}={rule_value(c.new)}" for c in made) or "unchanged")
        )
    else:
        text = _nudge_text(proposal)
        rid = "wd-ask-" + hashlib.sha256(f"{where}\n{text}".encode()).hexdigest()[:16]
        client = await tools.client()
        inbox = await client.inbox(where)
        if any(entry.request_id == rid for entry in inbox.entries):
            console.print(f"already delivered: nudge {escape(where)} ({rid}); nothing sent again")
            return proposal
        await client.send(where, Steer(request_id=rid, text=text))
        console.print(f"applied: nudge {escape(where)} ({rid})")
    return proposal


def _nudge_text(proposal: dict) -> str:
    """The steer a nudge proposal sends: its text, or the default one (shown before it is confirmed)."""
    return str(proposal.get("text") or "[watchdog] a maintainer asks you to change approach")


async def _nudge_refused(goal_id: str, proposal: dict, tools: AskTools) -> str | None:
    """Why a nudge cannot be sent (checked before the maintainer is asked), or None."""
    try:
        Steer(request_id="wd-ask-check", text=_nudge_text(proposal))
    except ValueError as err:
        return f"the nudge's text is not a message a goal takes: {str(err).splitlines()[-1][:200]}"
    try:
        desc = await (await tools.client()).describe(goal_id)
    except GoalNotFound as err:
        return f"no goal {goal_id!r}: {err}"
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
