"""`perdure.tool`: a Python function of yours declared as a tool, under the replay contract
of perdure's own tools.

    class GenerateArgs(BaseModel):
        prompt: str
        variant: int

    @perdure.tool(risk="remote-write", replay="keyed", key_fields=["prompt", "variant"],
                  compensation="refund_generation", network=True, timeout_s=300)
    async def generate_image(args: GenerateArgs, call: perdure.ToolCall) -> dict:
        '''Generate one image variant with the paid generation API.'''
        job = await api.submit(args.prompt, idempotency_key=call.idempotency_key)
        call.cost(job["price_usd"])
        return job

The function takes one pydantic model (its arguments: the JSON schema planners and agents
are shown) and, if it wants it, a `ToolCall` (the effect's idempotency key, heartbeats,
the cost report, the workspace). It may be async, or sync (run in a thread, which no
timeout can stop: so a `check` or `once` write, whose retry must not overlap a call still
running, must be async). Bound its I/O under `timeout_s`. What it returns is the text the
step or the model sees: a string as it is, anything else as JSON. It raises
`perdure.ToolError` for a failure the model can act on (nothing happened).

What the declaration says, and what perdure then does for every call:
- `risk`: `read` and `local-write` (the default is `read`) re-run freely; `remote-write`
  and `irreversible` reach outside the workspace: their calls get an effect key, are
  prepared and recorded before they are sent, and an irreversible one waits for a person.
- `replay` (a write must say): `keyed` re-sends the same key to a service that
  deduplicates it; `check` runs `lookup(args, call)` first and sends only when it finds
  nothing; `once` is never sent twice: an interrupted call becomes a question for a person.
  An exception other than ToolError from a write's function counts as "may have happened".
- The effect key, `fx-` + 32 hex digits from the goal, `target`, `action` and payload: by
  default the target is `tool:NAME`, the action NAME and the payload every argument; name
  the arguments that make the payload with `key_fields`, put fields in the target with a
  format string (`target="account:{account}"`), or give `effect=function(args) -> Effect`.
- `compensation`: the name of another of your tools that undoes this one's effect. It is
  registered before the effect is attempted and run, newest first, when the goal is aborted
  with rollback, with an `Undo` (the effect's key, this tool's name and its arguments): its
  argument model must be `perdure.Undo` (or extend it) and its replay `keyed` or `check`.
- `timeout_s` (one attempt), `heartbeat_s` (how soon a lost worker is noticed: 2 s for a
  keyed or checked write, 5 s for a `once` one, by default), `network` (it calls a service
  itself; a device offers it only with `--network`), `workspace` (it works in the goal's
  workspace: `call.workspace`), `devices` (a device may offer it), `max_cost_usd` (the most
  one call may cost: reserved from the goal's cost budget before a `tool` step runs, and a
  call the budget left could not pay is not sent), `secrets` (the environment variables
  whose values it uses: taken out of its output, errors and failures).
- `call.cost(usd)` reports what a call cost: it is charged to the goal's budget like model
  spend, before the next step is admitted. A read's attempt that fails is charged what it
  reported too (each attempt bills). Report the cost of a write's effect, also when the
  service answers a retried request from its idempotency store: the goal charges each
  call once, from the attempt that answered it; an effect found by a lookup, or that a
  person says happened, is charged what the lookup reported, else `max_cost_usd`.
- `safe_on_expiry` (["happened"], ["not_happened"] or both): what may be assumed of an
  uncertain call when the question whether it happened expires unanswered; only then may a
  step (or `on_expiry`, the outcome its questions take on expiry when the step, plan and goal
  name none) ask for it. A declaration asking for an assumption it does not declare is
  refused, and the worker does not start.

A declaration that contradicts itself raises `ToolDeclarationError` naming the tool when
its module is imported; checks across tools (a compensation naming no tool) run when a
worker loads the modules (tool_modules.py).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import re
import string
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field

from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.workflows.shared.retries import HEARTBEAT_TIMEOUT, ONCE_HEARTBEAT
from perdure.workflows.shared.tool_specs import (
    EFFECT_KEY,
    WRITE_RISKS,
    Compensation,
    Effect,
    ExpiryAssumption,
    ExpiryOutcome,
    ReplayPolicy,
    RiskClass,
)
from perdure.workflows.shared.user_tools import USER_TOOL_NAME, UserTool

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
RISKS: tuple[str, ...] = get_args(RiskClass)
REPLAYS: tuple[str, ...] = get_args(ReplayPolicy)
DEFAULT_TIMEOUT_S = 60.0
MAX_DESCRIPTION_CHARS = 2_000


class ToolDeclarationError(ValueError):
    """A declaration that cannot be used; the message names the tool and says why."""

    def __init__(self, tool: str, problem: str) -> None:
        super().__init__(f"tool {tool}: {problem}")
        self.tool = tool


class Undo(BaseModel):
    """What a compensation is called with: which effect to undo. It is decided before the
    effect is attempted, so it carries the key and the arguments, never the effect's
    result: find the effect by its key (the idempotency key it was sent with)."""

    model_config = ConfigDict(extra="forbid")

    effect_key: str = Field(pattern=EFFECT_KEY, description="The key the effect was made with (its idempotency key).")
    tool: str = Field(description="The tool whose effect this undoes.")
    args: dict = Field(description="The arguments that tool was called with.")


class ToolCall:
    """What a tool's function is told about its call, besides its arguments.

    perdure makes one per call. To test a tool, make one yourself (`ToolCall()`, or with
    an `idempotency_key`) and read `cost_usd` after the call."""

    def __init__(
        self,
        *,
        tool: str = "",
        goal_id: str = "",
        idempotency_key: str | None = None,
        attempt: int = 1,
        workspace: Path | None = None,
        progress: Any = None,
        on_heartbeat: Callable[[Any], None] | None = None,
    ) -> None:
        self.tool = tool
        self.goal_id = goal_id
        self.idempotency_key = idempotency_key
        """The effect key of a write (send it as the service's Idempotency-Key); None for a read."""
        self.attempt = attempt
        """1 on the first attempt; more when an earlier attempt failed or its worker was lost."""
        self.workspace = workspace
        """The goal's workspace (or the device's root), for a tool declared `workspace=True`."""
        self.progress = progress
        """What the previous attempt last reported with `heartbeat(progress)`, if it reached the server."""
        self.cost_usd = 0.0
        """The cost reported so far."""
        self._on_heartbeat = on_heartbeat

    def cost(self, usd: float) -> None:
        """Report what this call cost (adds up): charged to the goal's budget."""
        if isinstance(usd, bool) or not isinstance(usd, int | float) or not math.isfinite(usd) or usd < 0:
            raise ValueError(f"a tool's cost is a finite number of USD >= 0, got {usd!r}")
        self.cost_usd += float(usd)

    def heartbeat(self, progress: Any = None) -> None:
        """Say the call is alive, with an optional small JSON value a later attempt reads as
        `call.progress` (a job's handle, say). perdure heartbeats in the background too."""
        if self._on_heartbeat is not None:
            self._on_heartbeat(progress)


@dataclass(frozen=True)
class Signature:
    """Which parameter of a function takes the arguments, and which the ToolCall."""

    model: type[BaseModel]
    args_name: str
    call_name: str | None
    is_async: bool

    async def invoke(self, fn: Callable[..., Any], args: BaseModel, call: ToolCall) -> Any:
        """Call `fn`: an async one on the event loop, a sync one in a thread (the worker's
        event loop, and its heartbeats, go on meanwhile)."""
        kwargs: dict[str, Any] = {self.args_name: args}
        if self.call_name is not None:
            kwargs[self.call_name] = call
        if self.is_async:
            return await fn(**kwargs)
        return await asyncio.to_thread(fn, **kwargs)


@dataclass(frozen=True, eq=False)
class ToolDeclaration:
    """A declared tool: the function and everything perdure runs it by. Calling it calls the
    function, so a test may call it as it was written."""

    name: str
    description: str
    fn: Callable[..., Any]
    signature: Signature
    risk: RiskClass
    replay: ReplayPolicy
    effect_rule: Callable[[BaseModel], Effect] | None
    lookup: Callable[..., Any] | None
    lookup_signature: Signature | None
    compensation: str | None
    timeout_s: float
    heartbeat_s: float | None
    network: bool
    workspace: bool
    devices: bool
    max_cost_usd: float | None
    module: str
    secrets: tuple[str, ...] = ()
    """The environment variables whose values the tool uses: redacted from what it returns and raises."""
    safe_on_expiry: tuple[ExpiryAssumption, ...] = ()
    """What may be assumed of an uncertain call when its question expires unanswered."""
    on_expiry: ExpiryOutcome | None = None
    """The outcome its questions take on expiry when their step, plan and goal name none."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def args_model(self) -> type[BaseModel]:
        return self.signature.model

    @property
    def writes(self) -> bool:
        return self.risk in WRITE_RISKS

    def offer(self) -> UserTool:
        """The declaration as data, as a goal is told it."""
        return UserTool(
            name=self.name,
            description=self.description,
            input_schema=self.args_model.model_json_schema(),
            risk=self.risk,
            replay=self.replay,
            compensation=self.compensation,
            start_to_close_s=self.timeout_s,
            heartbeat_timeout_s=self.heartbeat_s,
            network=self.network,
            needs_workspace=self.workspace,
            on_devices=self.devices,
            max_cost_usd=self.max_cost_usd,
            module=self.module,
            safe_on_expiry=list(self.safe_on_expiry),
            on_expiry=self.on_expiry,
        )

    def secret_values(self) -> list[str]:
        """The values of its `secrets` in this process's environment (those set)."""
        return [value for name in self.secrets if (value := os.environ.get(name, "").strip())]

    def effect(self, args: BaseModel) -> Effect | None:
        return self.effect_rule(args) if self.effect_rule is not None else None

    def undo(self, key: str, args: BaseModel) -> Compensation | None:
        if self.compensation is None:
            return None
        record = Undo(effect_key=key, tool=self.name, args=args.model_dump(mode="json"))
        return Compensation(
            tool=self.compensation, args=record.model_dump(mode="json"), reason=f"undo {self.name} ({key})"
        )


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    risk: RiskClass = "read",
    replay: ReplayPolicy | None = None,
    target: str | None = None,
    action: str | None = None,
    key_fields: Sequence[str] | None = None,
    effect: Callable[[Any], Effect] | None = None,
    lookup: Callable[..., Any] | None = None,
    compensation: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    heartbeat_s: float | None = None,
    network: bool = False,
    workspace: bool = False,
    devices: bool = False,
    max_cost_usd: float | None = None,
    secrets: Sequence[str] = (),
    safe_on_expiry: Sequence[str] = (),
    on_expiry: str | None = None,
) -> Any:
    """Declare `fn` a perdure tool (module docstring: what each option means). Used bare
    (`@perdure.tool`, a read) or with options (`@perdure.tool(risk=..., replay=...)`)."""

    def declare(function: Callable[..., Any]) -> ToolDeclaration:
        return _declaration(
            function,
            name=name,
            description=description,
            risk=risk,
            replay=replay,
            target=target,
            action=action,
            key_fields=key_fields,
            effect=effect,
            lookup=lookup,
            compensation=compensation,
            timeout_s=timeout_s,
            heartbeat_s=heartbeat_s,
            network=network,
            workspace=workspace,
            devices=devices,
            max_cost_usd=max_cost_usd,
            secrets=secrets,
            safe_on_expiry=safe_on_expiry,
            on_expiry=on_expiry,
        )

    return declare(fn) if fn is not None else declare


