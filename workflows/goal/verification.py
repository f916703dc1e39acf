"""Verify before going on: after a long wait, the goal's finished steps are checked before
new work starts, and what no longer holds is voided as a rewind would void it.

When: a park at least `verify_after_s` long ends (a resume, or its wake time), or a run
continued as new starts after that long without progress (workflows/goal/verify_due.py). What: every
succeeded step of the current plan, as deep as its `verify` (or the goal's
recovery_mode) says, in one activity (activities/verification.py): existence (its output
artifact, the files it wrote), fingerprint (the files it read still digest the same),
semantic (its `verify` command still passes). Steps on a device are checked only for
their artifacts: their files are on the device. A check that cannot be made keeps
everything and says so; the goal never stops on it.

Workflow code.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows.contracts import Activities
from workflows.goal.context import GoalContext
from workflows.goal.scheduler import Scheduler
from workflows.goal.tool_runner import failure_message
from workflows.invalidation import invalidate_nodes
from workflows.plan import PlanStep
from workflows.state import Node, PlanDiff, Verification
from workflows.verify_contracts import NodeCheck, VerifyInput, VerifyResult

VERIFY_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=1))
VERIFY_HEARTBEAT = timedelta(seconds=60)
# Checks of finished work kept in the state (the newest; each is also a plan version).
VERIFICATIONS_KEPT = 20


class Verifier:
    def __init__(self, ctx: GoalContext, scheduler: Scheduler) -> None:
        self._ctx = ctx
        self._scheduler = scheduler

    def pending(self) -> bool:
        return bool(self._ctx.state.verify_due) and self._ctx.state.pause.mode == "running"

    async def run(self) -> None:
        state = self._ctx.state
        why, state.verify_due = state.verify_due or "", None
        if not self._ctx.verifies_after_waits:
            return  # a goal recorded before verification existed replays without it
        checks = [c for c in (self._check(s) for s in self._ctx.plan().steps) if c is not None]
        if not checks:
            return
        record = Verification(at=workflow.now(), why=why)
        try:
            result = await workflow.execute_activity(
                Activities.VERIFY_NODES,
                VerifyInput(workspace=state.spec.workspace, network=state.spec.allow_network, checks=checks),
                result_type=VerifyResult,
                start_to_close_timeout=timedelta(seconds=60 + sum(c.timeout_s for c in checks if c.command)),
                heartbeat_timeout=VERIFY_HEARTBEAT,
                retry_policy=VERIFY_RETRY,
                summary=f"verify {len(checks)} finished steps ({why})"[:200],
            )
        except ActivityError as err:
            record.problem = failure_message(err)[:300]
            record.kept = [c.node for c in checks]
        else:
            record.void = dict(result.void)
            invalidation = invalidate_nodes(self._ctx.plan(), self._statuses(), list(result.void), self._ctx.ran())
            record.kept = invalidation.kept
            record.downstream = [name for name in invalidation.void if name not in result.void]
            if invalidation.void:
                self._scheduler.void(invalidation.void)
                self._scheduler.record_plan_version(
                    "verify",
                    f"{why}: {record.summary()}",
                    PlanDiff(invalidated=invalidation.void, kept=invalidation.kept),
                )
        state.verifications = [*state.verifications, record][-VERIFICATIONS_KEPT:]
        self._ctx.log_gate(f"{why}: {record.summary()}")

    def _check(self, step: PlanStep) -> NodeCheck | None:
        node: Node = self._ctx.state.nodes[step.name]
        if node.status != "succeeded":
            return None
        spec = step.verify
        depth = spec.depth_for(self._ctx.state.spec.recovery_mode) if spec else self._ctx.state.spec.recovery_mode
        if depth == "trust":
            return None
        on_device = getattr(step, "device", None) is not None
        return NodeCheck(
            node=step.name,
            depth="existence" if on_device else depth,
            artifacts=[node.output] if node.output else [],
            fingerprints=[] if on_device else list(node.fingerprints),
            command=None if on_device or spec is None else spec.command,
            expect_exit=spec.expect_exit if spec else 0,
            timeout_s=spec.timeout_s if spec else 120,
        )

    def _statuses(self) -> dict[str, str]:
        return {name: node.status for name, node in self._ctx.state.nodes.items()}
