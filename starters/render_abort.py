"""How an abort looks in a terminal: requested (what still runs, what is still to undo), then
aborted (what was undone, what could not be and why), for `perdure status` and `perdure abort`.

Presentation only; every fact comes from the goal's progress snapshot (AbortProgress).
"""

from __future__ import annotations

from datetime import datetime

from rich.console import Console
from rich.text import Text

from perdure.workflows.goal.contracts.abort_contracts import AbortEffect, AbortProgress, AbortStep


def _at(when: datetime | None) -> str:
    return f"{when:%Y-%m-%d %H:%M:%S} UTC" if when else "(time unknown)"


def headline(abort: AbortProgress) -> str:
    rollback = "rollback: yes" if abort.rollback else "rollback: no"
    asked = f"by {abort.by}" if abort.by else ""
    if abort.stage == "requested":
        head = f"abort requested {_at(abort.requested_at)} {asked}".rstrip()
    else:
        head = f"aborted {_at(abort.achieved_at)} (requested {_at(abort.requested_at)} {asked})".replace(" )", ")")
    tail = " · emergency stop: the plan's wrap-up steps still run" if abort.emergency else ""
    return f"{head} · {rollback} · {abort.reason}{tail}"


def _step(label: str, step: AbortStep) -> str:
    tools = ", ".join(step.tools) or step.kind
    return f"{label}: {step.node} ({tools})" + (f": {step.note}" if step.note else "")


def _effect(label: str, effect: AbortEffect) -> str:
    made = f"{effect.node} · {effect.tool or 'its write'}"
    if effect.status in ("pending", "running"):
        return f"{label}: {made} by {effect.undo} ({effect.status})" + (f": {effect.why}" if effect.why else "")
    if effect.status == "done":
        return f"{label}: {made} by {effect.undo}" + (f" ({effect.why})" if effect.why else "")
    return f"{label}: {made}: {effect.why or effect.status}"


def abort_lines(abort: AbortProgress) -> list[str]:
    """The headline, then a line per step still running or stopped and per effect."""
    lines = [headline(abort)]
    lines += [_step("  still running", s) for s in abort.running]
    lines += [_step("  stopped", s) for s in abort.stopped]
    lines += [_effect("  to undo", e) for e in abort.to_undo]
    lines += [_effect("  undone", e) for e in abort.undone]
    lines += [_effect("  not undone", e) for e in abort.not_undone]
    if abort.stage == "achieved" and len(lines) == 1:
        lines.append("  nothing was running or left to undo")
    return lines


def watch_hint(goal_id: str) -> str:
    return f"watch it: perdure status {goal_id} (or perdure watch {goal_id})"


def print_abort(console: Console, abort: AbortProgress) -> None:
    style = "bold yellow" if abort.stage == "requested" else "bold red"
    first, *rest = abort_lines(abort)
    # Text, not markup: a reason or a tool's error prints as written.
    console.print(Text(first, style=style), highlight=False)
    for line in rest:
        console.print(Text(line), highlight=False)
