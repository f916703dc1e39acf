"""Node runners, one per node kind: what a ready node of that kind does to produce
its output. The scheduler looks the runner up by the step's kind; settling the
outcome (status, twins, downstream) stays in the scheduler.

A new node kind: a step type in workflows/goal/contracts/plan.py (STEP_TYPES), a runner module
here taking `NodeDeps`, and one entry in `RUNNERS`; a kind without a runner stops
the worker at import, before any goal runs.
"""

from __future__ import annotations

from typing import get_args

from perdure.workflows.goal.contracts.plan import NodeKind
from perdure.workflows.goal.nodes.agent import AgentNode
from perdure.workflows.goal.nodes.base import NodeDeps, NodeRunner
from perdure.workflows.goal.nodes.llm import LlmNode
from perdure.workflows.goal.nodes.subgoal import SubgoalNode
from perdure.workflows.goal.nodes.tool import ToolNode
from perdure.workflows.goal.nodes.wait import WaitNode

RUNNERS: dict[str, type[NodeRunner]] = {
    "tool": ToolNode,
    "llm": LlmNode,
    "agent": AgentNode,
    "subgoal": SubgoalNode,
    "wait": WaitNode,
}

_missing = set(get_args(NodeKind)) - set(RUNNERS)
if _missing:
    raise ImportError(f"node kinds without a runner in workflows/goal/nodes: {', '.join(sorted(_missing))}")


def node_runners(deps: NodeDeps) -> dict[str, NodeRunner]:
    return {kind: runner(deps) for kind, runner in RUNNERS.items()}


__all__ = ["NodeDeps", "NodeRunner", "node_runners"]
