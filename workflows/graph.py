"""Task-graph logic: node keys, readiness and downstream sets. Pure functions.

A node key is derived from what determines a node's output (kind, canonical
input, the digests of the outputs it consumes) and never from ids or time, so
the same work gets the same key in every run and after every replan.
"""

from __future__ import annotations

from collections.abc import Mapping

from workflows.canonical import digest_of
from workflows.plan import Plan, PlanStep
from workflows.state import Node

DONE = {"succeeded"}
TERMINAL = {"succeeded", "failed", "uncertain", "invalidated", "abandoned"}


def step_input(step: PlanStep) -> dict:
    """The part of a step that determines its output; name, edges and premises excluded."""
    return step.model_dump(mode="json", exclude={"name", "needs", "premises"})


def node_key(step: PlanStep, dep_digests: Mapping[str, str], premises: Mapping[str, str] | None = None) -> str:
    """Stable key: kind + canonical input + digests of the outputs it consumes.

    `dep_digests` maps each needed step name to its output digest; names are
    kept because templates refer to dependencies by name. A step that declares
    premises also keys on them: on the set of values it holds for, or on the
    current value when it depends on the premise loosely, so narrowing within
    that set keeps the key and anything else gives new work a new key.
    """
    material: dict = {"kind": step.kind, "input": step_input(step), "deps": dict(sorted(dep_digests.items()))}
    if step.premises:
        current = premises or {}
        material["premises"] = {
            key: sorted(values) if values is not None else current.get(key)
            for key, values in sorted(step.premises.items())
        }
    return "node:" + digest_of(material).removeprefix("sha256:")


def ready_steps(plan: Plan, nodes: Mapping[str, Node]) -> list[str]:
    """Pending steps whose dependencies all succeeded, in plan order."""
    ready = []
    for step in plan.steps:
        node = nodes[step.name]
        if node.status != "pending":
            continue
        if all(nodes[d].status in DONE for d in step.needs):
            ready.append(step.name)
    return ready


def downstream(plan: Plan, name: str) -> list[str]:
    """Every step that depends on `name`, directly or transitively, in plan order."""
    dependants: dict[str, set[str]] = {s.name: set() for s in plan.steps}
    for s in plan.steps:
        for d in s.needs:
            dependants[d].add(s.name)
    seen: set[str] = set()
    todo = [name]
    while todo:
        for child in dependants[todo.pop()]:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return [s.name for s in plan.steps if s.name in seen]


def topological_order(plan: Plan) -> list[str]:
    """Plan steps ordered so every step comes after the steps it needs (stable)."""
    placed: list[str] = []
    placed_set: set[str] = set()
    remaining = list(plan.steps)
    while remaining:
        for step in remaining:
            if all(d in placed_set for d in step.needs):
                placed.append(step.name)
                placed_set.add(step.name)
                remaining.remove(step)
                break
    return placed
