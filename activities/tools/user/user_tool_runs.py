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

A read's attempt that raises was billed all the same: what it and the attempts before it
reported travels as `failed_cost_usd` in its failure's details (charged by the goal when it
is the last) and in its heartbeat (read back by the next attempt, whose result then carries
it). A write's failed attempts carry none: the attempt that answers reports the effect's cost.

The values of the environment variables a tool declares in `secrets` are taken out of its
output, its errors and its failures (credentials.redact), and an exception of its own never
travels as a failure's cause: what reaches history, a prompt or a log is the redacted text.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from perdure.activities.artifacts import ArtifactMissing
from perdure.activities.tools import credentials
from perdure.activities.tools.catalogue.tool_base import EffectCall, EffectTool, LocalCall, LocalTool
from perdure.activities.tools.catalogue.tool_errors import NotSent, OutcomeUnknown, ToolError
from perdure.activities.tools.user.tool_decorator import ToolCall, ToolDeclaration
from perdure.workflows.shared.tool_specs import FAILED_COST, Compensation, Effect, Tool, ToolSpec

MAX_FAILURE_CHARS = 500


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


def _previous_beat() -> dict:
    """The previous attempt's last heartbeat details, if they reached the server."""
    details = activity.info().heartbeat_details if activity.in_activity() else ()
    last = details[-1] if details else None
    return last if isinstance(last, dict) else {}


def _tool_call(declared: ToolDeclaration, goal_id: str, workspace: Path, beat: Any, key: str | None = None) -> ToolCall:
    """What the tool's function (or lookup) is told about this call."""
    return ToolCall(
        tool=declared.name,
        goal_id=goal_id,
        idempotency_key=key,
        attempt=activity.info().attempt if activity.in_activity() else 1,
        workspace=workspace if declared.workspace else None,
        progress=_previous_beat().get("progress"),
        on_heartbeat=_on_heartbeat(beat),
    )


def _failure(err: Exception, secrets: list[str], details: dict | None = None) -> ApplicationError:
    """The activity failure an exception of the tool's becomes: its text redacted, its type
    kept (an ApplicationError's retry choice too); raise it `from None`."""
    # The type goes in `type` (shown beside the message), as Temporal makes it of a raw exception.
    said = str(getattr(err, "message", None) or err) or "no message"
    message = credentials.redact(said, secrets)[:MAX_FAILURE_CHARS]
    if isinstance(err, ApplicationError):
        kind, non_retryable = err.type or type(err).__name__, err.non_retryable
    else:
        kind, non_retryable = type(err).__name__, False
    return ApplicationError(message, *([details] if details else []), type=kind, non_retryable=non_retryable)


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
        declared, secrets = self.declaration, self.declaration.secret_values()
        earlier = float(_previous_beat().get(FAILED_COST) or 0.0)
        if earlier:
            _beat_failed_cost(call, earlier)  # every beat of this attempt repeats it
        tool_call = _tool_call(declared, call.goal_id, call.root, call.beat)
        try:
            value = await declared.signature.invoke(declared.fn, args, tool_call)
        except ToolError as err:
            call.meter.cost_usd += earlier + tool_call.cost_usd
            raise credentials.redacted(err, secrets) from None
        except Exception as err:  # noqa: BLE001 - the user's code may fail anyhow; its attempt may have billed
            spent = earlier + tool_call.cost_usd
            if spent:
                _beat_failed_cost(call, spent)  # the next attempt reads it back
            raise _failure(err, secrets, {FAILED_COST: spent} if spent else None) from None
        call.meter.cost_usd += earlier + tool_call.cost_usd
        return credentials.redact(as_text(value), secrets)


def _beat_failed_cost(call: LocalCall, spent: float) -> None:
    if call.beat is not None:
        details = call.beat.details if isinstance(call.beat.details, dict) else {}
        call.beat.set({**details, FAILED_COST: spent})


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

    async def send(self, call: EffectCall, args: Any) -> dict:
        declared, secrets = self.declaration, self.declaration.secret_values()
        tool_call = _tool_call(declared, call.goal_id, call.workspace, call.beat, call.key)
        try:
            value = await declared.signature.invoke(declared.fn, args, tool_call)
        except (ToolError, NotSent, OutcomeUnknown) as err:
            raise credentials.redacted(err, secrets) from None
        except Exception as err:  # noqa: BLE001 - the user's code may fail anyhow; it may have sent first
            said = credentials.redact(f"{type(err).__name__}: {err}", secrets)[:MAX_FAILURE_CHARS]
            raise OutcomeUnknown(said) from None
        finally:
            call.meter.cost_usd += tool_call.cost_usd
        return await self._receipt(call, value, secrets)

    async def lookup(self, call: EffectCall, args: Any) -> dict | None:
        declared, secrets = self.declaration, self.declaration.secret_values()
        assert declared.lookup is not None and declared.lookup_signature is not None
        tool_call = _tool_call(declared, call.goal_id, call.workspace, call.beat, call.key)
        try:
            found = await declared.lookup_signature.invoke(declared.lookup, args, tool_call)
        except ToolError as err:
            raise credentials.redacted(err, secrets) from None
        except Exception as err:  # noqa: BLE001 - not knowing whether it happened: the attempt fails, a retry looks again
            raise _failure(err, secrets) from None
        finally:
            call.meter.cost_usd += tool_call.cost_usd
        if found is None:
            return None
        return {**await self._receipt(call, found, secrets), "found_by": "its lookup"}

    async def _receipt(self, call: EffectCall, value: Any, secrets: list[str]) -> dict:
        text = credentials.redact(as_text(value), secrets)
        return {"output": (await call.store.aput_text(text)).digest, "chars": len(text)}

    def describe(self, call: EffectCall, args: Any, receipt: dict) -> str:
        digest = receipt.get("output")
        if not digest:
            said = receipt.get("confirmed_by") or "a person"
            return f"{self.declaration.name}: not called again; {said} said it happened"
        try:
            return call.store.get_text(digest)
        except ArtifactMissing:
            return f"{self.declaration.name} happened; its output {digest} is not in this worker's artifact store"
