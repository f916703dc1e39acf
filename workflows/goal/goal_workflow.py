"""GoalWorkflow: the deterministic body of one goal, as a skeleton.

It plans, turns the plan into a task graph, dispatches every ready node as
activities, and always finishes with a report. The class holds the Temporal
surface (init, run, the handlers, the loop, continue-as-new); each concern
behind it is a collaborator in this package (see `__init__`), given one shared
GoalContext and no reference back to the workflow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

# Pydantic, our contracts and the goal's collaborators are deterministic and hold no
# module state; passing them through keeps the sandbox from re-importing them (and
# pydantic's machinery) for every workflow run.
with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from perdure.workflows.devices.device_contracts import DEVICE_PRESENCE_SIGNAL
    from perdure.workflows.goal.alarm import Alarm
    from perdure.workflows.goal.closing import Closing
    from perdure.workflows.goal.context import GoalContext, GoalFailed
    from perdure.workflows.goal.contracts.decision_contracts import DECISIONS_QUERY, DecisionLog
    from perdure.workflows.goal.contracts.goal_contracts import (
        GOAL_WORKFLOW,
        GoalResult,
        ProgressSnapshot,
        Queries,
        Signals,
        SubgoalOutcome,
        Updates,
    )
    from perdure.workflows.goal.contracts.messages import InboxView, Receipt
    from perdure.workflows.goal.contracts.migrations import StateFromNewerCode, StateRefused, load_state
    from perdure.workflows.goal.contracts.state import GoalInput, GoalState, UndecryptedInput
    from perdure.workflows.goal.decision_log import DecisionLogRoom
    from perdure.workflows.goal.device_placement import Devices
    from perdure.workflows.goal.effect_guard import EffectGuard
    from perdure.workflows.goal.inbox import Inbox
    from perdure.workflows.goal.lost_workers import LostWorkers
    from perdure.workflows.goal.model_calls import ModelCalls
    from perdure.workflows.goal.nodes import NodeDeps, node_runners
    from perdure.workflows.goal.past import Past
    from perdure.workflows.goal.pause import Pause
    from perdure.workflows.goal.planner import Planner
    from perdure.workflows.goal.publisher import Publisher
    from perdure.workflows.goal.question_deadlines import QuestionDeadlines
    from perdure.workflows.goal.rules.forking import FORK_POINT_QUERY, ForkPoint, ForkPointInput, fork_point
    from perdure.workflows.goal.scheduler import Scheduler
    from perdure.workflows.goal.spend import Spend, same_moment
    from perdure.workflows.goal.steering import Steering
    from perdure.workflows.goal.stream import EventStream
    from perdure.workflows.goal.tool_runner import ToolRunner
    from perdure.workflows.goal.unreadable import refuse_undecrypted
    from perdure.workflows.goal.verification import Verifier
    from perdure.workflows.goal.verify_due import note_code_version, note_wait_ended
    from perdure.workflows.shared import metrics
    from perdure.workflows.shared.run_boundary import continue_on_current_version
    from perdure.workflows.shared.statuses import IN_FLIGHT

# What a subgoal_settled signal sent with no argument is given (a RawValue that decodes to nothing).
NO_OUTCOME = RawValue(Payload())
# A goal parked because a stored chunk could not be read asks again after this long (pause.py),
# when the chunk was one of its settled steps (the loop runs). Parked because its plan could
# not be read as a run starts, it waits for a message only (`_load_past`): a resume tries
# again, an abort ends it; no expiry question, which only the loop could take an answer to.
UNREADABLE_EXPIRY = timedelta(hours=48)


class _AbortedUnloaded(Exception):
    """Aborted while parked because its stored plan could not be read: nothing of it ran."""


# A ValidationError raised by workflow code means data this code cannot accept (a
# model's plan or a carried field that does not validate): retrying the workflow task
# would fail the same way forever, so the goal fails with the message instead.
@workflow.defn(name=GOAL_WORKFLOW, failure_exception_types=[ValidationError])
class GoalWorkflow:
    @workflow.init
    def __init__(self, input: GoalInput) -> None:
        # An input this worker cannot decrypt (runtime/converter.py): nothing else is set
        # up; the run ends at once (workflows/goal/unreadable.py).
        self._undecrypted = input if isinstance(input, UndecryptedInput) else None
        if self._undecrypted is not None:
            return
        self._load_problem: str | None = None
        self._newer_state: StateFromNewerCode | None = None
        state = self._load(input)
        state.started_at = state.started_at or workflow.now()
        # Bumped when a node settles or a message arrives; the loop waits on it.
        self._wakeups = 0
        ctx = GoalContext(state, workflow.info().workflow_id, self._wake)
        self._ctx = ctx
        self._decisions = DecisionLogRoom(ctx)
        self._past = Past(ctx)
        ctx.on_settled, ctx.restore_past = self._past.settled, self._past.restore
        self._pause = Pause(ctx)
        self._past.on_unreadable = self._park_unreadable
        if self._load_problem:
            self._pause.park(self._load_problem, None, timedelta(days=3650))
        self._inbox = Inbox(ctx, self._load_problem)
        self._spend = Spend(ctx, self._pause)
        self._pause.on_resume = self._spend.judge_at_resume
        self._events = EventStream(ctx, input.stream)
        ctx.on_status, ctx.on_gate, ctx.on_receipt = (
            self._events.on_status,
            self._events.on_gate,
            self._events.on_receipt,
        )
        self._publisher = Publisher(ctx, self._spend, self._events)
        lost = LostWorkers(ctx, self._spend)
        calls = ModelCalls(ctx, self._inbox, self._spend, lost)
        self._devices = Devices(ctx)
        tools = ToolRunner(state, self._devices, ctx.tools, lost, self._spend.charge_tool)
        self._pause.run_check = tools.check
        self._guard = EffectGuard(ctx, tools, self._devices, self._spend)
        runners = node_runners(NodeDeps(ctx, calls, self._guard, tools, self._pause, self._spend))
        self._scheduler = Scheduler(ctx, self._spend, runners, self._publisher.publish, self._devices)
        self._planner = Planner(ctx, calls, self._scheduler, self._inbox, self._devices, self._spend)
        self._steering = Steering(ctx, self._inbox, self._pause, self._scheduler)
        self._deadlines = QuestionDeadlines(ctx, self._pause, self._steering.act_on)
        self._verifier = Verifier(ctx, self._scheduler, calls)
        self._closing = Closing(ctx, self._publisher.publish, self._past.close)
        self._alarm = Alarm()
        self._clock: asyncio.Task | None = None
        self._question_clock: asyncio.Task | None = None
        self._alarm_task: asyncio.Task | None = None

    def _load(self, input: GoalInput) -> GoalState:
        fresh = GoalState(spec=input.spec, premises=dict(input.spec.premises))
        if input.state is None:
            # A fork's reused work is found by key like the goal's own (workflows/goal/scheduler.py).
            fresh.outputs_by_key = dict(input.spec.reuse_outputs)
            return fresh
        try:
            return load_state(input.state)
        except StateFromNewerCode as err:
            # Raised again as the run starts (an exception out of __init__ leaves the SDK's
            # run coroutine dangling): it fails this workflow task, which is retried until
            # a worker with the newer code takes the run. Nothing is decided meanwhile.
            self._newer_state = err
            return fresh
        except StateRefused as err:
            # Never continue with a state this code cannot read: park, say why, keep it for audit.
            self._load_problem = f"cannot resume from the carried state: {err}"
            return GoalState(spec=input.spec, premises=dict(input.spec.premises), phase="parked")

    @workflow.run
    async def run(self, input: GoalInput) -> GoalResult:
        if self._undecrypted is not None:
            raise refuse_undecrypted(self._undecrypted)
        if self._newer_state is not None:
            raise self._newer_state
        state = self._ctx.state
        if self._load_problem:
            return await self._refuse_to_resume()
        loaded = await self._load_past()
        if input.state is not None:
            note_wait_ended(state, state.last_progress_at, "continued as new")
        else:
            self._ctx.metrics.add(metrics.GOALS_STARTED, 1)
        self._spend.mark_activity(True)  # planning, or resuming work carried over
        self._clock = asyncio.create_task(self._budget_clock())
        self._question_clock = asyncio.create_task(self._deadlines.clock())
        self._alarm_task = asyncio.create_task(self._alarm.run())
        try:
            if not loaded:
                raise _AbortedUnloaded
            if state.plan is None:
                await self._planner.make_plan()
                self._scheduler.ask_approvals_ahead()
            await self._past.prepare()
            self._scheduler.materialise_nodes()
            self._scheduler.adopt_carried_twins()
            self._devices.watch()
            state.phase = "running"
            self._publisher.publish()
            await self._run_graph()
        except GoalFailed as err:
            state.failure = str(err)
        except _AbortedUnloaded:
            # Nothing of this run's plan ran, but earlier runs' effects may be asked to be
            # undone: their records are carried in the state, and undoing needs no plan.
            if state.pause.rollback:
                await self._guard.roll_back(self._events.abort_changed)
            self._pause.abort_achieved()
        self._inbox.close()
        result = await self._closing.report()
        # A goal in which no step succeeded failed with a reason of its own (closing.py).
        failure = result.failure if result.outcome == "failed" else state.failure
        self._events.ended(result.outcome, failure, result.report.digest)
        await self._tell_parent(result)
        # Updates still waiting for a receipt get it before the goal closes; a subscriber's
        # poll is let go (it reads the rest by query).
        self._events.release_subscribers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._closing.fails_workflow(result):
            # The report travels in the failure's details: `perdure result` and a parent goal read it there.
            message = result.failure or result.outcome
            raise ApplicationError(message, result.model_dump(mode="json"), type="GoalFailed", non_retryable=True)
        return result

    async def _refuse_to_resume(self) -> GoalResult:
        """A carried state that cannot be loaded: stay parked (visible, answerable) until aborted."""
        state = self._ctx.state
        while state.pause.mode != "aborting":
            await self._next_wakeup()
            await self._steering.apply_pending()  # admission lets only an abort through
        self._pause.abort_achieved()  # nothing ran: nothing to wait for or undo
        state.failure = self._load_problem
        self._inbox.close()
        result = await self._closing.report()
        self._events.ended(result.outcome, state.failure, result.report.digest)
        await self._tell_parent(result)
        self._events.release_subscribers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        raise ApplicationError(state.failure, result.model_dump(mode="json"), type="GoalFailed", non_retryable=True)

    async def _load_past(self) -> bool:
        """A large goal's plan, stored by reference (workflows/goal/past.py). One whose chunks
        cannot be read parks the goal saying why; meanwhile only a park, a resume or an abort
        is applied (the rest waits for the plan), a resume tries again. False: aborted."""
        state = self._ctx.state
        while not await self._past.load():
            while state.pause.mode == "parked":
                await self._next_wakeup()
                await self._steering.apply_pending(only=("park", "resume", "abort"))
            if state.pause.mode == "aborting":
                return False
        return True

    def _park_unreadable(self, why: str) -> None:
        """A stored chunk could not be read (workflows/goal/past.py): parked, saying what to do."""
        self._pause.park(why, None, UNREADABLE_EXPIRY)
        self._ctx.decide("park", f"parked: {why}")

    async def _tell_parent(self, result: GoalResult) -> None:
        """A subgoal tells its parent how it ended (to the parent's latest run: a parent that
        continued as new meanwhile still hears it); a parent that has ended cannot."""
        parent = self._ctx.state.spec.parent
        if parent is None:
            return
        outcome = SubgoalOutcome(child_id=workflow.info().workflow_id, result=result)
        try:
            await workflow.get_external_workflow_handle(parent.goal_id).signal(Signals.SUBGOAL_SETTLED, outcome)
        except Exception as err:  # noqa: BLE001 - e.g. the parent is closed: nobody to tell
            workflow.logger.info("parent not told", extra={"parent": parent.goal_id, "error": str(err)[:200]})

    # --- the Temporal surface: every handler delegates ------------------------------

    @workflow.signal(name=Signals.SUBGOAL_SETTLED)
    def subgoal_settled(self, raw: RawValue = NO_OUTCOME) -> None:
        """A child goal's end (workflows/goal/nodes/subgoal.py). Decoded here under a
        catch-all: whatever anyone sends by this name never fails a workflow task."""
        try:
            outcome = workflow.payload_converter().from_payload(raw.payload, SubgoalOutcome)
        except Exception as err:  # noqa: BLE001 - refused, never raised
            workflow.logger.warning("subgoal_settled refused", extra={"reason": f"{type(err).__name__}"[:200]})
            return
        self._ctx.subgoal_ended(outcome)

    # What clients signal: `handle.signal(GoalWorkflow.message_signal, payload)` sends by
    # this name, which `any_signal` takes (the SDK accepts a name where a method would be).
    message_signal = Signals.MESSAGE

    @workflow.signal(dynamic=True)
    def any_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """Durable admission without a worker. Dynamic, so it gets raw payloads: a
        `message` signal with no argument, two, or bytes that do not decode is refused
        with a reason instead of failing every workflow task from then on, and so is a
        signal name the goal does not know. The device registry's presence signal is
        not a user message: it updates what the goal knows of a device."""
        if name == DEVICE_PRESENCE_SIGNAL:
            self._devices.on_presence(args)
            return
        self._inbox.on_signal(name, args)

    @workflow.update(name=Updates.SUBMIT)
    async def submit(self, *args: Any) -> Receipt:
        """Admission with a receipt, when a worker is up. Any number of loosely typed
        arguments, so the validator, not the decoder or Python's arity check, explains
        what is wrong with a malformed call."""
        return await self._inbox.on_update(args)

    @submit.validator
    def _validate_submit(self, *args: Any) -> None:
        self._inbox.validate_update(args)

    @workflow.query(name=Queries.INBOX)
    def inbox(self) -> InboxView:
        return self._inbox.view()

    @workflow.query(name=Queries.PROGRESS)
    def progress(self) -> ProgressSnapshot:
        return self._publisher.snapshot()

    @workflow.query(name=DECISIONS_QUERY)
    def decisions(self) -> DecisionLog:
        """The decision log as the state holds it: its latest entries, the refs of the rest."""
        return self._ctx.state.decisions

    @workflow.query(name=FORK_POINT_QUERY)
    def fork_point(self, input: ForkPointInput) -> ForkPoint:
        """What `perdure fork` starts a new goal from: the plan and the work it may reuse."""
        return fork_point(self._ctx.state, input)

    # --- the loop -------------------------------------------------------------------

    async def _run_graph(self) -> None:
        """Apply messages, dispatch what is ready, wait for the next event; until done."""
        state, index = self._ctx.state, self._ctx.index
        while True:
            self._scheduler.raise_workflow_task_error()
            await self._steering.apply_pending()
            self._deadlines.on_time()  # after the messages: an answer sent before a deadline wins
            note_code_version(state)
            if self._verifier.pending():
                await self._verifier.run()  # after a long wait: what no longer holds is void first
            # Only work with a task delays the boundary: a node waiting for a person is
            # state and is carried (its question stays open in the next run).
            if self._continue_as_new_due() and not self._scheduler.busy():
                await self._continue_as_new()
            if state.pause.mode == "aborting":
                await self._stop(f"aborted: {state.abort_reason}")
                return
            if state.pause.mode == "running" and not self._continue_as_new_due():
                self._devices.watch()  # a new plan version may name devices
                self._scheduler.resume_waiting()
                # Re-planning on evidence (planner.py): a trigger that waits for the work in
                # flight lets nothing new start meanwhile.
                evidence = self._planner.evidence_trigger()
                if evidence is None or evidence.in_flight != "wait":
                    self._scheduler.dispatch_ready()
                self._planner.watch_in_flight()
                if evidence is not None and self._planner.may_replan_now(evidence):
                    await self._planner.replan_on_evidence(evidence)
                    continue
                # A replan may drop steps: it waits until no write is in flight to cut off.
                if self._planner.drift_check_due() and not self._ctx.writes_in_flight:
                    await self._planner.check_drift()
                    continue
            self._scheduler.tidy_ahead_card()
            running = index().any(IN_FLIGHT) or self._scheduler.starting_in_next_task()
            if not running and state.pause.mode == "running" and not state.open_questions():
                if index().ready():
                    continue  # made ready during the pass (a wrap-up step whose need was refused)
                queued = self._inbox.pending(("queue",))
                if not queued:
                    if self._past.ends_in_a_run_of_its_own():
                        await self._continue_as_new()
                    return
                await self._planner.plan_follow_up(queued)
                continue
            state.phase = self._waiting_phase()
            self._spend.mark_activity(self._active())
            self._publisher.publish()
            at, summary = self._pause.deadline(), None
            device_wait = self._devices.deadline()
            if device_wait is not None and state.pause.mode == "running":
                at, summary = device_wait, "a step's wait for its device reaches its limit"
            try:
                await self._next_wakeup(at, summary)
            except TimeoutError:
                await self._pause.on_deadline()
                if state.pause.mode == "running":
                    await self._devices.on_deadline()

    async def _stop(self, why: str) -> None:
        """Abort (or an emergency stop): requested until what it waits for has settled, then
        achieved. The event stream says each step (it adds nothing to history)."""
        await self._stop_work(why)
        self._pause.abort_achieved()
        self._events.abort_changed()

    async def _stop_work(self, why: str) -> None:
        """Cancel all work but the writes in flight, which are never abandoned; once they
        settle (or time out as uncertain), roll back if asked. After an emergency stop the
        plan's wrap-up steps still run."""
        self._scheduler.cancel_in_flight(why)
        self._events.abort_changed()
        # Writes in flight settle; subgoals asked to stop say when they have (compensations run).
        while self._ctx.writes_in_flight or self._ctx.children():
            await self._next_wakeup()
            self._scheduler.close_stopped_children(why)
            self._events.abort_changed()
        self._scheduler.cancel_in_flight(why)
        pause = self._ctx.state.pause
        if pause.rollback:
            await self._guard.roll_back(self._events.abort_changed)
        if pause.emergency and self._scheduler.stop_pending(why):
            while True:
                self._scheduler.dispatch_wrap_up()
                # Only work with a task: an uncertain write or a wrap-up step that asks a
                # person would never settle here (no message is applied while stopping);
                # the report says so and closes their questions.
                if not self._scheduler.busy():
                    return
                await self._next_wakeup()
                self._events.abort_changed()

    def _active(self) -> bool:
        """Work in flight or ready to run: what the wall budget counts. Parked with
        nothing running, or waiting only for a person, is not."""
        index, state = self._ctx.index(), self._ctx.state
        if index.any(("running",)):
            return True
        held = {name for q in state.open_questions() for name in q.hold}
        return state.pause.mode == "running" and any(name not in held for name in index.ready())

    async def _budget_clock(self) -> None:
        """A durable timer for the moment a time budget runs out (active time or the
        deadline), whatever is in flight: then the goal stops as it would when a charge
        goes past the budget. Set again only when that moment moves (the goal turned idle
        or active), not when the goal turns idle and active again in one workflow task: the
        timer must not depend on how the task's events were grouped (workflows/goal/alarm.py)."""
        spend = self._spend
        while self._ctx.state.pause.mode != "aborting":
            seen, at = spend.activity_changes, spend.limit_at()
            try:
                if at is not None and at <= workflow.now():
                    # Already out: no zero-length timer (whether one is a command differs
                    # between Python versions of the SDK's event loop).
                    raise TimeoutError

                def moved(seen: int = seen, at: datetime | None = at) -> bool:
                    return spend.activity_changes != seen and not same_moment(spend.limit_at(), at)

                await workflow.wait_condition(
                    lambda: moved() or self._ctx.state.pause.mode == "aborting",
                    timeout=None if at is None else at - workflow.now(),
                    timeout_summary="time budget runs out" if at is not None else None,
                )
            except TimeoutError:
                spend.on_clock()
                if self._ctx.state.pause.mode != "aborting":
                    # Nothing to stop right now: the hard gate refuses the next step.
                    await workflow.wait_condition(lambda seen=seen: spend.activity_changes != seen)

    def _wake(self) -> None:
        self._wakeups += 1

    async def _next_wakeup(self, at: datetime | None = None, summary: str | None = None) -> None:
        """Until something wakes the loop; TimeoutError once the time `at` has come (at once if
        it came while the loop was busy). The timer is the alarm's, keyed on `at` as a time,
        never on `now`: a deadline already past when a pass reaches here is the same deadline
        at every pass (workflows/goal/alarm.py)."""
        seen = self._wakeups
        if self._alarm.take(at):
            raise TimeoutError
        self._alarm.set(at, (summary or "parked: wake or expiry") if at is not None else None)
        await workflow.wait_condition(lambda: self._wakeups != seen or self._alarm.rang(at))
        if self._wakeups == seen and self._alarm.take(at):
            raise TimeoutError

    def _waiting_phase(self) -> str:
        state = self._ctx.state
        if state.pause.mode == "parked":
            return "parked"
        if state.open_questions() and not self._ctx.index().any(("running",)):
            return "awaiting_human"
        if self._ctx.index().any(("offline",)) and not self._ctx.index().any(("running",)):
            return "awaiting_device"
        return "running"

    # --- continue-as-new ------------------------------------------------------------

    def _continue_as_new_due(self) -> bool:
        """History and replay are bounded: start a new run when the server suggests it, at
        the goal's own event limit, or once enough steps settled in this run. The loop
        stops dispatching until nothing is in flight."""
        return self._ctx.continue_as_new_due()

    async def _continue_as_new(self) -> None:
        state = self._ctx.state
        # What may take workflow tasks of its own comes first: a large goal's settled steps no
        # step needs and its plan go by reference, a decision chunk being stored ends (the
        # next run carries their refs).
        await self._past.settle()
        state.runs += 1
        events = workflow.info().get_current_history_length()
        self._ctx.log_gate(f"continued as new: run {state.runs} after {events} events", kind="run")
        await self._decisions.settled()
        # An update that arrived meanwhile waits for its message's turn: it gets its receipt in
        # this run (the new run would cut its handler off).
        while self._inbox.awaiting_receipt():
            await self._steering.apply_pending()
            await self._past.settle()
            await self._decisions.settled()
        # Handlers still running would be cut off by the new run; let them finish. The
        # stream's subscribers are let go first: they follow the chain to the new run.
        self._publisher.sync_events()
        self._events.release_subscribers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        # The plan travels once, in plan_versions: a plan file's copy in the spec is not
        # read again once planned, and at 10,000 steps each copy costs the next run's
        # first workflow task a second of validation.
        state.spec = state.spec.model_copy(update={"plan": None, "stored_plan": None, "reuse_outputs": {}})
        continue_on_current_version(
            GoalInput(spec=state.spec, state=state.model_dump_json(), stream=self._events.get_state()),
            task_timeout=self._ctx.next_task_timeout(),
        )
