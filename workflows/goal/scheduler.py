"""The task graph at work: which ready nodes start (past the spend gates), how a node
is dispatched (reused by key, joined to a twin in flight, or run by its kind's
runner), how its outcome settles it and its twins, and how plan changes void,
cancel and adopt nodes.

Workflow code. Node tasks are asyncio tasks of the workflow; none is in flight at
continue-as-new (a node waiting for a person or parked has none: its wait is state),
so only the twins index is rebuilt from the state as a run starts. What a node of each kind does is in
nodes/; this room only starts it and records the outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, FailureError, TemporalError

from perdure.workflows.goal.context import GoalContext, NodeFailed, NodeStopped, NodeWaiting
from perdure.workflows.goal.contracts.goal_contracts import Usage
from perdure.workflows.goal.contracts.messages import PARENT_STOP, Abort
from perdure.workflows.goal.contracts.plan import Plan, PlanStep
from perdure.workflows.goal.contracts.state import Node, PlanDiff, PlanVersion, RetiredNode
from perdure.workflows.goal.decision_log import plan_adopted
from perdure.workflows.goal.device_placement import Devices
from perdure.workflows.goal.goal_memory import GoalMemoryRoom
from perdure.workflows.goal.nodes import NodeRunner
from perdure.workflows.goal.rules import approvals_ahead, frontier, questions, risk_order
from perdure.workflows.goal.rules.node_index import plan_graph
from perdure.workflows.goal.spend import Spend
from perdure.workflows.goal.tool_runner import failure_message
from perdure.workflows.shared import graph
from perdure.workflows.shared.statuses import IN_FLIGHT, NodeStatus

# The most nodes started in one workflow task (over all its passes); the rest start in the
# next, after a 1 ms timer. A remote write's ScheduleActivityTask command is about 1 KB, so 5,000 writes
# ready at once made a completion past Temporal's 4 MB gRPC limit, which the server fails,
# every retry alike (tests/test_wide_fanout.py); and each node's bookkeeping is a fraction
# of a millisecond, so this bounds a task's work well inside the SDK's 2 s deadlock limit.
STARTS_PER_TASK = 500


def fails_the_workflow_task(err: Exception) -> bool:
    """The SDK's own errors about the workflow code, not about a node's work
    (NondeterminismError and the sandbox's restrictions, a read-only context, a call
    outside the workflow's event loop): Temporal errors that are no failure of an
    activity, child or application. They must fail the workflow task, never a node."""
    return isinstance(err, TemporalError) and not isinstance(err, FailureError)


def failure_text(err: Exception) -> str:
    """What a node that raised `err` shows as its error: an application error's message
    and type, a Temporal failure's message, else the exception's type and text."""
    if isinstance(err, ActivityError):
        return failure_message(err)
    if isinstance(err, ApplicationError):
        return f"{err.message} ({err.type})" if err.type else err.message
    if isinstance(err, FailureError):
        return err.message
    return f"{type(err).__name__}: {err}"


class Scheduler:
    def __init__(
        self,
        ctx: GoalContext,
        spend: Spend,
        runners: Mapping[str, NodeRunner],
        publish: Callable[[], None],
        devices: Devices,
    ) -> None:
        self._ctx = ctx
        self._spend = spend
        self._devices = devices
        self._runners = runners
        self._publish = publish
        # In-flight node tasks, so a rewind, narrow or abort can cancel them.
        self._tasks: dict[str, asyncio.Task] = {}
        # Key -> nodes waiting on the in-flight run of that key (they share its outcome).
        # An index, checked against the nodes on every use, so a stale entry is harmless;
        # it spares a scan of every node per dispatch and per settled node.
        self._followers: dict[str, list[str]] = {}
        self._owners: dict[str, str] = {}  # key -> the node whose task runs it
        self._stopped_children: set[str] = set()  # subgoal nodes already asked to stop
        self._next_pass: asyncio.Task | None = None  # the timer after which a full task's rest starts
        self._task_starts = (0, 0)  # (history length when the workflow task started, nodes it started)
        self._workflow_task_error: Exception | None = None
        # Nodes voided while a write of theirs was in flight: reset once it settles.
        self._void_after_settle: set[str] = set()
        # Nodes a re-plan on evidence lets finish and discards (planner.py): they settle void.
        self._discarding: set[str] = set()
        # Recall before an llm or agent step, episodic memories as steps settle, the end card.
        self._memory = GoalMemoryRoom(ctx)

    def materialise_nodes(self) -> None:
        state = self._ctx.state
        steps = self._ctx.plan().steps
        if frontier.is_large(len(steps)):
            return  # a large goal's step gets its node when it is touched (GoalContext.node)
        for step in steps:
            if step.name not in state.nodes:
                state.nodes[step.name] = Node(name=step.name, kind=step.kind, needs=list(step.needs))

    def adopt_carried_twins(self) -> None:
        """As a run starts: a twin carried from the last run still shares its owner's
        outcome (the owner was waiting for a person when the goal continued as new)."""
        nodes = self._ctx.state.nodes
        for name in self._ctx.index().names(IN_FLIGHT):
            node = nodes[name]
            if node.key is None:
                continue
            if node.reused and node.status == "running":
                self._followers.setdefault(node.key, []).append(name)
            elif not node.reused:
                self._owners[node.key] = name

    def starting_in_next_task(self) -> bool:
        """Ready nodes wait for the next workflow task (this one started STARTS_PER_TASK):
        the loop waits for the timer's wake-up, as for work in flight."""
        return self._next_pass is not None and not self._next_pass.done()

    def busy(self) -> bool:
        """Work that holds the goal in this run: a node's task, or a twin sharing one.
        A node waiting for a person, or parked, has no task: it is state, carried."""
        return bool(self._tasks)

    def resume_waiting(self) -> None:
        """Run again every node whose question was answered (in this run or an earlier
        one), and every parked node without a task, since the goal runs again."""
        state = self._ctx.state
        answered = {q.id for q in state.questions if q.decided}
        for name in self._ctx.index().names(("blocked", "uncertain", "parked")):
            node = state.nodes[name]
            if name in self._tasks:
                continue
            if node.status == "parked" or node.waiting_on in answered:
                self._resume(node)
        for name, child in self._ctx.children():
            if child in state.subgoal_outcomes and name not in self._tasks:
                self._resume(state.nodes[name])  # it takes how its child ended and settles
        for name in self._ctx.index().names(("offline",)):
            node = state.nodes[name]
            if name in self._tasks:
                continue
            verdict = self._devices.verdict(node)
            if verdict == "resume":
                self._resume(node)
            elif verdict == "skip":
                self._devices.forget(name)
                node.waiting_on = None
                self._ctx.set_status(node, "abandoned")
                node.error = "skipped by a person while its device was offline"
                node.finished_at = workflow.now()
                self._abandon_downstream(name)
                self._ctx.wake()

    def _resume(self, node: Node) -> None:
        node.waiting_on = None
        self._ctx.set_status(node, "running")
        node.runs += 1
        step = self._ctx.plan().step(node.name)
        self._tasks[node.name] = asyncio.create_task(self._run_node(step, node, node.runs))

    def dispatch_ready(self) -> None:
        """Start every ready node the open questions do not hold, the risk order does not
        hold back (workflows/goal/rules/risk_order.py) and the gates admit."""
        state = self._ctx.state
        if state.evidence.pending is not None:
            return  # a re-plan on evidence waits for the steps it lets finish: nothing starts under the old plan
        held = {name for q in state.open_questions() for name in q.hold}
        committed = self._spend.new_pass()
        index = self._ctx.index()
        order = risk_order.OrderPass(
            risk_order.risk_facts(self._ctx.plan(), self._ctx.tools()),
            index.ready(),
            index.names(IN_FLIGHT),
            lambda name: self._ctx.index().status_of(name),
        )
        for name in order.order():
            step = self._ctx.plan().step(name)
            if name in held:
                continue
            if self._held_back(order, name):
                continue
            if self._task_is_full():
                break  # before the gate, which logs what it decides
            admission = self._spend.admit(step, committed)
            if admission.action == "stop":
                self._stop_node(name, admission.reason)
            if admission.action != "run":
                continue
            self._dispatch(step)
            risk_order.record_start(state.nodes[name].placements, workflow.now())
            if state.nodes[name].status in IN_FLIGHT:
                self._count_start()
                # Now in flight: reserve its P80 for the next step's gate.
                self._spend.reserve(committed, step.kind, estimate=self._spend.estimate_of(step, committed))
                order.claim(name)

    def _task_is_full(self) -> bool:
        """STARTS_PER_TASK nodes started in this workflow task: the rest start in the
        next, after a 1 ms timer."""
        length, started = self._task_starts
        if length != workflow.info().get_current_history_length() or started < STARTS_PER_TASK:
            return False
        if self._next_pass is None or self._next_pass.done():
            self._next_pass = asyncio.create_task(self._wake_after_a_timer())
        return True

    def _count_start(self) -> None:
        # A workflow task's passes share its count: local activities resolving in the task
        # wake the loop for more passes before it completes (a new task, a new history length).
        length, started = self._task_starts
        now = workflow.info().get_current_history_length()
        self._task_starts = (now, started + 1 if length == now else 1)

    async def _wake_after_a_timer(self) -> None:
        await workflow.sleep(timedelta(milliseconds=1))
        self._ctx.wake()

    def _held_back(self, order: risk_order.OrderPass, name: str) -> bool:
        """Whether the risk order makes `name` wait this pass; the decision is kept on
        the node (state: continue-as-new and replay keep it, `status --why` shows it)."""
        node = self._ctx.node(name)
        hold = order.hold(name)
        if hold is None:
            return False
        if hold[0] not in node.placements:
            # Decided once per hold, not on every pass that keeps it.
            self._ctx.decide("gate", f"{name}: held back by the risk order: {hold[1]}", about=[name])
        risk_order.record_hold(node.placements, *hold, workflow.now())
        # In line for its targets: a later writer of the same ones waits behind it.
        order.claim(name)
        return True

    def adopt_plan(self, plan: Plan, source: str, reason: str) -> PlanDiff:
        """Make `plan` current. Unchanged steps keep their nodes; changed or removed ones
        leave the node table (cancelled if in flight), what they did kept as retired
        work; finished work is reused by key."""
        assert not self._ctx.stored, "stored work is restored before a plan changes (workflows/goal/past.py)"
        state = self._ctx.state
        old = {s.name: s for s in self._ctx.plan().steps}
        added = [s.name for s in plan.steps if s.name not in old or old[s.name] != s]
        removed = [name for name in old if name not in {s.name for s in plan.steps}]
        version = len(state.plan_versions)
        for name in added + removed:
            task = self._tasks.pop(name, None)
            if task is not None:
                task.cancel()
            node = state.nodes.get(name)
            if node is not None:
                self._retire(node, version)
                del state.nodes[name]
        diff = PlanDiff(added=added, removed=removed)
        self.record_plan_version(source, reason, diff, plan)
        self.materialise_nodes()
        self._release_orphaned_twins()
        self.ask_approvals_ahead()
        return diff

    def ask_approvals_ahead(self) -> None:
        """At each adoption: one card for the plan's irreversible steps no approval given
        covers. Nothing waits for it but those steps, when their turn comes (EffectGuard). A
        card still open from the plan before stands if it lists the same; else it is replaced,
        and its steps still waiting wait for the new card (or run on, if it lists them no more)."""
        state, plan = self._ctx.state, self._ctx.plan()
        on_devices = self._devices.approvals_ahead(plan.steps)
        listed = approvals_ahead.to_list(state, plan, self._ctx.tools(), on_devices)
        before = approvals_ahead.open_card(state)
        if before is not None and approvals_ahead.same_list(before, listed):
            return
        card = questions.approvals_ahead(state, workflow.now(), listed) if listed else None
        if card is not None:
            state.questions.append(card)
        if before is not None:
            before.status, before.answered_at = "closed", workflow.now()
            instead = f"; its steps are asked on {card.id}" if card is not None else ""
            before.answer_text = f"not needed: plan v{len(state.plan_versions)} was adopted{instead}"
            on_card = {a.step for a in card.ahead} if card is not None else set()
            for node in list(state.nodes.values()):
                if node.waiting_on != before.id or node.name in self._tasks:
                    continue
                if node.name in on_card:
                    node.waiting_on = card.id
                else:
                    self._resume(node)
        if card is not None or before is not None:
            self._ctx.wake()

    def tidy_ahead_card(self) -> None:
        """The open approvals-ahead card, kept to what still needs a person: a step listed only
        for its device leaves it once that device's own rules say its calls ask nobody (they
        are not known at adoption); a card with no step left to run (they failed, were given up,
        ran where nobody is asked) is closed: it must not keep the goal waiting."""
        state = self._ctx.state
        card = approvals_ahead.open_card(state)
        if card is None:
            return
        tools = self._ctx.tools()
        kept = [
            a
            for a in card.ahead
            if a.on is None or (a.tool in tools and tools[a.tool].risk == "irreversible") or self._devices.asks(a)
        ]
        if kept and len(kept) < len(card.ahead):
            card.ahead = kept
            card.title, card.stuck = questions.ahead_text(kept)
        if not kept or approvals_ahead.unneeded(state) is not None:
            card.status, card.answered_at = "closed", workflow.now()
            card.answer_text = "not needed: none of its steps is left to run where a person is asked"

    def _retire(self, node: Node, version: int) -> None:
        """Keep a node plan v`version` had and the next one leaves out, unless it never
        started: whatever ran, failed or was given up stays in the report and the outcome."""
        if node.status == "pending":
            return
        self._devices.forget(node.name)
        if node.status in ("running", "blocked", "parked", "offline"):
            # Cut off by the plan change. An uncertain node stays uncertain: its effect may have happened.
            self._ctx.set_status(node, "abandoned")
            node.error, node.finished_at = f"left out by plan v{version + 1} while it ran", workflow.now()
        if node.status != "uncertain":
            self._close_questions_of(node, f"step '{node.name}' was left out by plan v{version + 1}")
        self._ctx.state.retired_nodes.append(RetiredNode(node=node, plan_version=version, dropped_by=version + 1))

    def _close_questions_of(self, node: Node, why: str) -> None:
        """Nobody is left to act on the answer: an open question would keep the goal
        waiting. Whether an effect happened is still asked (a rollback needs it)."""
        for question in self._ctx.state.open_questions():
            if node.name in question.nodes and question.topic != "uncertain_effect":
                question.status, question.answered_at = "closed", workflow.now()
                question.answer_text = f"not needed: {why}"

    def record_plan_version(
        self,
        source: str,
        reason: str,
        diff: PlanDiff,
        plan: Plan | None = None,
        who: str | None = None,
        about: Sequence[str] = (),
    ) -> None:
        """A new plan version, in the state and in the decision log (`who`: the person whose
        message made it; `about`: the steps it is about beyond those it changed)."""
        versions = self._ctx.state.plan_versions
        version = PlanVersion(
            version=len(versions) + 1, plan=plan or self._ctx.plan(), reason=reason, source=source, diff=diff
        )
        versions.append(version)
        plan_adopted(self._ctx, version, who, about)

    def void(self, names: list[str]) -> None:
        """Reset void work to pending, cancelling it if in flight; its cached output
        is forgotten so it runs again. Abandoned work downstream may run again too."""
        index = self._ctx.index()
        assert not any(map(index.is_stored, names)), "stored work is restored before it is voided (past.py)"
        reset = set(names)
        for name in names:
            reset.update(d for d in graph.downstream(self._ctx.plan(), name) if index.status_of(d) == "abandoned")
        for name in reset:
            node = self._ctx.node(name)
            if self._ctx.writes_in_flight.get(name):
                # Never cut off a write: the node stops after it settles, then is reset.
                self._ctx.stopping.add(name)
                self._void_after_settle.add(name)
                continue
            self._reset(node)
        self._release_orphaned_twins()

    def _release_orphaned_twins(self) -> None:
        """A node sharing a twin's work that was voided or left out has nobody to wait on
        now: back to pending, so it runs on its own. A twin waiting for a person (no
        task, still in flight) is still its owner."""
        nodes = self._ctx.state.nodes
        owners = {n.key for n in nodes.values() if not n.reused and n.status in IN_FLIGHT}
        for node in nodes.values():
            if node.status == "running" and node.reused and node.name not in self._tasks and node.key not in owners:
                self._ctx.set_status(node, "pending")
                node.key, node.reused = None, False

    def _reset(self, node: Node) -> None:
        """Back to pending, its task cancelled and its cached output forgotten; what it
        was waiting for a person about is closed (it runs again and asks anew)."""
        state = self._ctx.state
        self._close_questions_of(node, f"step '{node.name}' was voided and runs again")
        for name, child in self._ctx.children():
            if name == node.name:  # its child's work is void too: it is asked to stop, not rolled back
                stop = Abort(
                    request_id=PARENT_STOP, reason=f"step '{name}' was voided", rollback=False, by="parent goal"
                )
                self._ctx.tell_child(child, stop)
        node.child = None
        if node.key and state.outputs_by_key.get(node.key) == node.output:
            state.outputs_by_key.pop(node.key, None)
        task = self._tasks.pop(node.name, None)
        if task is not None:
            task.cancel()
        self._discarding.discard(node.name)
        self._ctx.set_status(node, "pending")
        node.output, node.preview, node.error, node.key, node.reused = None, "", None, None, False
        node.waiting_on, node.agent = None, None
        self._devices.forget(node.name)

    def cancel_nodes(self, names: list[str], why: str) -> None:
        """Cut off the work of these nodes, which has no effect of its own in flight: those
        with a task are abandoned (a node waiting with no task is left to the plan change)."""
        nodes = self._ctx.state.nodes
        for name in names:
            task = self._tasks.pop(name, None)
            if task is None:
                continue
            task.cancel()
            node = nodes[name]
            self._ctx.set_status(node, "abandoned")
            node.error, node.finished_at = why, workflow.now()

    def let_finish(self, names: list[str]) -> None:
        """These nodes have an effect of their own in the air: they go on until it has
        landed (told to stop at their next safe point after it) and settle void, what they
        did kept on the node (`_discard`)."""
        self._discarding.update(names)
        self._ctx.stopping.update(names)

    def finishing(self, names: list[str]) -> list[str]:
        """Those of these nodes let finish that still have work in flight."""
        return [name for name in names if name in self._discarding and name in self._tasks]

    def end_discarding(self, names: list[str]) -> None:
        for name in names:
            self._discarding.discard(name)
            self._ctx.stopping.discard(name)

    def cancel_in_flight(self, why: str) -> None:
        """Stop all work: cancel every node's task except those with a write in flight,
        which are told to stop once it settles (the goal waits for them)."""
        settling = {name for name in self._tasks if self._ctx.writes_in_flight.get(name)}
        for name, task in list(self._tasks.items()):
            if name not in settling:
                task.cancel()
                del self._tasks[name]
        self._ctx.stopping |= settling
        # A subgoal is asked to stop (with rollback when the goal rolls back) and waited for.
        children = {name for name, _ in self._ctx.children()}
        if children - self._stopped_children:
            pause = self._ctx.state.pause
            self._ctx.stop_children(why, rollback=pause.mode == "aborting" and pause.rollback, join=None)
            self._stopped_children |= children
        nodes = self._ctx.state.nodes
        for name in self._ctx.index().names(IN_FLIGHT):
            node = nodes[name]
            if name in settling or name in children:
                continue
            self._ctx.stopped_by_abort.setdefault(name, node.status)  # what the abort's status lists as stopped
            if node.status == "uncertain":
                # Its effect may have happened: say so, never "aborted" or "not run".
                node.error = f"{why}; whether its effect happened is unknown"
            else:
                self._ctx.set_status(node, "abandoned")
                node.error = why
            node.finished_at = workflow.now()

    def close_stopped_children(self, why: str) -> None:
        """While the goal stops: the subgoals that have said how they ended settle as
        abandoned (what they spent charged), the others are still waited for."""
        outcomes = self._ctx.state.subgoal_outcomes
        for name, child in self._ctx.children():
            outcome = outcomes.pop(child, None)
            if outcome is None:
                continue
            node = self._ctx.state.nodes[name]
            if outcome.result is not None and (outcome.result.tokens or outcome.result.cost_usd):
                self._spend.charge(Usage(output_tokens=outcome.result.tokens, cost_usd=outcome.result.cost_usd), node)
            node.waiting_on = None
            self._ctx.set_status(node, "abandoned")
            ended = outcome.result.outcome if outcome.result is not None else "without a result"
            node.error = f"{why}; its subgoal {child} ended {ended}"
            node.finished_at = workflow.now()

    def stop_pending(self, why: str) -> list[str]:
        """An emergency stop: every pending step but the wrap-up ones will not run; they
        are abandoned with the reason, and the wrap-up steps they held become ready. A large
        goal's steps that have no node are abandoned without one (GoalState.stopped_untouched:
        counted as closing.py counts the steps that never started, not made a node each)."""
        state, plan, index = self._ctx.state, self._ctx.plan(), self._ctx.index()
        large = frontier.is_large(len(plan.steps))
        if large:
            pending = {name for name, node in state.nodes.items() if node.status == "pending"}
            pending.update(w for w in plan_graph(plan).wrap_up if index.status_of(w) == "pending")
            names = sorted(pending, key=index.position)
        else:
            names = index.names(("pending",))
        wrap_up = []
        for name in names:
            node = self._ctx.node(name)
            if plan.step(name).wrap_up:
                wrap_up.append(name)
            else:
                self._ctx.set_status(node, "abandoned")
                node.error = f"not started: {why}"
        if large:
            state.stopped_untouched = f"not started: {why}"
            self._ctx.index().abandon_untouched()
        return wrap_up

    def dispatch_wrap_up(self) -> None:
        """After an emergency stop: start the wrap-up steps that are ready, past every gate."""
        plan = self._ctx.plan()
        for name in self._ctx.index().ready():
            if plan.step(name).wrap_up:
                self._dispatch(plan.step(name))

    def _stop_node(self, name: str, reason: str) -> None:
        node = self._ctx.node(name)
        self._ctx.set_status(node, "abandoned")
        node.error = reason
        self._ctx.log_gate(f"{name}: {reason}", about=[name])
        self._abandon_downstream(name)

    def _dispatch(self, step: PlanStep) -> None:
        state = self._ctx.state
        node = self._ctx.node(step.name)
        deps = {dep: ref.digest for dep, ref in self._ctx.inputs(step).items()}
        node.key = graph.node_key(step, deps, state.premises)
        node.started_at = workflow.now()
        node.runs += 1
        cached = state.outputs_by_key.get(node.key)
        if cached is not None:
            # Same kind, input and dependency outputs as finished work: reuse it.
            node.output, node.reused, node.finished_at = cached, True, node.started_at
            self._ctx.set_status(node, "succeeded")
            return
        self._ctx.set_status(node, "running")
        owner = self._owners.get(node.key)
        if owner is not None and owner != node.name and self._in_flight_run_of(owner, node.key):
            # The same work is in flight: share its outcome instead of paying twice.
            node.reused = True
            self._followers.setdefault(node.key, []).append(node.name)
            return
        self._owners[node.key] = node.name
        self._tasks[step.name] = asyncio.create_task(self._run_node(step, node, node.runs))

    def _in_flight_run_of(self, name: str, key: str) -> bool:
        node = self._ctx.state.nodes.get(name)
        return node is not None and node.key == key and node.status == "running" and not node.reused

    async def _run_node(self, step: PlanStep, node: Node, run: int) -> None:
        try:
            if self._memory.wants_recall(step, node):
                # Driven by the scheduler, not the model: the memories go into its input.
                await self._memory.recall(step, node)
            output, preview = await self._runners[step.kind].run(step, node)
        except asyncio.CancelledError:
            # Voided or aborted while in flight; whoever cancelled it set its status.
            return
        except NodeWaiting:
            # Waiting for a person is state (node.waiting_on): no task holds it, so the
            # goal may continue as new meanwhile; `resume_waiting` runs it again.
            if self._tasks.get(node.name) is asyncio.current_task():
                del self._tasks[node.name]
            self._publish()
            return
        except (ActivityError, NodeFailed, NodeStopped) as err:
            if node.runs != run or node.status != "running":
                return  # an outcome for work that was voided meanwhile
            if self._settled_after_void(node):
                pass
            elif node.name in self._discarding:
                if isinstance(err, NodeStopped) and not err.uncertain:
                    self._discard(node, "invalidated", f"discarded after its effects settled ({err})")
                else:
                    status = "uncertain" if isinstance(err, NodeStopped) else "failed"
                    self._discard(node, status, failure_message(err) if isinstance(err, ActivityError) else str(err))
            elif isinstance(err, NodeStopped):
                self._ctx.set_status(node, "uncertain" if err.uncertain else "abandoned")
                node.error = str(err)
            else:
                self._fail(node, failure_message(err) if isinstance(err, ActivityError) else str(err))
        except Exception as err:
            # Anything else the node's work raised: a local activity that failed for good
            # (a read in a read segment) arrives as its ApplicationError, not an
            # ActivityError; so does a bug in a runner. Left to end the task, it would leave
            # the node running forever, the error only in the worker's log.
            if fails_the_workflow_task(err):
                self._workflow_task_error = self._workflow_task_error or err
                self._ctx.wake()
                return
            if node.runs != run or node.status != "running":
                return
            if self._settled_after_void(node):
                pass
            elif node.name in self._discarding:
                self._discard(node, "failed", failure_text(err))
            else:
                self._fail(node, failure_text(err))
        else:
            if node.runs != run or node.status != "running":
                return
            if self._settled_after_void(node):
                pass
            elif node.name in self._discarding:
                # Kept on the node, never cached by key: nothing reuses a discarded output.
                node.output, node.preview = output, preview
                self._discard(node, "invalidated", "its output is discarded: it was let finish by a re-plan")
            else:
                assert node.key is not None
                self._ctx.state.outputs_by_key[node.key] = output
                for settled in self._sharing(node):
                    # Output first: a dependant made ready by this status reads it.
                    settled.output, settled.preview = output, preview
                    self._ctx.set_status(settled, "succeeded")
        self._memory.settled(node)
        # Not in a `finally`: on worker eviction the coroutine is closed and
        # must not touch workflow state on its way out.
        self._finish(node)

    def _finish(self, node: Node) -> None:
        self._ctx.settled_this_run += 1
        self._tasks.pop(node.name, None)
        node.agent = None  # a settled node's loop is over
        node.finished_at = self._ctx.state.last_progress_at = workflow.now()
        self._spend.record_settled(node)
        self._ctx.wake()
        self._publish()

    def _settled_after_void(self, node: Node) -> bool:
        """A node voided while its write was in flight: the write settled (its effect is
        recorded), so the node is reset now and runs again under its replay policy."""
        if node.name not in self._void_after_settle:
            return False
        self._void_after_settle.discard(node.name)
        self._ctx.stopping.discard(node.name)
        self._reset(node)
        self._release_orphaned_twins()
        return True

    def _discard(self, node: Node, status: NodeStatus, error: str) -> None:
        """A node let finish by a re-plan on evidence settled: void (or failed, or uncertain,
        as its last effect ended), what it spent charged and its effects recorded as any
        node's; the new plan, adopted once every step let finish has settled, decides what
        runs in its place (an effect it finds recorded is not sent again)."""
        self._discarding.discard(node.name)
        self._ctx.stopping.discard(node.name)
        self._ctx.set_status(node, status)
        node.error = error
        self._tasks.pop(node.name, None)
        # Twins that waited on its outcome run on their own.
        self._followers.pop(node.key or "", None)
        self._release_orphaned_twins()

    def _fail(self, node: Node, error: str) -> None:
        for settled in self._sharing(node):
            self._ctx.set_status(settled, "failed")
            settled.error = error
            self._abandon_downstream(settled.name)

    def raise_workflow_task_error(self) -> None:
        """Raise, in the workflow's main coroutine, an SDK error a node's task met
        (nondeterminism, a sandbox restriction): in the node's own task it would be lost,
        and it must fail the workflow task, which Temporal retries until fixed code runs."""
        if self._workflow_task_error is not None:
            raise self._workflow_task_error

    def _sharing(self, node: Node) -> list[Node]:
        """The node plus any node that waited on the same in-flight key."""
        nodes = self._ctx.state.nodes
        names = dict.fromkeys(self._followers.pop(node.key or "", []))
        followers = [nodes[n] for n in names if nodes[n] is not node and nodes[n].key == node.key]
        followers = [n for n in followers if n.status == "running"]
        for follower in followers:
            follower.finished_at = workflow.now()
        return [node, *followers]

    def _abandon_downstream(self, failed: str) -> None:
        plan, index = self._ctx.plan(), self._ctx.index()
        for name in graph.downstream(plan, failed):
            if index.status_of(name) != "pending" or plan.step(name).wrap_up:
                continue
            blocked = self._ctx.node(name)
            if blocked.status == "pending":
                self._ctx.set_status(blocked, "abandoned")
                blocked.error = f"needs '{failed}', which failed"
