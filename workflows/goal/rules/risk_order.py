"""Risk placed on purpose: which ready steps the scheduler holds back, and why. Pure.

Two rules, asked once per dispatch pass (workflows/goal/scheduler.py):
- A remote-write or irreversible step (a tool step whose tool has that risk class, or an
  agent step that may call such a tool) goes last: while any read-only or local step
  with no path to or from it is ready or in flight, it is deferred. Only that frontier
  is looked at: the work further on is reached through it, and work held behind another
  risky step would make two deferred steps wait for each other. A step with
  `defer: false` is pinned where the plan puts it.
- Steps whose write sets overlap (the same path, one path a directory holding the other,
  or the same remote target as written) never run side by side: the later in the pass's
  order waits until the earlier has settled.

A decision is kept on the node as a placement text (`Node.placements`, under the keys
below), so it is state: continue-as-new carries it, replay rebuilds it, and `status
--why` shows it after the step has run. The per-plan facts are computed once per plan
version and cached on the plan; a pass costs what is ready or in flight, never a scan of
every node. Nothing here may read a clock or the workflow: the caller passes `now`.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.workflows.goal.contracts.plan import Plan, PlanStep
from perdure.workflows.shared.statuses import TERMINAL
from perdure.workflows.shared.tool_specs import ToolSpec

RISKY = ("irreversible", "remote-write")  # the order is the rank: the first is the graver
# Placement keys of the two decisions (a node's other placements are keyed by tool name).
DEFERRED = "risk order"
SERIALIZED = "write set"
ORDER_KEYS = (DEFERRED, SERIALIZED)
# A target with a scheme (mailto:, https://, s3://) is remote: compared as written.
_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# Tools whose write set is known from the call itself, when the step declares none.
_REPOSITORY = ".git"
BLOCKERS_SHOWN = 3


def step_risk(step: PlanStep, specs: Mapping[str, ToolSpec] = TOOL_SPECS) -> tuple[str, list[str]] | None:
    """(the gravest risk class, the tools that have it or the other risky class) of a
    step that may write outside the workspace; None for read-only and local work.
    An agent step counts by the tools it may call: whether it will call them is known
    only once it ran, and the risk to place is the one it was given."""
    fields = type(step).model_fields  # a lookup that misses on a model is slow: 10,000 steps
    tools = [step.tool] if "tool" in fields else list(step.tools or []) if "tools" in fields else []
    risky = [t for t in tools if t in specs and specs[t].risk in RISKY]
    if not risky:
        return None
    gravest = min(RISKY.index(specs[t].risk) for t in risky)
    return RISKY[gravest], risky


def normal_target(target: str) -> str:
    """A write target as compared: a remote one as written, a path normalised
    (`./src//a.py` and `src/a.py` are one file; a trailing slash is the directory)."""
    target = target.strip()
    if _REMOTE.match(target):
        return target
    return posixpath.normpath(target)


def write_set(step: PlanStep) -> tuple[str, ...]:
    """What a step writes: its declared `writes`, else what its tool call names (a
    write_file's path, a git commit's or revert's repository); empty when unknown."""
    declared = step.writes
    if declared is None:
        tool = step.tool if "tool" in type(step).model_fields else None
        path = step.args.get("path") if tool == "write_file" else None
        if isinstance(path, str) and path and "{{" not in path:
            declared = [path]
        elif tool in ("git_commit", "git_revert"):
            declared = [_REPOSITORY]
        else:
            declared = []
    return tuple(dict.fromkeys(normal_target(t) for t in declared))


def _covering_dirs(path: str) -> list[str]:
    """The directories that hold `path`, innermost first, the workspace root (`.`) last."""
    dirs = []
    head = posixpath.dirname(path)
    while head and head not in dirs:
        dirs.append(head)
        if head in ("/", "."):
            break
        head = posixpath.dirname(head)
    if not path.startswith("/") and path != ".":
        dirs.append(".")
    return list(dict.fromkeys(dirs))


def overlap(a: str, b: str) -> bool:
    """Whether two normalised targets can touch the same thing."""
    if a == b:
        return True
    if _REMOTE.match(a) or _REMOTE.match(b):
        return False
    return a in _covering_dirs(b) or b in _covering_dirs(a)


@dataclass
class RiskFacts:
    """What the rules need to know about a plan, computed once per plan version."""

    steps: list
    risk: dict[str, tuple[str, list[str]]]  # risky step -> (class, its risky tools)
    deferrable: set[str]  # risky steps without `defer: false`
    writes: dict[str, tuple[str, ...]]  # step -> its write set, when it has one
    needs: dict[str, list[str]]
    wrap_up: set[str]
    _ancestors: dict[str, frozenset[str]] = field(default_factory=dict)

    def ancestors(self, name: str) -> frozenset[str]:
        """Every step `name` needs, directly or not (asked only for wrap-up steps,
        the only ones that are ready while work they need may still be unsettled)."""
        found = self._ancestors.get(name)
        if found is None:
            seen: set[str] = set()
            todo = list(self.needs[name])
            while todo:
                dep = todo.pop()
                if dep not in seen:
                    seen.add(dep)
                    todo.extend(self.needs[dep])
            found = self._ancestors[name] = frozenset(seen)
        return found


_FACTS = "_risk_facts"


def risk_facts(plan: Plan, specs: Mapping[str, ToolSpec] = TOOL_SPECS) -> RiskFacts:
    """The plan's facts, cached beside its fields (never dumped, ignored by ==) and
    built again when its steps were replaced. `specs`: the goal's tool table (a goal's
    catalogue is listed before its first plan and never changes)."""
    facts = plan.__dict__.get(_FACTS)
    if facts is not None and facts.steps is plan.steps and len(facts.needs) == len(plan.steps):
        return facts
    risk = {s.name: r for s in plan.steps if (r := step_risk(s, specs)) is not None}
    facts = RiskFacts(
        steps=plan.steps,
        risk=risk,
        deferrable={s.name for s in plan.steps if s.name in risk and s.defer},
        writes={s.name: w for s in plan.steps if (w := write_set(s))},
        needs={s.name: s.needs for s in plan.steps},
        wrap_up={s.name for s in plan.steps if s.wrap_up},
    )
    plan.__dict__[_FACTS] = facts
    return facts


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:BLOCKERS_SHOWN])
    return shown + (", …" if len(names) > BLOCKERS_SHOWN else "")


