"""Human checkpoints: the question cards a goal asks, built from its state. Pure.

A card says what is done, where the goal is stuck, the options with what each
costs, and a recommendation, so a person can answer without reading the log.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from workflows.state import GoalState, Question, QuestionOption


def _done_summary(state: GoalState) -> str:
    done = [n.name for n in state.nodes.values() if n.status == "succeeded"]
    total = len(state.nodes)
    if not done:
        return f"nothing finished yet (0 of {total} steps)"
    return f"{len(done)} of {total} steps finished: {', '.join(done[:12])}{' …' if len(done) > 12 else ''}"


def next_question_id(state: GoalState) -> str:
    return f"q{len(state.questions) + 1}"


def park_expired(state: GoalState, now: datetime, expiry: timedelta) -> Question:
    hours = expiry.total_seconds() / 3600
    return Question(
        id=next_question_id(state),
        topic="park_expired",
        title=f"Still parked: {state.pause.reason}",
        done=_done_summary(state),
        stuck=f"The goal has been parked since {state.pause.parked_at:%Y-%m-%d %H:%M} UTC ({state.pause.reason}).",
        options=[
            QuestionOption(id="resume", label="Resume now", cost="work continues at once"),
            QuestionOption(
                id="extend", label=f"Keep waiting another {hours:g} h", cost="nothing is spent while parked"
            ),
            QuestionOption(id="abort", label="Stop and report what is done", cost="unfinished steps are dropped"),
        ],
        recommendation="extend if what you are waiting for is still coming; otherwise resume",
        asked_at=now,
    )


def narrow_confirm(state: GoalState, now: datetime, nodes: list[str], hold: list[str], changes: dict) -> Question:
    change = ", ".join(f"{k}={v}" for k, v in sorted(changes.items()))
    spent = sum(state.nodes[n].cost_usd for n in nodes if n in state.nodes)
    tokens = sum(state.nodes[n].tokens for n in nodes if n in state.nodes)
    return Question(
        id=next_question_id(state),
        topic="narrow_confirm",
        title=f"Do these steps still hold after {change}?",
        done=_done_summary(state),
        stuck=(
            f"Steps {', '.join(nodes)} depend on what changed in a way the goal cannot judge"
            + (f"; {', '.join(hold)} wait for the answer." if hold else ".")
        ),
        options=[
            QuestionOption(
                id="redo", label="Redo them under the new premises", cost=f"about {tokens} tokens (${spent:.4f}) again"
            ),
            QuestionOption(id="keep", label="Keep their outputs", cost="nothing"),
        ],
        recommendation="redo if their output mentions what you narrowed away; otherwise keep",
        asked_at=now,
        nodes=list(nodes),
        hold=list(hold),
    )


def stalled(state: GoalState, now: datetime, step: str, message: str) -> Question:
    node = state.nodes.get(step)
    spent = f"{node.tokens} tokens (${node.cost_usd:.4f}) so far" if node else ""
    return Question(
        id=next_question_id(state),
        topic="stalled",
        title=f"Step '{step}' is going in circles",
        done=_done_summary(state),
        stuck=message,
        options=[
            QuestionOption(id="continue", label="Let it keep trying", cost=f"more turns; {spent}"),
            QuestionOption(id="abandon", label="Abandon this path", cost="the step fails; work that needs it stops"),
        ],
        recommendation="abandon unless you can add a hint with `perdure steer` first",
        asked_at=now,
        nodes=[step],
    )


def confirm_effect(state: GoalState, now: datetime, step: str, tool: str, what: str, why: str) -> Question:
    return Question(
        id=next_question_id(state),
        topic="confirm_effect",
        title=f"Confirm {tool} in step '{step}'",
        done=_done_summary(state),
        stuck=f"{tool} is irreversible, so it runs only with your confirmation. It will: {what}. Why: {why}",
        options=[
            QuestionOption(id="approve", label=f"Run {tool} as shown", cost="cannot be undone"),
            QuestionOption(
                id="reject", label="Do not run it", cost="the step is told you refused (add why with --text)"
            ),
        ],
        recommendation="approve only if the amount, recipient and reason are what you expect",
        asked_at=now,
        nodes=[step],
    )


def uncertain_effect(state: GoalState, now: datetime, step: str, tool: str, effect_key: str, error: str) -> Question:
    return Question(
        id=next_question_id(state),
        topic="uncertain_effect",
        title=f"Did {tool} in step '{step}' happen?",
        done=_done_summary(state),
        stuck=f"{error} (effect key {effect_key})",
        options=[
            QuestionOption(id="happened", label="It happened: carry on", cost="nothing is sent again"),
            QuestionOption(id="not_happened", label="It did not happen: send it now", cost="one more call"),
            QuestionOption(id="fail", label="Leave it: fail the step", cost="work that needs it stops"),
        ],
        recommendation="check the receiving side for the effect key, then answer happened or not_happened",
        asked_at=now,
        nodes=[step],
    )


def escalation(state: GoalState, now: datetime, finding: str, detail: str) -> Question:
    return Question(
        id=next_question_id(state),
        topic="escalation",
        title=f"The watchdog found this goal {finding}",
        done=_done_summary(state),
        stuck=detail,
        options=[
            QuestionOption(id="continue", label="Carry on as it is", cost="it keeps spending"),
            QuestionOption(id="park", label="Park it until I look", cost="nothing is spent while parked"),
            QuestionOption(id="abort", label="Stop and report", cost="unfinished work is dropped"),
        ],
        recommendation="park it if you cannot look now; steer it if you can see what it misses",
        asked_at=now,
    )
