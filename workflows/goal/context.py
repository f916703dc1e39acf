"""What every room of the goal shares: the state, the goal's id, a way to wake the
loop, and the few primitives all of them need (the plan, a step's inputs, the node
index, a status change, the gate log, the decision log, asking a person and waiting
for the answer).

Workflow code, run inside the goal's workflow task. Collaborators get this object
and never the workflow itself, so no room can reach into another's fields.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import MetricMeter

from perdure.workflows.goal.contracts import decision_contracts
from perdure.workflows.goal.contracts.abort_contracts import AbortProgress
from perdure.workflows.goal.contracts.decision_contracts import RULE
from perdure.workflows.goal.contracts.goal_contracts import Signals, SubgoalOutcome
from perdure.workflows.goal.contracts.messages import PARENT_STOP, Abort
from perdure.workflows.goal.contracts.plan import Plan, PlanStep
from perdure.workflows.goal.contracts.state import GoalState, Node, Question
from perdure.workflows.goal.rules.abort_view import abort_progress
from perdure.workflows.goal.rules.node_index import NodeIndex
from perdure.workflows.shared import metrics
from perdure.workflows.shared.contracts import ArtifactRef
from perdure.workflows.shared.mcp_tools import McpCatalogue, McpTool, tool_table
from perdure.workflows.shared.run_boundary import continue_as_new_due, goal_task_timeout, steps_per_run
from perdure.workflows.shared.statuses import TERMINAL, NodeStatus
from perdure.workflows.shared.tool_specs import ToolSpec
from perdure.workflows.shared.user_tools import UserTool, UserToolCatalogue

# Keeps the gate log bounded however long the goal runs.
GATE_LOG_ENTRIES = 200


class NodeFailed(Exception):
    """A node ended without an output; the message is shown to the user."""


class GoalFailed(Exception):
    """The goal cannot continue (no valid plan, planner unavailable)."""


class NodeWaiting(Exception):
    """A node that waits with no task of its own: for the answer to a question
    (`node.waiting_on`), parked for the goal to resume, or for its device. The scheduler
    runs it again then, in this run or a later one. `maybe_ran`: a device call of the
    node was lost after it was sent (its effect may have happened)."""

    maybe_ran = False


class NodeStopped(Exception):
    """A node was told to stop (abort, void) and ended at its next safe point, after its
    writes settled. `uncertain`: its last effect's outcome is unknown."""

    def __init__(self, message: str, uncertain: bool = False) -> None:
        super().__init__(message)
        self.uncertain = uncertain


