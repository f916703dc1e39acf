"""What every room of the goal shares: the state, the goal's id, a way to wake the
loop, and the few primitives all of them need (the plan, a step's inputs, the node
index, a status change, the gate log, asking a person and waiting for the answer).

Workflow code, run inside the goal's workflow task. Collaborators get this object
and never the workflow itself, so no room can reach into another's fields.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import workflow

from workflows.contracts import ArtifactRef
from workflows.node_index import NodeIndex
from workflows.plan import Plan, PlanStep
from workflows.state import GoalState, Node, Question
from workflows.statuses import NodeStatus

# Keeps the gate log bounded however long the goal runs.
GATE_LOG_ENTRIES = 200


class NodeFailed(Exception):
    """A node ended without an output; the message is shown to the user."""


class GoalFailed(Exception):
    """The goal cannot continue (no valid plan, planner unavailable)."""


class GoalContext:
    def __init__(self, state: GoalState, goal_id: str, wake: Callable[[], None]) -> None:
        self.state = state
        self.goal_id = goal_id
        # Bumps the loop's wake-up counter: a node settled, a message or a question arrived.
        self.wake = wake
        self._index: NodeIndex | None = None

    def plan(self) -> Plan:
        plan = self.state.plan
        assert plan is not None
        return plan

    def inputs(self, step: PlanStep) -> dict[str, ArtifactRef]:
        """The outputs of the steps `step` needs (it is ready, so they all have one)."""
        refs = {}
        for dep in step.needs:
            output = self.state.nodes[dep].output
            assert output is not None
            refs[dep] = output
        return refs

    def index(self) -> NodeIndex:
        """Statuses and ready steps without a scan of every node (workflows/node_index.py);
        built again when the plan or the node table changes."""
        state = self.state
        if self._index is None or not self._index.fits(state.plan, state.nodes):
            self._index = NodeIndex(state.plan, state.nodes)
        return self._index

    def set_status(self, node: Node, status: NodeStatus) -> None:
        self.index().set_status(node, status)

    def log_gate(self, entry: str) -> None:
        log = self.state.gate_log
        log.append(entry)
        del log[:-GATE_LOG_ENTRIES]

    async def ask(self, node: Node, question: Question, status: NodeStatus = "blocked") -> str:
        """Ask a person and block this node (only) until the answer comes."""
        self.state.questions.append(question)
        self.set_status(node, status)
        self.wake()  # the loop re-judges the phase: the goal may now await a person
        await workflow.wait_condition(lambda: question.status == "answered")
        self.set_status(node, "running")
        return question.answer or ""


def short_key(key: str | None) -> str:
    """A node key as activity summaries show it."""
    return (key or "").removeprefix("node:")[:12]