def _declaration(fn: Callable[..., Any], **options: Any) -> ToolDeclaration:
    if not callable(fn) or not hasattr(fn, "__name__"):
        raise ToolDeclarationError(repr(fn)[:60], "perdure.tool declares a function")
    name = options["name"] or fn.__name__
    _check_name(name)
    risk, replay = options["risk"], options["replay"]
    if risk not in RISKS:
        raise ToolDeclarationError(name, f"risk {risk!r} is not one of {', '.join(RISKS)}")
    writes = risk in WRITE_RISKS
    if replay is None:
        if writes:
            raise ToolDeclarationError(
                name, f"is {risk}: declare its replay policy, keyed, check or once (what a retry may do)"
            )
        replay = "safe"
    if replay not in REPLAYS:
        raise ToolDeclarationError(name, f"replay {replay!r} is not one of {', '.join(REPLAYS)}")
    _check_policy(name, risk, replay, options)
    signature = signature_of(name, fn, "its function")
    lookup = options["lookup"]
    if lookup is not None and getattr(lookup, "__name__", "") == "<lambda>":
        raise ToolDeclarationError(
            name,
            f"its lookup is a lambda: give a function annotated like the tool's, "
            f"def find(args: {signature.model.__name__}, call: perdure.ToolCall) -> dict | None",
        )
    if replay in ("check", "once") and not signature.is_async:
        again = "its retry" if replay == "check" else "a person's `not happened`"
        raise ToolDeclarationError(
            name,
            f"replays `{replay}` but is a plain function: a thread cannot be stopped when its attempt times out, "
            f"and {again} would send it again beside it; make it `async def` and bound its I/O under timeout_s",
        )
    lookup_signature = signature_of(name, lookup, "its lookup", signature.model) if lookup is not None else None
    timeout_s, heartbeat_s = _timeouts(name, replay, writes, options["timeout_s"], options["heartbeat_s"])
    max_cost = options["max_cost_usd"]
    if max_cost is not None and (
        isinstance(max_cost, bool)
        or not isinstance(max_cost, int | float)
        or not math.isfinite(max_cost)
        or max_cost < 0
    ):
        raise ToolDeclarationError(name, f"max_cost_usd must be a finite number of USD >= 0, got {max_cost!r}")
    return ToolDeclaration(
        name=name,
        description=_description(name, fn, options["description"]),
        fn=fn,
        signature=signature,
        risk=risk,
        replay=replay,
        effect_rule=_effect_rule(name, signature.model, options) if writes else None,
        lookup=lookup,
        lookup_signature=lookup_signature,
        compensation=options["compensation"],
        timeout_s=timeout_s,
        heartbeat_s=heartbeat_s,
        network=bool(options["network"]),
        workspace=bool(options["workspace"]),
        devices=bool(options["devices"]),
        max_cost_usd=float(max_cost) if max_cost is not None else None,
        module=getattr(fn, "__module__", "") or "",
        secrets=_secrets(name, options["secrets"]),
        **_expiry(name, risk, options["safe_on_expiry"], options["on_expiry"]),
    )