class GoalContext:
    def __init__(self, state: GoalState, goal_id: str, wake: Callable[[], None]) -> None:
        self.state = state
        self.goal_id = goal_id
        # Bumps the loop's wake-up counter: a node settled, a message or a question arrived.
        self.wake = wake
        self._index: NodeIndex | None = None
        # A large goal's steps stored in the past (workflows/goal/past.py keeps it as PastLog.stored says).
        self.stored: set[str] = set()
        # Node -> the tools of the remote writes it has in flight. A write in flight is never
        # cancelled: stopping or voiding its node waits for it to settle (nothing is in flight
        # at continue-as-new, so this is never carried).
        self.writes_in_flight: dict[str, list[str]] = {}
        # What an abort found (workflows/goal/rules/abort_view.py): node -> the status it had when
        # the abort stopped it at once, and the effect key whose undo is on its way.
        self.stopped_by_abort: dict[str, str] = {}
        self.undoing: str | None = None
        # Nodes told to stop once their writes settle (the goal is stopping, or they were voided).
        self.stopping: set[str] = set()
        # Steps settled in this run (not carried): what bounds the run's replay.
        self.settled_this_run = 0
        self._tools: tuple[McpCatalogue | None, UserToolCatalogue | None, Mapping[str, ToolSpec]] | None = None
        # The event stream's hooks (workflows/goal/stream.py): a status change, a gate decision.
        self.on_status: Callable[[Node], None] | None = None
        self.on_gate: Callable[[str], None] | None = None
        self.on_receipt: Callable[[Any], None] | None = None
        # The decision log's room (workflows/goal/decision_log.py): a decision was recorded.
        self.on_decision: Callable[[], None] | None = None
        # The past (workflows/goal/past.py): a node settled, so it may be stored once no step
        # needs it; and what brings the stored ones back before settled work is judged (False:
        # they could not be read, the goal is parked saying why, and the judging must not go on).
        self.on_settled: Callable[[Node], None] | None = None
        self.restore_past: Callable[[], Awaitable[bool]] = _nothing_stored
        # The goal's perdure_* metrics (workflows/shared/metrics.py): the SDK's replay-safe meter, or
        # none where a room is exercised outside a workflow.
        self.metrics = metrics.PerdureMeter(workflow.metric_meter() if workflow.in_workflow() else MetricMeter.noop)

    def continue_as_new_due(self) -> bool:
        """The run should end at its next safe point: its history is long (or the server's
        current version changed), enough steps settled in it to bound its replay, or its
        plan grew past what its workflow task timeout lets a replay take."""
        spec = self.state.spec
        timeout = workflow.info().task_timeout
        # More than the timeout is sized for: a run that settles each step of its plan once
        # ends on its own, with no continue-as-new just before its end.
        if self.settled_this_run > (spec.continue_as_new_after_nodes or steps_per_run(timeout)):
            return True
        if self.next_task_timeout() > timeout:
            return True
        return continue_as_new_due(spec.continue_as_new_after_events)

    def next_task_timeout(self) -> timedelta:
        """The workflow task timeout the next run gets: what its plan needs, never shorter
        than this run's (a goal started with a longer one keeps it)."""
        return max(goal_task_timeout(self.state.plan_size() or len(self.state.nodes)), workflow.info().task_timeout)

    def tell_child(self, child_id: str, message: BaseModel) -> None:
        """Send a subgoal a message (as its user would, with a request id of its own); a
        child that has ended meanwhile cannot take it, and that is no error here."""

        async def send() -> None:
            try:
                await workflow.get_external_workflow_handle(child_id).signal(
                    Signals.MESSAGE, message.model_dump(mode="json")
                )
            except Exception as err:  # noqa: BLE001 - e.g. the child closed: nothing to tell it
                workflow.logger.info("subgoal not told", extra={"child": child_id, "error": str(err)[:200]})

        asyncio.create_task(send())

    def children(self) -> list[tuple[str, str]]:
        """The subgoals running now (workflows/goal/nodes/subgoal.py): (node, child goal id),
        in plan order. Their waits are state, so this holds in every run of the goal."""
        found = []
        for name in self.index().names(("running",)):
            waiting = self.state.nodes[name].waiting_on or ""
            if waiting.startswith("subgoal:"):
                found.append((name, waiting.removeprefix("subgoal:")))
        return found

    def tell_children(self, make: Callable[[str], BaseModel]) -> None:
        """`make(child_id)` to every subgoal running now."""
        for _, child_id in self.children():
            self.tell_child(child_id, make(child_id))

    def stop_children(
        self, why: str, but: str | None = None, rollback: bool = True, join: str | None = "fail_fast"
    ) -> None:
        """Ask the subgoals running now to stop (an abort message, with rollback unless told
        not to): those joined `join` (None: all), except `but`. Their nodes settle once
        they have stopped and said so."""
        plan = self.plan()
        for name, child_id in self.children():
            if name == but or (join is not None and getattr(plan.step(name), "join", None) != join):
                continue
            self.tell_child(
                child_id, Abort(request_id=PARENT_STOP, reason=why[:300], rollback=rollback, by="parent goal")
            )

    def subgoal_ended(self, outcome: SubgoalOutcome) -> None:
        """A child said how it ended (or its handle did): kept for its node, which runs again."""
        if any(child == outcome.child_id for _, child in self.children()):
            self.state.subgoal_outcomes.setdefault(outcome.child_id, outcome)
            self.wake()

    def tools(self) -> Mapping[str, ToolSpec]:
        """The goal's tool table: the built-in tools, those of its MCP catalogue and the user's own."""
        mcp, own = self.state.mcp, self.state.user_tools
        if self._tools is None or self._tools[0] is not mcp or self._tools[1] is not own:
            table = tool_table(mcp.tools.values() if mcp is not None else (), own.tools.values() if own else ())
            self._tools = (mcp, own, table)
        return self._tools[2]

    def mcp_tools(self, names: list[str]) -> list[McpTool]:
        """The catalogue entries of those of `names` that come from MCP servers."""
        catalogue = self.state.mcp
        return [catalogue.tools[n] for n in names if n in catalogue.tools] if catalogue is not None else []

    def user_tools(self, names: list[str]) -> list[UserTool]:
        """The catalogue entries of those of `names` that are the user's own tools."""
        catalogue = self.state.user_tools
        return [catalogue.tools[n] for n in names if n in catalogue.tools] if catalogue is not None else []

    def plan(self) -> Plan:
        plan = self.state.plan
        assert plan is not None
        return plan

    def inputs(self, step: PlanStep) -> dict[str, ArtifactRef]:
        """The outputs of the steps `step` needs (it is ready, so they all have one,
        except for a wrap-up step's needs that ended without one)."""
        refs = {}
        for dep in step.needs:
            node = self.state.nodes.get(dep)  # a wrap-up step's need abandoned without a node (stop_pending)
            output = node.output if node is not None else None
            if output is None:
                assert step.wrap_up, f"step '{step.name}' is ready without the output of '{dep}'"
                continue
            refs[dep] = output
        return refs

    def index(self) -> NodeIndex:
        """Statuses and ready steps without a scan of every node (workflows/goal/rules/node_index.py);
        built again when the plan or the node table changes."""
        state = self.state
        if self._index is None or not self._index.fits(state.plan, state.nodes):
            counts = state.past.counts if state.past is not None else None
            untouched = "pending" if state.stopped_untouched is None else "abandoned"
            self._index = NodeIndex(state.plan, state.nodes, self.stored, counts, untouched)
        return self._index

    def forget_index(self) -> None:
        """The steps stored in the past changed other than through the index: build it again."""
        self._index = None

    def node(self, name: str) -> Node:
        """The node of step `name`. A large goal's pending step that has none yet gets it here
        (workflows/goal/rules/frontier.py); KeyError: no step of the plan, or one stored in the past."""
        node = self.state.nodes.get(name)
        if node is not None:
            return node
        index = self.index()
        if index.is_stored(name):
            raise KeyError(f"step '{name}' is stored in the past")
        step = self.plan().step(name)
        node = Node(name=step.name, kind=step.kind, needs=list(step.needs))
        if index.status_of(name) == "abandoned":  # after an emergency stop (Scheduler.stop_pending)
            node = Node(name=step.name, kind=step.kind, needs=list(step.needs), status="abandoned")
            node.error = self.state.stopped_untouched
        self.state.nodes[name] = node
        index.materialised(node)
        return node

    def set_status(self, node: Node, status: NodeStatus) -> None:
        settles = status in TERMINAL and node.status != status
        self.index().set_status(node, status)
        if settles:
            self.metrics.add(metrics.NODES_SETTLED, 1, kind=node.kind, outcome=status)
            if self.on_settled is not None:
                self.on_settled(node)
        if self.on_status is not None:
            self.on_status(node)

    def abort_progress(self) -> AbortProgress | None:
        """What an abort has done so far (None: not aborting), for the snapshot and the stream."""
        return abort_progress(self.state, self.writes_in_flight, self.stopped_by_abort, self.undoing)

    def log_gate(self, entry: str, kind: str | None = "gate", about: Iterable[str] = ()) -> None:
        """A line of the gate log (bounded, the latest shown by status), also a decision of
        `kind` by a rule in the decision log; None where the line repeats a decision
        recorded as such (a plan version adopted)."""
        log = self.state.gate_log
        log.append(entry)
        del log[:-GATE_LOG_ENTRIES]
        if self.on_gate is not None:
            self.on_gate(entry)
        if kind is not None:
            self.decide(kind, entry, RULE, about)

    def decide(self, kind: str, text: str, who: str = RULE, about: Iterable[str] = ()) -> None:
        """Record a decision that shaped the work in the goal's decision log: its kind (see
        decision_contracts.KINDS), what was decided and why, who decided (the model, a rule,
        a deadline that passed: "expired", or a person's name) and the steps it is about."""
        decision_contracts.record(self.state.decisions, workflow.now(), kind, text, who, about)
        if self.on_decision is not None:
            self.on_decision()

    def stop_point(self, node: Node) -> None:
        """A safe point of a node's work: a node told to stop ends here."""
        if node.name in self.stopping:
            raise NodeStopped(f"stopped before its next step: {self.state.abort_reason or 'its work was voided'}")

    async def ask(self, node: Node, question: Question, status: NodeStatus = "blocked") -> str:
        """Ask a person and block this node (only) until the answer comes. A question
        asked before (the node runs again after its answer) returns that answer.

        The wait is state, not a coroutine: the node's task ends here (NodeWaiting) and
        the scheduler runs the node again once the question is answered, in this run or
        a later one (continue-as-new does not wait for a person). Tool and agent nodes ask;
        their runners start again from what the state holds."""
        self.stop_point(node)
        if question.decided:  # by a person, or by its deadline (workflows/goal/question_deadlines.py)
            return question.answer or ""
        if question.status == "open" and all(q.id != question.id for q in self.state.questions):
            self.state.questions.append(question)
        self.set_status(node, status)
        self.wake()  # the loop re-judges the phase: the goal may now await a person
        node.waiting_on = question.id
        raise NodeWaiting(f"waiting for the answer to {question.id}")

    def question_about(self, node: Node, effect_key: str, topic: str) -> Question | None:
        """The card this node already asked about this effect (it runs again after an answer)."""
        for question in reversed(self.state.questions):
            if question.status == "closed":
                continue  # closed when its step was voided or left out: ask again
            if question.topic == topic and question.effect_key == effect_key and node.name in question.nodes:
                return question
        return None


async def _nothing_stored() -> bool:
    return True


def short_key(key: str | None) -> str:
    """A node key as activity summaries show it."""
    return (key or "").removeprefix("node:")[:12]
