"""The runner that makes each effect happen once: the worker's half of the side-effect protocol.

For every call of an effect tool (activities/tools/catalogue/tool_base.py `EffectTool`:
the built-in remote writes, MCP tools that are not `safe` reads, and the writes of a user's
own tools, activities/tools/user/), `run_effect`:
1. derives the effect key from the resolved arguments (`perdure.workflows.shared.effects`), so
   every attempt of the same logical effect carries the same key;
2. refuses an `irreversible` tool unless the workflow says a human confirmed it;
3. decides from the attempt number, the previous attempt's last heartbeat and
   the replay policy whether to reuse a receipt, look the effect up, send it
   (again, under the same key) or answer `uncertain`;
4. heartbeats the phase around the external call: `intent` with the key before,
   `done` with the receipt after.
It must not guess: when an effect may or may not have happened and nothing can
tell, the result is `uncertain` and nothing is sent again.

Each tool's own part (what it sends, how it finds an effect again, how it words the
outcome) is in its module of activities/tools/catalogue/. Fault points
(`perdure.activities.faults`) mark where crash tests may kill the worker; they do
nothing unless PERDURE_FAULT is set.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from perdure.activities.artifacts import ArtifactStore, preview
from perdure.activities.faults import fault_point
from perdure.activities.heartbeat import Heartbeat
from perdure.activities.tools.catalogue.tool_base import CallMeter, EffectCall, EffectTool
from perdure.activities.tools.catalogue.tool_errors import NotSent, OutcomeUnknown, ToolError
from perdure.workflows.shared.contracts import ToolInput, ToolResult
from perdure.workflows.shared.effects import (
    decide_retry,
    done_details,
    effect_key,
    intent_details,
    last_heartbeat,
)
from perdure.workflows.shared.tool_specs import Compensation, ToolArgs, ToolSpec

COST = "cost_usd"
"""A receipt's record of what the effect cost (a user tool's `call.cost`), when it cost anything."""


async def run_effect(
    impl: EffectTool, spec: ToolSpec, input: ToolInput, args: ToolArgs, store: ArtifactStore, beat: Heartbeat
) -> ToolResult:
    # The implementation is the declaration: a user tool's rules are known only here.
    effect = impl.effect(args, input.workspace)
    assert effect is not None, f"{input.tool} has no effect description"
    key = effect_key(input.goal_id, *effect)
    # On the tool call's span (activities/spans.py), when tracing is on.
    trace.get_current_span().set_attribute("perdure.effect_key", key)
    call = EffectCall(
        goal_id=input.goal_id, tool=input.tool, workspace=Path(input.workspace), key=key, store=store, beat=beat
    )
    outcome = _Outcome(spec, input, key, impl.target(args), impl.undo(key, args), call.meter)

    if spec.risk == "irreversible" and not input.confirmed:
        return outcome.failed(
            f"{input.tool} is irreversible and needs a human confirmation before it runs; "
            "nothing was sent (the workflow must ask and set confirmed)"
        )

    if input.resolution == "happened":
        # A person checked the receiving side after an uncertain attempt: record, do not send.
        receipt = {"confirmed_by": "a person, after an uncertain attempt"}
        unknown_cost_at_cap(call, spec)
        text = await _described(impl, call, args, receipt)
        return outcome.result(ok=True, output=await store.aput_text(text), preview=preview(text), receipt=receipt)

    info = activity.info()
    previous = last_heartbeat(info.heartbeat_details, key)
    decision = decide_retry(spec.replay, info.attempt, previous)
    activity.logger.info(
        "effect decided", extra={"tool": input.tool, "attempt": info.attempt, "effect_key": key, "decision": decision}
    )

    if decision == "uncertain":
        return outcome.uncertain(
            f"an earlier attempt of {input.tool} was interrupted and may have sent the request "
            f"(effect key {key}); whether {outcome.target} received it is unknown, and {input.tool} is never "
            "sent twice on its own: a human must check and decide"
        )

    receipt: dict | None = None
    if decision == "reuse":
        assert previous is not None
        receipt = {**previous["receipt"], "confirmed_by": "an earlier attempt's receipt"}
        # What the effect cost travels on its receipt: the goal charges it from this attempt.
        call.meter.cost_usd = float(receipt.get(COST) or 0.0)
    elif decision == "lookup":
        try:
            receipt = await impl.lookup(call, args)
        except ToolError as err:
            return outcome.failed(err.message)
        if receipt is not None:
            # Made by an attempt whose answer never reached the goal: charged now.
            unknown_cost_at_cap(call, spec)

    if receipt is None:
        beat.set(intent_details(key))
        fault_point("before_effect", input.tool, effect_key=key)
        try:
            receipt = await impl.send(call, args)
        except ToolError as err:
            activity.logger.info("effect refused", extra={"tool": input.tool, "effect_key": key, "error": err.message})
            return outcome.failed(err.message)
        except (NotSent, OutcomeUnknown) as err:
            return outcome.unconfirmed(err, info)
        fault_point("after_effect", input.tool, effect_key=key)
        if call.meter.cost_usd:
            receipt = {**receipt, COST: call.meter.cost_usd}
        beat.set(done_details(key, receipt))
        fault_point("after_receipt", input.tool, effect_key=key)

    text = await _described(impl, call, args, receipt)
    return outcome.result(ok=True, output=await store.aput_text(text), preview=preview(text), receipt=receipt)


async def _described(impl: EffectTool, call: EffectCall, args: ToolArgs, receipt: dict) -> str:
    # In a thread: a tool's description may read what its send stored (the store blocks).
    return await asyncio.to_thread(impl.describe, call, args, receipt)


def unknown_cost_at_cap(call: EffectCall, spec: ToolSpec) -> None:
    """An effect that happened in an attempt whose answer was lost, found again (a lookup) or
    confirmed by a person: charged what the lookup reported, else, its cost unknown, at the
    most the tool declares one call may cost (as a lost model attempt is charged at its estimate)."""
    if not call.meter.cost_usd and spec.max_cost_usd:
        call.meter.cost_usd = spec.max_cost_usd


@dataclass(frozen=True)
class _Outcome:
    """Builds the ToolResult of one effect call; the compensation travels whenever the effect may exist."""

    spec: ToolSpec
    input: ToolInput
    key: str
    target: str
    compensation: Compensation | None
    meter: CallMeter

    def result(self, **fields: Any) -> ToolResult:
        if fields.get("ok") or fields.get("uncertain"):
            fields["compensation"] = self.compensation
        return ToolResult(
            call_id=self.input.call_id,
            tool=self.input.tool,
            risk=self.spec.risk,
            effect_key=self.key,
            cost_usd=self.meter.cost_usd,
            **fields,
        )

    def failed(self, message: str) -> ToolResult:
        return self.result(ok=False, error=message)

    def uncertain(self, message: str) -> ToolResult:
        activity.logger.warning(
            "effect uncertain", extra={"tool": self.input.tool, "effect_key": self.key, "error": message}
        )
        return self.result(ok=False, uncertain=True, error=message)

    def unconfirmed(self, err: NotSent | OutcomeUnknown, info: activity.Info) -> ToolResult:
        """The call failed without a definite answer: retry, report, or say it is uncertain."""
        tool, target = self.input.tool, self.target
        if self.spec.replay == "once":
            if isinstance(err, NotSent):
                return self.failed(f"{tool} was not delivered to {target}: {err}")
            return self.uncertain(
                f"{tool} may have reached {target} but no answer says so ({err}); "
                f"it is never sent twice on its own (effect key {self.key}): a human must check and decide"
            )
        maximum = info.retry_policy.maximum_attempts if info.retry_policy else 0
        if maximum == 0 or info.attempt < maximum:
            # Safe to retry: the next attempt sends the same key (keyed) or looks first (check).
            raise ApplicationError(
                f"{tool} to {target} not confirmed yet: {err}",
                {"effect_key": self.key},
                type="EffectNotConfirmed",
                next_retry_delay=_delay(err.retry_after_s),
            )
        if info.attempt == 1 and isinstance(err, NotSent):
            return self.failed(f"{tool} to {target} was not sent: {err}")
        return self.uncertain(
            f"{tool} to {target} was not confirmed in {info.attempt} attempts (last: {err}); an earlier attempt "
            f"may have got through. Running it again is safe: it carries the same effect key {self.key}"
        )


def _delay(seconds: float | None) -> timedelta | None:
    return timedelta(seconds=seconds) if seconds else None
