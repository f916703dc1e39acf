"""What a drift check is shown of the plan, and when one is due. Pure.

A drift check is one of the goal's own model calls: it must cost the same whatever the
size of the plan. It is shown the plan's size (steps, finished, failed, steps per kind),
the next steps still to run and the latest finished ones with their previews, each line
cut, never the whole plan: a plan of 3,000 reads once cost 52 M tokens in drift checks
that each carried every step. What it is shown is at most about OUTLINE_CHARS characters
besides the goal and the user's steering, which the user wrote.

Cadence: a spec that sets `drift_every` is checked every that many finished nodes (0:
never), as before. One that leaves it unset (contracts.DEFAULT_DRIFT_EVERY) counts only
finished model steps (llm, agent, subgoal): work that can drift, whose cost the check's is
small beside. A plan of tools alone is then never checked unless the user asks.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Mapping

from perdure.workflows.goal.contracts.goal_contracts import DEFAULT_DRIFT_EVERY, DriftOutline
from perdure.workflows.goal.contracts.plan import AgentStep, LlmStep, Plan, PlanStep, SubgoalStep, ToolStep, WaitStep
from perdure.workflows.goal.contracts.state import GoalState, Node
from perdure.workflows.goal.rules.node_index import NodeIndex

UPCOMING_SHOWN = 12
RECENT_SHOWN = 12
LINE_CHARS = 160
# What the outline may take at most: its lines, and a little for the counts and names.
OUTLINE_CHARS = (UPCOMING_SHOWN + RECENT_SHOWN) * (LINE_CHARS + 80) + 400
MODEL_KINDS = ("llm", "agent", "subgoal")
# Characters a token, for estimates made before a call: fewer than the ~4 of English prose,
# so an estimate errs high (activities/models/context_window.py counts the same way).
CHARS_PER_TOKEN = 3
# The drift prompt's own text around what it is shown (its instructions, headings), and its reply.
PROMPT_CHARS = 1_500
REPLY_TOKENS = 400


def drift_check_due(drift_every: int | None, checks_so_far: int, index: NodeIndex) -> bool:
    """Whether the next drift check is due, by the spec's cadence (see the module docstring)."""
    if drift_every == 0:
        return False
    if drift_every is None:
        return index.count_of_kinds(("succeeded",), MODEL_KINDS) >= (checks_so_far + 1) * DEFAULT_DRIFT_EVERY
    return index.count(("succeeded",)) >= (checks_so_far + 1) * drift_every


def outline(plan: Plan, nodes: Mapping[str, Node]) -> DriftOutline:
    """The plan as a drift check sees it: counts, the next steps to run, the latest finished."""
    kinds: dict[str, int] = {}
    upcoming: list[str] = []
    finished = failed = 0
    for step in plan.steps:
        kinds[step.kind] = kinds.get(step.kind, 0) + 1
        node = nodes.get(step.name)
        status = node.status if node is not None else "pending"
        if status == "succeeded":
            finished += 1
        elif status == "failed":
            failed += 1
        elif len(upcoming) < UPCOMING_SHOWN:
            upcoming.append(_cut(f"{step.name} ({step.kind}, {status}): {describe_step(step)}"))
    done = [n for n in (nodes.get(s.name) for s in plan.steps) if n is not None and n.status == "succeeded"]
    latest = heapq.nlargest(RECENT_SHOWN, enumerate(done), key=lambda item: (_when(item[1]), item[0]))
    recent = {node.name: _cut(node.preview) for _, node in sorted(latest, key=lambda item: item[0])}
    return DriftOutline(
        steps=len(plan.steps), finished=finished, failed=failed, kinds=kinds, upcoming=upcoming, recent=recent
    )


def call_tokens(shown: DriftOutline, state: GoalState) -> int:
    """A drift call's tokens, estimated before it is sent (for the budget gates): the outline,
    the goal and the user's steering it is told, the prompt around them, and its reply."""
    spec = state.spec
    told = [spec.goal, *spec.constraints, *state.guidance, *(f"{k} = {v}" for k, v in state.premises.items())]
    told += [path.for_prompt() for path in state.rejected_paths]
    chars = len(shown.model_dump_json()) + sum(len(text) for text in told) + PROMPT_CHARS
    return chars // CHARS_PER_TOKEN + REPLY_TOKENS


def describe_step(step: PlanStep) -> str:
    """What a step does, in a line."""
    if isinstance(step, LlmStep | AgentStep):
        return step.prompt
    if isinstance(step, ToolStep):
        return f"{step.tool} {json.dumps(step.args, sort_keys=True, ensure_ascii=False)}"
    if isinstance(step, SubgoalStep):
        return step.goal or f"its own plan of {len(step.plan.steps) if step.plan else 0} steps"
    if isinstance(step, WaitStep):
        return f"wait until {step.until.isoformat()}" if step.until else f"wait {step.after}"
    return step.kind


def _when(node: Node) -> str:
    return node.finished_at.isoformat() if node.finished_at else ""


def _cut(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 1] + "…"
