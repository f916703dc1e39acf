"""A local activity that fails raises its own error in the workflow (an ApplicationError: the
activity raised one, or any exception the SDK converted), not an ActivityError as an activity
does; only a local activity's timeout comes as an ActivityError. Measured with temporalio
1.35: `ApplicationError: OSError: nope`, `ActivityError: Local Activity timed out (cause
TimeoutError)`. Each place that calls a local activity and means to go on without it must
catch both (temporalio's FailureError)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from temporalio.exceptions import ApplicationError

from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.nodes import tool


async def test_a_look_whose_local_activity_fails_is_no_look_and_the_step_goes_on(monkeypatch: pytest.MonkeyPatch):
    # Before: the ApplicationError escaped `_look`, and the step failed after its call had run
    # (the look after a write), or before it ran (the look before).
    async def refused(*args, **kwargs):
        raise ApplicationError("Permission denied: 'notes.md'", type="PermissionError")

    monkeypatch.setattr(tool.workflow, "execute_local_activity", refused)
    ctx = SimpleNamespace(state=SimpleNamespace(spec=SimpleNamespace(workspace="/tmp/ws")))
    node_runner = tool.ToolNode(SimpleNamespace(ctx=ctx, guard=None))
    looked = await node_runner._look(Node(name="read", kind="tool"), ["notes.md"], "after")
    assert looked is None
