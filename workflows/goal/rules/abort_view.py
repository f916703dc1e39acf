"""What an abort has done so far (contracts/abort_contracts.py), read off the goal's state and
what the workflow knows of its work in flight. Pure.

An abort is requested until nothing it waits for still runs (writes in flight, subgoals, an
emergency's wrap-up steps) and every undo has settled; then it is achieved. The effects are
read off the compensation records (newest first, the order they are undone in), the effects
that happened with no compensation, and the steps whose outcome nobody knows.
"""

from __future__ import annotations

from perdure.workflows.goal.contracts.abort_contracts import AbortEffect, AbortProgress, AbortStep
from perdure.workflows.goal.contracts.state import CompensationRecord, GoalState
from perdure.workflows.shared.statuses import ENDED_PHASES

NO_ROLLBACK = "no rollback was asked"


def abort_progress(
    state: GoalState, writes_in_flight: dict[str, list[str]], stopped: dict[str, str], undoing: str | None
) -> AbortProgress | None:
    """None unless the goal is aborting. `writes_in_flight`: node -> the tools of its writes on
    their way; `stopped`: node -> its status when the abort stopped it at once; `undoing`: the
    effect key whose undo is on its way."""
    pause = state.pause
    if pause.mode != "aborting":
        return None
    achieved = pause.abort_achieved_at is not None or state.phase in ENDED_PHASES
    progress = AbortProgress(
        stage="achieved" if achieved else "requested",
        requested_at=pause.abort_requested_at,
        achieved_at=pause.abort_achieved_at,
        by=pause.abort_by or "",
        reason=state.abort_reason or "",
        rollback=pause.rollback,
        emergency=pause.emergency,
        running=_running(state, writes_in_flight),
        stopped=[_stopped(state, name, status) for name, status in stopped.items()],
    )
    for effect in _effects(state, undoing, achieved):
        if effect.status in ("pending", "running"):
            progress.to_undo.append(effect)
        elif effect.status == "done":
            progress.undone.append(effect)
        else:
            progress.not_undone.append(effect)
    return progress


def _step_tool(state: GoalState, name: str) -> str | None:
    try:
        step = state.plan.step(name) if state.plan else None
    except KeyError:
        return None
    return getattr(step, "tool", None)


def _running(state: GoalState, writes_in_flight: dict[str, list[str]]) -> list[AbortStep]:
    found = []
    for name, node in state.nodes.items():
        if node.status != "running":
            continue
        waiting = node.waiting_on or ""
        tool = _step_tool(state, name)
        if name in writes_in_flight:
            tools, note = list(writes_in_flight[name]), "a write on its way: never cut off"
        elif waiting.startswith("subgoal:"):
            tools, note = [], f"its subgoal {waiting.removeprefix('subgoal:')} is asked to stop"
        else:
            tools, note = [tool] if tool else [], "a wrap-up step" if state.pause.emergency else ""
        found.append(AbortStep(node=name, kind=node.kind, tools=tools, note=note))
    return found


def _stopped(state: GoalState, name: str, status: str) -> AbortStep:
    node = state.nodes.get(name)
    tool = _step_tool(state, name)
    if status == "uncertain":
        note = "whether its effect happened is unknown"
    else:
        note = "cancelled" if status == "running" else f"cancelled while {status}"
    return AbortStep(node=name, kind=node.kind if node else "", tools=[tool] if tool else [], note=note)


def _effects(state: GoalState, undoing: str | None, achieved: bool) -> list[AbortEffect]:
    """Every effect the abort is about, newest compensation first."""
    rollback = state.pause.rollback
    found = [e for r in reversed(state.compensations) if (e := _compensated(state, r, undoing, achieved))]
    compensated = {r.effect_key for r in state.compensations}
    for key, done in state.effects.items():
        if key not in compensated:
            why = f"{done.tool} declares no undo" if rollback else NO_ROLLBACK
            found.append(
                AbortEffect(
                    effect=key, node=done.node, tool=done.tool, status="no_undo" if rollback else "kept", why=why
                )
            )
    maybe_undone = {r.node for r in state.compensations if r.effect != "not_happened"}
    for name, node in state.nodes.items():
        if node.status == "uncertain" and name not in maybe_undone:
            tool = _step_tool(state, name)
            key = next((q.effect_key for q in state.questions if name in q.nodes and q.effect_key), None)
            why = f"whether {tool or 'its write'} happened is unknown, and nothing undoes it"
            found.append(AbortEffect(effect=key or "", node=name, tool=tool, status="uncertain", why=why))
    return found


def _compensated(
    state: GoalState, record: CompensationRecord, undoing: str | None, achieved: bool
) -> AbortEffect | None:
    if record.status == "not_needed" or record.effect == "not_happened":
        return None  # it did not happen: nothing to undo
    done = state.effects.get(record.effect_key)
    tool = done.tool if done else _step_tool(state, record.node)
    undo = record.compensation.tool
    maybe = "it may not have happened; the undo is keyed, safe either way" if record.effect == "maybe" else None
    if record.status == "done":
        status, why = "done", maybe
    elif record.status == "failed":
        status, why = "failed", f"undo by {undo} failed: {record.note or 'no reason given'}"
    elif not state.pause.rollback:
        status, why = "kept", NO_ROLLBACK
    elif achieved:
        status, why = "kept", "the goal ended before its undo ran"
    elif record.effect_key == undoing:
        status, why = "running", maybe
    else:
        status, why = "pending", "waits for its write to land" if record.effect == "in_flight" else maybe
    return AbortEffect(effect=record.effect_key, node=record.node, tool=tool, undo=undo, status=status, why=why)
