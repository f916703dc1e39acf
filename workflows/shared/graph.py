"""Task-graph logic: node keys, readiness and downstream sets. Pure functions.

A node key is derived from what determines a node's output (kind, canonical
input, the digests of the outputs it consumes) and never from ids or time, so
the same work gets the same key in every run and after every replan.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from perdure.workflows.goal.contracts.plan import Plan, PlanStep
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.shared.canonical import digest_of

DONE = {"succeeded"}


def step_input(step: PlanStep) -> dict:
    """The part of a step that determines its output; name, edges, premises and the
    flags about how it is scheduled, retried, sandboxed, verified or asked about (wrap_up,
    replay, network, verify, writes, defer, question_deadline) excluded."""
    dumped = step.model_dump(
        mode="json",
        exclude={
            "name",
            "needs",
            "premises",
            "wrap_up",
            "replay",
            "network",
            "device_wait_s",
            "verify",
            "writes",
            "defer",
            "question_deadline",
        },
    )
    if dumped.get("device", "") is None:
        # A step on a worker: keyed as before devices existed, so no finished work is redone.
        del dumped["device"]
    return dumped


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
    """Plan steps ordered so every step comes after the steps it needs (stable: of the
    steps whose needs are placed, the one listed first in the plan goes next)."""
    position = {s.name: i for i, s in enumerate(plan.steps)}
    waiting = {s.name: len(set(s.needs)) for s in plan.steps}
    dependants: dict[str, list[str]] = {s.name: [] for s in plan.steps}
    for step in plan.steps:
        for dep in set(step.needs):
            dependants[dep].append(step.name)
    ready = [position[name] for name, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    placed: list[str] = []
    while ready:
        name = plan.steps[heapq.heappop(ready)].name
        placed.append(name)
        for child in dependants[name]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, position[child])
    return placed
