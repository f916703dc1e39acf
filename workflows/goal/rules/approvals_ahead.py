"""Approvals collected ahead (issue 38): which steps of a plan an approvals-ahead card
lists (irreversible ones, and those on a device or host whose rules ask), what an answer to
it decides per step, what an earlier decision means for a call about to be sent, and when
an open card is no longer needed. Pure: the scheduler asks the card at each adoption and
keeps it tidy; the effect guard and the device placement consult it before a call.

An approval is bound to a digest of the arguments as the call's prepare sees them (the
same `digest_of` of the validated arguments; the plan's own for a tool the workflow cannot
validate), so a call that changed since is asked again.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError

from perdure.activities.tools.catalogue import TOOLS
from perdure.workflows.goal.contracts.goal_contracts import AheadApproval
from perdure.workflows.goal.contracts.plan import Plan, ToolStep, template_refs
from perdure.workflows.goal.contracts.state import GoalState, Question
from perdure.workflows.shared.canonical import canonical_json, digest_of
from perdure.workflows.shared.statuses import TERMINAL
from perdure.workflows.shared.tool_specs import ToolSpec

TOPIC = "approvals_ahead"


def bound_arguments(tool: str, args: dict) -> tuple[str, str | None]:
    """(the arguments as shown, their digest), the digest None while a template is unfilled."""
    if template_refs(args):
        return canonical_json(args), None
    declared = TOOLS.get(tool)
    if declared is None:
        return canonical_json(args), digest_of(args)
    try:
        resolved = declared.spec.args_model.model_validate(args).model_dump(mode="json")
    except ValidationError:
        return canonical_json(args), None  # the call itself will say what is wrong
    return canonical_json(resolved), digest_of(resolved)


def latest(state: GoalState, step: str, answered_only: bool = False) -> tuple[Question, AheadApproval] | None:
    """The newest approvals-ahead card still standing that lists `step`, with its entry
    (`answered_only`: a decision a person made, not a card still open)."""
    for question in reversed(state.questions):
        if question.topic != TOPIC or question.status == "closed":
            continue
        if answered_only and question.status != "answered":
            continue
        for entry in question.ahead:
            if entry.step == step:
                return question, entry
    return None


def open_card(state: GoalState) -> Question | None:
    """The approvals-ahead card still waiting for its answer, if any (one at a time)."""
    return next((q for q in reversed(state.open_questions()) if q.topic == TOPIC), None)


def same_list(card: Question, listed: list[AheadApproval]) -> bool:
    """Whether a new plan's list is what the open card already shows: it stands, unchanged."""
    return [a.line() for a in card.ahead] == [a.line() for a in listed]


def matches(entry: AheadApproval, tool: str, args: dict | None, prepared_digest: str | None = None) -> bool:
    """Whether the call about to run is the one approved: the same tool, and its validated
    arguments (the prepare's digest) or, for a tool the workflow cannot validate (a user's,
    an MCP server's), the very arguments the plan gave, templates filled. A re-plan that keeps
    a step's name and arguments but gives it another tool runs nothing on the old approval."""
    if entry.digest is None or entry.tool != tool:
        return False
    if prepared_digest is not None and entry.digest == prepared_digest:
        return True
    return args is not None and not template_refs(args) and entry.digest == digest_of(args)


def to_list(
    state: GoalState, plan: Plan, tools: Mapping[str, ToolSpec], on_devices: Mapping[str, tuple[str, str | None]]
) -> list[AheadApproval]:
    """The plan's steps that will wait for a person (irreversible, or on a device or host whose
    rules ask: `on_devices`, step -> (device, its root if known)) no approval given already
    covers (same arguments, same device)."""
    listed = []
    for step in plan.steps:
        if not isinstance(step, ToolStep) or (spec := tools.get(step.tool)) is None:
            continue
        on, root = on_devices.get(step.name, (None, None))
        if spec.risk != "irreversible" and on is None:
            continue
        shown, digest = bound_arguments(step.tool, step.args)
        before = latest(state, step.name, answered_only=True)
        earlier = before[1] if before is not None and before[1].decision == "approved" else None
        if earlier is not None and digest and (earlier.tool, earlier.digest, earlier.on) == (step.tool, digest, on):
            continue
        listed.append(
            AheadApproval(
                step=step.name,
                tool=step.tool,
                arguments=shown,
                digest=digest,
                on=on,
                root=root,
                approved_before=earlier.line_of_call() if earlier is not None else "",
            )
        )
    return listed


def unneeded(state: GoalState) -> Question | None:
    """The open approvals-ahead card none of whose steps is left to run (each settled, or no
    longer in the plan): nobody would act on its answer, and it must not keep the goal waiting."""
    card = open_card(state)
    if card is None:
        return None
    for entry in card.ahead:
        node = state.nodes.get(entry.step)
        if node is not None and node.status not in TERMINAL:
            return None
    return card


def decide(question: Question, choice: str, steps: list[str]) -> None:
    """Record an answer per step: approve (all), reject (all), approve_some (the named; the
    rest asked when they run), refuse_some (the named; the rest approved), expired (nobody
    answered by the card's deadline: the steps it could approve are refused, the ones whose
    arguments are not known yet asked when they are, as the card said). A step whose
    arguments are not known yet is never approved ahead: it is asked when they are."""
    named = set(steps)
    for entry in question.ahead:
        if question.status == "expired" and entry.digest is None:
            entry.decision = "ask"
            continue
        picked = entry.step in named
        if choice == "reject" or (choice == "refuse_some" and picked):
            entry.decision = "refused"
        elif choice == "approve" or (choice == "approve_some" and picked) or (choice == "refuse_some" and not picked):
            entry.decision = "approved" if entry.digest else "ask"
        else:
            entry.decision = "ask"
