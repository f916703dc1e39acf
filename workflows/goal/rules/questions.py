"""Human checkpoints: the question cards a goal asks, built from its state. Pure.

A card says what is done, where the goal is stuck, the options with what each
costs, and a recommendation, so a person can answer without reading the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from perdure.workflows.goal.contracts.goal_contracts import AHEAD_INTRO, AheadApproval
from perdure.workflows.goal.contracts.state import GoalState, Question, QuestionOption
from perdure.workflows.goal.rules import frontier
from perdure.workflows.shared.durations import duration_text


def _done_summary(state: GoalState) -> str:
    done = [n.name for n in state.nodes.values() if n.status == "succeeded"]
    total = len(state.nodes)
    finished = len(done)
    if frontier.is_large(state.plan_size()):
        # Its node table holds its frontier; the steps stored in the past are counted (rules/frontier.py).
        total = state.plan_size()
        finished += sum(state.past.counts.get("succeeded", {}).values()) if state.past is not None else 0
    if not finished:
        return f"nothing finished yet (0 of {total} steps)"
    return f"{finished} of {total} steps finished: {', '.join(done[:12])}{' …' if finished > 12 else ''}"


def done_so_far(state: GoalState, asked: list[Question]) -> list[str]:
    """What each card shows as done: the goal's work as it stands now, since steps go on while
    a card waits; the summary it was asked with would be stale."""
    now = _done_summary(state) if asked else ""
    return [now for _ in asked]


def next_question_id(state: GoalState) -> str:
    return f"q{len(state.questions) + 1}"


def _card(
    state: GoalState,
    now: datetime,
    topic: str,
    title: str,
    stuck: str,
    options: list[tuple[str, str, str]],
    recommendation: str,
    **about: list | str | None,
) -> Question:
    """A question card: the parts every card shares (its id, what is done, when it was
    asked) filled in; `options` as (id, label, cost); `about`: its nodes and hold."""
    return Question(
        id=next_question_id(state),
        topic=topic,
        title=title,
        done=_done_summary(state),
        stuck=stuck,
        options=[QuestionOption(id=i, label=label, cost=cost) for i, label, cost in options],
        recommendation=recommendation,
        asked_at=now,
        **about,
    )


def park_expired(state: GoalState, now: datetime, expiry: timedelta) -> Question:
    hours = expiry.total_seconds() / 3600
    return _card(
        state,
        now,
        "park_expired",
        f"Still parked: {state.pause.reason}",
        f"The goal has been parked since {state.pause.parked_at:%Y-%m-%d %H:%M} UTC ({state.pause.reason}).",
        [
            ("resume", "Resume now", "work continues at once"),
            ("extend", f"Keep waiting another {hours:g} h", "nothing is spent while parked"),
            ("abort", "Stop and report what is done", "unfinished steps are dropped"),
        ],
        "extend if what you are waiting for is still coming; otherwise resume",
    )


def narrow_confirm(state: GoalState, now: datetime, nodes: list[str], hold: list[str], changes: dict) -> Question:
    change = ", ".join(f"{k}={v}" for k, v in sorted(changes.items()))
    spent = sum(state.nodes[n].cost_usd for n in nodes if n in state.nodes)
    tokens = sum(state.nodes[n].tokens for n in nodes if n in state.nodes)
    return _card(
        state,
        now,
        "narrow_confirm",
        f"Do these steps still hold after {change}?",
        f"Steps {', '.join(nodes)} depend on what changed in a way the goal cannot judge"
        + (f"; {', '.join(hold)} wait for the answer." if hold else "."),
        [
            ("redo", "Redo them under the new premises", f"about {tokens} tokens (${spent:.4f}) again"),
            ("keep", "Keep their outputs", "nothing"),
        ],
        "redo if their output mentions what you narrowed away; otherwise keep",
        nodes=list(nodes),
        hold=list(hold),
    )


def stalled(state: GoalState, now: datetime, step: str, message: str) -> Question:
    node = state.nodes.get(step)
    spent = f"{node.tokens} tokens (${node.cost_usd:.4f}) so far" if node else ""
    return _card(
        state,
        now,
        "stalled",
        f"Step '{step}' is going in circles",
        message,
        [
            ("continue", "Let it keep trying", f"more turns; {spent}"),
            ("abandon", "Abandon this path", "the step fails; work that needs it stops"),
        ],
        "abandon unless you can add a hint with `perdure steer` first",
        nodes=[step],
    )


def confirm_effect(
    state: GoalState, now: datetime, step: str, tool: str, what: str, why: str, effect_key: str | None = None
) -> Question:
    return _card(
        state,
        now,
        "confirm_effect",
        f"Confirm {tool} in step '{step}'",
        f"{tool} is irreversible, so it runs only with your confirmation. It will: {what}. Why: {why}",
        [
            ("approve", f"Run {tool} as shown", "cannot be undone"),
            ("reject", "Do not run it", "the step is told you refused (add why with --text)"),
        ],
        "approve only if the amount, recipient and reason are what you expect",
        nodes=[step],
        effect_key=effect_key,
        tool=tool,
    )


def uncertain_effect(state: GoalState, now: datetime, step: str, tool: str, effect_key: str, error: str) -> Question:
    if tool == "run_command":
        return _uncertain_command(state, now, step, effect_key, error)
    return _card(
        state,
        now,
        "uncertain_effect",
        f"Did {tool} in step '{step}' happen?",
        f"{error} (effect key {effect_key})",
        [
            ("happened", "It happened: carry on", "nothing is sent again"),
            ("not_happened", "It did not happen: send it now", "one more call"),
            ("fail", "Leave it: fail the step", "work that needs it stops"),
        ],
        "check the receiving side for the effect key, then answer happened or not_happened",
        nodes=[step],
        effect_key=effect_key,
        tool=tool,
    )


def _uncertain_command(state: GoalState, now: datetime, step: str, key: str, error: str) -> Question:
    """A shell command's run was interrupted: only the workspace (or what the command
    reaches) can tell whether it did its work, and no service deduplicates a re-run."""
    return _card(
        state,
        now,
        "uncertain_effect",
        f"Did run_command in step '{step}' happen?",
        error,
        [
            ("happened", "It ran: keep the step done", "not run again; the step's output says it is unknown"),
            ("not_happened", "It did not run: run it once more", "one more run of the command"),
            ("fail", "Leave it: fail the step", "work that needs it stops"),
        ],
        "look for what the command does (a line appended, a file written, a push, a request) "
        "before answering happened or not_happened",
        nodes=[step],
        effect_key=key,
        tool="run_command",
    )


def escalation(state: GoalState, now: datetime, finding: str, detail: str) -> Question:
    return _card(
        state,
        now,
        "escalation",
        f"The watchdog found this goal {finding}",
        detail,
        [
            ("continue", "Carry on as it is", "it keeps spending"),
            ("park", "Park it until I look", "nothing is spent while parked"),
            ("abort", "Stop and report", "unfinished work is dropped"),
        ],
        "park it if you cannot look now; steer it if you can see what it misses",
    )


def confirm_device_call(
    state: GoalState, now: datetime, step: str, tool: str, what: str, device: str, root: str, key: str
) -> Question:
    return _card(
        state,
        now,
        "confirm_device_call",
        f"Run {tool} on device {device} for step '{step}'?",
        f"Step '{step}' wants to run on device {device} (in {root}): {what}. Calls that change something on a "
        "personal machine wait for a person unless the device or the goal allows them (README, Devices).",
        [
            ("approve", f"Run it on {device}", "it runs once, as shown"),
            ("reject", "Do not run it", "the step is told you refused (add why with --text)"),
        ],
        f"approve if that is what you expect to happen in {root}",
        nodes=[step],
        effect_key=key,
        tool=tool,
    )


def device_offline(
    state: GoalState,
    now: datetime,
    step: str,
    device: str,
    waited_s: float,
    others: list[tuple[str, bool]],
    workspace: str | None = None,
) -> Question:
    """A step has waited longer than its device_wait_s for its device to come online; with
    `workspace`, for the host holding the goal's workspace (a move takes all its steps there)."""
    waited = duration_text(waited_s, days=True)
    kind = "device" if workspace is None else "host"
    moves = [
        (
            f"device:{name}",
            f"Run it on device {name}" if workspace is None else f"Move workspace {workspace} to host {name}",
            ("it runs there now" if workspace is None else "this step and the goal's later workspace steps run there")
            if online
            else f"{name} is offline too",
        )
        for name, online in others
    ]
    return _card(
        state,
        now,
        "device_offline",
        f"Step '{step}' has waited {waited} for {kind} {device}",
        f"{kind.capitalize()} {device} has been offline for the {waited} step '{step}' has waited for it; nothing is "
        f"spent meanwhile, and the step runs by itself if the {kind} comes back.",
        [
            ("wait", f"Keep waiting for {device}", "nothing is spent while it waits; asked again after as long"),
            *moves,
            ("skip", "Skip this step", "the step is abandoned; work that needs it stops"),
        ],
        f"wait if {device} is coming back; otherwise run it elsewhere or skip it",
        nodes=[step],
    )


