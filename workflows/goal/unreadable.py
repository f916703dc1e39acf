"""What a goal does with an input its worker cannot decrypt (a client encrypted it with a
payload key, the worker has none: runtime/converter.py hands the goal an UndecryptedInput).

A fresh goal on its first workflow task has done nothing yet: it fails at once, naming the
key and what to do, instead of failing that task forever (a goal stuck where only
`perdure status` could tell why). A run that continued as new, or a replay of a goal another
worker was running, has done things: failing it would lose them, so the task fails instead
and is retried until a worker with the key takes it. Workflow code.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from perdure.workflows.goal.contracts.state import UndecryptedInput

UNREADABLE_INPUT = "GoalInputUnreadable"


def refuse_undecrypted(input: UndecryptedInput) -> Exception:
    """The exception the goal's run raises: the goal's failure, or this workflow task's."""
    fresh = workflow.info().continued_run_id is None and not workflow.unsafe.is_replaying()
    if fresh:
        return ApplicationError(input.problem(fresh), type=UNREADABLE_INPUT, non_retryable=True)
    return RuntimeError(input.problem(fresh))