def _when(at: datetime) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S} UTC"


def deferral_note(risk: tuple[str, list[str]], blockers: list[str]) -> str:
    count = f"{len(blockers)} independent step{'s' if len(blockers) != 1 else ''}"
    return f"deferred: {risk[0]} ({', '.join(risk[1])}); waits for {count} ({_names(blockers)})"


_SINCE = re.compile(r"; since (.+ UTC)$")


def deferred_since(note: str | None) -> str | None:
    """When a step still deferred was first deferred, from its note."""
    found = _SINCE.search(note or "") if (note or "").startswith("deferred: ") else None
    return found.group(1) if found else None


def released_note(note: str, at: datetime) -> str:
    """The note of a deferred step that goes now: what it waited for, from when to when."""
    since = deferred_since(note)
    if since is None:
        return note
    return _SINCE.sub("", note).replace("; waits for ", "; waited for ", 1) + f" from {since} to {_when(at)}"


def serialized_note(holder: str, mine: str, theirs: str) -> str:
    if mine == theirs:
        return f"serialized with {holder}: both write {mine}"
    inner, outer = (mine, theirs) if theirs in _covering_dirs(mine) else (theirs, mine)
    return f"serialized with {holder}: both write {inner} ({outer}/ holds it)"


class OrderPass:
    """One dispatch pass: the order to judge the ready steps in, and for each whether it
    waits. Built from the ready steps and the nodes in flight at the start of the pass;
    `status` reads a node's status now (steps dispatched earlier in the pass count)."""

    def __init__(
        self, facts: RiskFacts, ready: list[str], in_flight: Iterable[str], status: Callable[[str], str]
    ) -> None:
        self._facts = facts
        self._ready = ready
        self._in_flight = [n for n in in_flight if status(n) not in TERMINAL]
        self._status = status
        self._frontier: list[str] | None = None
        self._exact: dict[str, tuple[str, str]] = {}  # target -> (holder, its target)
        self._inside: dict[str, tuple[str, str]] = {}  # directory -> a holder writing under it
        for name in self._in_flight:
            self.claim(name)

    def order(self) -> list[str]:
        """The ready steps, deferrable risky ones last (each group in plan order): they are
        judged once the rest of the pass has started what it could."""
        deferrable = self._facts.deferrable
        return [n for n in self._ready if n not in deferrable] + [n for n in self._ready if n in deferrable]

    def hold(self, name: str) -> tuple[str, str] | None:
        """(placement key, note) when `name` must wait this pass; None when it may start."""
        if name in self._facts.deferrable:
            blockers = self.blockers(name)
            if blockers:
                return DEFERRED, deferral_note(self._facts.risk[name], blockers)
        for mine in self._facts.writes.get(name, ()):
            holder = self._holder(mine)
            if holder is not None and holder[0] != name:
                return SERIALIZED, serialized_note(holder[0], mine, holder[1])
        return None

    def blockers(self, name: str) -> list[str]:
        """The read-only and local steps ready or in flight now with no path to or from
        `name` (a ready step's needs have all settled, so none of them is upstream; none
        is downstream, since `name` has not run)."""
        if self._frontier is None:
            risk, seen = self._facts.risk, set()
            frontier = []
            for other in [*self._in_flight, *self._ready]:
                if other not in risk and other not in seen and self._status(other) not in TERMINAL:
                    seen.add(other)
                    frontier.append(other)
            self._frontier = frontier
        if name in self._facts.wrap_up:
            upstream = self._facts.ancestors(name)
            return [b for b in self._frontier if b not in upstream]
        return self._frontier

    def claim(self, name: str) -> None:
        """`name` started, or waits in line for its targets: later writers queue behind it."""
        for target in self._facts.writes.get(name, ()):
            self._exact.setdefault(target, (name, target))
            if not _REMOTE.match(target):
                for directory in _covering_dirs(target):
                    self._inside.setdefault(directory, (name, target))

    def _holder(self, target: str) -> tuple[str, str] | None:
        found = self._exact.get(target)
        if found is not None or _REMOTE.match(target):
            return found
        found = self._inside.get(target)
        if found is not None:
            return found
        for directory in _covering_dirs(target):
            found = self._exact.get(directory)
            if found is not None:
                return found
        return None


def record_hold(placements: dict[str, str], key: str, note: str, now: datetime) -> None:
    """Keep the decision on the node; a deferral keeps the time it began."""
    if key == DEFERRED:
        note += f"; since {deferred_since(placements.get(DEFERRED)) or _when(now)}"
    placements[key] = note


def record_start(placements: dict[str, str], now: datetime) -> None:
    """A step that starts: a deferral still open on it says when it ended."""
    note = placements.get(DEFERRED)
    if note is not None and deferred_since(note) is not None:
        placements[DEFERRED] = released_note(note, now)
