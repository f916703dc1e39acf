"""What an abort's progress says, worked out from a goal's state without Temporal
(workflows/goal/rules/abort_view.py): the cases the end-to-end tests do not reach, an
effect whose outcome nobody knows, an undo of one that may not have happened, an
emergency's wrap-up step, and the carried state of a goal never aborted."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from perdure.workflows.goal import pause as pause_module
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.goal.contracts.state import (
    CompensationRecord,
    EffectRecord,
    GoalState,
    Node,
    PlanVersion,
    Question,
)
from perdure.workflows.goal.pause import Pause
from perdure.workflows.goal.rules.abort_view import abort_progress
from perdure.workflows.shared.tool_specs import Compensation
from tests.builders import spec

AT = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)
HOOK = {"url": "http://hook/notice", "payload": {}}
STEPS = [
    {"name": "pay", "kind": "tool", "tool": "make_payment", "args": {}},
    {"name": "notice", "kind": "tool", "tool": "notify_webhook", "args": HOOK},
    {"name": "wrap", "kind": "tool", "tool": "write_file", "args": {"path": "x", "content": ""}, "wrap_up": True},
]


def aborting(rollback: bool, statuses: dict[str, str], emergency: bool = False) -> GoalState:
    plan = Plan.model_validate({"steps": STEPS})
    state = GoalState(
        spec=spec(Path("/tmp/ws")),
        plan_versions=[PlanVersion(version=1, plan=plan, reason="test", source="plan-file")],
        nodes={s.name: Node(name=s.name, kind=s.kind, status=statuses.get(s.name, "pending")) for s in plan.steps},
        abort_reason="wrong invoice",
    )
    pause = state.pause
    pause.mode, pause.rollback, pause.emergency = "aborting", rollback, emergency
    pause.abort_requested_at, pause.abort_by = AT, "message a1"
    return state


def refund(effect: str, status: str = "registered") -> CompensationRecord:
    undo = Compensation(tool="refund_payment", args={"payment_key": "fx-1"}, reason="perdure rollback")
    return CompensationRecord(node="pay", effect_key="fx-1", compensation=undo, effect=effect, status=status)


def test_an_effect_nobody_knows_the_outcome_of_and_with_no_undo_is_not_undone_with_why():
    state = aborting(rollback=True, statuses={"pay": "succeeded", "notice": "uncertain"})
    state.compensations.append(refund("maybe"))
    state.questions.append(
        Question(
            id="q1", topic="uncertain_effect", title="t", done="", stuck="", options=[], recommendation="",
            asked_at=AT, nodes=["notice"], effect_key="fx-2",
        )
    )  # fmt: skip
    progress = abort_progress(state, {}, {"notice": "uncertain"}, undoing="fx-1")

    assert progress.stage == "requested" and progress.by == "message a1" and progress.requested_at == AT
    (undoing,) = progress.to_undo
    assert (undoing.node, undoing.undo, undoing.status) == ("pay", "refund_payment", "running")
    assert "may not have happened" in undoing.why
    (unknown,) = progress.not_undone
    assert (unknown.node, unknown.effect, unknown.status) == ("notice", "fx-2", "uncertain")
    assert unknown.why == "whether notify_webhook happened is unknown, and nothing undoes it"
    (stopped,) = progress.stopped
    assert stopped.note == "whether its effect happened is unknown"


def test_once_achieved_an_undo_that_failed_and_a_write_left_without_rollback_say_why():
    state = aborting(rollback=True, statuses={"pay": "succeeded"})
    state.compensations.append(refund("happened", status="failed").model_copy(update={"note": "HTTP 500"}))
    state.effects["fx-1"] = EffectRecord(node="pay", tool="make_payment")
    state.pause.abort_achieved_at = AT
    progress = abort_progress(state, {}, {}, undoing=None)
    assert progress.stage == "achieved" and progress.to_undo == []
    assert [(e.status, e.why) for e in progress.not_undone] == [("failed", "undo by refund_payment failed: HTTP 500")]

    kept = aborting(rollback=False, statuses={"pay": "succeeded"})
    kept.compensations.append(refund("happened"))
    kept.effects["fx-1"] = EffectRecord(node="pay", tool="make_payment")
    progress = abort_progress(kept, {}, {}, undoing=None)
    assert [(e.node, e.tool, e.status, e.why) for e in progress.not_undone] == [
        ("pay", "make_payment", "kept", "no rollback was asked")
    ]


def test_an_emergency_stop_lists_its_wrap_up_step_as_running_and_a_running_goal_has_no_abort():
    state = aborting(rollback=False, statuses={"wrap": "running"}, emergency=True)
    state.pause.abort_by = None
    progress = abort_progress(state, {}, {}, undoing=None)
    assert progress.emergency and [(s.node, s.tools, s.note) for s in progress.running] == [
        ("wrap", ["write_file"], "a wrap-up step")
    ]

    running = GoalState(spec=spec(Path("/tmp/ws")))
    assert abort_progress(running, {}, {}, undoing=None) is None
    # A goal never aborted carries no abort fields: what it carried before this change.
    assert "abort" not in running.pause.model_dump_json()


def test_a_second_abort_in_one_activation_keeps_the_first_ones_rollback_reason_and_requester(monkeypatch):
    """Two aborts applied together (a retried `perdure abort` without --rollback): the undo the
    first asked for is not cancelled, and the report says the first one's reason."""
    monkeypatch.setattr(pause_module.workflow, "now", lambda: AT)
    state = GoalState(spec=spec(Path("/tmp/ws")))
    pause = Pause(SimpleNamespace(state=state))
    pause.abort("wrong invoice", rollback=True, by="alice (message a1)")
    pause.abort("stop it", rollback=False, by="bob (message a2)")
    assert (state.pause.mode, state.pause.rollback, state.abort_reason) == ("aborting", True, "wrong invoice")
    assert state.pause.abort_by == "alice (message a1)"
    pause.abort("and undo it", rollback=True)  # a later abort may still ask for the undo
    assert state.pause.rollback
