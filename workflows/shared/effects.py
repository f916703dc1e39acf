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
attempt number. The activity side lives in `activities/tools/effect_tools.py`.

No I/O and nothing that varies between runs: the workflow calls these too. A
write is prepared (its key, compensation and the arguments a person confirms)
by `prepared_effect` from its resolved arguments, in the prepare activity when
they must be read from the artifact store (a `{{steps.NAME}}` template, a
model's JSON by reference), else in the workflow itself (`prepared_in_workflow`):
one function, so one key whichever side prepared it.

Shell commands (`run_command`) have no key a service could deduplicate by: an
interrupted one is re-run only when it is replay-safe (`command_replay`), and is
otherwise `uncertain`, like a `once` tool.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, NamedTuple

from pydantic import ValidationError

from perdure.workflows.goal.contracts.plan import template_refs
from perdure.workflows.shared.canonical import canonical_json, digest_of
from perdure.workflows.shared.contracts import Compensation, PreparedEffect, ToolInput
from perdure.workflows.shared.mcp_tools import McpArgs
from perdure.workflows.shared.tool_specs import (
    TOOL_SPECS,
    GitCommitArgs,
    GitRevertArgs,
    HttpRequestArgs,
    MakePaymentArgs,
    NotifyWebhookArgs,
    RefundPaymentArgs,
    ReplayPolicy,
    RunCommandArgs,
    SendEmailArgs,
    ToolArgs,
)

EffectDecision = Literal["send", "reuse", "lookup", "uncertain"]
EFFECT_KEY_PATTERN = r"^fx-[0-9a-f]{32}$"

INTENT = "intent"
DONE = "done"
# How much of a write's resolved arguments a prepared effect shows (a confirmation card).
SHOWN_ARGUMENT_CHARS = 2_000


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
        named = {"auth": args.auth} if args.auth else {}  # another credential is another effect
        return Effect(args.url, args.method, {"body": args.body, "headers": args.headers, **named})
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
    if isinstance(args, McpArgs):
        # The tool on its server is the target; the arguments are the whole request.
        return Effect(f"mcp:{tool}", "call", args.model_dump(mode="json"))
    return None


def effect_key_for(goal_id: str, tool: str, args: ToolArgs, workspace: str) -> str | None:
    effect = effect_of(tool, args, workspace)
    return effect_key(goal_id, *effect) if effect is not None else None


def prepared_effect(goal_id: str, tool: str, args: ToolArgs, workspace: str) -> PreparedEffect:
    """A write prepared from its resolved, validated arguments: its effect key, the call that
    would undo it, and the arguments as a person confirming it sees them."""
    key = effect_key_for(goal_id, tool, args, workspace)
    resolved = args.model_dump(mode="json")
    shown = canonical_json(resolved)
    if len(shown) > SHOWN_ARGUMENT_CHARS:
        shown = shown[: SHOWN_ARGUMENT_CHARS - 1] + "…"
    return PreparedEffect(
        tool=tool,
        effect_key=key,
        compensation=compensation_for(tool, key, args) if key else None,
        arguments=shown,
        arguments_digest=digest_of(resolved),
    )


def prepared_in_workflow(call: ToolInput) -> PreparedEffect | None:
    """A write prepared without the prepare activity, when nothing of it is in the artifact
    store: a built-in tool, its arguments in the call and no `{{steps.NAME}}` left to fill
    in. None: the activity prepares it (it reads the store, and words what is wrong with
    arguments that do not validate)."""
    spec = TOOL_SPECS.get(call.tool)
    if spec is None or call.mcp is not None or call.args is None or call.args_ref is not None:
        return None
    if not call.resolved and template_refs(call.args):
        return None
    try:
        args = spec.args_model.model_validate(call.args)
    except ValidationError:
        return None
    return prepared_effect(call.goal_id, call.tool, args, call.workspace)


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
        # The undo names its own credential, else the request's (sent only to its declared hosts).
        undo = args.undo.model_copy(update={"auth": args.undo.auth or args.auth})
        return Compensation(
            tool="http_request",
            args=undo.model_dump(mode="json", exclude_none=True),
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


# --- shell commands ---------------------------------------------------------------

READ_ONLY_COMMANDS: frozenset[str] = frozenset({"ls", "cat", "pwd", "head", "tail", "wc", "grep"})
"""Commands re-run after an interruption without asking: none of them has an option
that writes (unlike `sort -o`, `find -delete`, `sed -i`)."""
READ_ONLY_GIT: frozenset[str] = frozenset({"status", "diff", "log", "show"})
"""`git SUBCOMMAND` forms that only read (`git status` may refresh the index, which is
invisible and idempotent)."""
GIT_WRITING_OPTIONS = ("--output", "--ext-diff", "--textconv")
"""git options that write a file or run a program named in the repository's config."""
COMMAND_SEPARATORS = frozenset({"|", "||", "&&", ";"})
SEPARATOR_CHARACTERS = ";|&"
# Refused anywhere in the text, even quoted: redirections, substitutions, subshells,
# backgrounding, escapes, line breaks (the shell runs each line) and globs' cousins
# that run code. A refusal only costs a question after an interruption.
UNSAFE_CHARACTERS = frozenset("<>`$(){}&\\\n\r!")


def read_only_command(command: str) -> bool:
    """True only when every part of `command` is an allowlisted read: simple commands
    joined by `|`, `||`, `&&` or `;`, no redirection, substitution, subshell or
    background job. Conservative: whatever this parse cannot vouch for is not safe."""
    if not command.strip() or any(c in UNSAFE_CHARACTERS for c in command.replace("&&", "")):
        return False
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=SEPARATOR_CHARACTERS)
        lexer.whitespace_split = True
        lexer.commenters = ""
        tokens = list(lexer)
    except ValueError:
        return False  # unbalanced quotes
    part: list[str] = []
    parts = [part]
    for token in tokens:
        if token in COMMAND_SEPARATORS:
            part = []
            parts.append(part)
        elif set(token) <= set(SEPARATOR_CHARACTERS):
            return False  # `;;`, `|&` and the like
        else:
            part.append(token)
    return all(_read_only_part(words) for words in parts)


def _read_only_part(words: list[str]) -> bool:
    if not words:
        return False  # an empty part: `ls ;` or `| cat` is not a plain command
    name, args = words[0], words[1:]
    if name in READ_ONLY_COMMANDS:
        return True
    if name == "git" and args and args[0] in READ_ONLY_GIT:
        return not any(a.startswith(GIT_WRITING_OPTIONS) for a in args[1:])
    return False


def command_replay(args: RunCommandArgs) -> str | None:
    """Why an interrupted run of this command may simply run again, or None when it
    may not (a person is asked whether it happened)."""
    if args.replay == "safe":
        return 'declared replay: "safe"'
    if read_only_command(args.command):
        return "a read-only command"
    return None


def decide_command_retry(attempt: int, args: RunCommandArgs) -> Literal["run", "uncertain"]:
    """A command's attempt after an interrupted one (the worker was lost, the attempt
    timed out) runs it again only when it is replay-safe; heartbeats cannot tell
    whether the shell got as far as the effect."""
    if attempt > 1 and command_replay(args) is None:
        return "uncertain"
    return "run"


def command_key(goal_id: str, node_key: str, started_at: datetime | None) -> str:
    """Names one run of a command call in a node's life (a question asked about it is
    found again when the node resumes); a node voided and started again gets a new one."""
    return effect_key(goal_id, f"command:{node_key}", "run", started_at.isoformat() if started_at else None)
