"""Every model call of a goal: the context it is told (pending steers apply here,
at the model-turn boundary), one set of activity options, and the charge of its
usage, failed attempts included. Planner, drift check, verification questions, llm nodes
and agent turns all call through here; a call no step asked for is booked by its kind
(`own`: contracts.OWN_CALL_KINDS) as well as in the goal's totals.

Failed attempts (the provider bills them) reach the ledger by one of three ways, all
read from data in history, so replay charges the same: the successful result's
`failed_attempts` (workflows/shared/retries.py `with_attempts`); the failing ApplicationError's
details, when the activity failed for good; or, when its last attempt timed out (the
worker died), that attempt's last heartbeat details, where attempts that left no record
are the ones that died with their worker (marked `lost`). A record without usage is
charged at the node kind's P80 estimate, marked estimated (Spend.charge_failed_attempts).
A call whose attempts dead workers used up is scheduled again while the goal allows,
with the attempts the model's own failures left it (lost_workers.py).

A call whose resource has a quota and whose slot is later (QuotaWait, activities/quota/quota_admission.py)
waits here on a durable timer, shown on its node, and runs again with its slot's key; a
resource without a quota never takes this path.

Workflow code: it schedules activities. A new model-backed activity needs only an
input and a result type in workflows/goal/contracts/goal_contracts.py and a call to `ModelCalls.run`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts.decision_contracts import sender
from perdure.workflows.goal.contracts.goal_contracts import ModelContext, Usage
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.inbox import Inbox
from perdure.workflows.goal.lost_workers import LostWorkers, out_of_attempts
from perdure.workflows.goal.spend import Spend
from perdure.workflows.quota.quota_workflow import QUOTA_KEY, QUOTA_WAIT, slot_text, waited_seconds, waited_text
from perdure.workflows.shared.retries import (
    MODEL_OPTIONS,
    MODEL_RETRY,
    ModelAttempt,
    failed_attempts_in,
    unaccounted_attempts,
    with_attempts,
)


class _Charged(Protocol):
    usage: Usage


R = TypeVar("R", bound=_Charged)
# How long before its quota slot a waiting call is scheduled again (less than activities/quota/quota_admission.py
# ADMIT_WITHIN): what a timer, a workflow task and an activity start may take on a loaded worker.
# A call back later than its slot loses it (activities/quota/quota_admission.py LATE); 0.5 s was too little on
# 2 loaded cores (a suite run saw most calls retake their slots, and the line grow fourfold).
SLOT_LEAD = timedelta(seconds=2)
# What a failed attempt of a call outside any node (planner, drift check) is estimated as.
UNNODED_KIND = "llm"


class ModelCalls:
    def __init__(self, ctx: GoalContext, inbox: Inbox, spend: Spend, lost: LostWorkers) -> None:
        self._ctx = ctx
        self._inbox = inbox
        self._spend = spend
        self._lost = lost

    def context(self, boundary: str, node: Node | None = None) -> ModelContext:
        """The context for a model call about to start: pending steers apply here."""
        state, spec = self._ctx.state, self._ctx.state.spec
        for entry in self._inbox.pending(("steer",)):
            state.guidance.append(entry.message.text)
            self._inbox.settle(entry, "applied", f"applied at {boundary}")
            self._ctx.decide("steer", f"guidance from {boundary} on: {entry.message.text}", sender(entry.message.by))
        return ModelContext(
            profile=spec.model_profile,
            goal=spec.goal,
            constraints=spec.constraints,
            premises=state.premises,
            guidance=state.guidance,
            rejected=[path.for_prompt() for path in state.rejected_paths],
            degraded=bool(node and node.degraded),
        )

    async def run(
        self,
        activity: str,
        payload: BaseModel,
        result_type: type[R],
        summary: str,
        node: Node | None = None,
        own: str | None = None,
    ) -> R:
        """One model activity; its usage, and its failed attempts', are charged to the goal
        (and to `node`, or to the kind of the goal's own calls it is, `own`: contracts.OWN_CALL_KINDS)
        as it returns. An activity that dead workers ran out of attempts is scheduled again while
        the goal allows (lost_workers.py), with the attempts the model's own failures left it. An
        ActivityError (out of retries) propagates once its failed attempts are charged: what it
        means is the caller's call."""
        kind = node.kind if node is not None else UNNODED_KIND
        own_failures = lost = 0
        while True:
            options = model_options(own_failures)
            try:
                result = await workflow.execute_activity(
                    activity, payload, result_type=with_attempts(result_type), summary=summary, **options
                )
                break
            except ActivityError as err:
                wait = quota_wait_of(err)
                if wait is not None:
                    attempts = failed_attempts_in(wait)
                else:
                    made = options["retry_policy"].maximum_attempts if out_of_attempts(err) else None
                    attempts = attempts_of_failure(err, made)
                self._charge(attempts, kind, node, own)
                if wait is not None:
                    own_failures += sum(1 for a in attempts if not a.lost)
                    await self._wait_for_quota(wait, node)
                    payload = with_quota_key(payload, str(wait["key"]))
                    continue
                if not out_of_attempts(err) or not any(a.lost for a in attempts):
                    raise
                own_failures += sum(1 for a in attempts if not a.lost)
                lost += sum(1 for a in attempts if a.lost)
                if own_failures >= MODEL_RETRY.maximum_attempts or not self._lost.again(node, summary, lost, kind):
                    raise
        self._charge(getattr(result, "failed_attempts", []), kind, node, own)
        self._spend.charge(result.usage, node, own)
        return result  # type: ignore[return-value]  # a subclass of result_type

    def _charge(self, attempts: list[ModelAttempt], kind: str, node: Node | None, own: str | None) -> None:
        """Charge failed attempts; those that died with their worker are counted as lost too
        (lost_workers.py)."""
        for attempt in attempts:
            self._spend.charge_failed_attempts(usage_of(attempt), kind, node, own)
        self._lost.count(node, sum(1 for a in attempts if a.lost))

    async def _wait_for_quota(self, wait: dict, node: Node | None) -> None:
        """Until the call's slot, on a durable timer; the node shows it meanwhile and keeps,
        after, how long it waited and behind how many calls (what estimates leave out)."""
        resource, at = str(wait["quota"]), datetime.fromisoformat(str(wait["at"]))
        before = waited_seconds(node.placements) if node is not None else 0.0
        if node is not None:
            node.placements[QUOTA_KEY] = slot_text(resource, at)
        started = workflow.now()
        # Back a little early: the activity waits out the rest itself, so the request leaves
        # at its slot instead of at the slot plus a workflow task and an activity start.
        if at - SLOT_LEAD > started:
            await workflow.sleep(at - SLOT_LEAD - started)
        if node is not None:
            waited = before + (workflow.now() - started).total_seconds()
            node.placements[QUOTA_KEY] = waited_text(resource, waited, int(wait.get("ahead") or 0))


def quota_wait_of(err: ActivityError) -> dict | None:
    """The slot a call must wait for (activities/quota/quota_admission.py's QuotaWait), or None."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type == QUOTA_WAIT and cause.details:
        details = cause.details[0]
        return details if isinstance(details, dict) and {"quota", "at", "key"} <= details.keys() else None
    return None


def with_quota_key(payload: BaseModel, key: str) -> BaseModel:
    """The same call, asking for the slot reserved under `key`."""
    context = getattr(payload, "context", None)
    if not isinstance(context, ModelContext):
        return payload
    return payload.model_copy(update={"context": context.model_copy(update={"quota_key": key})})


def attempts_of_failure(err: ActivityError, attempts: int | None = None) -> list[ModelAttempt]:
    """The failed attempts of an activity that failed for good, from what history holds.
    `attempts`: how many it made, when known (its retry policy's maximum, reached); else
    up to the attempt of its last beat."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        return failed_attempts_in(cause.details)
    if isinstance(cause, TimeoutError):
        details = list(cause.last_heartbeat_details)
        info = details[0] if details and isinstance(details[0], dict) else {}
        # No heartbeat at all: the one attempt died before its first beat, maybe mid-request.
        through = info.get("attempt") if isinstance(info.get("attempt"), int) else 1
        # The last attempt may have died before its first beat: the beat is an earlier one's.
        through = max(through, attempts or 0)
        return failed_attempts_in(info) + unaccounted_attempts(info, through, handle_pays=True)
    return []


def model_options(own_failures: int) -> dict:
    """MODEL_OPTIONS for a call scheduled again: the attempts the model's own failures left it."""
    remaining = max(1, (MODEL_RETRY.maximum_attempts or 1) - own_failures)
    return {**MODEL_OPTIONS, "retry_policy": replace(MODEL_RETRY, maximum_attempts=remaining)}


def usage_of(attempt: ModelAttempt) -> Usage | None:
    if not attempt.known:
        return None
    return Usage(input_tokens=attempt.input_tokens, output_tokens=attempt.output_tokens, cost_usd=attempt.cost_usd)
