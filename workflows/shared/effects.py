"""Effect keys, the retry decision and compensations: the pure half of perdure's side-effect contract.

An effect key names one logical effect: the goal, the target it reaches (a
mailbox, a URL, a repository, a payee), the action and a digest of the payload.
It is the same on every retry of that effect and different as soon as the
payload changes, so a service that deduplicates by key sees one effect however
often a crashed worker's activity is retried.

A remote-write activity heartbeats its phase around the external call
(`intent` with the key, then `done` with the receipt). Heartbeats are throttled
and asynchronous, so their absence proves nothing: `decide_retry` only trusts a
`done` receipt, and otherwise decides from the tool's replay policy and the
attempt number. The activity side lives in `activities/tools/effect_runner.py`.

What a call reaches, does and sends, and what undoes it, each tool declares
(`Tool.effect`, `Tool.undo`: perdure.workflows.shared.tool_specs); this module finds the
declaration by the tool's name (`declared`: a built-in tool of
perdure.activities.tools.catalogue, or any MCP tool) and knows no tool of its own. A user's
own tool (`perdure.tool`) is declared only on the workers that load it: they pass its
declaration in, and the workflow never prepares one itself.

No I/O and nothing that varies between runs: the workflow calls these too. A
write is prepared (its key, compensation and the arguments a person confirms)
by `prepared_effect` from its resolved arguments, in the prepare activity when
they must be read from the artifact store (a `{{steps.NAME}}` template, a
model's JSON by reference), else in the workflow itself (`prepared_in_workflow`):
one function, so one key whichever side prepared it.

Shell commands have no key a service could deduplicate by (their retry is decided by
activities/tools/catalogue/command_tool.py); `command_key` only names one run of a
command call, so a question asked about it is found again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from perdure.activities.tools.catalogue import TOOLS
from perdure.workflows.goal.contracts.plan import template_refs
from perdure.workflows.shared.canonical import canonical_json, digest_of
from perdure.workflows.shared.contracts import PreparedEffect, ToolInput
from perdure.workflows.shared.mcp_tools import McpDeclaration, is_mcp_tool
from perdure.workflows.shared.tool_specs import Compensation, Effect, ReplayPolicy, Tool

EffectDecision = Literal["send", "reuse", "lookup", "uncertain"]

INTENT = "intent"
DONE = "done"
# How much of a write's resolved arguments a prepared effect shows (a confirmation card).
SHOWN_ARGUMENT_CHARS = 2_000


def effect_key(goal_id: str, target: str, action: str, payload: Any) -> str:
    """`fx-` + 32 hex digits (128 bits) over the goal, target, action and payload digest."""
    material = canonical_json({"goal": goal_id, "target": target, "action": action, "payload": digest_of(payload)})
    return "fx-" + hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]


def declared(tool: str) -> Tool | None:
    """The declaration of the tool named `tool`: a built-in one, or any MCP tool's; None for a name neither."""
    if tool in TOOLS:
        return TOOLS[tool]
    return McpDeclaration(tool) if is_mcp_tool(tool) else None


def effect_of(tool: str, args: BaseModel, workspace: str, declaration: Tool | None = None) -> Effect | None:
    """What a remote-write call reaches, does and sends (its declaration's `effect`); None
    for tools with no remote effect. `declaration`: a user tool's, which only the worker
    that loads it has (default: the built-in or MCP one of that name)."""
    declaration = declaration or declared(tool)
    return declaration.effect(args, workspace) if declaration is not None else None


def effect_key_for(
    goal_id: str, tool: str, args: BaseModel, workspace: str, declaration: Tool | None = None
) -> str | None:
    effect = effect_of(tool, args, workspace, declaration)
    return effect_key(goal_id, *effect) if effect is not None else None


def prepared_effect(
    goal_id: str, tool: str, args: BaseModel, workspace: str, declaration: Tool | None = None
) -> PreparedEffect:
    """A write prepared from its resolved, validated arguments: its effect key, the call that
    would undo it, and the arguments as a person confirming it sees them."""
    key = effect_key_for(goal_id, tool, args, workspace, declaration)
    resolved = args.model_dump(mode="json")
    shown = canonical_json(resolved)
    if len(shown) > SHOWN_ARGUMENT_CHARS:
        shown = shown[: SHOWN_ARGUMENT_CHARS - 1] + "…"
    return PreparedEffect(
        tool=tool,
        effect_key=key,
        compensation=compensation_for(tool, key, args, declaration) if key else None,
        arguments=shown,
        arguments_digest=digest_of(resolved),
    )


def prepared_in_workflow(call: ToolInput) -> PreparedEffect | None:
    """A write prepared without the prepare activity, when nothing of it is in the artifact
    store: a built-in tool, its arguments in the call and no `{{steps.NAME}}` left to fill
    in. None: the activity prepares it (it reads the store, and words what is wrong with
    arguments that do not validate)."""
    tool = TOOLS.get(call.tool)
    if tool is None or call.mcp is not None or call.args is None or call.args_ref is not None:
        return None
    if not call.resolved and template_refs(call.args):
        return None
    try:
        args = tool.spec.args_model.model_validate(call.args)
    except ValidationError:
        return None
    return prepared_effect(call.goal_id, call.tool, args, call.workspace)


def compensation_for(tool: str, key: str, args: BaseModel, declaration: Tool | None = None) -> Compensation | None:
    """The call that undoes this effect, known before the effect is attempted (it needs only the key)."""
    declaration = declaration or declared(tool)
    return declaration.undo(key, args) if declaration is not None else None


def intent_details(key: str) -> dict:
    return {"phase": INTENT, "effect_key": key}


def done_details(key: str, receipt: dict) -> dict:
    return {"phase": DONE, "effect_key": key, "receipt": receipt}


def last_heartbeat(details: Sequence[Any], key: str) -> dict | None:
    """The previous attempt's last phase detail for this effect key, if it reached the server."""
    if not details:
        return None
    last = details[-1]
    if isinstance(last, dict) and last.get("effect_key") == key:
        return last
    return None


def decide_retry(policy: ReplayPolicy, attempt: int, last_heartbeat: dict | None) -> EffectDecision:
    """What this attempt of a tool call does before (or instead of) its effect.

    - a `done` heartbeat with a receipt reached the server: reuse that receipt;
    - `check`: look the effect up first, on every attempt (the lookup is cheap and
      also catches the same effect made by an earlier activity of the goal);
    - `once` after attempt 1: an earlier attempt may have got through and the
      service cannot tell us, so the outcome is `uncertain`;
    - otherwise send (`keyed` re-sends the same key; the service deduplicates).
    """
    if last_heartbeat and last_heartbeat.get("phase") == DONE and isinstance(last_heartbeat.get("receipt"), dict):
        return "reuse"
    if policy == "check":
        return "lookup"
    if policy == "once" and attempt > 1:
        return "uncertain"
    return "send"


# --- shell commands ---------------------------------------------------------------


def command_key(goal_id: str, node_key: str, started_at: datetime | None) -> str:
    """Names one run of a command call in a node's life (a question asked about it is
    found again when the node resumes); a node voided and started again gets a new one."""
    return effect_key(goal_id, f"command:{node_key}", "run", started_at.isoformat() if started_at else None)
