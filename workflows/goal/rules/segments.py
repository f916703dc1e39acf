"""Where a tool call runs: checkpoint at side-effect boundaries, not at every step.

A regular activity costs a round trip through the server's task queues (tens of
milliseconds) and gives the step its own checkpoint in history. A read does not
need one: running it again after a crash is free and harmless. So short reads,
and other short calls whose replay policy is `safe`, run as *local activities*
on the worker that runs the goal; consecutive ones form a segment whose results
are written to history together at the next workflow-task boundary. Anything
that reaches the outside world (`remote-write`, `irreversible`) is a regular
activity with its own checkpoint, so a segment always ends before it; so is any
call expected to take long, which needs heartbeats to notice a lost worker.
Except, in a goal that says so (`GoalSpec.local_keyed_writes`, which every start
sets), a write whose re-run is harmless: `keyed` (the service deduplicates by its
effect key) or `check` (looked up before it writes), and not irreversible, runs as a
local activity too; a crash before its workflow task completes sends it again. Only
when the write is fully known at plan time and has nothing to undo (`intent_needed`):
a local activity records nothing before it runs, so a message applied by the worker
that takes the goal over (an abort with rollback, a rewind, a narrowing: signals are
applied before the lost task's results) can stop the step before the goal records it.
A write with an undo would then have happened with no compensation recorded, and one
whose arguments come from other steps' outputs or a model could, after a rewind, land a
second, different write. Those keep their activity, scheduled (recorded) before the call.

This module is the one place that rule lives. Pure: the workflow calls it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.workflows.goal.contracts.plan import template_refs
from perdure.workflows.shared.contracts import ToolInput
from perdure.workflows.shared.tool_specs import ToolSpec

Where = Literal["local", "activity"]

HARMLESS_AGAIN = {
    "keyed": "a re-run is deduplicated by its effect key",
    "check": "a re-run looks its effect up first",
}
"""Writes a worker lost in the middle may simply run again: as local activities they have no
intent recorded before the call, and a replacement worker runs them again from attempt 1.
A `once` call's retry must know an attempt existed (a scheduled activity's attempt count),
so it keeps its activity; so does every irreversible call."""

DEFAULT_LOCAL_UP_TO_S = 2.0
"""Calls expected to take longer than this stay regular activities with heartbeats.
A local activity holds the goal's workflow task open while it runs; past a couple of
seconds a crash costs more time to notice than the saved round trip is worth."""


class Placement(BaseModel):
    where: Where
    why: str
    alone: bool = False  # a local write: runs by itself, in its order, never in a segment's batch

    @property
    def local(self) -> bool:
        return self.where == "local"

    @property
    def in_segment(self) -> bool:
        """Runs with the replay-safe calls around it (together, in any order)."""
        return self.local and not self.alone

    def describe(self) -> str:
        return f"{'local activity' if self.local else 'activity'}: {self.why}"


def harmless_again(spec: ToolSpec) -> bool:
    """A write whose re-run is harmless by its declaration (keyed or check, not irreversible)."""
    return spec.risk in ("remote-write", "local-write") and spec.replay in HARMLESS_AGAIN


def may_run_locally(spec: ToolSpec) -> bool:
    """What a local activity may run by the tool's declaration: a call free to repeat, or a
    write whose re-run is harmless. The worker checks its own declaration against it: the
    goal placed the call by the declaration it planned with (activities/tools/run_tool.py)."""
    if harmless_again(spec):
        return True
    return spec.replay == "safe" and spec.risk in ("read", "local-write")


def intent_needed(call: ToolInput | None, undoable: bool) -> str | None:
    """Why a harmless write must still have its intent in history before it is sent (None:
    it need not). `undoable`: its prepared effect has a compensation."""
    if call is None:
        return "its arguments are not known yet"
    if undoable:
        return "it has an undo, recorded with its intent before it is sent, for a rollback"
    if call.args_ref is not None or call.args is None:
        return "its arguments are a model's, not known when the plan was made"
    if template_refs(call.args):
        return "its arguments name other steps' outputs, not known when the plan was made"
    return None


def place(
    spec: ToolSpec | None,
    local_up_to_s: float = DEFAULT_LOCAL_UP_TO_S,
    keyed_writes: bool = False,
    call: ToolInput | None = None,
    undoable: bool = False,
) -> Placement:
    """Decide from the tool's risk class, replay policy and expected duration; `keyed_writes`:
    writes whose re-run is harmless run locally too (GoalSpec.local_keyed_writes), when
    `call` is fully known at plan time and nothing undoes it (`undoable`: see intent_needed)."""
    if spec is None:
        return Placement(where="activity", why="unknown tool: the activity reports the error")
    # A harmless write's duration is its service's, known in advance or not: bounded by its
    # timeout, and a lost worker is noticed by the workflow task timeout as for any local activity.
    harmless = keyed_writes and harmless_again(spec)
    if harmless and (needed := intent_needed(call, undoable)) is not None:
        return Placement(where="activity", why=f"{spec.risk}, {spec.replay}: {needed}")
    if not harmless:
        if spec.risk in ("remote-write", "irreversible"):
            return Placement(where="activity", why=f"{spec.risk}: a side effect gets its own checkpoint")
        if spec.replay != "safe":
            return Placement(where="activity", why=f"replay policy '{spec.replay}': re-running it is not free")
        if spec.expected_s is None:
            return Placement(where="activity", why="duration not known in advance: heartbeats notice a lost worker")
    if local_up_to_s <= 0:
        return Placement(where="activity", why="local activities are turned off for this goal")
    if spec.expected_s is not None and spec.expected_s > local_up_to_s:
        return Placement(
            where="activity",
            why=f"expected {spec.expected_s:g} s > {local_up_to_s:g} s: long calls heartbeat as activities",
        )
    if harmless:
        why = f"{spec.risk}, {HARMLESS_AGAIN[spec.replay]}: recorded with its task"
        return Placement(where="local", why=why, alone=True)
    return Placement(
        where="local",
        why=f"{spec.risk}, safe to re-run, expected ≤ {spec.expected_s:g} s: checkpointed with its segment",
    )


def place_tool(tool: str, local_up_to_s: float = DEFAULT_LOCAL_UP_TO_S) -> Placement:
    return place(TOOL_SPECS.get(tool), local_up_to_s)


def batches(local: list[bool]) -> list[list[int]]:
    """Split calls (in the model's order) into groups that run one after another:
    consecutive local calls run together, every other call alone, so no read is
    moved across a write."""
    groups: list[list[int]] = []
    for index, is_local in enumerate(local):
        if is_local and groups and local[groups[-1][0]]:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups
