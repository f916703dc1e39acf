"""Cost density: how much a branch of the plan spends per unit of progress, and what to do about it.

Owns what a branch is, how its cost and progress are counted, and the verdict:
ok, no_successors (its running node may finish, nothing new is dispatched in
it) or stop_branch (stop it now, keep its finished outputs). The workflow
records the verdict with its reason and acts on it.

A branch is named after a source step (one with no `needs`); a step belongs to
every source it descends from, so a join step belongs to several branches and
its cost and progress are split evenly between them. Deliberately simple: a
plan with a single source is one branch, and the gate then judges the whole goal.

Pure: no I/O, clocks or randomness; output order is sorted, so it is stable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, Field

from perdure.workflows.goal.contracts.state import Node

DensityAction = Literal["ok", "no_successors", "stop_branch"]
DEFAULT_STOP_FACTOR = 3.0
_SEVERITY: dict[str, int] = {"ok": 0, "no_successors": 1, "stop_branch": 2}


class BranchProgress(BaseModel):
    """Spend and progress of one branch. Progress is in finished nodes (fractional for shared joins)."""

    branch: str
    cost_usd: float = Field(default=0.0, ge=0)
    progress: float = Field(default=0.0, ge=0)

    @property
    def density(self) -> float:
        """USD per unit of progress. A branch with no progress yet is credited with one unit,
        so its first node is judged like a finished one instead of as infinitely dense."""
        return self.cost_usd / max(self.progress, 1.0)


class DensityVerdict(BaseModel):
    branch: str
    action: DensityAction
    reason: str
    density: float


def branch_roots(needs: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Map each step to the sorted source steps (no needs) it descends from; a source maps to itself.

    Raises ValueError on a dependency that is not a step or on a cycle (a
    validated Plan has neither).
    """
    roots: dict[str, list[str]] = {}
    visiting: set[str] = set()

    def resolve(name: str) -> list[str]:
        if name in roots:
            return roots[name]
        if name not in needs:
            raise ValueError(f"unknown step '{name}'")
        if name in visiting:
            raise ValueError(f"steps form a cycle through '{name}'")
        visiting.add(name)
        deps = needs[name]
        found = sorted({r for d in deps for r in resolve(d)}) if deps else [name]
        visiting.discard(name)
        roots[name] = found
        return found

    for name in sorted(needs):
        resolve(name)
    return {name: roots[name] for name in sorted(roots)}


def branch_progress(nodes: Mapping[str, Node]) -> list[BranchProgress]:
    """Cost and progress per branch, sorted by branch name. Progress counts succeeded nodes
    (reused ones included); cost counts every node, failed ones too."""
    roots = branch_roots({name: node.needs for name, node in nodes.items()})
    totals: dict[str, list[float]] = {}
    for name in sorted(nodes):
        node = nodes[name]
        share = 1.0 / len(roots[name])
        for root in roots[name]:
            cost, progress = totals.setdefault(root, [0.0, 0.0])
            totals[root] = [
                cost + node.cost_usd * share,
                progress + (share if node.status == "succeeded" else 0.0),
            ]
    return [BranchProgress(branch=b, cost_usd=c, progress=p) for b, (c, p) in sorted(totals.items())]


def density_verdict(branch: BranchProgress, limit: float, stop_factor: float = DEFAULT_STOP_FACTOR) -> DensityVerdict:
    """ok up to `limit` USD per unit of progress; no_successors above it; stop_branch above limit * stop_factor."""
    if limit <= 0:
        raise ValueError(f"density limit must be positive, got {limit}")
    if stop_factor < 1:
        raise ValueError(f"stop_factor must be at least 1, got {stop_factor}")
    density = branch.density
    measured = (
        f"branch '{branch.branch}' spent ${branch.cost_usd:.4f} for {branch.progress:g} finished node(s): "
        f"${density:.4f} per node"
    )
    if density > limit * stop_factor:
        return DensityVerdict(
            branch=branch.branch,
            action="stop_branch",
            reason=f"{measured}, over {stop_factor:g}x the ${limit:.4f} limit: branch stopped, finished outputs kept",
            density=density,
        )
    if density > limit:
        return DensityVerdict(
            branch=branch.branch,
            action="no_successors",
            reason=f"{measured}, over the ${limit:.4f} limit: running node may finish, no successor dispatched",
            density=density,
        )
    return DensityVerdict(
        branch=branch.branch, action="ok", reason=f"{measured}, within the ${limit:.4f} limit", density=density
    )


def verdict_for_step(
    name: str, nodes: Mapping[str, Node], limit: float, stop_factor: float = DEFAULT_STOP_FACTOR
) -> DensityVerdict:
    """The most severe verdict among the branches `name` belongs to: what the workflow asks before dispatching it.

    Ties keep the first branch in name order, so the reason is stable.
    """
    roots = branch_roots({n: node.needs for n, node in nodes.items()})[name]
    by_branch = {b.branch: b for b in branch_progress(nodes)}
    verdicts = [density_verdict(by_branch[root], limit, stop_factor) for root in roots]
    return max(verdicts, key=lambda v: _SEVERITY[v.action])


def fair_share_limit(max_cost_usd: float, planned_nodes: int, slack: float = 2.0) -> float:
    """A default density limit: the cost budget's fair share per planned node, times `slack`."""
    if max_cost_usd <= 0 or planned_nodes <= 0 or slack <= 0 or not math.isfinite(max_cost_usd):
        raise ValueError("fair_share_limit needs a positive, finite budget, node count and slack")
    return max_cost_usd / planned_nodes * slack
