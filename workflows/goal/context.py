"""What every room of the goal shares: the state, the goal's id, a way to wake the
loop, and the few primitives all of them need (the plan, a step's inputs, the node
index, a status change, the gate log, asking a person and waiting for the answer).

Workflow code, run inside the goal's workflow task. Collaborators get this object
and never the workflow itself, so no room can reach into another's fields.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import MetricMeter

from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.workflows.goal.contracts.messages import Abort
from perdure.workflows.goal.contracts.plan import Plan, PlanStep
from perdure.workflows.goal.contracts.state import GoalState, Node, Question
from perdure.workflows.goal.patches import (
    AGENT_WAITS_PATCH,
    BASELINE_PATCH,
    BUDGET_CLOCK_PATCH,
    COMMAND_REPLAY_PATCH,
    DEVICE_WAIT_TIMER_PATCH,
    DEVICES_PATCH,
    DISPATCH_PASSES_PATCH,
    EFFECTS_FIRST_PATCH,
    MCP_TOOLS_PATCH,
    MEMORY_CARD_PATCH,
    MEMORY_PATCH,
    NODE_ERRORS_SETTLE_PATCH,
    NODES_PER_RUN_PATCH,
    OWN_CALLS_BOUNDED_PATCH,
    OWN_CHANGES_PATCH,
    PARKS_HOLD_VERDICTS_PATCH,
    READ_AHEAD_PATCH,
    READ_BATCHES_PATCH,
    READ_COMMITS_PATCH,
    REPLAN_DISCARDS_PATCH,
    REPLAN_ON_EVIDENCE_PATCH,
    RISK_ORDER_PATCH,
    SUBGOAL_SLICES_PATCH,
    UNSUCCESSFUL_GOALS_FAIL_PATCH,
    VERIFY_ON_NEW_CODE_PATCH,
    VERIFY_PATCH,
    VERIFY_QUESTION_PATCH,
    VOID_WAITS_PATCH,
    WAITS_PATCH,
    WORKER_LOSS_PATCH,
    WRITES_PREPARED_HERE_PATCH,
    patched_here,
)
from perdure.workflows.goal.rules.node_index import NodeIndex
from perdure.workflows.shared import metrics
from perdure.workflows.shared.contracts import ArtifactRef, Signals, SubgoalOutcome
from perdure.workflows.shared.mcp_tools import McpCatalogue, McpTool, names_mcp_tools, tool_table
from perdure.workflows.shared.run_boundary import continue_as_new_due, goal_task_timeout, steps_per_run
from perdure.workflows.shared.statuses import RAN, STARTED, TERMINAL, NodeStatus
from perdure.workflows.shared.tool_specs import WRITE_RISKS, ToolSpec

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
        # Node -> remote writes it has in flight. A write in flight is never cancelled:
        # stopping or voiding its node waits for it to settle (nothing is in flight at
        # continue-as-new, so this is never carried).
        self.writes_in_flight: dict[str, int] = {}
        # Nodes told to stop once their writes settle (the goal is stopping, or they were voided).
        self.stopping: set[str] = set()
        self.effects_first = self.waits_are_state = self.node_errors_settle = self.agent_waits_are_state = False
        self.void_reaches_waits = self.budgets_by_time_and_wrap_up = False
        self.commands_ask = self.lists_devices = self.device_timers_of_offline = self.verifies_after_waits = False
        self.verifies_by_question = False
        self.replans_on_evidence = self.uses_memory = self.memory_card_to_router = False
        self.orders_risk = self.verifies_on_new_code = self.subgoals_reserve_slices = False
        self.looks_around_commands = False
        self.replan_discards_in_flight = False
        self.lists_mcp_tools = False
        self.prepares_writes_here = False
        self.runs_bounded_by_nodes = self.dispatches_in_passes = False
        self.bounds_own_calls = False
        self.parks_hold_verdicts = self.unsuccessful_goals_fail = False
        self.schedules_lost_calls_again = False
        # Steps settled in this run (not carried): what bounds the run's replay.
        self.settled_this_run = 0
        self._tools: tuple[McpCatalogue | None, Mapping[str, ToolSpec]] | None = None
        # The event stream's hooks (workflows/goal/stream.py): a status change, a gate decision.
        self.on_status: Callable[[Node], None] | None = None
        self.on_gate: Callable[[str], None] | None = None
        self.on_receipt: Callable[[Any], None] | None = None
        # The goal's perdure_* metrics (workflows/shared/metrics.py): the SDK's replay-safe meter, or
        # none where a room is exercised outside a workflow.
        self.metrics = metrics.PerdureMeter(workflow.metric_meter() if workflow.in_workflow() else MetricMeter.noop)

    def decide_patches(self) -> None:
        """Which of the goal's behaviour changes this run has: called first in every run.
        A run with the baseline has every change it stands for, in one marker (patches.py)."""
        self._carried_patches = set(self.state.patches)
        self._patched(BASELINE_PATCH)
        self.effects_first = self._patched(EFFECTS_FIRST_PATCH)
        self.waits_are_state = self._patched(WAITS_PATCH)
        self.node_errors_settle = self._patched(NODE_ERRORS_SETTLE_PATCH)
        self.agent_waits_are_state = self._patched(AGENT_WAITS_PATCH)
        self.void_reaches_waits = self._patched(VOID_WAITS_PATCH)
        self.commands_ask = self._patched(COMMAND_REPLAY_PATCH)
        self.budgets_by_time_and_wrap_up = self._patched(BUDGET_CLOCK_PATCH)
        self.lists_devices = self._patched(DEVICES_PATCH)
        self.device_timers_of_offline = self._patched(DEVICE_WAIT_TIMER_PATCH)
        self.verifies_after_waits = self._patched(VERIFY_PATCH)
        self.verifies_by_question = self._patched(VERIFY_QUESTION_PATCH)
        self.replans_on_evidence = self._patched(REPLAN_ON_EVIDENCE_PATCH)
        self.orders_risk = self._patched(RISK_ORDER_PATCH)
        self.replan_discards_in_flight = self._patched(REPLAN_DISCARDS_PATCH)
        self.uses_memory = self._patched(MEMORY_PATCH)
        self.memory_card_to_router = self._patched(MEMORY_CARD_PATCH)
        self.verifies_on_new_code = self._patched(VERIFY_ON_NEW_CODE_PATCH)
        self.subgoals_reserve_slices = self._patched(SUBGOAL_SLICES_PATCH)
        self.looks_around_commands = self._patched(OWN_CHANGES_PATCH)
        self.runs_bounded_by_nodes = self._patched(NODES_PER_RUN_PATCH)
        self.dispatches_in_passes = self._patched(DISPATCH_PASSES_PATCH)
        # Only goals that may check for drift: every other goal's history has no marker for it.
        if self.state.spec.drift_every != 0:
            self.bounds_own_calls = self._patched(OWN_CALLS_BOUNDED_PATCH)
        # Read by the tool runner from the state's patches (it has no context).
        self._patched(READ_BATCHES_PATCH)
        self._patched(READ_AHEAD_PATCH)
        self._patched(READ_COMMITS_PATCH)
        if names_mcp_tools(self.state.spec.allowed_tools):
            self.lists_mcp_tools = self._patched(MCP_TOOLS_PATCH)
        if any(TOOL_SPECS[t].risk in WRITE_RISKS for t in self.state.spec.allowed_tools if t in TOOL_SPECS):
            self.prepares_writes_here = self._patched(WRITES_PREPARED_HERE_PATCH)
        self.parks_hold_verdicts = self._patched(PARKS_HOLD_VERDICTS_PATCH)
        self.unsuccessful_goals_fail = self._patched(UNSUCCESSFUL_GOALS_FAIL_PATCH)
        # Last: histories recorded before it have the markers above in this order.
        self.schedules_lost_calls_again = self._patched(WORKER_LOSS_PATCH)

    def continue_as_new_due(self) -> bool:
        """The run should end at its next safe point: its history is long (or the server's
        current version changed), enough steps settled in it to bound its replay, or its
        plan grew past what its workflow task timeout lets a replay take."""
        spec = self.state.spec
        if self.runs_bounded_by_nodes:
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
        return max(goal_task_timeout(len(self.state.nodes)), workflow.info().task_timeout)

    def _patched(self, patch: str) -> bool:
        """`workflow.patched`, once per chain of runs: a run continued from one that had the
        patch has it too (its carried state, its input, says so) and records no marker of
        its own, so a run's events go to its work. So does a run with the baseline, for every
        change the baseline stands for. A run whose input names no patches (the first, or one
        carried by older code) asks the SDK, marker and all."""
        on = patch in self._carried_patches or patched_here(self.state, patch)
        if on and patch not in self.state.patches:
            self.state.patches.append(patch)
        return on

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
            self.tell_child(child_id, Abort(request_id="stop-by-parent", reason=why[:300], rollback=rollback))

    def subgoal_ended(self, outcome: SubgoalOutcome) -> None:
        """A child said how it ended (or its handle did): kept for its node, which runs again."""
        if any(child == outcome.child_id for _, child in self.children()):
            self.state.subgoal_outcomes.setdefault(outcome.child_id, outcome)
            self.wake()

    def ran(self) -> frozenset[str]:
        """The statuses a rewind or narrow acts on in this run."""
        return STARTED if self.void_reaches_waits else RAN

    def suspends(self, node: Node) -> bool:
        """Whether this node's waits end its task (the wait is state) or hold it."""
        if node.kind == "tool":
            return self.waits_are_state
        return node.kind == "agent" and self.agent_waits_are_state

    def tools(self) -> Mapping[str, ToolSpec]:
        """The goal's tool table: the built-in tools and those of its MCP catalogue."""
        catalogue = self.state.mcp
        if self._tools is None or self._tools[0] is not catalogue:
            self._tools = (catalogue, tool_table(catalogue.tools.values() if catalogue is not None else ()))
        return self._tools[1]

    def mcp_tools(self, names: list[str]) -> list[McpTool]:
        """The catalogue entries of those of `names` that come from MCP servers."""
        catalogue = self.state.mcp
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
            output = self.state.nodes[dep].output
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
            self._index = NodeIndex(state.plan, state.nodes)
        return self._index

    def set_status(self, node: Node, status: NodeStatus) -> None:
        settles = status in TERMINAL and node.status != status
        self.index().set_status(node, status)
        if settles:
            self.metrics.add(metrics.NODES_SETTLED, 1, kind=node.kind, outcome=status)
        if self.on_status is not None:
            self.on_status(node)

    def log_gate(self, entry: str) -> None:
        log = self.state.gate_log
        log.append(entry)
        del log[:-GATE_LOG_ENTRIES]
        if self.on_gate is not None:
            self.on_gate(entry)

    def stop_point(self, node: Node) -> None:
        """A safe point of a node's work: a node told to stop ends here."""
        if node.name in self.stopping:
            raise NodeStopped(f"stopped before its next step: {self.state.abort_reason or 'its work was voided'}")

    async def ask(
        self, node: Node, question: Question, status: NodeStatus = "blocked", *, suspend: bool = False
    ) -> str:
        """Ask a person and block this node (only) until the answer comes. A question
        asked before (the node runs again after its answer) returns that answer.

        With `suspend` the wait is state, not a coroutine: the node's task ends here and
        the scheduler runs the node again once the question is answered, in this run or
        a later one (continue-as-new does not wait for a person). Without it the node
        waits inside its task (goals recorded before the waits were state; see `suspends`)."""
        self.stop_point(node)
        if question.status == "answered":
            return question.answer or ""
        if question.status == "open" and all(q.id != question.id for q in self.state.questions):
            self.state.questions.append(question)
        self.set_status(node, status)
        self.wake()  # the loop re-judges the phase: the goal may now await a person
        if suspend:
            node.waiting_on = question.id
            raise NodeWaiting(f"waiting for the answer to {question.id}")
        await workflow.wait_condition(lambda: question.status == "answered")
        self.set_status(node, "running")
        return question.answer or ""

    def question_about(self, node: Node, effect_key: str, topic: str) -> Question | None:
        """The card this node already asked about this effect (it runs again after an answer)."""
        for question in reversed(self.state.questions):
            if question.status == "closed":
                continue  # closed when its step was voided or left out: ask again
            if question.topic == topic and question.effect_key == effect_key and node.name in question.nodes:
                return question
        return None


def short_key(key: str | None) -> str:
    """A node key as activity summaries show it."""
    return (key or "").removeprefix("node:")[:12]
