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
attempt number. The activity side lives in `activities/effect_tools.py`.

No I/O and nothing that varies between runs: the workflow may call these too,
e.g. to know a plan step's effect key and compensation before dispatching it
(only when its arguments hold no `{{steps.NAME}}` template, since keys are
computed from the resolved arguments).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from workflows.canonical import canonical_json, digest_of
from workflows.contracts import Compensation
from workflows.tool_specs import (
    GitCommitArgs,
    GitRevertArgs,
    HttpRequestArgs,
    MakePaymentArgs,
    NotifyWebhookArgs,
    RefundPaymentArgs,
    ReplayPolicy,
    SendEmailArgs,
    ToolArgs,
)

EffectDecision = Literal["send", "reuse", "lookup", "uncertain"]
EFFECT_KEY_PATTERN = r"^fx-[0-9a-f]{32}$"

INTENT = "intent"
DONE = "done"


def effect_key(goal_id: str, target: str, action: str, payload: Any) -> str:
    """`fx-` + 32 hex digits (128 bits) over the goal, target, action and payload digest."""
    material = canonical_json({"goal": goal_id, "target": target, "action": action, "payload": digest_of(payload)})
    return "fx-" + hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]


class Effect(NamedTuple):
    target: str
    action: str
    payload: Any


def effect_of(tool: str, args: ToolArgs, workspace: str) -> Effect | None:
    """What a remote-write call reaches, does and sends; None for tools with no remote effect.

    The payload is everything that goes into the request, so a changed body is a
    new effect; output formatting options (max_bytes) and the undo recipe are not.
    """
    if isinstance(args, HttpRequestArgs):
        return Effect(args.url, args.method, {"body": args.body, "headers": args.headers})
    if isinstance(args, SendEmailArgs):
        return Effect(f"mailto:{args.to}", "send", args.model_dump(mode="json"))
    if isinstance(args, GitCommitArgs):
        return Effect(f"git:{workspace}", "commit", args.model_dump(mode="json"))
    if isinstance(args, GitRevertArgs):
        return Effect(f"git:{workspace}", "revert", args.model_dump(mode="json"))
    if isinstance(args, NotifyWebhookArgs):
        return Effect(args.url, "POST", args.payload)
    if isinstance(args, MakePaymentArgs):
        return Effect(f"payee:{args.recipient}", "pay", args.model_dump(mode="json"))
    if isinstance(args, RefundPaymentArgs):
        return Effect(f"refund:{args.payment_key or args.payment_id}", "refund", args.model_dump(mode="json"))
    del tool
    return None


def effect_key_for(goal_id: str, tool: str, args: ToolArgs, workspace: str) -> str | None:
    effect = effect_of(tool, args, workspace)
    return effect_key(goal_id, *effect) if effect is not None else None


def compensation_for(tool: str, key: str, args: ToolArgs) -> Compensation | None:
    """The call that undoes this effect, known before the effect is attempted (it needs only the key)."""
    if isinstance(args, MakePaymentArgs):
        return Compensation(
            tool="refund_payment",
            args={"payment_key": key, "reason": "perdure rollback"},
            reason=f"refund the payment to {args.recipient} ({args.amount_cents} cents {args.currency})",
        )
    if isinstance(args, GitCommitArgs):
        subject = args.message.strip().splitlines()[0] if args.message.strip() else args.message
        return Compensation(tool="git_revert", args={"effect_key": key}, reason=f"revert the commit '{subject[:80]}'")
    if isinstance(args, HttpRequestArgs) and args.undo is not None:
        return Compensation(
            tool="http_request",
            args=args.undo.model_dump(mode="json", exclude_none=True),
            reason=f"undo {args.method} {args.url} with {args.undo.method} {args.undo.url}",
        )
    del tool
    return None


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
