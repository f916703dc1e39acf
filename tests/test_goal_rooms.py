"""The goal workflow's rooms stay complete: every message kind has a steering verb
(or a boundary that applies it later), every node kind a runner and a cost
estimate before any history. A kind added in one place and forgotten in another
fails here, not in a running goal."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest

from perdure.workflows.goal.contracts.messages import UserMessage
from perdure.workflows.goal.contracts.plan import NodeKind
from perdure.workflows.goal.inbox import LATER_KINDS
from perdure.workflows.goal.nodes import RUNNERS
from perdure.workflows.goal.rules.estimates import KIND_DEFAULTS
from perdure.workflows.goal.steering import Steering


def message_kinds() -> set[str]:
    union = get_args(UserMessage)[0]
    return {model.model_fields["kind"].default for model in get_args(union)}


def test_every_message_kind_is_a_steering_verb_or_applied_at_a_later_boundary():
    verbs = set(Steering(None, None, None, None).verbs)  # type: ignore[arg-type]
    assert verbs.isdisjoint(LATER_KINDS)
    assert verbs | set(LATER_KINDS) == message_kinds()


def test_every_node_kind_has_a_runner_and_a_default_estimate():
    kinds = set(get_args(NodeKind))
    assert kinds == {"tool", "llm", "agent", "subgoal", "wait"}
    assert set(RUNNERS) == kinds
    assert kinds <= set(KIND_DEFAULTS)


@pytest.mark.slow
def test_a_node_kind_without_a_runner_stops_the_import():
    # A new step type in the plan with no runner registered: the goal package must not load.
    code = (
        "from typing import Literal\n"
        "import perdure.workflows.goal.contracts.plan as plan\n"
        "plan.NodeKind = Literal['tool', 'llm', 'agent', 'device']\n"
        "import perdure.workflows.goal.goal_workflow\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert "node kinds without a runner in workflows/goal/nodes: device" in done.stderr
