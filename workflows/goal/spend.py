"""What the goal spends and may spend: the budget and density gates before a node
is dispatched, the estimates they judge by, reservations for work in flight, the
charge of every model call and of every tool call that reported a cost, the refusal of a
paid tool's call the cost budget could not pay (its declared most), active time
(what the wall budget counts), and the emergency stop, by a charge past the budget or
by the clock (held while the goal is parked, and judged as it resumes).

Workflow code, deciding from the ledger in the state; the rules themselves are
pure (workflows/shared/budget.py, density.py, estimates.py). A new budget rule is a
branch of `admit` (before dispatch) or of `charge` (after a call).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from temporalio import workflow

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts.goal_contracts import Budget, OwnCalls, Usage
from perdure.workflows.goal.contracts.plan import PlanStep, SubgoalStep, ToolStep
from perdure.workflows.goal.contracts.state import KindStats, Node
from perdure.workflows.goal.pause import Pause
from perdure.workflows.goal.rules import frontier
from perdure.workflows.goal.rules.density import fair_share_limit, verdict_for_step
from perdure.workflows.goal.rules.estimates import (
    DEFAULT_PRICE_PER_1K_TOKENS_USD,
    KindEstimate,
    estimate_kind,
    own_seconds,
)
from perdure.workflows.shared import budget, metrics
from perdure.workflows.shared.statuses import IN_FLIGHT
from perdure.workflows.shared.tool_specs import ToolSpec

# Keeps the per-kind ledger bounded however long the goal runs.
LEDGER_SAMPLES = 200


@dataclass(frozen=True)
class Admission:
    """A gate's answer for one ready step: run it, let it wait for in-flight work to
    settle (it may come in under its estimate), or stop it for good, with the reason."""

    action: Literal["run", "wait", "stop"]
    reason: str = ""


class Spend:
    def __init__(self, ctx: GoalContext, pause: Pause) -> None:
        self._ctx = ctx
        self._pause = pause
        # Kind -> estimate, for one pass of the loop: the ledger does not change within it.
        self._estimates: dict[str, KindEstimate] = {}
        # Bumped when the goal becomes active or idle: the budget clock re-arms.
        self.activity_changes = 0

    def new_pass(self) -> budget.BudgetUse:
        """Start a dispatch pass: estimates afresh, and what is committed so far."""
        self._estimates = {}
        return self.committed()

    def admit(self, step: PlanStep, committed: budget.BudgetUse) -> Admission:
        """Whether `step` may start now, given what is spent and reserved (`committed`)."""
        state = self._ctx.state
        node = self._ctx.node(step.name)
        decision = budget.gate(
            state.spec.budget,
            committed,
            self.estimate_of(step, committed),
            node_kind=step.kind,
            wrap_up=step.wrap_up,
            soft_fraction=state.spec.soft_gate,
        )
        if decision.action in ("skip", "wrap_up_only", "emergency_stop"):
            if self._ctx.index().any(IN_FLIGHT):
                return Admission("wait")
            self._ctx.metrics.add(metrics.GATE_DECISIONS, 1, decision=decision.action)
            return Admission("stop", f"not started: {decision.reason}")
        # A large goal's node table holds only its frontier (workflows/goal/rules/frontier.py): its
        # branches cannot be judged from it, and judging them from every node cost a scan per step.
        large = frontier.is_large(state.plan_size())
        if step.needs and state.spec.budget.max_cost_usd and not step.wrap_up and not large:
            limit = fair_share_limit(state.spec.budget.max_cost_usd, len(state.nodes))
            verdict = verdict_for_step(step.name, state.nodes, limit)
            if verdict.action != "ok":
                self._ctx.metrics.add(metrics.GATE_DECISIONS, 1, decision="density")
                return Admission("stop", f"not started: branch {verdict.branch} {verdict.reason}")
        node.degraded = decision.action == "degraded"
        if node.degraded:
            self._ctx.metrics.add(metrics.GATE_DECISIONS, 1, decision="degraded")
            self._ctx.log_gate(f"{step.name}: runs degraded ({decision.reason})")
        return Admission("run")

    def actual_use(self) -> budget.BudgetUse:
        state, now = self._ctx.state, workflow.now()
        started = state.started_at or now
        calendar = (now - started).total_seconds()
        deadline = state.spec.budget.deadline
        return budget.BudgetUse(
            tokens=state.ledger.tokens,
            cost_usd=state.ledger.cost_usd,
            wall_seconds=self.active_seconds(),
            calendar_seconds=calendar,
            deadline_seconds=(deadline - started).total_seconds() if deadline else None,
        )

    # --- active time and the budget clock -----------------------------------------

    def mark_activity(self, active: bool) -> None:
        """The goal is active (work in flight or ready to run) or idle (parked, or
        waiting only for a person) from now on."""
        ledger, now = self._ctx.state.ledger, workflow.now()
        if active and ledger.active_since is None:
            ledger.active_since = now
        elif not active and ledger.active_since is not None:
            ledger.active_seconds += (now - ledger.active_since).total_seconds()
            ledger.active_since = None
        else:
            return
        self.activity_changes += 1

    def active_seconds(self) -> float:
        ledger = self._ctx.state.ledger
        running = (workflow.now() - ledger.active_since).total_seconds() if ledger.active_since else 0.0
        return ledger.active_seconds + running

    def limit_at(self) -> datetime | None:
        """The moment a time budget runs out at the current pace, or None: the same while the
        goal stays active (or idle), wherever in the workflow task it is worked out."""
        left = self.time_to_limit()
        return None if left is None else workflow.now() + left

    def time_to_limit(self) -> timedelta | None:
        """How long until a time budget runs out at the current pace (active time
        advances only while the goal is active; the deadline always), or None."""
        spec, ledger = self._ctx.state.spec, self._ctx.state.ledger
        left: list[float] = []
        if spec.budget.max_wall_seconds and ledger.active_since is not None:
            left.append(spec.budget.max_wall_seconds - self.active_seconds())
        if spec.budget.deadline:
            left.append((spec.budget.deadline - workflow.now()).total_seconds())
        if not left:
            return None
        return timedelta(seconds=max(min(left), 0.0))

    def on_clock(self) -> None:
        """A time budget ran out: with work still in flight, that is an emergency stop."""
        self._check_emergency(at_limit=True)

    def judge_at_resume(self) -> None:
        """A parked goal gets no budget verdict (a step that ran on while it was parked may
        have charged or timed it past a budget): it is judged as it resumes. Work still in
        flight then is stopped as the clock would stop it; with none, the hard gate
        refuses the next step."""
        self._check_emergency(at_limit=True)

    def fractions(self) -> dict[str, float]:
        return budget.budget_fractions(self._ctx.state.spec.budget, self.actual_use())

    def committed(self, leave_out: str | None = None) -> budget.BudgetUse:
        """What is spent plus what in-flight nodes (but `leave_out`) are expected to spend still (their P80)."""
        use = self.actual_use()
        nodes = self._ctx.state.nodes
        for name in self._ctx.index().names(IN_FLIGHT):
            if name == leave_out:
                continue
            node = nodes[name]
            if node.kind == "subgoal":
                # A child holds its grant; one not started yet is granted from this figure.
                if node.budget_granted is not None:
                    held = budget.grant_estimate(node.budget_granted, self.estimate("subgoal"))
                    self.reserve(use, node.kind, node, held)
                continue
            self.reserve(use, node.kind, node, self._priced(name, self.estimate(node.kind)))
        return use

    def reserve(
        self, use: budget.BudgetUse, kind: str, node: Node | None = None, estimate: KindEstimate | None = None
    ) -> None:
        estimate = estimate or self.estimate(kind)
        use.tokens += max(0, estimate.tokens_p80 - (node.tokens if node else 0))
        use.cost_usd += max(0.0, estimate.cost_p80 - (node.cost_usd if node else 0.0))

    def estimate_of(self, step: PlanStep, committed: budget.BudgetUse) -> KindEstimate:
        """What `step` is expected to spend: its kind's estimate; a subgoal, the budget it
        would be granted now."""
        estimate = self.estimate(step.kind)
        if isinstance(step, SubgoalStep):
            return budget.grant_estimate(self.grant(step, committed), estimate)
        return self._priced(step.name, estimate)

    def _priced(self, step_name: str, estimate: KindEstimate) -> KindEstimate:
        """A tool step's estimate, at least the most its tool declares one call may cost
        (a user's paid tool, `max_cost_usd`): counted before the money is spent."""
        plan = self._ctx.state.plan
        try:
            step = plan.step(step_name) if plan is not None else None
        except KeyError:
            return estimate
        spec = self._ctx.tools().get(step.tool) if isinstance(step, ToolStep) else None
        if spec is None or spec.max_cost_usd is None or spec.max_cost_usd <= estimate.cost_p80:
            return estimate
        return estimate.model_copy(
            update={"cost_p50": max(estimate.cost_p50, spec.max_cost_usd), "cost_p80": spec.max_cost_usd}
        )

    def tool_call_refused(self, tool: str, spec: ToolSpec, node: Node | None) -> str | None:
        """Why a call of a paid tool must not be sent: the most one call may cost (its
        `max_cost_usd`) is more than the cost budget has left beside what the other work in
        flight reserves (a `tool` step reserved it for its own call when it was admitted; an
        agent's call reserved nothing). None: send it. A tool that declares no most is
        charged after the fact only; a wrap-up step's call is never held back, as the step
        is not (budget.gate)."""
        limit = self._ctx.state.spec.budget.max_cost_usd
        if not limit or spec.max_cost_usd is None or (node is not None and self._wrap_up(node.name)):
            return None
        left = limit - self.committed(leave_out=node.name if node is not None else None).cost_usd
        if spec.max_cost_usd <= left:
            return None
        self._ctx.metrics.add(metrics.GATE_DECISIONS, 1, decision="skip")
        return (
            f"{tool} was not called: one call may cost up to {spec.max_cost_usd:g} USD (its max_cost_usd) and the "
            f"goal's cost budget has {max(left, 0.0):.2f} USD left of {limit:g} USD"
        )

    def _wrap_up(self, step_name: str) -> bool:
        plan = self._ctx.state.plan
        try:
            return plan is not None and plan.step(step_name).wrap_up
        except KeyError:
            return False

    def grant(self, step: SubgoalStep, committed: budget.BudgetUse | None = None) -> Budget:
        """The budget a subgoal starts with (workflows/shared/budget.py subgoal_grant)."""
        limits = self._ctx.state.spec.budget
        return budget.subgoal_grant(limits, step.budget_share, committed or self.committed())

    def estimate(self, kind: str) -> KindEstimate:
        if kind not in self._estimates:
            self._estimates[kind] = estimate_kind(
                self._ctx.state.ledger.by_kind.get(kind), kind, price_per_1k_tokens_usd=self._observed_price()
            )
        return self._estimates[kind]

    def charge(self, usage: Usage, node: Node | None = None, own: str | None = None) -> None:
        """Book one model call's usage on the goal (and its node, or the kind of the goal's
        own calls it is, `own`); past the budget, stop."""
        self._ctx.state.ledger.model_calls += 1
        if own is not None:
            self._ctx.state.ledger.own_calls.setdefault(own, OwnCalls()).calls += 1
        self._book(usage, node, own)

    def charge_tool(self, cost_usd: float, node: Node | None = None) -> None:
        """Book what a tool call reported it cost (a user's paid tool, `call.cost`) on the goal
        and its node, like a model call's: the next gate counts it; past the budget, stop."""
        if cost_usd <= 0:
            return
        self._ctx.state.ledger.tool_cost_usd += cost_usd
        self._book(Usage(cost_usd=cost_usd), node)

    def charge_failed_attempts(
        self, usage: Usage | None, kind: str, node: Node | None = None, own: str | None = None
    ) -> None:
        """Book the usage of model attempts that failed or timed out (the provider bills
        them): as reported when it is known (`usage`, summed over the attempts), else one
        attempt at `kind`'s P80 estimate, marked estimated."""
        ledger = self._ctx.state.ledger
        if usage is None:
            estimate = self.estimate(kind)
            usage = Usage(output_tokens=estimate.tokens_p80, cost_usd=estimate.cost_p80, estimated=True)
        ledger.failed_attempts += 1
        if usage.estimated:
            ledger.estimated_cost_usd += usage.cost_usd
        self._book(usage, node, own)

    def _book(self, usage: Usage, node: Node | None, own: str | None = None) -> None:
        ledger = self._ctx.state.ledger
        ledger.input_tokens += usage.input_tokens
        ledger.output_tokens += usage.output_tokens
        ledger.cost_usd += usage.cost_usd
        if node is not None:
            node.tokens += usage.tokens
            node.cost_usd += usage.cost_usd
        if own is not None:
            spent = ledger.own_calls.setdefault(own, OwnCalls())
            spent.tokens += usage.tokens
            spent.cost_usd += usage.cost_usd
        self._check_emergency()

    def own_call_refused(self, what: str, estimate: KindEstimate) -> str | None:
        """Why one of the goal's own optional calls must not be sent now (budget.own_call_gate), or None."""
        state = self._ctx.state
        reason = budget.own_call_gate(
            state.spec.budget, self.committed(), estimate, what=what, soft_fraction=state.spec.soft_gate
        )
        if reason is not None:
            self._ctx.metrics.add(metrics.GATE_DECISIONS, 1, decision="skip")
        return reason

    def call_estimate(self, tokens: int) -> KindEstimate:
        """A call of about `tokens` tokens (prompt and reply), priced as the goal's calls so far."""
        price = self._observed_price()
        cost = tokens / 1000 * (DEFAULT_PRICE_PER_1K_TOKENS_USD if price is None else price)
        return KindEstimate(
            tokens_p50=tokens,
            tokens_p80=tokens,
            cost_p50=cost,
            cost_p80=cost,
            seconds_p50=0,
            seconds_p80=0,
            samples=0,
            from_defaults=True,
        )

    def record_settled(self, node: Node) -> None:
        """A settled node's duration, cost and tokens join its kind's samples (for estimates)."""
        stats = self._ctx.state.ledger.by_kind.setdefault(node.kind, KindStats())
        stats.runs += 1
        seconds = own_seconds(node)  # a wait for quota is the resource's time, not the node's
        if seconds is not None:
            stats.seconds = (stats.seconds + [seconds])[-LEDGER_SAMPLES:]
        stats.costs_usd = (stats.costs_usd + [node.cost_usd])[-LEDGER_SAMPLES:]
        stats.tokens = (stats.tokens + [node.tokens])[-LEDGER_SAMPLES:]

    def _observed_price(self) -> float | None:
        ledger = self._ctx.state.ledger
        return ledger.cost_usd / (ledger.tokens / 1000) if ledger.tokens else None

    def _check_emergency(self, at_limit: bool = False) -> None:
        state = self._ctx.state
        if state.pause.mode == "aborting":
            return
        if state.pause.mode == "parked":
            return  # parking costs nothing, over lunch too: judged at resume
        if not self._ordinary_work_in_flight():
            return  # only wrap-up steps run: they may go past the budget, by design
        decision = budget.emergency_check(state.spec.budget, self.actual_use(), at_limit=at_limit)
        if decision is not None:
            self._ctx.metrics.add(metrics.GATE_DECISIONS, 1, decision="emergency_stop")
            self._ctx.log_gate(f"emergency stop: {decision.reason}", kind="abort")
            self._pause.abort(f"emergency stop: {decision.reason}", rollback=False, emergency=True)
            self._ctx.wake()

    def _ordinary_work_in_flight(self) -> bool:
        plan = self._ctx.state.plan
        if plan is None:
            return True  # planning
        return any(not plan.step(name).wrap_up for name in self._ctx.index().names(("running",)))


def same_moment(a: datetime | None, b: datetime | None) -> bool:
    """Two budget deadlines worked out at different times (float seconds): equal to the millisecond."""
    if a is None or b is None:
        return a is b
    return abs(a - b) < timedelta(milliseconds=1)