def approvals_ahead(state: GoalState, now: datetime, listed: list[AheadApproval]) -> Question:
    """One card, when a plan is adopted, for every step in it that will wait for a person
    (irreversible, or on a device whose rules ask): answered now, the goal runs unattended
    and each call still goes as late as risk ordering puts it."""
    title, stuck = ahead_text(listed)
    return _card(
        state,
        now,
        "approvals_ahead",
        title,
        stuck,
        [
            ("approve", "Approve them all", "each runs once, as shown, when its turn comes"),
            ("approve_some", "Approve the steps named (the rest are asked when they run)", "as for approve"),
            ("refuse_some", "Refuse the steps named (the rest are approved)", "a refused step and what needs it drop"),
            ("reject", "Refuse them all", "they and what needs them drop"),
        ],
        "approve only if the amounts, recipients and reasons are what you expect",
        ahead=listed,
    )


def ahead_text(listed: list[AheadApproval]) -> tuple[str, str]:
    """An approvals-ahead card's title and text, for the steps it lists."""
    title = f"Approve ahead: {_names(entry.step for entry in listed)}"
    return title, f"{AHEAD_INTRO}: " + "; ".join(entry.line() for entry in listed)


def _names(steps: Iterable[str], shown: int = 5) -> str:
    """Step names for a card's title: the first few, and how many more."""
    names = list(steps)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(f"'{n}'" for n in names[:shown]) + more