def _expiry(name: str, risk: str, safe: Any, outcome: Any) -> dict[str, Any]:
    """`safe_on_expiry` and `on_expiry`: an assumption only for a write (nothing else is ever
    uncertain), and a default outcome that assumes only what the tool declares safe."""
    if isinstance(safe, str) or not all(s in get_args(ExpiryAssumption) for s in safe):
        raise ToolDeclarationError(name, f"safe_on_expiry lists happened and/or not_happened, got {safe!r}")
    if safe and risk not in WRITE_RISKS:
        raise ToolDeclarationError(
            name, f"is {risk} but declares safe_on_expiry: only a write's outcome is ever unknown"
        )
    if outcome is not None and outcome not in get_args(ExpiryOutcome):
        raise ToolDeclarationError(name, f"on_expiry {outcome!r} is not one of {', '.join(get_args(ExpiryOutcome))}")
    if outcome in get_args(ExpiryAssumption) and outcome not in safe:
        raise ToolDeclarationError(
            name,
            f"on_expiry {outcome} assumes what became of its call, but it does not declare that safe: add "
            f'safe_on_expiry=["{outcome}"] if it is, or use deny, park or abort',
        )
    return {"safe_on_expiry": tuple(dict.fromkeys(safe)), "on_expiry": outcome}


