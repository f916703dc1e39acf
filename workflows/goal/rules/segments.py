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
local activity too; a crash before its workflow task completes sends it again.

This module is the one place that rule lives. Pure: the workflow calls it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from perdure.activities.tools.catalogue import TOOL_SPECS
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


def place(spec: ToolSpec | None, local_up_to_s: float = DEFAULT_LOCAL_UP_TO_S, keyed_writes: bool = False) -> Placement:
    """Decide from the tool's risk class, replay policy and expected duration; `keyed_writes`:
    writes whose re-run is harmless run locally too (GoalSpec.local_keyed_writes)."""
    if spec is None:
        return Placement(where="activity", why="unknown tool: the activity reports the error")
    # A harmless write's duration is its service's, known in advance or not: bounded by its
    # timeout, and a lost worker is noticed by the workflow task timeout as for any local activity.
    harmless = keyed_writes and spec.risk in ("remote-write", "local-write") and spec.replay in HARMLESS_AGAIN
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
