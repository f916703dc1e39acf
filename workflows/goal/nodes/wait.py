"""A wait node: a durable timer until the step's planned time, then a sentence saying when
the goal acted and how late (workflows/goal/rules/timing.py), kept as the step's output so a later
step's model reads it.

Workflow code. The planned time is read off the plan and the node (`until`, or the node's
start plus `after`), never off the clock of the run that waits, so a wait that crosses
continue-as-new or a park keeps its time. While the timer runs the node is parked with a
task of its own; the task lets go (the wait is state, the node parked with no task) when the
goal is due to continue as new or is parked, and the scheduler runs it again in the next run
or on resume: then it fires at once if its time has passed, marked late.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from temporalio import workflow

from perdure.workflows.goal.context import GoalContext, NodeWaiting
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.plan import WaitStep
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.contracts.wait_contracts import WaitOutput, WaitOutputInput
from perdure.workflows.goal.device_placement import LOCAL_RETRY, LOCAL_TIMEOUT
from perdure.workflows.goal.nodes.base import NodeDeps
from perdure.workflows.goal.rules import timing
from perdure.workflows.shared.contracts import ArtifactRef

# node.waiting_on while the wait is state: why it let go of its task.
WAIT_CARRIED = "wait:carried"
WAIT_PARKED = "wait:parked"
# The end of a waiting node's preview once a park has held it: it survives the resume (which
# clears waiting_on), so the wait, firing then, knows the goal was parked at its time.
HELD_BY_PARK = "; held: the goal is parked"


def planned_time(step: WaitStep, node: Node) -> datetime:
    delay = step.delay()
    if delay is None:
        assert step.until is not None
        return step.until
    assert node.started_at is not None  # set when the node was dispatched; a resume keeps it
    return node.started_at + delay


def timer_summary(name: str, planned: datetime) -> str:
    """The summary of a wait step's timer: what history shows, and how its events are found."""
    return f"wait step {name}: until {planned:%Y-%m-%d %H:%M:%S} UTC"


class WaitNode:
    def __init__(self, deps: NodeDeps) -> None:
        self._ctx = deps.ctx
        self._keeping = asyncio.Lock()

    async def run(self, step: WaitStep, node: Node) -> tuple[ArtifactRef, str]:
        ctx, state = self._ctx, self._ctx.state
        planned = planned_time(step, node)
        waiting = f"waiting until {planned:%Y-%m-%d %H:%M:%S} UTC"
        if workflow.now() < planned:
            ctx.set_status(node, "parked")
            node.preview = waiting
            try:
                await workflow.wait_condition(
                    lambda: self._lets_go(ctx) is not None,
                    timeout=planned - workflow.now(),
                    timeout_summary=timer_summary(step.name, planned),
                )
            except TimeoutError:
                pass
            else:
                self._let_go(node, waiting, self._lets_go(ctx) or WAIT_CARRIED)
        if state.pause.mode == "parked":
            # Its time came in the task that parked the goal: it fires on resume.
            self._let_go(node, waiting, WAIT_PARKED)
        parked = node.preview.endswith(HELD_BY_PARK)
        node.waiting_on = None
        ctx.set_status(node, "running")  # the scheduler settles only a running node
        # One at a time: steps acting together (after an outage) keep their order, and their
        # local activities, which read history for a while, never resolve out of order.
        async with self._keeping:
            entry, output = await self._kept(step, planned, parked)
        timing.record(state.timers, entry)
        node.preview = entry.text()
        return output, entry.text()

    async def _kept(self, step: WaitStep, planned: datetime, parked: bool) -> tuple[timing.TimerRecord, ArtifactRef]:
        """Judged and kept by one local activity, which reads why a late timer was late off
        the goal's history (whether the server or the worker was missing)."""
        out = await workflow.execute_local_activity(
            Activities.WAIT_OUTPUT,
            WaitOutputInput(
                name=step.name,
                planned=planned,
                acted=workflow.now(),
                parked=parked,
                summary=timer_summary(step.name, planned),
            ),
            result_type=WaitOutput,
            start_to_close_timeout=LOCAL_TIMEOUT,
            retry_policy=LOCAL_RETRY,
            summary=f"keep output · wait {step.name}",
        )
        assert out.stored.output is not None
        return out.record, out.stored.output

    def _let_go(self, node: Node, waiting: str, why: str) -> None:
        """End the task; the wait is state (the node parked, no task) until the scheduler
        runs it again: in the next run, or when the goal resumes."""
        self._ctx.set_status(node, "parked")
        node.waiting_on = why
        node.preview = waiting + (HELD_BY_PARK if why == WAIT_PARKED else "")
        self._ctx.wake()
        raise NodeWaiting(f"{waiting}: the wait is state ({why})")

    @staticmethod
    def _lets_go(ctx: GoalContext) -> str | None:
        """Why the node's task should end with its wait carried as state, or None."""
        if ctx.state.pause.mode == "parked":
            return WAIT_PARKED
        if ctx.continue_as_new_due():
            return WAIT_CARRIED
        return None


__all__ = ["WaitNode", "planned_time"]