def _secrets(name: str, secrets: Any) -> tuple[str, ...]:
    if isinstance(secrets, str) or not all(isinstance(s, str) and re.fullmatch(ENV_NAME, s) for s in secrets):
        raise ToolDeclarationError(
            name, f"secrets is a list of environment variable names, e.g. ['PAYMENTS_KEY'], got {secrets!r}"
        )
    return tuple(secrets)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not re.fullmatch(USER_TOOL_NAME, name) or name.startswith("mcp__"):
        raise ToolDeclarationError(
            str(name), "a tool's name is lower-case letters, digits and '_', starting with a letter, at most 64"
        )
    if name in TOOL_SPECS:
        raise ToolDeclarationError(name, "is the name of a built-in tool: give yours another (name=...)")


def _check_policy(name: str, risk: str, replay: str, options: dict[str, Any]) -> None:
    """The contradictions of risk, replay, lookup, effect key and compensation."""
    writes = risk in WRITE_RISKS
    if writes and replay == "safe":
        raise ToolDeclarationError(name, f"is {risk} but its replay is `safe`: a retry would repeat the effect")
    if not writes and replay != "safe":
        raise ToolDeclarationError(
            name,
            f"is {risk} but replays `{replay}`: only a call that reaches outside the workspace has an effect to "
            "key, look up or guard; declare it remote-write (or irreversible)",
        )
    if replay == "check" and options["lookup"] is None:
        raise ToolDeclarationError(name, "replays `check` but has no lookup: give lookup=function(args, call)")
    if options["lookup"] is not None and replay != "check":
        raise ToolDeclarationError(name, f"has a lookup but replays `{replay}`: a lookup is what `check` runs")
    keyed_by = [k for k in ("target", "action", "key_fields", "effect") if options[k] is not None]
    if not writes and (keyed_by or options["compensation"] is not None):
        what = ", ".join(keyed_by + (["compensation"] if options["compensation"] is not None else []))
        raise ToolDeclarationError(name, f"is {risk} but declares {what}: only a write has an effect to key or undo")
    if options["effect"] is not None and len(keyed_by) > 1:
        raise ToolDeclarationError(name, "gives `effect` and also target/action/key_fields: give one or the other")
    if options["compensation"] is not None and options["compensation"] == name:
        raise ToolDeclarationError(name, "names itself as its compensation")


