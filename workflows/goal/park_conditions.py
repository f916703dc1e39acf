"""Parks that end by themselves: what a condition says, and one check of it.

Workflow code. A file or a command is checked by one short activity, the sandboxed
run_command tool in the goal's workspace (a file by `test -e`, so the check sees the
workspace where the commands see it); a signal is not polled, the steering verb ends the
park. Between checks the goal's loop waits on a durable timer (Pause.timeout) that doubles
from the park's first interval to its longest. This module must not change the pause
state beyond the condition's own record: resuming is the pause's.
"""

from __future__ import annotations

import shlex
from datetime import timedelta

from temporalio import workflow

from perdure.workflows.goal.contracts.messages import Park
from perdure.workflows.goal.contracts.state import GoalState, ParkCondition
from perdure.workflows.shared.contracts import ToolInput

# A check is a short look: one that runs longer says the condition does not hold yet.
CHECK_TIMEOUT_S = 60


def condition_of(message: Park) -> ParkCondition | None:
    kinds = (("file", message.until_file), ("command", message.until_command), ("signal", message.until_signal))
    for kind, target in kinds:
        if target is not None:
            return ParkCondition(
                kind=kind, target=target, interval_s=message.poll_first_s, max_interval_s=message.poll_max_s
            )
    return None


def first_check(condition: ParkCondition) -> None:
    if condition.kind != "signal":
        condition.next_check_at = workflow.now()


def check_input(state: GoalState, goal_id: str, condition: ParkCondition) -> ToolInput:
    command = condition.target if condition.kind == "command" else f"test -e {shlex.quote(condition.target)}"
    return ToolInput(
        goal_id=goal_id,
        node_key=f"park-check-{condition.checks}",
        tool="run_command",
        workspace=state.spec.workspace,
        # Replay-safe: a check that dies with its worker is simply run again.
        args={"command": command, "replay": "safe", "timeout_s": CHECK_TIMEOUT_S},
        network=state.spec.allow_network,
    )


def summary(condition: ParkCondition) -> str:
    return f"park check · {condition.kind} {condition.target}"


def after_miss(condition: ParkCondition, result: str) -> None:
    """The condition did not hold: the next check waits twice as long, up to the longest."""
    condition.checks += 1
    condition.last_result = result[:200]
    condition.next_check_at = workflow.now() + timedelta(seconds=condition.interval_s)
    condition.interval_s = min(condition.interval_s * 2, condition.max_interval_s)
