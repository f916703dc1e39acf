"""GoalWorkflow: the deterministic body of one goal.

It plans (through a model activity, or from a declarative plan file), turns the
plan into a task graph, dispatches every ready node as activities (independent
nodes run concurrently), records outputs by artifact reference, and always
finishes with a report node. The workflow only decides: every model call, tool
call and file access is an activity called by its stable name, and the state it
keeps (one `GoalState`) holds digests and references, never transcripts.

Around it: `tool_runner.py` runs one tool call (read segments, retries, what an
exhausted write becomes), `node_index.py` answers which nodes are where without
a scan, `progress_view.py` builds what the query and the UI show, `retries.py`
holds every timeout and retry policy.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

# Pydantic and our contracts are pure; passing them through keeps the sandbox
# from re-importing pydantic's machinery for every workflow run.
with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from workflows import budget, graph, questions, segments, stall
    from workflows import search_attributes as sa
    from workflows.canonical import canonical_json
    from workflows.contracts import (
        GOAL_WORKFLOW,
        Activities,
        AgentTurnInput,
        AgentTurnResult,
        ArtifactRef,
        DriftInput,
        DriftResult,
        GenerateInput,
        GenerateResult,
        GoalResult,
        ModelContext,
        NodeStatus,
        PlanInput,
        PlanResult,
        PlanRevision,
        ProgressSnapshot,
        Queries,
        ReportInput,
        ReportResult,
        Signals,
        StepOutcome,
        ToolInput,
        ToolResult,
        Updates,
        Usage,
    )
    from workflows.density import fair_share_limit, verdict_for_step
    from workflows.estimates import estimate_kind
    from workflows.eta import estimate_eta
    from workflows.goal.tool_runner import ToolRunner, failure_message
    from workflows.invalidation import held_by, invalidate_by_premise, invalidate_from
    from workflows.messages import (
        InboxEntry,
        InboxView,
        Receipt,
        Refusal,
        UserMessage,
        content_digest,
        parse_message,
        receipt_of,
    )
    from workflows.migrations import StateFromNewerCode, StateRefused, load_state
    from workflows.node_index import NodeIndex
    from workflows.plan import AgentStep, LlmStep, Plan, PlanStep, ToolStep, check_plan
    from workflows.progress_view import details_markdown, progress_snapshot
    from workflows.retries import MODEL_HEARTBEAT, MODEL_RETRY, MODEL_TIMEOUT, REPORT_RETRY
    from workflows.state import (
        CompensationRecord,
        GoalInput,
        GoalState,
        KindStats,
        Node,
        PlanDiff,
        PlanVersion,
        RejectedPath,
    )
    from workflows.statuses import IN_FLIGHT, RAN, TERMINAL
    from workflows.tool_specs import COMPACTION_TOOL, TOOL_SPECS

# Keeps the per-kind ledger and the gate log bounded however long the goal runs.
LEDGER_SAMPLES = 200
GATE_LOG_ENTRIES = 200


class NodeFailed(Exception):
    """A node ended without an output; the message is shown to the user."""


class GoalFailed(Exception):
    """The goal cannot continue (no valid plan, planner unavailable)."""


@workflow.defn(name=GOAL_WORKFLOW, failure_exception_types=[ValidationError])
class GoalWorkflow:
    @workflow.init
    def __init__(self, input: GoalInput) -> None:
        self._load_problem: str | None = None
        self._newer_state: StateFromNewerCode | None = None
        if input.state is None:
            self._state = GoalState(spec=input.spec, premises=dict(input.spec.premises))
        else:
            try:
                self._state = load_state(input.state)
            except StateFromNewerCode as err:
                # Raised again as the run starts (an exception out of __init__ leaves the SDK's
                # run coroutine dangling): it fails this workflow task, which is retried until
                # a worker with the newer code takes the run. Nothing is decided meanwhile.
                self._newer_state = err
                self._state = GoalState(spec=input.spec, premises=dict(input.spec.premises))
            except StateRefused as err:
                # Never continue with a state this code cannot read: park, say why, keep it for audit.
                self._load_problem = f"cannot resume from the carried state: {err}"
                self._state = GoalState(spec=input.spec, premises=dict(input.spec.premises), phase="parked")
                self._park(self._load_problem, None, timedelta(days=3650))
        self._state.started_at = self._state.started_at or workflow.now()
        # Bumped when a node settles or a message arrives; the loop waits on it.
        self._wakeups = 0
        self._published: tuple | None = None
        # In-flight node tasks, so a rewind, narrow or abort can cancel them.
        # Never carried across continue-as-new: that happens with nothing in flight.
        self._tasks: dict[str, asyncio.Task] = {}
        # Key -> nodes waiting on the in-flight run of that key (they share its outcome).
        # An index, checked against the nodes on every use, so a stale entry is harmless;
        # it spares a scan of every node per dispatch and per settled node.
        self._followers: dict[str, list[str]] = {}
        self._owners: dict[str, str] = {}  # key -> the node whose task runs it
        # Kind -> estimate, for one pass of the loop: the ledger does not change within it.
        self._estimates: dict[str, Any] = {}
        self._details_at = None
        self._tools = ToolRunner(self._state)
        self._index: NodeIndex | None = None

    @workflow.run
    async def run(self, input: GoalInput) -> GoalResult:
        if self._newer_state is not None:
            raise self._newer_state
        state = self._state
        if self._load_problem:
            return await self._refuse_to_resume()
        try:
            if state.plan is None:
                await self._make_plan()
            self._materialise_nodes()
            state.phase = "running"
            self._publish()
            await self._run_graph()
        except GoalFailed as err:
            state.failure = str(err)
        self._close_inbox()
        result = await self._report()
        # Updates still waiting for a receipt get it before the goal closes.
        await workflow.wait_condition(workflow.all_handlers_finished)
        if state.failure:
            raise ApplicationError(
                state.failure,
                result.model_dump(mode="json"),
                type="GoalFailed",
                non_retryable=True,
            )
        return result

    async def _refuse_to_resume(self) -> GoalResult:
        """A carried state that cannot be loaded: stay parked (visible, answerable) until aborted."""
        while self._state.pause.mode != "aborting":
            seen = self._wakeups
            await workflow.wait_condition(lambda seen=seen: self._wakeups != seen)
            await self._apply_messages()  # admission lets only an abort through
        self._state.failure = self._load_problem
        self._close_inbox()
        result = await self._report()
        raise ApplicationError(
            self._state.failure, result.model_dump(mode="json"), type="GoalFailed", non_retryable=True
        )

    # --- admission: every user message, by signal or update -------------------------

    @workflow.signal(name=Signals.MESSAGE)
    def message_signal(self, raw: Any) -> None:
        """Durable admission without a worker: the server stores the signal; the
        payload is checked here, since a signal cannot be refused at the door."""
        message, problem = parse_message(raw)
        request_id = raw.get("request_id") if isinstance(raw, dict) else None
        if message is None:
            self._refuse(request_id if isinstance(request_id, str) else None, problem or "malformed message")
            return
        problem = self._admission_problem(message)
        if problem:
            self._refuse(message.request_id, problem)
            return
        if self._entry(message.request_id) is None:
            self._admit(message, "signal")

    @workflow.update(name=Updates.SUBMIT)
    async def submit(self, raw: Any) -> Receipt:
        """Admission with a receipt, when a worker is up. Waits until the message
        is applied, except steer and queue, which apply later by design. The
        payload is typed loosely so the validator, not the decoder, explains
        what is wrong with a malformed one."""
        message, _ = parse_message(raw)
        entry = self._entry(message.request_id) or self._admit(message, "update")
        if entry.kind not in ("steer", "queue"):
            # Applied at the loop's next safe point (after planning, if a plan is being made).
            await workflow.wait_condition(
                lambda: entry.status != "pending" or self._state.phase in ("reporting", "finished", "failed")
            )
        return receipt_of(entry)

    @submit.validator
    def _validate_submit(self, raw: Any) -> None:
        message, problem = parse_message(raw)
        problem = problem or self._admission_problem(message)
        if problem:
            raise ValueError(problem)

    @workflow.query(name=Queries.INBOX)
    def inbox(self) -> InboxView:
        return InboxView(entries=[receipt_of(e) for e in self._state.inbox], refused=self._state.refused)

    def _entry(self, request_id: str) -> InboxEntry | None:
        return next((e for e in self._state.inbox if e.request_id == request_id), None)

    def _admission_problem(self, message: UserMessage) -> str | None:
        """Why a well-formed message cannot be admitted now, or None. A retry of
        an admitted message (same id, same content) is not a problem."""
        state = self._state
        existing = self._entry(message.request_id)
        if existing is not None:
            if existing.digest != content_digest(message):
                return (
                    f"request id '{message.request_id}' was already used for a different {existing.kind} message; "
                    "use a new request id for a new message"
                )
            return None
        if state.phase in ("reporting", "finished", "failed"):
            return f"the goal has ended ({state.phase}); it takes no more messages"
        if self._load_problem and message.kind != "abort":
            return f"{self._load_problem}; it can only be aborted"
        if state.pause.mode == "aborting" and message.kind != "abort":
            return "the goal is being aborted"
        kind = message.kind
        if kind == "rewind":
            if state.plan is None or message.node not in state.nodes:
                known = ", ".join(state.nodes) or "none yet"
                return f"unknown step '{message.node}' (steps: {known})"
            if state.nodes[message.node].status not in RAN:
                return f"step '{message.node}' has not run yet ({state.nodes[message.node].status}); nothing to rewind"
        elif kind == "narrow":
            unknown = sorted(set(message.premises) - set(state.premises))
            if unknown:
                known = ", ".join(f"{k}={v}" for k, v in sorted(state.premises.items())) or "none"
                return f"unknown premise key(s): {', '.join(unknown)} (this goal's premises: {known})"
        elif kind in ("answer", "approve"):
            question = next((q for q in state.questions if q.id == message.question_id), None)
            if question is None:
                return f"no question '{message.question_id}' on this goal"
            if question.status != "open" or self._pending_answer(question.id):
                return f"question '{message.question_id}' is already answered"
            choice = message.choice if kind == "answer" else ("approve" if message.approved else "reject")
            if choice not in {o.id for o in question.options}:
                options = ", ".join(o.id for o in question.options)
                return f"'{choice}' is not an option of {question.id} (options: {options})"
        elif kind == "park" and state.pause.mode == "parked":
            return f"the goal is already parked ({state.pause.reason})"
        elif kind == "resume" and state.pause.mode != "parked":
            return "the goal is not parked"
        return None

    def _pending_answer(self, question_id: str) -> bool:
        return any(
            e.status == "pending" and e.kind in ("answer", "approve") and e.message.question_id == question_id
            for e in self._state.inbox
        )

    def _admit(self, message: UserMessage, via: str) -> InboxEntry:
        entry = InboxEntry(
            request_id=message.request_id,
            kind=message.kind,
            digest=content_digest(message),
            message=message,
            via=via,
            received_at=workflow.now(),
        )
        self._state.inbox.append(entry)
        self._wakeups += 1
        return entry

    def _refuse(self, request_id: str | None, reason: str) -> None:
        workflow.logger.info("message refused", extra={"request_id": request_id, "reason": reason})
        self._state.refused.append(Refusal(request_id=request_id, reason=reason, received_at=workflow.now()))

    def _settle(self, entry: InboxEntry, status: str, note: str, **detail: Any) -> None:
        entry.status, entry.note, entry.settled_at = status, note, workflow.now()
        entry.detail.update(detail)

    def _close_inbox(self) -> None:
        """No message is silently dropped: what was never applied says why."""
        for entry in self._state.inbox:
            if entry.status == "pending":
                self._settle(entry, "rejected", f"the goal ended before this {entry.kind} could be applied")

    # --- queries --------------------------------------------------------------------

    @workflow.query(name=Queries.PROGRESS)
    def progress(self) -> ProgressSnapshot:
        state = self._state
        fractions = budget.budget_fractions(state.spec.budget, self._actual_use())
        return progress_snapshot(state, workflow.info().workflow_id, self._percent_done(), fractions, self._eta())

    def _eta(self):
        state = self._state
        if state.phase in ("finished", "failed", "reporting"):
            return None
        index = self._node_index()
        remaining = index.unsettled_by_kind()
        running = index.count(("running",))
        return estimate_eta(remaining, state.ledger.by_kind, running=running, parallelism=max(1, running))

    # --- planning -----------------------------------------------------------

    def _model_context(self, boundary: str, node: Node | None = None) -> ModelContext:
        """The context for a model call about to start: pending steers apply here."""
        state, spec = self._state, self._state.spec
        for entry in state.inbox:
            if entry.kind == "steer" and entry.status == "pending":
                state.guidance.append(entry.message.text)
                self._settle(entry, "applied", f"applied at {boundary}")
        return ModelContext(
            profile=spec.model_profile,
            goal=spec.goal,
            constraints=spec.constraints,
            premises=state.premises,
            guidance=state.guidance,
            rejected=[path.for_prompt() for path in state.rejected_paths],
            degraded=bool(node and node.degraded),
        )

    async def _make_plan(self) -> None:
        state, spec = self._state, self._state.spec
        if spec.plan is not None:
            problems = check_plan(spec.plan, spec.allowed_tools)
            if problems:
                raise GoalFailed("the plan file cannot run: " + "; ".join(problems))
            state.plan_versions.append(
                PlanVersion(version=1, plan=spec.plan, reason="declarative plan from the user", source="plan-file")
            )
            return
        plan, repairs = await self._ask_planner(None)
        reason = "planned from the goal" if not repairs else f"planned after {repairs} repair(s)"
        state.plan_versions.append(PlanVersion(version=1, plan=plan, reason=reason, source="planner"))

    async def _ask_planner(self, revision: PlanRevision | None) -> tuple[Plan, int]:
        """A valid plan and how many repairs it took; GoalFailed when there is none."""
        spec = self._state.spec
        rejected: ArtifactRef | None = None
        rejection: str | None = None
        attempts = spec.max_plan_repairs + 1
        label = "replan" if revision else "plan"
        for attempt in range(1, attempts + 1):
            summary = label if attempt == 1 else f"{label} · repair {attempt - 1} of {spec.max_plan_repairs}"
            try:
                result = await workflow.execute_activity(
                    Activities.PLAN,
                    PlanInput(
                        context=self._model_context(summary),
                        allowed_tools=spec.allowed_tools,
                        revision=revision,
                        attempt=attempt,
                        rejected=rejected,
                        rejection=rejection,
                    ),
                    result_type=PlanResult,
                    start_to_close_timeout=MODEL_TIMEOUT,
                    heartbeat_timeout=MODEL_HEARTBEAT,
                    retry_policy=MODEL_RETRY,
                    summary=summary,
                )
            except ActivityError as err:
                raise GoalFailed(f"the planner call failed: {failure_message(err)}") from err
            self._charge_model_call(result.usage)
            if result.plan is not None:
                return result.plan, attempt - 1
            rejected, rejection = result.raw, result.error
            workflow.logger.info("plan rejected", extra={"attempt": attempt, "reason": rejection})
        raise GoalFailed(f"the planner gave no valid plan in {attempts} attempt(s); last problem: {rejection}")

    def _materialise_nodes(self) -> None:
        plan = self._plan()
        for step in plan.steps:
            if step.name not in self._state.nodes:
                self._state.nodes[step.name] = Node(name=step.name, kind=step.kind, needs=list(step.needs))

    # --- the loop -------------------------------------------------------------

    async def _run_graph(self) -> None:
        """Apply messages, dispatch what is ready, wait for the next event; until done."""
        state = self._state
        while True:
            await self._apply_messages()
            if self._continue_as_new_due() and not self._node_index().any(IN_FLIGHT):
                await self._continue_as_new()
            if state.pause.mode == "aborting":
                self._cancel_in_flight(f"aborted: {state.abort_reason}")
                if state.pause.rollback:
                    await self._roll_back()
                return
            if state.pause.mode == "running" and not self._continue_as_new_due():
                held = self._held()
                self._estimates = {}
                committed = self._committed()
                for name in self._node_index().ready():
                    step = self._plan().step(name)
                    if name not in held and self._admit_by_gates(step, committed):
                        self._dispatch(step)
                        if state.nodes[name].status in IN_FLIGHT:
                            # Now in flight: reserve its P80 for the next step's gate.
                            self._reserve(committed, step.kind)
                if self._drift_check_due():
                    await self._check_drift()
                    continue
            running = self._node_index().any(IN_FLIGHT)
            if not running and state.pause.mode == "running" and not state.open_questions():
                queued = [e for e in state.inbox if e.kind == "queue" and e.status == "pending"]
                if not queued:
                    return
                await self._plan_follow_up(queued)
                continue
            state.phase = self._waiting_phase(running)
            self._publish()
            seen = self._wakeups
            timeout = self._park_timeout()
            try:
                await workflow.wait_condition(
                    lambda seen=seen: self._wakeups != seen,
                    timeout=timeout,
                    timeout_summary="parked: wake or expiry" if timeout else None,
                )
            except TimeoutError:
                self._on_park_deadline()

    def _continue_as_new_due(self) -> bool:
        """History is bounded: start a new run when the server suggests it, or at the
        goal's own event limit. The loop stops dispatching until nothing is in flight."""
        info = workflow.info()
        return info.is_continue_as_new_suggested() or (
            info.get_current_history_length() >= self._state.spec.continue_as_new_after_events
        )

    async def _continue_as_new(self) -> None:
        state = self._state
        # Handlers still running would be cut off by the new run; let them finish.
        await workflow.wait_condition(workflow.all_handlers_finished)
        state.runs += 1
        self._log_gate(
            f"continued as new: run {state.runs} after {workflow.info().get_current_history_length()} events"
        )
        # The plan travels once, in plan_versions: a plan file's copy in the spec is not
        # read again once planned, and at 10,000 steps each copy costs the next run's
        # first workflow task a second of validation.
        state.spec = state.spec.model_copy(update={"plan": None})
        workflow.continue_as_new(GoalInput(spec=state.spec, state=state.model_dump_json()))

    def _waiting_phase(self, running: bool) -> str:
        state = self._state
        if state.pause.mode == "parked":
            return "parked"
        if state.open_questions() and not self._node_index().any(("running",)):
            return "awaiting_human"
        return "running"

    def _held(self) -> set[str]:
        return {name for q in self._state.open_questions() for name in q.hold}

    # --- budget and density gates: decided here, before dispatch, never in a prompt ----

    def _admit_by_gates(self, step: PlanStep, committed: budget.BudgetUse) -> bool:
        """Whether `step` may start now, given what is spent and reserved (`committed`).
        A step refused for good is abandoned with the reason; one that only has to wait
        for in-flight work to settle stays pending."""
        state = self._state
        node = state.nodes[step.name]
        decision = budget.gate(
            state.spec.budget,
            committed,
            self._estimate(step.kind),
            node_kind=step.kind,
            wrap_up=False,
            soft_fraction=state.spec.soft_gate,
        )
        if decision.action in ("skip", "wrap_up_only", "emergency_stop"):
            if self._node_index().any(IN_FLIGHT):
                return False  # in-flight work may come in under its estimate; judge again then
            self._stop_node(step.name, f"not started: {decision.reason}")
            return False
        if step.needs and state.spec.budget.max_cost_usd:
            limit = fair_share_limit(state.spec.budget.max_cost_usd, len(state.nodes))
            verdict = verdict_for_step(step.name, state.nodes, limit)
            if verdict.action != "ok":
                self._stop_node(step.name, f"not started: branch {verdict.branch} {verdict.reason}")
                return False
        node.degraded = decision.action == "degraded"
        if node.degraded:
            self._log_gate(f"{step.name}: runs degraded ({decision.reason})")
        return True

    def _stop_node(self, name: str, reason: str) -> None:
        node = self._state.nodes[name]
        self._set_status(node, "abandoned")
        node.error = reason
        self._log_gate(f"{name}: {reason}")
        self._abandon_downstream(name)

    def _log_gate(self, entry: str) -> None:
        log = self._state.gate_log
        log.append(entry)
        del log[:-GATE_LOG_ENTRIES]

    def _actual_use(self) -> budget.BudgetUse:
        state = self._state
        started = state.started_at or workflow.now()
        return budget.BudgetUse(
            tokens=state.ledger.tokens,
            cost_usd=state.ledger.cost_usd,
            wall_seconds=(workflow.now() - started).total_seconds(),
        )

    def _committed(self) -> budget.BudgetUse:
        """What is spent plus what in-flight nodes are expected to spend still (their P80)."""
        use = self._actual_use()
        nodes = self._state.nodes
        for name in self._node_index().names(IN_FLIGHT):
            self._reserve(use, nodes[name].kind, nodes[name])
        return use

    def _reserve(self, use: budget.BudgetUse, kind: str, node: Node | None = None) -> None:
        estimate = self._estimate(kind)
        use.tokens += max(0, estimate.tokens_p80 - (node.tokens if node else 0))
        use.cost_usd += max(0.0, estimate.cost_p80 - (node.cost_usd if node else 0.0))

    def _estimate(self, kind: str):
        if kind not in self._estimates:
            self._estimates[kind] = estimate_kind(
                self._state.ledger.by_kind.get(kind), kind, price_per_1k_tokens_usd=self._observed_price()
            )
        return self._estimates[kind]

    def _observed_price(self) -> float | None:
        ledger = self._state.ledger
        return ledger.cost_usd / (ledger.tokens / 1000) if ledger.tokens else None

    def _check_emergency(self) -> None:
        state = self._state
        if state.pause.mode == "aborting":
            return
        decision = budget.emergency_check(state.spec.budget, self._actual_use())
        if decision is not None:
            self._log_gate(f"emergency stop: {decision.reason}")
            self._abort(f"emergency stop: {decision.reason}", rollback=False)
            self._wakeups += 1

    # --- drift: does finishing this plan still satisfy the goal? -------------------

    def _drift_check_due(self) -> bool:
        state = self._state
        every = state.spec.drift_every
        return bool(every) and self._node_index().count(("succeeded",)) >= (state.drift_checks + 1) * every

    async def _check_drift(self) -> None:
        state = self._state
        state.drift_checks += 1
        finished = {n.name: n.preview for n in state.nodes.values() if n.status == "succeeded"}
        summary = f"drift check {state.drift_checks}"
        try:
            verdict = await workflow.execute_activity(
                Activities.DRIFT_CHECK,
                DriftInput(context=self._model_context(summary), plan=self._plan(), finished=finished),
                result_type=DriftResult,
                start_to_close_timeout=MODEL_TIMEOUT,
                heartbeat_timeout=MODEL_HEARTBEAT,
                retry_policy=MODEL_RETRY,
                summary=summary,
            )
        except ActivityError as err:
            self._log_gate(f"{summary} could not run: {failure_message(err)}")
            return
        self._charge_model_call(verdict.usage)
        self._log_gate(f"{summary}: {'on track' if verdict.on_track else 'drifting'} ({verdict.reason})")
        if verdict.on_track:
            return
        revision = PlanRevision(
            reason=f"a drift check found: {verdict.reason}", current=self._plan(), finished=finished
        )
        try:
            plan, _ = await self._ask_planner(revision)
        except GoalFailed as err:
            self._log_gate(f"replanning after the drift check failed: {err}")
            return
        self._adopt_plan(plan, "drift", f"drift check: {verdict.reason}")

    def _adopt_plan(self, plan: Plan, source: str, reason: str) -> PlanDiff:
        """Make `plan` current. Unchanged steps keep their nodes; changed or removed
        ones are dropped (cancelled if in flight); finished work is reused by key."""
        state = self._state
        old = {s.name: s for s in self._plan().steps}
        added = [s.name for s in plan.steps if s.name not in old or old[s.name] != s]
        removed = [name for name in old if name not in {s.name for s in plan.steps}]
        for name in added + removed:
            task = self._tasks.pop(name, None)
            if task is not None:
                task.cancel()
            state.nodes.pop(name, None)
        diff = PlanDiff(added=added, removed=removed)
        self._new_plan_version(source, reason, diff, plan)
        self._materialise_nodes()
        return diff

    def _park_timeout(self) -> timedelta | None:
        pause = self._state.pause
        if pause.mode != "parked":
            return None
        deadlines = [d for d in (pause.wake_at, None if pause.expiry_asked else pause.expires_at) if d]
        if not deadlines:
            return None
        return max(min(deadlines) - workflow.now(), timedelta(seconds=1))

    def _on_park_deadline(self) -> None:
        state, pause = self._state, self._state.pause
        now = workflow.now()
        if pause.wake_at and now >= pause.wake_at:
            self._resume("woke at the time set when parking")
            return
        if pause.expires_at and now >= pause.expires_at and not pause.expiry_asked:
            pause.expiry_asked = True
            expiry = pause.expires_at - (pause.parked_at or pause.expires_at)
            state.questions.append(questions.park_expired(state, now, expiry))

    # --- applying messages at the safe point ----------------------------------------

    async def _apply_messages(self) -> None:
        for entry in list(self._state.inbox):
            if entry.status != "pending" or entry.kind in ("steer", "queue"):
                continue
            message = entry.message
            if entry.kind == "park":
                self._park(message.reason, message.until, timedelta(hours=message.expiry_hours))
                self._settle(entry, "applied", f"parked: {message.reason}")
            elif entry.kind == "resume":
                self._resume("resumed by the user")
                self._settle(entry, "applied", "resumed")
            elif entry.kind == "abort":
                self._abort(message.reason, message.rollback)
                self._settle(entry, "applied", f"aborting: {message.reason}")
            elif entry.kind == "rewind":
                self._settle(entry, "applied", **self._rewind(message.node, message.why))
            elif entry.kind == "narrow":
                self._settle(entry, "applied", **self._narrow(message.premises, message.why))
            elif entry.kind in ("answer", "approve"):
                self._settle(entry, "applied", self._answer(entry))
            elif entry.kind == "escalate":
                question = questions.escalation(self._state, workflow.now(), message.finding, message.detail)
                self._state.questions.append(question)
                self._settle(entry, "applied", f"asked as {question.id}")

    def _park(self, reason: str, until, expiry: timedelta) -> None:
        now = workflow.now()
        self._state.pause.mode = "parked"
        self._state.pause.reason = reason
        self._state.pause.parked_at = now
        self._state.pause.wake_at = until
        self._state.pause.expires_at = now + expiry
        self._state.pause.expiry_asked = False

    def _resume(self, why: str) -> None:
        pause = self._state.pause
        pause.mode, pause.reason, pause.wake_at, pause.expires_at = "running", None, None, None
        # A wait that ends is a fresh start for anyone judging progress by time.
        self._state.last_progress_at = workflow.now()
        for question in self._state.open_questions():
            if question.topic == "park_expired":
                question.status, question.answer, question.answered_at = "answered", "resume", workflow.now()
        workflow.logger.info("resumed", extra={"why": why})

    def _abort(self, reason: str, rollback: bool) -> None:
        self._state.pause.mode = "aborting"
        self._state.pause.rollback = rollback
        self._state.abort_reason = reason

    def _answer(self, entry: InboxEntry) -> str:
        message = entry.message
        question = next(q for q in self._state.questions if q.id == message.question_id)
        choice = message.choice if entry.kind == "answer" else ("approve" if message.approved else "reject")
        question.status, question.answer, question.answer_text = "answered", choice, message.text
        question.answered_at = self._state.last_progress_at = workflow.now()
        if question.topic == "park_expired":
            if choice == "resume":
                self._resume("the user answered the expiry question")
            elif choice == "extend":
                pause = self._state.pause
                extension = (pause.expires_at or workflow.now()) - (pause.parked_at or workflow.now())
                pause.parked_at, pause.expires_at, pause.expiry_asked = (
                    workflow.now(),
                    workflow.now() + extension,
                    False,
                )
            elif choice == "abort":
                self._abort("the user chose to stop after the park expired", rollback=False)
        elif question.topic == "narrow_confirm" and choice == "redo":
            self._void(question.nodes)
        elif question.topic == "escalation" and choice == "park":
            self._park("parked after a watchdog escalation", None, timedelta(hours=48))
        elif question.topic == "escalation" and choice == "abort":
            self._abort("stopped after a watchdog escalation", rollback=False)
        return f"{question.id} answered: {choice}"

    def _rewind(self, node: str, why: str) -> dict:
        state = self._state
        target = state.nodes[node]
        state.rejected_paths.append(RejectedPath(node=node, why=why, output_preview=target.preview, at=workflow.now()))
        invalidation = invalidate_from(self._plan(), self._statuses(), node)
        self._void(invalidation.void)
        self._new_plan_version(
            "rewind", f"rewind of '{node}': {why}", PlanDiff(invalidated=invalidation.void, kept=invalidation.kept)
        )
        return {
            "note": f"rewound '{node}': {len(invalidation.void)} step(s) void, {len(invalidation.kept)} kept",
            "void": invalidation.void,
            "kept": invalidation.kept,
        }

    def _narrow(self, changes: dict[str, str], why: str | None) -> dict:
        state = self._state
        invalidation = invalidate_by_premise(self._plan(), self._statuses(), changes)
        state.premises = {**state.premises, **changes}
        self._void(invalidation.void)
        if invalidation.to_confirm:
            hold = held_by(self._plan(), invalidation.to_confirm)
            state.questions.append(
                questions.narrow_confirm(state, workflow.now(), invalidation.to_confirm, hold, changes)
            )
        change = ", ".join(f"{k}={v}" for k, v in sorted(changes.items()))
        self._new_plan_version(
            "narrow",
            f"narrowed {change}" + (f": {why}" if why else ""),
            PlanDiff(invalidated=invalidation.void, kept=invalidation.kept, to_confirm=invalidation.to_confirm),
        )
        return {
            "note": (
                f"narrowed {change}: {len(invalidation.void)} void, {len(invalidation.kept)} kept, "
                f"{len(invalidation.to_confirm)} to confirm"
            ),
            "void": invalidation.void,
            "kept": invalidation.kept,
            "to_confirm": invalidation.to_confirm,
        }

    def _statuses(self) -> dict[str, str]:
        return {name: node.status for name, node in self._state.nodes.items()}

    def _void(self, names: list[str]) -> None:
        """Reset void work to pending, cancelling it if in flight; its cached output
        is forgotten so it runs again. Abandoned work downstream may run again too."""
        state = self._state
        reset = set(names)
        for name in names:
            reset.update(d for d in graph.downstream(self._plan(), name) if state.nodes[d].status == "abandoned")
        for name in reset:
            node = state.nodes[name]
            if node.key and state.outputs_by_key.get(node.key) == node.output:
                state.outputs_by_key.pop(node.key, None)
            task = self._tasks.pop(name, None)
            if task is not None:
                task.cancel()
            self._set_status(node, "pending")
            node.output, node.preview, node.error, node.key, node.reused = None, "", None, None, False
        # A node that was waiting on a twin's in-flight work has nobody to wait on now.
        for node in state.nodes.values():
            if node.status == "running" and node.reused and node.name not in self._tasks:
                if not any(t.key == node.key and t.name in self._tasks for t in state.nodes.values()):
                    self._set_status(node, "pending")
                    node.key, node.reused = None, False

    def _new_plan_version(self, source: str, reason: str, diff: PlanDiff, plan: Plan | None = None) -> None:
        versions = self._state.plan_versions
        versions.append(
            PlanVersion(version=len(versions) + 1, plan=plan or self._plan(), reason=reason, source=source, diff=diff)
        )

    async def _plan_follow_up(self, queued: list[InboxEntry]) -> None:
        """The goal would be idle: plan the queued follow-up work as a new plan version."""
        state = self._state
        current = self._plan()
        revision = PlanRevision(
            reason="the user queued follow-up work",
            current=current,
            finished={n.name: n.preview for n in state.nodes.values() if n.status == "succeeded"},
            requests=[e.message.text for e in queued],
        )
        try:
            plan, _ = await self._ask_planner(revision)
        except GoalFailed as err:
            for entry in queued:
                self._settle(entry, "rejected", f"could not plan it: {err}")
            return
        diff = self._adopt_plan(plan, "queue", "planned queued follow-up work")
        for entry in queued:
            self._settle(entry, "applied", f"planned as plan v{len(state.plan_versions)}", added=diff.added)

    def _cancel_in_flight(self, why: str) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        nodes = self._state.nodes
        for name in self._node_index().names(IN_FLIGHT):
            self._set_status(nodes[name], "abandoned")
            nodes[name].error, nodes[name].finished_at = why, workflow.now()

    # --- execution ------------------------------------------------------------

    def _dispatch(self, step: PlanStep) -> None:
        state = self._state
        node = state.nodes[step.name]
        deps = {}
        for dep in step.needs:
            output = state.nodes[dep].output
            assert output is not None  # only steps whose deps succeeded are ready
            deps[dep] = output.digest
        node.key = graph.node_key(step, deps, state.premises)
        node.started_at = workflow.now()
        node.runs += 1
        cached = state.outputs_by_key.get(node.key)
        if cached is not None:
            # Same kind, input and dependency outputs as finished work: reuse it.
            node.output, node.reused, node.finished_at = cached, True, node.started_at
            self._set_status(node, "succeeded")
            return
        self._set_status(node, "running")
        owner = self._owners.get(node.key)
        if owner is not None and owner != node.name and self._in_flight_run_of(owner, node.key):
            # The same work is in flight: share its outcome instead of paying twice.
            node.reused = True
            self._followers.setdefault(node.key, []).append(node.name)
            return
        self._owners[node.key] = node.name
        self._tasks[step.name] = asyncio.create_task(self._run_node(step, node, node.runs))

    def _in_flight_run_of(self, name: str, key: str) -> bool:
        node = self._state.nodes.get(name)
        return node is not None and node.key == key and node.status == "running" and not node.reused

    async def _run_node(self, step: PlanStep, node: Node, run: int) -> None:
        try:
            if isinstance(step, ToolStep):
                output, preview = await self._run_tool_step(step, node)
            elif isinstance(step, LlmStep):
                output, preview = await self._run_llm_step(step, node)
            else:
                output, preview = await self._run_agent_step(step, node)
        except asyncio.CancelledError:
            # Voided or aborted while in flight; whoever cancelled it set its status.
            return
        except (ActivityError, NodeFailed) as err:
            if node.runs != run or node.status != "running":
                return  # an outcome for work that was voided meanwhile
            error = failure_message(err) if isinstance(err, ActivityError) else str(err)
            for settled in self._sharing(node):
                self._set_status(settled, "failed")
                settled.error = error
                self._abandon_downstream(settled.name)
        else:
            if node.runs != run or node.status != "running":
                return
            assert node.key is not None
            self._state.outputs_by_key[node.key] = output
            for settled in self._sharing(node):
                # Output first: a dependant made ready by this status reads it.
                settled.output, settled.preview = output, preview
                self._set_status(settled, "succeeded")
        # Not in a `finally`: on worker eviction the coroutine is closed and
        # must not touch workflow state on its way out.
        self._tasks.pop(node.name, None)
        node.finished_at = self._state.last_progress_at = workflow.now()
        self._record_kind_stats(node)
        self._wakeups += 1
        self._publish()

    def _sharing(self, node: Node) -> list[Node]:
        """The node plus any node that waited on the same in-flight key."""
        nodes = self._state.nodes
        names = dict.fromkeys(self._followers.pop(node.key or "", []))
        followers = [nodes[n] for n in names if nodes[n] is not node and nodes[n].key == node.key]
        followers = [n for n in followers if n.status == "running"]
        for follower in followers:
            follower.finished_at = workflow.now()
        return [node, *followers]

    def _abandon_downstream(self, failed: str) -> None:
        for name in graph.downstream(self._plan(), failed):
            blocked = self._state.nodes[name]
            if blocked.status == "pending":
                self._set_status(blocked, "abandoned")
                blocked.error = f"needs '{failed}', which failed"

    def _inputs(self, step: PlanStep) -> dict[str, ArtifactRef]:
        refs = {}
        for dep in step.needs:
            output = self._state.nodes[dep].output
            assert output is not None
            refs[dep] = output
        return refs

    async def _run_tool_step(self, step: ToolStep, node: Node) -> tuple[ArtifactRef, str]:
        result = await self._call_tool(
            ToolInput(
                goal_id=workflow.info().workflow_id,
                node_key=node.key or "",
                tool=step.tool,
                workspace=self._state.spec.workspace,
                args=step.args,
                inputs=self._inputs(step),
            ),
            summary=f"tool {step.tool} · {step.name} · {short_key(node.key)}",
            node=node,
            what=f"{step.tool} {canonical_json(step.args)[:300]}",
            why=f"plan step '{step.name}'",
        )
        if not result.ok or result.output is None:
            raise NodeFailed(f"{step.tool} failed: {result.error}")
        return result.output, result.preview

    async def _run_llm_step(self, step: LlmStep, node: Node) -> tuple[ArtifactRef, str]:
        summary = f"llm · {step.name} · {short_key(node.key)}"
        result = await workflow.execute_activity(
            Activities.GENERATE,
            GenerateInput(
                context=self._model_context(summary, node),
                step=step.name,
                prompt=step.prompt,
                inputs=self._inputs(step),
            ),
            result_type=GenerateResult,
            start_to_close_timeout=MODEL_TIMEOUT,
            heartbeat_timeout=MODEL_HEARTBEAT,
            retry_policy=MODEL_RETRY,
            summary=summary,
        )
        self._charge_model_call(result.usage, node)
        return result.output, result.preview

    async def _run_agent_step(self, step: AgentStep, node: Node) -> tuple[ArtifactRef, str]:
        max_turns = step.max_turns or self._state.spec.max_agent_turns
        transcript: ArtifactRef | None = None
        tool_results: list[ToolResult] = []
        notes: list[str] = []
        inputs = self._inputs(step)
        for turn in range(1, max_turns + 1):
            await self._wait_while_parked(node)
            summary = f"agent turn {turn}/{max_turns} · {step.name} · {short_key(node.key)}"
            context = self._model_context(summary, node)
            # Turn 1 sees all guidance in its prompt; later turns are told what is new.
            new_guidance = context.guidance[node.guidance_seen :] if turn > 1 else []
            node.guidance_seen = len(context.guidance)
            result = await workflow.execute_activity(
                Activities.AGENT_TURN,
                AgentTurnInput(
                    context=context,
                    step=step.name,
                    prompt=step.prompt,
                    inputs=inputs,
                    tools=step.tools,
                    turn=turn,
                    max_turns=max_turns,
                    transcript=transcript,
                    tool_results=tool_results,
                    new_guidance=new_guidance,
                    notes=notes,
                    compact_after_chars=self._state.spec.compact_context_after_chars,
                ),
                result_type=AgentTurnResult,
                start_to_close_timeout=MODEL_TIMEOUT,
                heartbeat_timeout=MODEL_HEARTBEAT,
                retry_policy=MODEL_RETRY,
                summary=summary,
            )
            self._charge_model_call(result.usage, node)
            node.turns = turn
            if result.compaction is not None:
                node.compactions.append(result.compaction)
            transcript = result.transcript
            if result.final is not None:
                return result.final, result.preview
            compacted = result.compaction is not None and COMPACTION_TOOL not in step.tools
            offered = [*step.tools, COMPACTION_TOOL] if compacted else step.tools
            tool_results = await self._agent_tool_calls(step, node, turn, result.tool_calls, offered)
            notes = await self._judge_stall(step, node, result, tool_results)
        raise NodeFailed(f"the agent used all {max_turns} turns without a final answer")

    async def _agent_tool_calls(
        self, step: AgentStep, node: Node, turn: int, calls: list, offered: list[str]
    ) -> list[ToolResult]:
        """The tool calls of one model turn, in the model's order; consecutive calls that
        run as local activities (independent reads) run concurrently. `offered`: the
        tools this turn's model saw (the step's, plus read_artifact after a compaction)."""
        if not self._tools.segments_enabled():
            return [await self._agent_tool_call(step, node, turn, i, c, offered) for i, c in enumerate(calls)]
        local = [c.tool in offered and self._tools.placement(c.tool).local for c in calls]
        results: list[ToolResult | None] = [None] * len(calls)
        for group in segments.batches(local):
            done = await asyncio.gather(*(self._agent_tool_call(step, node, turn, i, calls[i], offered) for i in group))
            for index, tool_result in zip(group, done, strict=True):
                results[index] = tool_result
        return [r for r in results if r is not None]

    async def _agent_tool_call(
        self, step: AgentStep, node: Node, turn: int, index: int, call, offered: list[str]
    ) -> ToolResult:
        if call.tool not in offered:
            return ToolResult(
                call_id=call.call_id,
                tool=call.tool,
                ok=False,
                error=f"tool '{call.tool}' is not available in this step; available: {', '.join(offered) or 'none'}",
            )
        return await self._call_tool(
            ToolInput(
                goal_id=workflow.info().workflow_id,
                node_key=f"{node.key}#turn{turn}.{index}",
                tool=call.tool,
                workspace=self._state.spec.workspace,
                args_ref=call.args,
                inputs=self._inputs(step),
                call_id=call.call_id,
            ),
            summary=f"tool {call.tool} · {step.name} turn {turn} · {short_key(node.key)}",
            node=node,
            what=f"{call.tool} {call.preview}",
            why=f"the agent in step '{step.name}' asked for it (turn {turn}): {step.prompt[:200]}",
        )

    async def _wait_while_parked(self, node: Node) -> None:
        """An agent does not start a new turn while the goal is parked (and is not judged meanwhile)."""
        if self._state.pause.mode != "parked":
            return
        self._set_status(node, "parked")
        self._wakeups += 1
        await workflow.wait_condition(lambda: self._state.pause.mode != "parked")
        self._set_status(node, "running")

    async def _judge_stall(
        self, step: AgentStep, node: Node, turn: AgentTurnResult, results: list[ToolResult]
    ) -> list[str]:
        """Feed the stall ladder one step; return notes for the model's next turn."""
        outputs = [r.preview if r.ok else f"error: {r.error}" for r in results] or [turn.preview]
        calls = [stall.describe_call(c.tool, c.preview) for c in turn.tool_calls]
        node.stall, action = stall.observe_step(
            node.stall, outputs, threshold=self._state.spec.stall_threshold, calls=calls
        )
        if action is None:
            return []
        self._log_gate(f"{step.name}: stalled, {action.kind.replace('_', ' ')} ({action.reason})")
        if action.kind == "remind":
            return [stall.remind_message(action.tried, self._state.spec.stall_threshold)]
        if action.kind == "switch_tool":
            return [stall.switch_tool_message(action.tried, step.tools)]
        if action.kind == "ask_human":
            question = questions.stalled(
                self._state, workflow.now(), step.name, stall.ask_human_message(step.name, action.tried)
            )
            self._state.questions.append(question)
            answer = await self._await_answer(node, question)
            if answer == "continue":
                return [f"A person reviewed the stall and said to continue. {question.answer_text or ''}".strip()]
        self._state.rejected_paths.append(
            RejectedPath(
                node=step.name,
                why=f"abandoned after repeated steps without new information: {'; '.join(action.tried[-3:])}",
                output_preview=node.preview,
                at=workflow.now(),
            )
        )
        raise NodeFailed(f"abandoned: {action.reason}")

    async def _await_answer(self, node: Node, question, status: str = "blocked") -> str:
        """Block this node (only) until a person answers the question."""
        self._set_status(node, status)
        self._wakeups += 1  # the loop re-judges the phase: the goal may now await a person
        await workflow.wait_condition(lambda: question.status == "answered")
        self._set_status(node, "running")
        return question.answer or ""

    async def _call_tool(self, tool_input: ToolInput, summary: str, node: Node, what: str, why: str) -> ToolResult:
        """One tool call with the effect rules around it: an irreversible tool waits for a
        person's confirmation; an uncertain outcome is a question, never a guess; an
        effect that can be undone has its compensation registered."""
        spec = TOOL_SPECS.get(tool_input.tool)
        if spec is not None and spec.risk == "irreversible":
            question = questions.confirm_effect(self._state, workflow.now(), node.name, tool_input.tool, what, why)
            self._state.questions.append(question)
            if await self._await_answer(node, question) != "approve":
                reason = f"a person refused {tool_input.tool}: {question.answer_text or 'no reason given'}"
                self._state.rejected_paths.append(
                    RejectedPath(node=node.name, why=reason, output_preview=what, at=workflow.now())
                )
                return ToolResult(
                    call_id=tool_input.call_id, tool=tool_input.tool, risk=spec.risk, ok=False, error=reason
                )
            tool_input = tool_input.model_copy(update={"confirmed": True})
        result = await self._tools.execute(tool_input, summary, node)
        if result.uncertain:
            question = questions.uncertain_effect(
                self._state, workflow.now(), node.name, tool_input.tool, result.effect_key or "?", result.error or ""
            )
            self._state.questions.append(question)
            answer = await self._await_answer(node, question, status="uncertain")
            if answer in ("happened", "not_happened"):
                resolved = tool_input.model_copy(update={"resolution": answer})
                result = await self._tools.execute(resolved, f"{summary} · {answer.replace('_', ' ')}", node)
        if result.ok and result.compensation is not None and result.effect_key:
            self._state.compensations.append(
                CompensationRecord(node=node.name, effect_key=result.effect_key, compensation=result.compensation)
            )
        return result

    async def _roll_back(self) -> None:
        """Abort with rollback: undo registered effects newest first, each a keyed tool call."""
        for record in reversed(self._state.compensations):
            if record.status == "done":
                continue
            comp = record.compensation
            try:
                result = await self._tools.execute(
                    ToolInput(
                        goal_id=workflow.info().workflow_id,
                        node_key=f"compensate:{record.effect_key}",
                        tool=comp.tool,
                        workspace=self._state.spec.workspace,
                        args=comp.args,
                        confirmed=True,
                    ),
                    summary=f"compensate · {comp.tool} · {record.node} · {record.effect_key[:15]}",
                )
            except ActivityError as err:
                record.status, record.note = "failed", failure_message(err)
                continue
            record.status = "done" if result.ok else "failed"
            record.note = result.preview if result.ok else result.error

    # --- ledger, report, visibility ---------------------------------------------

    def _charge_model_call(self, usage: Usage, node: Node | None = None) -> None:
        ledger = self._state.ledger
        ledger.model_calls += 1
        ledger.input_tokens += usage.input_tokens
        ledger.output_tokens += usage.output_tokens
        ledger.cost_usd += usage.cost_usd
        if node is not None:
            node.tokens += usage.tokens
            node.cost_usd += usage.cost_usd
        self._check_emergency()

    def _record_kind_stats(self, node: Node) -> None:
        stats = self._state.ledger.by_kind.setdefault(node.kind, KindStats())
        stats.runs += 1
        if node.started_at and node.finished_at:
            stats.seconds = (stats.seconds + [(node.finished_at - node.started_at).total_seconds()])[-LEDGER_SAMPLES:]
        stats.costs_usd = (stats.costs_usd + [node.cost_usd])[-LEDGER_SAMPLES:]
        stats.tokens = (stats.tokens + [node.tokens])[-LEDGER_SAMPLES:]

    def _outcome(self, nodes: list[Node]) -> str:
        state = self._state
        if state.failure:
            return "failed"
        if state.pause.mode == "aborting":
            return "aborted"
        if nodes and all(n.status == "succeeded" for n in nodes):
            return "succeeded"
        return "partial"

    async def _report(self) -> GoalResult:
        state = self._state
        state.phase = "reporting"
        self._publish()
        nodes = [state.nodes[name] for name in graph.topological_order(state.plan)] if state.plan else []
        outcome = self._outcome(nodes)
        unfinished = [f"{n.name}: {n.error or n.status}" for n in nodes if n.status != "succeeded"]
        failure = state.failure or (f"aborted: {state.abort_reason}" if outcome == "aborted" else None)
        report = await workflow.execute_activity(
            Activities.WRITE_REPORT,
            ReportInput(
                goal_id=workflow.info().workflow_id,
                goal=state.spec.goal,
                outcome=outcome,
                failure=failure,
                steps=[
                    StepOutcome(
                        name=n.name,
                        kind=n.kind,
                        status=n.status,
                        output=n.output,
                        error=n.error,
                        tokens=n.tokens,
                        cost_usd=n.cost_usd,
                    )
                    for n in nodes
                ],
                unfinished=unfinished,
                notes=self._report_notes(),
                tokens=state.ledger.tokens,
                cost_usd=state.ledger.cost_usd,
            ),
            result_type=ReportResult,
            start_to_close_timeout=timedelta(minutes=1),
            retry_policy=REPORT_RETRY,
            summary=f"report · {outcome}",
        )
        state.result = GoalResult(
            outcome=outcome,
            failure=failure,
            report=report.report,
            excerpt=report.excerpt,
            outputs={n.name: n.output for n in nodes if n.output is not None},
            failed_steps=[n.name for n in nodes if n.status in ("failed", "abandoned")],
            unfinished=unfinished,
            tokens=state.ledger.tokens,
            cost_usd=state.ledger.cost_usd,
        )
        state.phase = "failed" if state.failure else "finished"
        self._publish()
        return state.result

    def _report_notes(self) -> list[str]:
        state = self._state
        notes = [f"plan v{v.version} ({v.source}): {v.reason}" for v in state.plan_versions[1:]]
        notes += [f"guidance applied: {g}" for g in state.guidance]
        notes += [f"rejected path: {p.for_prompt()}" for p in state.rejected_paths]
        notes += [f"question {q.id} ({q.title}): {q.answer or 'unanswered'}" for q in state.questions]
        notes += [
            f"effect {r.effect_key} of {r.node}: undo by {r.compensation.tool} {r.status}"
            + (f" ({r.note})" if r.note else "")
            for r in state.compensations
        ]
        return notes

    def _plan(self) -> Plan:
        plan = self._state.plan
        assert plan is not None
        return plan

    def _node_index(self) -> NodeIndex:
        """Statuses and ready steps without a scan of every node (workflows/node_index.py);
        built again when the plan or the node table changes."""
        state = self._state
        if self._index is None or not self._index.fits(state.plan, state.nodes):
            self._index = NodeIndex(state.plan, state.nodes)
        return self._index

    def _set_status(self, node: Node, status: NodeStatus) -> None:
        self._node_index().set_status(node, status)

    def _percent_done(self) -> int:
        state = self._state
        if state.phase in ("finished", "failed"):
            return 100
        if not state.nodes:
            return 0
        settled = self._node_index().count(TERMINAL)
        return int(100 * settled / len(state.nodes))

    def _publish(self) -> None:
        """Mirror phase and progress to search attributes and the UI's details.

        Search-attribute upserts are history events, so they are written only
        when the phase, the pause or the need for a human changes, or progress
        crosses a ten-percent step.
        """
        state = self._state
        percent = self._percent_done()
        parked = state.pause.mode == "parked"
        needs_human = bool(state.open_questions())
        marker = (state.phase, percent // 10, parked, needs_human)
        now = workflow.now()
        if self._details_at != now or marker != self._published:
            # workflow.now() stands still within a workflow task: the details (what the UI
            # shows, not history) are worked out once per task and on every change of phase,
            # not for every node that settles in a long read segment.
            self._details_at = now
            workflow.set_current_details(self._details_markdown(percent))
        if marker == self._published:
            return
        self._published = marker
        workflow.upsert_search_attributes(
            [
                sa.GOAL_STATUS.value_set(state.phase),
                sa.PERCENT_DONE.value_set(percent),
                sa.COST_USD.value_set(round(state.ledger.cost_usd, 6)),
                sa.PARKED.value_set(parked),
                sa.NEEDS_HUMAN.value_set(needs_human),
                sa.LAST_PROGRESS_AT.value_set(workflow.now()),
            ]
        )

    def _details_markdown(self, percent: int) -> str:
        fractions = budget.budget_fractions(self._state.spec.budget, self._actual_use())
        return details_markdown(self._state, self._node_index(), percent, fractions, self._eta())


def short_key(key: str | None) -> str:
    return (key or "").removeprefix("node:")[:12]
