"""perdure: a durable runtime for AI agents that work on one goal for hours or days, on Temporal.

The public API. Everything else under `perdure.` is the runtime's own rooms (see the docs'
architecture page) and may change between versions:

    Client         start, steer, answer and read goals from Python (async, typed):
                   `await perdure.Client.connect()`, configured as the `perdure` command is
    connect        a Temporal client with perdure's data converter, from the standard
                   Temporal configuration (profile file, TEMPORAL_* variables) and PERDURE_*
    PerdurePlugin  the same converter and sandbox settings for your own clients and workers
    Plan           a plan file's model (`perdure start --plan FILE` takes its YAML or JSON)
    GoalSpec       what starts a goal: its text or plan, budget, model profile, devices
    GoalResult     what a finished goal returns
    GoalWorkflow   the goal's workflow type, for replaying a goal's history in your tests
    tool           declare a function of yours a tool (risk, replay policy, effect key,
                   compensation, cost); `ToolCall` is what it is told of its call, `Undo`
                   what a compensation is called with, `Effect` an effect key's material,
                   `ToolError` a failure the model can act on, `OutcomeUnknown` a call that
                   may have happened; `ToolDeclarationError` a declaration refused

and what the client raises, each a `PerdureError` with a text that says why: GoalNotFound,
InvalidRequest (nothing was sent), BadPlanFile, StartRefused, NotOffered, MessageRejected,
GoalEnded, StillRunning, EndedWithoutResult, ResultUnreadable, NoWorkerAnswered; and
ServerUnavailable (a RuntimeError) when no Temporal server answers.

Names load on first use, so `import perdure` costs nothing (the workflow sandbox imports it).
"""

from __future__ import annotations

from importlib import import_module, metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perdure.activities.tools.catalogue.tool_errors import OutcomeUnknown, ToolError
    from perdure.activities.tools.user.tool_decorator import ToolCall, ToolDeclarationError, Undo, tool
    from perdure.runtime.connect import ServerUnavailable, connect
    from perdure.runtime.plugin import PerdurePlugin
    from perdure.starters.client.client_errors import (
        BadPlanFile,
        EndedWithoutResult,
        GoalEnded,
        GoalNotFound,
        InvalidRequest,
        MessageRejected,
        NotOffered,
        NoWorkerAnswered,
        PerdureError,
        ResultUnreadable,
        StartRefused,
        StillRunning,
    )
    from perdure.starters.client.perdure_client import Client
    from perdure.workflows.goal.contracts.goal_contracts import GoalResult, GoalSpec
    from perdure.workflows.goal.contracts.plan import Plan
    from perdure.workflows.goal.goal_workflow import GoalWorkflow
    from perdure.workflows.shared.tool_specs import Effect

_ERRORS = "perdure.starters.client.client_errors"
_PUBLIC = {
    "Client": "perdure.starters.client.perdure_client",
    "connect": "perdure.runtime.connect",
    "ServerUnavailable": "perdure.runtime.connect",
    "PerdurePlugin": "perdure.runtime.plugin",
    "Plan": "perdure.workflows.goal.contracts.plan",
    "GoalSpec": "perdure.workflows.goal.contracts.goal_contracts",
    "GoalResult": "perdure.workflows.goal.contracts.goal_contracts",
    "GoalWorkflow": "perdure.workflows.goal.goal_workflow",
    **{
        name: _ERRORS
        for name in (
            "PerdureError",
            "InvalidRequest",
            "BadPlanFile",
            "GoalNotFound",
            "StartRefused",
            "NotOffered",
            "MessageRejected",
            "GoalEnded",
            "StillRunning",
            "EndedWithoutResult",
            "ResultUnreadable",
            "NoWorkerAnswered",
        )
    },
    "tool": "perdure.activities.tools.user.tool_decorator",
    "ToolCall": "perdure.activities.tools.user.tool_decorator",
    "ToolDeclarationError": "perdure.activities.tools.user.tool_decorator",
    "Undo": "perdure.activities.tools.user.tool_decorator",
    "Effect": "perdure.workflows.shared.tool_specs",
    "ToolError": "perdure.activities.tools.catalogue.tool_errors",
    "OutcomeUnknown": "perdure.activities.tools.catalogue.tool_errors",
}

__all__ = [
    "BadPlanFile",
    "Client",
    "Effect",
    "EndedWithoutResult",
    "GoalEnded",
    "GoalNotFound",
    "GoalResult",
    "GoalSpec",
    "GoalWorkflow",
    "InvalidRequest",
    "MessageRejected",
    "NoWorkerAnswered",
    "NotOffered",
    "OutcomeUnknown",
    "PerdureError",
    "PerdurePlugin",
    "Plan",
    "ResultUnreadable",
    "ServerUnavailable",
    "StartRefused",
    "StillRunning",
    "ToolCall",
    "ToolDeclarationError",
    "ToolError",
    "Undo",
    "__version__",
    "connect",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return metadata.version("perdure")
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'perdure' has no attribute {name!r}")
