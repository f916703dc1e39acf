"""What the goal shows about itself while it runs: the `progress` query's snapshot,
the Temporal UI's current details, and the search attributes visibility lists
goals by (phase, percent done, cost, parked, needs a person, last progress).

Workflow code: it upserts search attributes (history events) and sets the current
details (served by a query). What the snapshot and details say is pure, in
workflows/goal/rules/progress_view.py; this room decides when to publish.
"""

from __future__ import annotations

from temporalio import workflow

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts.goal_contracts import ProgressSnapshot
from perdure.workflows.goal.rules.eta import Eta, estimate_eta
from perdure.workflows.goal.rules.progress_view import details_markdown, progress_snapshot
from perdure.workflows.goal.spend import Spend
from perdure.workflows.goal.stream import EventStream
from perdure.workflows.shared import search_attributes as sa
from perdure.workflows.shared.budget import budget_fractions
from perdure.workflows.shared.statuses import CLOSED_PHASES, ENDED_PHASES, TERMINAL


class Publisher:
    def __init__(self, ctx: GoalContext, spend: Spend, events: EventStream) -> None:
        self._ctx = ctx
        self._spend = spend
        self._events = events
        self._published: tuple | None = None
        self._details_at = None

    def snapshot(self) -> ProgressSnapshot:
        use = self._spend.actual_use()
        return progress_snapshot(
            self._ctx.state,
            self._ctx.goal_id,
            self.percent_done(),
            budget_fractions(self._ctx.state.spec.budget, use),
            self._eta(),
            active_seconds=use.wall_seconds,
            abort=self._ctx.abort_progress(),
            index=self._ctx.index(),
        )

    def publish(self) -> None:
        """Mirror phase and progress to search attributes and the UI's details.

        Search-attribute upserts are history events, so they are written only
        when the phase, the pause or the need for a human changes, or progress
        crosses a ten-percent step.
        """
        state = self._ctx.state
        percent = self.percent_done()
        self._events.sync(self.percent_done, self._progress)
        parked = state.pause.mode == "parked"
        needs_human = bool(state.open_questions())
        marker = (state.phase, percent // 10, parked, needs_human)
        now = workflow.now()
        if self._details_at != now or marker != self._published:
            # workflow.now() stands still within a workflow task: the details (what the UI
            # shows, not history) are worked out once per task and on every change of phase,
            # not for every node that settles in a long read segment.
            self._details_at = now
            fractions = self._spend.fractions()
            workflow.set_current_details(details_markdown(state, self._ctx.index(), percent, fractions, self._eta()))
        if marker == self._published:
            return
        self._published = marker
        workflow.upsert_search_attributes(
            [
                sa.GOAL_STATUS.value_set(state.phase),
                sa.PERCENT_DONE.value_set(percent),
                sa.COST_USD.value_set(round(state.ledger.cost_usd, 6)),
                sa.PARKED.value_set(parked),
                sa.NEEDS_HUMAN.value_set(needs_human),
                sa.LAST_PROGRESS_AT.value_set(workflow.now()),
            ]
        )

    def sync_events(self) -> None:
        """The event stream only (no search attributes, which are commands): before the
        run continues as new, so what its last workflow task changed is published."""
        self._events.sync(self.percent_done, self._progress)
        self._events.sync_now()

    def _progress(self) -> tuple[dict[str, float], str | None, str | None]:
        eta = self._eta()
        return self._spend.fractions(), eta.text if eta else None, eta.confidence if eta else None

    def percent_done(self) -> int:
        state = self._ctx.state
        if state.phase in CLOSED_PHASES:
            return 100
        index = self._ctx.index()
        # A large goal's plan is loaded as each run starts (past.py): meanwhile its size is the stored plan's.
        total = index.total if state.plan is not None else state.plan_size() or index.total
        if not total:
            return 0
        return int(100 * index.count(TERMINAL) / total)

    def _eta(self) -> Eta | None:
        state = self._ctx.state
        if state.phase in ENDED_PHASES or state.pause.mode == "parked":
            return None  # a parked goal has no end in sight until it is resumed
        index = self._ctx.index()
        remaining = index.unsettled_by_kind()
        running = index.count(("running",))
        return estimate_eta(remaining, state.ledger.by_kind, running=running, parallelism=max(1, running))
