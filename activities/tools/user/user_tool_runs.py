"""A user's declared tool as the tool activity runs it: a write is an `EffectTool`, so
`run_effect` (activities/tools/effect_runner.py) gives it its effect key, the intent and done
heartbeats, the refusal of an unconfirmed irreversible call and the retry decision of its
replay policy; anything else is a `LocalTool` run directly.

Each call gets a `ToolCall`: the effect key as its idempotency key, the attempt, what the
previous attempt last reported (`progress`), the workspace when the tool asked for it, and
the cost report, which goes on the call's result (and on a write's receipt, so a retry that
reuses the receipt still charges it). A write's exception other than ToolError counts as
"may have happened" (`OutcomeUnknown`): a keyed write is sent again under its key, a checked
one looked up, a `once` one asked about. The output is kept in the artifact store and the
receipt holds its digest, so heartbeats and history stay small.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel
from temporalio import activity

from perdure.activities.artifacts import ArtifactMissing
from perdure.activities.tools.catalogue.tool_base import EffectCall, EffectTool, LocalCall, LocalTool
from perdure.activities.tools.catalogue.tool_errors import NotSent, OutcomeUnknown, ToolError
from perdure.activities.tools.user.tool_decorator import ToolCall, ToolDeclaration
from perdure.workflows.shared.tool_specs import Compensation, Effect, Tool, ToolSpec


def spec_of(declaration: ToolDeclaration) -> ToolSpec:
    """The worker's spec of a declared tool: the goal's (its offer's), with the real model."""
    return declaration.offer().spec().model_copy(update={"args_model": declaration.args_model, "input_schema": None})


def implementation(declaration: ToolDeclaration) -> Tool:
    return UserEffectTool(declaration) if declaration.writes else UserLocalTool(declaration)


def as_text(value: Any) -> str:
    """What a tool's function returned, as the step or the model sees it."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json(indent=1)
    try:
        return json.dumps(value, indent=1, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _previous_progress() -> Any:
    if not activity.in_activity():
        return None
    details = activity.info().heartbeat_details
    last = details[-1] if details else None
    return last.get("progress") if isinstance(last, dict) else None


def _on_heartbeat(beat: Any) -> Any:
    """`call.heartbeat(progress)`: beats now with the call's phase details and the progress;
    from a sync tool's thread too (the beat is sent from the event loop)."""
    if beat is None or not activity.in_activity():
        return None
    loop = asyncio.get_running_loop()

    def on_loop(progress: Any) -> None:
        details = beat.details if isinstance(beat.details, dict) else {}
        beat.set({**details, "progress": progress})

    return lambda progress: loop.call_soon_threadsafe(on_loop, progress)


class UserLocalTool(LocalTool):
    """A read or a workspace write: called directly; running it again is free."""

    def __init__(self, declaration: ToolDeclaration) -> None:
        self.declaration = declaration
        self.spec = spec_of(declaration)

    async def run(self, call: LocalCall, args: Any) -> str:
        declared = self.declaration
        tool_call = ToolCall(
            tool=declared.name,
            goal_id=call.goal_id,
            attempt=activity.info().attempt if activity.in_activity() else 1,
            workspace=call.root if declared.workspace else None,
            progress=_previous_progress(),
            on_heartbeat=_on_heartbeat(call.beat),
        )
        try:
            return as_text(await declared.signature.invoke(declared.fn, args, tool_call))
        finally:
            call.meter.cost_usd += tool_call.cost_usd


class UserEffectTool(EffectTool):
    """A write to the outside world, made by the user's function under the effect protocol."""

    def __init__(self, declaration: ToolDeclaration) -> None:
        self.declaration = declaration
        self.spec = spec_of(declaration)

    def effect(self, args: Any, workspace: str) -> Effect | None:
        return self.declaration.effect(args)

    def undo(self, key: str, args: Any) -> Compensation | None:
        return self.declaration.undo(key, args)

    def target(self, args: Any) -> str:
        effect = self.declaration.effect(args)
        return f"the service of {self.declaration.name} ({effect.target if effect else 'its target'})"

    def _call(self, call: EffectCall) -> ToolCall:
        return ToolCall(
            tool=self.declaration.name,
            goal_id=call.goal_id,
            idempotency_key=call.key,
            attempt=activity.info().attempt if activity.in_activity() else 1,
            workspace=call.workspace if self.declaration.workspace else None,
            progress=_previous_progress(),
            on_heartbeat=_on_heartbeat(call.beat),
        )

    async def send(self, call: EffectCall, args: Any) -> dict:
        declared = self.declaration
        tool_call = self._call(call)
        try:
            value = await declared.signature.invoke(declared.fn, args, tool_call)
        except (ToolError, NotSent, OutcomeUnknown):
            raise
        except Exception as err:  # noqa: BLE001 - the user's code may fail anyhow; it may have sent first
            raise OutcomeUnknown(f"{type(err).__name__}: {str(err)[:500]}") from err
        finally:
            call.meter.cost_usd += tool_call.cost_usd
        return self._receipt(call, value)

    async def lookup(self, call: EffectCall, args: Any) -> dict | None:
        declared = self.declaration
        assert declared.lookup is not None and declared.lookup_signature is not None
        tool_call = self._call(call)
        try:
            found = await declared.lookup_signature.invoke(declared.lookup, args, tool_call)
        finally:
            call.meter.cost_usd += tool_call.cost_usd
        if found is None:
            return None
        return {**self._receipt(call, found), "found_by": "its lookup"}

    def _receipt(self, call: EffectCall, value: Any) -> dict:
        text = as_text(value)
        return {"output": call.store.put_text(text).digest, "chars": len(text)}

    def describe(self, call: EffectCall, args: Any, receipt: dict) -> str:
        digest = receipt.get("output")
        if not digest:
            said = receipt.get("confirmed_by") or "a person"
            return f"{self.declaration.name}: not called again; {said} said it happened"
        try:
            return call.store.get_text(digest)
        except ArtifactMissing:
            return f"{self.declaration.name} happened; its output {digest} is not in this worker's artifact store"
