"""The goal's decision log as the workflow keeps it (workflows/goal/contracts/decision_contracts.py
has the entries and the rules): what a plan version adopted records, and the storing of
the older entries in the artifact store.

Workflow code. A room records a decision with `GoalContext.decide(kind, text, who=...,
about=...)` (a gate-log line records one too); this room stores the oldest entries as one
chunk when the rules say so, by a local activity in a task of its own, so no room waits for
the store. The entries stay in the state until the chunk's ref is back; continue-as-new
waits for a chunk being written (`settled`). A store that fails is tried again once
another half of `kept` has gathered, never on every decision.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import FailureError

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts import decision_contracts as decisions
from perdure.workflows.goal.contracts.decision_contracts import MODEL, PLAN_FILE, RULE, WriteDecisionsInput
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.state import PlanVersion
from perdure.workflows.shared.contracts import ArtifactRef

STORE_TIMEOUT = timedelta(seconds=30)
STORE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.5), maximum_attempts=3)
# Plan source -> the kind of decision a version from it is, and who made it (None: the
# person who sent the message, given by the caller). A version the re-verification made is
# recorded by the verification itself (workflows/goal/verification.py), with what it voided.
PLAN_SOURCES: dict[str, tuple[str, str | None]] = {
    "planner": ("plan", MODEL),
    "plan-file": ("plan", PLAN_FILE),
    "queue": ("replan", MODEL),
    "drift": ("replan", MODEL),
    "evidence": ("replan", MODEL),
    "rewind": ("rewind", None),
    "narrow": ("narrow", None),
}
STEPS_NAMED = 8


class DecisionLogRoom:
    def __init__(self, ctx: GoalContext) -> None:
        self._ctx = ctx
        self._writing: asyncio.Task | None = None
        # How many recent entries there were when a store failed: not tried again before more gather.
        self._failed_at: int | None = None
        ctx.on_decision = self._store_if_due

    async def settled(self) -> None:
        """Wait for the chunk being written, if any (the run is about to end)."""
        while self._writing is not None and not self._writing.done():
            await asyncio.wait([self._writing])

    def _store_if_due(self) -> None:
        if self._writing is not None and not self._writing.done():
            return
        log, kept = self._ctx.state.decisions, self._ctx.state.spec.decisions_kept
        if self._failed_at is not None and len(log.recent) < self._failed_at + max(kept // 2, 1):
            return
        entries = decisions.chunk_due(log, kept)
        if entries:
            self._writing = asyncio.create_task(self._store(entries))

    async def _store(self, entries: list[decisions.Decision]) -> None:
        first, last = entries[0].seq, entries[-1].seq
        try:
            ref = await workflow.execute_local_activity(
                Activities.WRITE_DECISIONS,
                WriteDecisionsInput(goal_id=self._ctx.goal_id, entries=entries),
                result_type=ArtifactRef,
                start_to_close_timeout=STORE_TIMEOUT,
                retry_policy=STORE_RETRY,
                summary=f"decisions {first}-{last}",
            )
        except FailureError as err:
            # A local activity fails as its own error (ApplicationError, TimeoutError), not an
            # ActivityError. Kept in the state meanwhile: nothing is lost, the run only carries more.
            self._failed_at = len(self._ctx.state.decisions.recent)
            workflow.logger.warning("decisions not stored", extra={"error": str(err.cause or err)[:200]})
            return
        self._failed_at = None
        decisions.stored(self._ctx.state.decisions, entries, ref)
        self._store_if_due()  # more may have gathered while it was written


def plan_adopted(ctx: GoalContext, version: PlanVersion, who: str | None = None, about: Sequence[str] = ()) -> None:
    """The decisions a new plan version records: the plan itself (what it changed and why)
    and, apart, the steps it left out. `who` for a version a person's message made."""
    kind, by = PLAN_SOURCES.get(version.source, (None, RULE))
    if kind is None:
        return
    who = who or by or RULE
    plan, diff = version.plan, version.diff
    if version.version == 1 and plan is not None:
        names = [s.name for s in plan.steps]
        text = f"plan v1 adopted ({version.reason}): {len(names)} step(s): {_named(names)}"
    else:
        changes = [
            f"{label} {_named(names)}"
            for label, names in (
                ("added", diff.added),
                ("void", diff.invalidated),
                ("kept", diff.kept),
                ("to confirm", diff.to_confirm),
            )
            if names
        ]
        said = f"; {', '.join(changes)}" if changes else ""
        text = f"plan v{version.version} ({version.source}) replaces v{version.version - 1}: {version.reason}{said}"
    ctx.decide(kind, text, who, [*about, *diff.added, *diff.invalidated])
    if diff.removed:
        ctx.decide(
            "drop", f"plan v{version.version} leaves out {_named(diff.removed)}: {version.reason}", who, diff.removed
        )


def _named(names: list[str]) -> str:
    shown = ", ".join(names[:STEPS_NAMED])
    return shown + (f" (and {len(names) - STEPS_NAMED} more)" if len(names) > STEPS_NAMED else "")
