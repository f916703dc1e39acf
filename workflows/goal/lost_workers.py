"""Attempts lost to dead workers: whether a call whose activity they ended is scheduled
again, and what the goal counts of them.

An activity retries under its RetryPolicy, and Temporal's policy cannot tell an attempt
the model or tool failed from one whose worker died (its heartbeat or start-to-close
timeout fired). So a worker killed as often as a step has attempts used to fail the
step. Now, when an activity ends out of attempts and dead workers took some of them, the
caller schedules the same call again, as a new activity with the same input (the same
effect key): model calls (model_calls.py, which knows from the attempts' records which
were lost and keeps the model's own failures at their limit) and tool calls whose second
run is harmless (tool_runner.py: `safe`, `keyed` and `check` tools, replay-safe
commands; a `once` tool's lost attempt stays a question for a person). Each lost model
attempt is charged as possibly billed, like any failed attempt.

It is scheduled again while the goal allows it: the goal is not stopping, its step was
not told to stop, the budget gate would let one more attempt start (its kind's P80
estimate fits what is left; a wrap-up step may go past the budget, as the gates let it),
and the call has lost fewer than LOST_PER_CALL attempts: a call timing out that often is
more likely stuck on a live worker than unlucky. Every decision is in the gate
log; the ledger counts lost attempts per step, which status, the report and the result show.

Workflow code: decides from what history holds; schedules nothing itself.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError, RetryState, TimeoutError, TimeoutType

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.spend import Spend
from perdure.workflows.shared import budget

# A call scheduled again after this many of its attempts died is left to fail (module docstring).
LOST_PER_CALL = 30
# Where the ledger counts attempts of calls outside any step (planning, drift checks).
LOST_OUTSIDE_STEPS = "(planning and checks)"
LOST_TIMEOUTS = (TimeoutType.HEARTBEAT, TimeoutType.START_TO_CLOSE)


def out_of_attempts(err: ActivityError) -> bool:
    """The activity's retry policy ran out (not a non-retryable error, not a cancellation)."""
    return err.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED


def last_attempt_lost(err: ActivityError) -> bool:
    """The activity's last attempt timed out: its worker died (or stopped answering)."""
    return out_of_attempts(err) and isinstance(err.cause, TimeoutError) and err.cause.type in LOST_TIMEOUTS


class LostWorkers:
    def __init__(self, ctx: GoalContext, spend: Spend) -> None:
        self._ctx = ctx
        self._spend = spend

    def count(self, node: Node | None, lost: int) -> None:
        """Book `lost` attempts of a call of `node` (None: a call outside the steps)."""
        if lost <= 0:
            return
        ledger = self._ctx.state.ledger
        ledger.lost_attempts += lost
        step = node.name if node is not None else LOST_OUTSIDE_STEPS
        ledger.lost_by_step[step] = ledger.lost_by_step.get(step, 0) + lost

    def again(self, node: Node | None, summary: str, lost_in_call: int, kind: str) -> bool:
        """Whether a call (`summary`, estimated as a node of `kind`) whose activity dead
        workers ended, `lost_in_call` attempts lost so far, is scheduled again; the decision
        goes to the gate log."""
        refusal = self._refusal(node, lost_in_call, kind)
        what = f"{summary}: {lost_in_call} attempt(s) lost to worker deaths"
        self._ctx.log_gate(f"{what}; scheduled again" if refusal is None else f"{what}; not again: {refusal}")
        return refusal is None

    def _refusal(self, node: Node | None, lost_in_call: int, kind: str) -> str | None:
        state = self._ctx.state
        if state.pause.mode == "aborting":
            return "the goal is stopping"
        if node is not None and node.name in self._ctx.stopping:
            return "its step was told to stop"
        if lost_in_call >= LOST_PER_CALL:
            return f"{LOST_PER_CALL} lost is the most a call is given (it may be stuck, not unlucky)"
        # The gate a step passes to start, for one more attempt: money counted before it is spent.
        decision = budget.gate(
            state.spec.budget,
            self._spend.actual_use(),
            self._spend.estimate(kind),
            node_kind=kind,
            wrap_up=self._wrap_up(node),
            soft_fraction=state.spec.soft_gate,
        )
        if decision.action in ("skip", "wrap_up_only"):
            return f"the budget cannot take one more attempt: {decision.reason}"
        return None

    def _wrap_up(self, node: Node | None) -> bool:
        plan = self._ctx.state.plan
        if node is None or plan is None:
            return False
        try:
            return plan.step(node.name).wrap_up
        except KeyError:
            return False
