"""How a tool runs on a worker: the two kinds of implementation, what each call is given,
and the check that a declaration is complete and consistent.

A `LocalTool` does its work on this machine and returns the text the step or the model
sees; an `EffectTool` makes an effect on the outside world under the effect protocol
(activities/tools/effect_runner.py): `send` makes it and returns a small receipt,
`lookup` (for `check` tools) finds it by its key, `describe` words the outcome, `target`
names where it lands. A failure the model can act on is raised as `ToolError`
(tool_errors.py), an unconfirmed send as `NotSent` or `OutcomeUnknown`.

Pure at import, like every module of this package: the workflow imports the tool
modules that subclass these for their declarations.
"""

from __future__ import annotations

import codecs
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perdure.workflows.shared.tool_specs import WRITE_RISKS, Tool

SAMPLE_KEY = "fx-" + "0" * 32
"""The effect key the catalogue check builds a sample compensation with."""


@dataclass
class CallMeter:
    """What one call reported it cost (a user tool's `call.cost`), for its ToolResult."""

    cost_usd: float = 0.0


@dataclass
class LocalCall:
    """What a local tool's `run` is given besides its arguments."""

    root: Path
    """The workspace's real path, resolved once per call (as given, for a tool that needs no workspace)."""
    store: Any
    """The worker's ArtifactStore."""
    file: Any = None
    """A workspace tool's part in versioning (activities/tools/workspace_files.py FileCall)."""
    network: bool = False
    """A command tool's sandbox keeps the network (ToolInput.network)."""
    hidden: tuple[Path, ...] = ()
    """What a command tool's sandbox masks even inside the workspace (the artifact store...)."""
    quotas: Callable[[], dict] = dict
    """The worker's declared quotas (config.toml, reloaded): a fetch draws on its host's."""
    goal_id: str = ""
    tool: str = ""
    beat: Any = None
    """The call's activities/heartbeat.py Heartbeat (None outside an activity's run)."""
    meter: CallMeter = field(default_factory=CallMeter)


class LocalTool(Tool, ABC):
    """A tool whose work stays on this machine, or only reads."""

    @abstractmethod
    async def run(self, call: LocalCall, args: Any) -> str:
        """The text the step or the model sees; ToolError for a failure the model can act on."""


@dataclass(frozen=True)
class EffectCall:
    """What one effect tool's methods need to know about the call besides its arguments."""

    goal_id: str
    tool: str
    workspace: Path
    key: str
    store: Any
    beat: Any = None
    """The call's activities/heartbeat.py Heartbeat (None outside an activity's run)."""
    meter: CallMeter = field(default_factory=CallMeter)


class EffectTool(Tool, ABC):
    """A tool whose call reaches outside the workspace, run by `run_effect`. `send` makes the
    effect and returns a small receipt."""

    @abstractmethod
    async def send(self, call: EffectCall, args: Any) -> dict: ...

    async def lookup(self, call: EffectCall, args: Any) -> dict | None:
        """For `check` tools: the receipt of the effect if it already happened."""
        raise TypeError(f"{call.tool} is not a `check` tool and has no lookup")

    @abstractmethod
    def describe(self, call: EffectCall, args: Any, receipt: dict) -> str: ...

    @abstractmethod
    def target(self, args: Any) -> str:
        """Where the effect lands, for messages."""


def has_lookup(tool: Tool) -> bool:
    return isinstance(tool, EffectTool) and type(tool).lookup is not EffectTool.lookup


def how_confirmed(receipt: dict) -> str:
    """How an effect's receipt was obtained, when it was not just sent: worth telling the user."""
    if receipt.get("confirmed_by"):
        return f"; confirmed by {receipt['confirmed_by']}, not sent again"
    if receipt.get("found_by"):
        return f"; found by {receipt['found_by']}, not done again"
    if receipt.get("replayed"):
        return "; the service recognised the effect key and did not repeat it"
    return ""


def decoded(data: bytes, encoding: str = "utf-8", *, capped: bool = False) -> str:
    """Decode text; a capped read may end mid-character, which is dropped rather than shown as garbage."""
    try:
        decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    except LookupError:
        # A server may announce a charset Python does not know.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return decoder.decode(data, final=not capped)


# --- the catalogue check ----------------------------------------------------------------


def declaration_problems(tools: Mapping[str, Tool]) -> list[str]:
    """What is missing or contradictory in these declarations, one line per problem naming
    the tool; empty when each is complete and they agree with one another."""
    problems: list[str] = []
    for name, tool in tools.items():
        problems += [f"{name}: {problem}" for problem in _problems_of(name, tool, tools)]
    return problems


def _problems_of(name: str, tool: Tool, tools: Mapping[str, Tool]) -> list[str]:
    spec = getattr(tool, "spec", None)
    if spec is None:
        return ["declares no spec"]
    if spec.name != name:
        return [f"is registered as '{name}' but its spec names '{spec.name}'"]
    try:
        args = spec.args_model.model_validate(tool.example)
    except ValidationError as err:
        return [f"its example does not validate against {spec.args_model.__name__}: {err.errors()[0]['msg']}"]
    problems = []
    writes = spec.risk in WRITE_RISKS
    effect = tool.effect(args, "/workspace")
    if writes and spec.replay == "safe":
        problems.append(f"is {spec.risk} but its replay is `safe`: a retry would repeat the effect")
    if writes and not isinstance(tool, EffectTool):
        problems.append(f"is {spec.risk} but not an EffectTool: nothing would key, record or confirm its effect")
    if writes and effect is None:
        problems.append(f"is {spec.risk} but its example has no effect, so no effect key")
    if not writes and effect is not None:
        problems.append(f"is {spec.risk} but declares an effect: the goal records effects of writes only")
    if not isinstance(tool, EffectTool | LocalTool):
        problems.append("has no implementation (neither a LocalTool nor an EffectTool)")
    if spec.replay in ("keyed", "check") and not isinstance(tool, EffectTool):
        problems.append(f"replays `{spec.replay}` but is not an EffectTool: nothing would send its effect key")
    if spec.replay == "check" and not has_lookup(tool):
        problems.append("replays `check` but has no lookup")
    if spec.risk == "irreversible" and spec.compensation is None:
        problems.append("is irreversible but names no compensation")
    if writes and not spec.heartbeat_timeout_s:
        problems.append("reaches outside the workspace but sets no heartbeat timeout: a lost worker goes unnoticed")
    return problems + _compensation_problems(tool, args, tools)


def _compensation_problems(tool: Tool, args: Any, tools: Mapping[str, Tool]) -> list[str]:
    declared = tool.spec.compensation
    undo = tool.undo(SAMPLE_KEY, args)
    if declared is None:
        return [f"its example's compensation calls {undo.tool} but its spec names none"] if undo else []
    if declared not in tools:
        return [f"its compensation names {declared}, which is not a tool of the catalogue"]
    if undo is None:
        return [f"names {declared} as its compensation but its example's undo gives none"]
    if undo.tool != declared:
        return [f"names {declared} as its compensation but its example's undo calls {undo.tool}"]
    try:
        tools[declared].spec.args_model.model_validate(undo.args)
    except ValidationError as err:
        return [f"its compensation's arguments do not validate as {declared}'s: {err.errors()[0]['msg']}"]
    return []