def signature_of(name: str, fn: Callable[..., Any], what: str, model: type[BaseModel] | None = None) -> Signature:
    """Which parameter takes the arguments (annotated with a pydantic model: `model`, when
    given) and which the ToolCall; anything else is refused."""
    if not callable(fn):
        raise ToolDeclarationError(name, f"{what} is not a function")
    try:
        hints = typing.get_type_hints(fn)
        parameters = inspect.signature(fn).parameters.values()
    except (NameError, TypeError, ValueError) as err:
        raise ToolDeclarationError(name, f"the annotations of {what} cannot be read: {err}") from None
    args_name = call_name = None
    found: type[BaseModel] | None = None
    for parameter in parameters:
        hint = _without_none(hints.get(parameter.name))
        if isinstance(hint, type) and issubclass(hint, ToolCall):
            call_name = parameter.name
        elif isinstance(hint, type) and issubclass(hint, BaseModel) and args_name is None:
            args_name, found = parameter.name, hint
        elif parameter.default is inspect.Parameter.empty or parameter.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            raise ToolDeclarationError(
                name,
                f"{what} takes `{parameter.name}`, which is neither its argument model (a pydantic model) "
                "nor a perdure.ToolCall",
            )
    if found is None or args_name is None:
        raise ToolDeclarationError(
            name, f"{what} takes no argument model: annotate one parameter with a pydantic model (class X(BaseModel))"
        )
    if model is not None and not issubclass(model, found):
        raise ToolDeclarationError(name, f"{what} takes {found.__name__}, not the tool's {model.__name__}")
    if model is None:
        try:
            found.model_json_schema()
        except Exception as err:  # noqa: BLE001 - pydantic raises several kinds: each says why
            raise ToolDeclarationError(name, f"its argument model {found.__name__} has no JSON schema: {err}") from None
    return Signature(model=found, args_name=args_name, call_name=call_name, is_async=inspect.iscoroutinefunction(fn))


