"""Which work a requirement change voids: premise narrowing and rewinds. Pure.

A step declares the premises its output rests on: `premises: {scope: [all,
module_a]}` means "valid while scope is one of these values"; `{scope: null}`
means "depends on scope in a way only a person can judge". Changing a premise
voids the nodes whose declared values exclude the new value, asks about the
nodes that depend on it loosely, and keeps everything else. Anything downstream
of void work is void (it consumed a void output); anything downstream of work
awaiting confirmation awaits it too. Only nodes that have run are judged:
pending nodes simply run under the new premises.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.shared.graph import downstream
from perdure.workflows.shared.statuses import STARTED


class Invalidation(BaseModel):
    void: list[str] = Field(default_factory=list)
    kept: list[str] = Field(default_factory=list)
    to_confirm: list[str] = Field(default_factory=list)


def invalidate_by_premise(plan: Plan, statuses: Mapping[str, str], changes: Mapping[str, str]) -> Invalidation:
    """Split the nodes that have run (STARTED) into void / kept / to-confirm for new premise values."""
    directly_void: set[str] = set()
    directly_unsure: set[str] = set()
    for step in plan.steps:
        if statuses.get(step.name) not in STARTED:
            continue
        for key, new_value in changes.items():
            if key not in step.premises:
                continue
            valid_for = step.premises[key]
            if valid_for is None:
                directly_unsure.add(step.name)
            elif new_value not in valid_for:
                directly_void.add(step.name)
    return _close(plan, statuses, directly_void, directly_unsure - directly_void)


def invalidate_from(plan: Plan, statuses: Mapping[str, str], node: str) -> Invalidation:
    """A rewind: the node and everything downstream of it is void."""
    return invalidate_nodes(plan, statuses, [node])


def invalidate_nodes(plan: Plan, statuses: Mapping[str, str], nodes: list[str]) -> Invalidation:
    """Nodes that no longer hold (a rewind, a failed check): they and everything
    downstream of them are void."""
    return _close(plan, statuses, set(nodes), set())


def _close(plan: Plan, statuses: Mapping[str, str], void: set[str], unsure: set[str]) -> Invalidation:
    void = set(void)
    for name in list(void):
        void.update(downstream(plan, name))
    unsure = set(unsure) - void
    for name in list(unsure):
        unsure.update(d for d in downstream(plan, name) if d not in void)
    ran = {s.name for s in plan.steps if statuses.get(s.name) in STARTED}
    order = [s.name for s in plan.steps]
    return Invalidation(
        void=[n for n in order if n in void and n in ran],
        to_confirm=[n for n in order if n in unsure and n in ran],
        kept=[n for n in order if n in ran and n not in void and n not in unsure],
    )


def held_by(plan: Plan, to_confirm: list[str]) -> list[str]:
    """Pending work that must wait while `to_confirm` is undecided (it would consume those outputs)."""
    held: set[str] = set()
    for name in to_confirm:
        held.update(downstream(plan, name))
    return [s.name for s in plan.steps if s.name in held]
