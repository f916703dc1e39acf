"""Which nodes are in which status, and which pending steps are ready. Pure.

The goal's loop asks these questions on every pass and after every node that
settles; answered by scanning every node they made a goal of n nodes cost
O(n^2) (a 10,000-node goal spent most of its time counting). The index is kept
as statuses change, so each answer costs what changed, not the size of the goal.

Every status change goes through `set_status`: `Node` refuses a direct write of
its status (workflows/goal/contracts/state.py), so the index cannot silently fall out of step.
Answers come in the order of the plan (ready steps) or of the goal's node table
(everything else), as the scans they replace did: dispatch order is recorded in
history and must not depend on hashing.

A large goal (workflows/goal/rules/frontier.py) has no node for a step it has not touched:
the index counts such a step as pending (and lists it, in plan order, as one), and counts
the steps stored in the past by status and kind without listing them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from pydantic import BaseModel

from perdure.workflows.goal.contracts.migrations import collector_paused
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.shared.statuses import TERMINAL, NodeStatus


@dataclass(frozen=True)
class PlanGraph:
    """What the index needs of a plan that never changes with its statuses: built once per
    plan object and kept beside its fields (a large goal's plan may be shared by its runs on
    one worker: workflows/goal/past.py), so building an index costs what the goal holds, not
    a pass over every step of a plan of 100,000."""

    steps: list
    position: dict[str, int]
    needs: dict[str, list[str]]
    kind: dict[str, str]
    wrap_up: frozenset[str]
    dependants: dict[str, list[str]]
    roots: list[str]


_GRAPH = "_plan_graph"
_NO_GRAPH = PlanGraph([], {}, {}, {}, frozenset(), {}, [])


def plan_graph(plan: Plan | None) -> PlanGraph:
    if plan is None:
        return _NO_GRAPH
    graph = plan.__dict__.get(_GRAPH)
    if graph is not None and graph.steps is plan.steps and len(graph.position) == len(plan.steps):
        return graph
    steps = plan.steps
    with collector_paused():  # a list per step: the collector would walk the heap again and again
        graph = _build_graph(steps)
    plan.__dict__[_GRAPH] = graph  # never dumped, ignored by ==
    return graph


def _build_graph(steps: list) -> PlanGraph:
    dependants: dict[str, list[str]] = {s.name: [] for s in steps}
    for step in steps:
        for dep in step.needs:
            dependants[dep].append(step.name)
    return PlanGraph(
        steps=steps,
        position={s.name: i for i, s in enumerate(steps)},
        needs={s.name: s.needs for s in steps},
        kind={s.name: s.kind for s in steps},
        # Wrap-up steps (list what is unfinished, notify the owner) run once their needs
        # have ended, however they ended.
        wrap_up=frozenset(s.name for s in steps if s.wrap_up),
        dependants=dependants,
        roots=[s.name for s in steps if not s.needs],
    )


class NodeIndex:
    def __init__(
        self,
        plan: Plan | None,
        nodes: Mapping[str, Node],
        stored: Collection[str] = (),
        stored_counts: Mapping[str, Mapping[str, int]] | None = None,
        untouched: str = "pending",
    ) -> None:
        """`stored`: the steps stored in the past (no node); `stored_counts`: status -> kind -> how
        many; `untouched`: the status of a step with no node and not stored ("abandoned" once an
        emergency stop gave up every step not started: GoalState.stopped_untouched)."""
        self.plan = plan
        self.size = len(nodes)
        self._nodes = nodes
        graph = plan_graph(plan)
        self._step_position = graph.position
        self._needs = graph.needs
        self._wrap_up = graph.wrap_up
        self._dependants = graph.dependants
        self._kind_of = graph.kind
        self._stored = set(stored)
        self._untouched = untouched
        virtual = [n for n in graph.position if n not in nodes and n not in self._stored]
        # A goal with steps that have no node lists in plan order, else in node table order.
        self._lazy = bool(virtual or self._stored)
        self._position = self._step_position if self._lazy else {name: i for i, name in enumerate(nodes)}
        self._by_status: dict[str, dict[str, None]] = {}
        self._kinds: dict[str, dict[str, int]] = {}  # status -> kind -> count
        self._stored_kinds: dict[str, dict[str, int]] = {s: dict(k) for s, k in (stored_counts or {}).items()}
        for node in nodes.values():
            self._enter(node.name, node.kind, node.status)
        if virtual:
            self._by_status.setdefault(untouched, {}).update(dict.fromkeys(virtual))
            kinds = self._kinds.setdefault(untouched, {})
            for kind, count in Counter(graph.kind[n] for n in virtual).items():
                kinds[kind] = kinds.get(kind, 0) + count
        if self._lazy:
            # Ready: pending with every need settled. A step with needs has one with a node (a
            # stored step is no pending step's need), so only the roots and the dependants of
            # nodes can be; the rest of a large plan is not looked at.
            candidates = dict.fromkeys(graph.roots)
            for name in nodes:
                candidates.update(dict.fromkeys(self._dependants.get(name, ())))
                if name in self._wrap_up:  # its needs may all be abandoned without a node
                    candidates[name] = None
        else:
            candidates = dict.fromkeys(graph.position)
        self._ready = {name for name in candidates if self._is_ready(name)}

    def fits(self, plan: Plan | None, nodes: Mapping[str, Node]) -> bool:
        """Whether this index was built for this plan and node table (a new plan
        version, or nodes added or dropped with it, needs a new index)."""
        return plan is self.plan and len(nodes) == self.size and nodes is self._nodes

    # --- a large goal's node table grows and shrinks ----------------------------------

    def materialised(self, node: Node) -> None:
        """A step without a node was given one (in the status it had: `untouched`): nothing else changes."""
        self.size += 1

    def abandon_untouched(self) -> None:
        """Every step with no node and not stored is abandoned (an emergency stop), counted
        and never given a node; the wrap-up steps among them must have been given one."""
        if self._untouched == "abandoned":
            return
        self._untouched = "abandoned"
        pending = self._by_status.get("pending", {})
        virtual = [name for name in pending if name not in self._nodes]
        for name in virtual:
            kind = self._kind_of[name]
            self._leave(name, kind, "pending")
            self._enter(name, kind, "abandoned")
            self._ready.discard(name)
        for name in virtual:  # a wrap-up step waits for its needs to end, however they end
            for dependant in self._dependants.get(name, ()):
                if dependant in self._wrap_up and self._is_ready(dependant):
                    self._ready.add(dependant)

    def stored(self, nodes: Collection[Node]) -> None:
        """These settled nodes left the node table for the past: counted, never listed."""
        for node in nodes:
            self._leave(node.name, node.kind, node.status)
            self._stored.add(node.name)
            kinds = self._stored_kinds.setdefault(node.status, {})
            kinds[node.kind] = kinds.get(node.kind, 0) + 1
        self.size -= len(nodes)
        self._lazy = True
        self._position = self._step_position

    def is_stored(self, name: str) -> bool:
        return name in self._stored

    def status_of(self, name: str) -> str:
        """A step's status: its node's; "pending" for a step with no node yet (or "abandoned",
        after an emergency stop); "stored" for a step in the past."""
        node = self._nodes.get(name)
        if node is not None:
            return node.status
        return "stored" if name in self._stored else self._untouched

    def position(self, name: str) -> int:
        """A step's position in the plan."""
        return self._step_position[name]

    def dependants(self, name: str) -> list[str]:
        return self._dependants.get(name, [])

    @property
    def total(self) -> int:
        """The plan's steps, whatever their state (the node table, when there is no plan)."""
        return len(self._step_position) if self.plan is not None else self.size

    # --- the one door for status changes --------------------------------------------

    def set_status(self, node: Node, status: NodeStatus) -> None:
        old = node.status
        if old == status:
            return
        BaseModel.__setattr__(node, "status", status)
        name = node.name
        if self._nodes.get(name) is not node:
            return  # not (or no longer) in the goal's node table: a voided run's node
        self._leave(name, node.kind, old)
        self._enter(name, node.kind, status)
        if name in self._needs:
            if status == "pending" and self._is_ready(name):
                self._ready.add(name)
            elif old == "pending":
                self._ready.discard(name)
        if status == "succeeded":
            self._ready.update(d for d in self._dependants.get(name, ()) if self._is_ready(d))
        elif old == "succeeded":
            self._ready.difference_update(self._dependants.get(name, ()))
        if self._wrap_up and (status in TERMINAL or old in TERMINAL):
            for dependant in self._dependants.get(name, ()):
                if dependant in self._wrap_up:
                    (self._ready.add if self._is_ready(dependant) else self._ready.discard)(dependant)

    # --- answers --------------------------------------------------------------------

    def ready(self) -> list[str]:
        """Pending steps whose dependencies all succeeded (a wrap-up step's: all ended),
        in plan order."""
        return sorted(self._ready, key=self._step_position.__getitem__)

    def count(self, statuses: Collection[str]) -> int:
        """Steps in any of `statuses`, those stored in the past included."""
        stored = sum(n for s in statuses for n in self._stored_kinds.get(s, {}).values())
        return stored + sum(len(self._by_status.get(s, ())) for s in statuses)

    def count_of_kinds(self, statuses: Collection[str], kinds: Collection[str]) -> int:
        """Steps of any of `kinds` in any of `statuses`, those stored in the past included."""
        return sum(
            self._kinds.get(s, {}).get(k, 0) + self._stored_kinds.get(s, {}).get(k, 0) for s in statuses for k in kinds
        )

    def counts(self) -> dict[str, int]:
        """Status -> steps, those stored in the past and those with no node yet included."""
        found: dict[str, int] = {}
        for status, kinds in (*self._kinds.items(), *self._stored_kinds.items()):
            if n := sum(kinds.values()):
                found[status] = found.get(status, 0) + n
        return found

    def any(self, statuses: Collection[str]) -> bool:
        return any(self._by_status.get(s) or any(self._stored_kinds.get(s, {}).values()) for s in statuses)

    def names(self, statuses: Collection[str]) -> list[str]:
        """Steps in any of `statuses`, in the order of the goal's node table (of its plan, for
        a large goal, whose pending steps may have no node yet); never those stored in the past."""
        found = [name for s in statuses for name in self._by_status.get(s, ())]
        return sorted(found, key=self._position.__getitem__)

    def unsettled_by_kind(self) -> dict[str, int]:
        """Kind -> nodes not yet in a terminal status."""
        counts: dict[str, int] = {}
        for status, kinds in self._kinds.items():
            if status not in TERMINAL:
                for kind, n in kinds.items():
                    counts[kind] = counts.get(kind, 0) + n
        return {kind: n for kind, n in counts.items() if n}

    # --- bookkeeping ------------------------------------------------------------------

    def _is_ready(self, name: str) -> bool:
        if self.status_of(name) != "pending":
            return False
        settled = TERMINAL if name in self._wrap_up else ("succeeded",)
        # A stored step is never one a pending step needs (rules/frontier.py): "stored" is no
        # settled status here, so such a step would wait rather than start without its input.
        return all(self.status_of(d) in settled for d in self._needs[name])

    def _enter(self, name: str, kind: str, status: str) -> None:
        self._by_status.setdefault(status, {})[name] = None
        kinds = self._kinds.setdefault(status, {})
        kinds[kind] = kinds.get(kind, 0) + 1

    def _leave(self, name: str, kind: str, status: str) -> None:
        if self._by_status[status].pop(name, 0) is None:
            self._kinds[status][kind] -= 1