def _without_none(hint: Any) -> Any:
    """`X | None` (or Optional[X]) as X: a parameter that may be None takes X when given."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in get_args(hint) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint


def _description(name: str, fn: Callable[..., Any], given: str | None) -> str:
    text = (given if given is not None else inspect.getdoc(fn) or "").strip()
    if given is None:
        text = text.split("\n\n", 1)[0].replace("\n", " ").strip()  # the docstring's first paragraph
    if not text:
        raise ToolDeclarationError(
            name, "has no description: give description=... or a docstring (planners and agents choose tools by it)"
        )
    return text[:MAX_DESCRIPTION_CHARS]


def _timeouts(name: str, replay: str, writes: bool, timeout_s: Any, heartbeat_s: Any) -> tuple[float, float | None]:
    for label, value in (("timeout_s", timeout_s), ("heartbeat_s", heartbeat_s)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
            raise ToolDeclarationError(name, f"{label} must be a number of seconds > 0, got {value!r}")
    if heartbeat_s is None and writes:
        heartbeat_s = (ONCE_HEARTBEAT if replay == "once" else HEARTBEAT_TIMEOUT).total_seconds()
    if heartbeat_s is not None and heartbeat_s >= timeout_s:
        raise ToolDeclarationError(
            name,
            f"heartbeat_s ({heartbeat_s:g}) must be shorter than timeout_s ({timeout_s:g}): nothing would be noticed",
        )
    return float(timeout_s), float(heartbeat_s) if heartbeat_s is not None else None


def _effect_rule(name: str, model: type[BaseModel], options: dict[str, Any]) -> Callable[[BaseModel], Effect]:
    """What a call reaches, does and sends, from the declaration: its effect key's material."""
    effect = options["effect"]
    if effect is not None:
        if not callable(effect):
            raise ToolDeclarationError(name, "its `effect` is not a function of the arguments")

        def made_by_function(args: BaseModel) -> Effect:
            made = effect(args)
            if isinstance(made, tuple) and len(made) == 3:
                return Effect(*made)
            raise TypeError(f"tool {name}: its effect function returned {type(made).__name__}, not perdure.Effect")

        return made_by_function
    fields = set(model.model_fields)
    key_fields = options["key_fields"]
    if key_fields is not None:
        if isinstance(key_fields, str) or not key_fields:
            raise ToolDeclarationError(name, "key_fields is a non-empty list of argument names")
        unknown = [f for f in key_fields if f not in fields]
        if unknown:
            raise ToolDeclarationError(
                name, f"key_fields names {', '.join(map(str, unknown))}, not fields of {model.__name__}"
            )
    target = options["target"] or f"tool:{name}"
    try:
        named = [field for _, field, _, _ in string.Formatter().parse(target) if field is not None]
    except ValueError as err:
        raise ToolDeclarationError(name, f"its target {target!r} is not a format string: {err}") from None
    for field in named:
        root = re.split(r"[.\[!:]", field, maxsplit=1)[0]
        if root not in fields:
            raise ToolDeclarationError(name, f"its target names {{{field}}}, not a field of {model.__name__}")
    action = options["action"] or name
    chosen = list(key_fields) if key_fields is not None else None

    def made_by_fields(args: BaseModel) -> Effect:
        dumped = args.model_dump(mode="json")
        payload = {f: dumped.get(f) for f in chosen} if chosen is not None else dumped
        return Effect(target.format(**dumped), action, payload)

    return made_by_fields
