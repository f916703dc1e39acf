"""How a goal ends: its outcome (succeeded, partial, failed, aborted), the report
activity that writes what was done and what was not, the result it returns, and whether
its workflow ends failed (with that result in the failure).

Workflow code: it schedules the report activity. Every goal ends through here,
whether it finished, failed, was aborted or could not load its state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import get_args

from temporalio import workflow

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts.goal_contracts import (
    Activities,
    GoalResult,
    Outcome,
    ReportInput,
    ReportResult,
    StepOutcome,
)
from perdure.workflows.goal.contracts.past_chunks import step_outcome
from perdure.workflows.goal.contracts.state import CompensationRecord, Ledger, Node, PastLog, RetiredNode
from perdure.workflows.goal.goal_memory import GoalMemoryRoom
from perdure.workflows.goal.rules import frontier
from perdure.workflows.goal.rules import question_deadline_rules as deadlines
from perdure.workflows.goal.rules.progress_view import owned_objects
from perdure.workflows.shared import graph, metrics
from perdure.workflows.shared.retries import HEARTBEAT_TIMEOUT, REPORT_RETRY, REPORT_TIMEOUT
from perdure.workflows.shared.statuses import NodeStatus

# The latest decisions the report lists (`perdure log` shows them all).
REPORT_DECISIONS = 10
# Lines of unfinished work the result and the report name (a large goal may leave thousands).
UNFINISHED_LISTED = 100


class Closing:
    def __init__(
        self, ctx: GoalContext, publish: Callable[[], None], quiet_past: Callable[[], Awaitable[None]]
    ) -> None:
        self._ctx = ctx
        self._publish = publish
        self._memory = GoalMemoryRoom(ctx)
        # A large goal's store pass in flight ends, and no other starts (workflows/goal/past.py):
        # a step both listed from the node table and counted in the past would be told twice.
        self._quiet_past = quiet_past

    async def report(self) -> GoalResult:
        state = self._ctx.state
        await self._quiet_past()
        # What is still to be written, and what the end-of-goal card chose to keep.
        await self._memory.at_close()
        state.phase = "reporting"
        self._publish()
        nodes = self._current_nodes()
        past = state.past or PastLog(plan_version=0)
        # A large goal's steps that never got a node (it ended before they could start, or an
        # emergency stop abandoned them): counted.
        never = state.plan_size() - len(nodes) - past.count if state.plan is not None else 0
        # Work of earlier plan versions that the current plan left out and that did not end well.
        setbacks = [r for r in state.retired_nodes if r.node.status not in ("succeeded", "invalidated")]
        outcome = self._outcome(nodes, setbacks, past, never)
        self._close_questions(outcome)
        unfinished, unfinished_count = _unfinished(nodes, past, setbacks, never, state.stopped_untouched)
        failure = state.failure or (f"aborted: {state.abort_reason}" if outcome == "aborted" else None)
        if outcome == "failed" and failure is None:
            failure = _nothing_succeeded(nodes, past)
        self._ctx.decide("end", _ending(outcome, failure, unfinished_count))
        past_counts = {status: sum(kinds.values()) for status, kinds in past.counts.items()}
        if never > 0:
            untouched = "abandoned" if state.stopped_untouched is not None else "never started"
            past_counts[untouched] = past_counts.get(untouched, 0) + never
        log = state.decisions
        report = await workflow.execute_activity(
            Activities.WRITE_REPORT,
            ReportInput(
                goal_id=self._ctx.goal_id,
                goal=state.spec.goal,
                outcome=outcome,
                failure=failure,
                steps=[step_outcome(n) for n in nodes] + [_earlier_step(r) for r in state.retired_nodes],
                unfinished=unfinished,
                notes=self._notes(),
                tokens=state.ledger.tokens,
                cost_usd=state.ledger.cost_usd,
                tool_cost_usd=state.ledger.tool_cost_usd,
                own_calls=state.ledger.own_calls,
                decisions=log.recent[-REPORT_DECISIONS:],
                decision_count=log.count,
                past=past.chunks,
                past_counts=past_counts,
                past_tokens=past.tokens,
                past_cost_usd=past.cost_usd,
            ),
            result_type=ReportResult,
            start_to_close_timeout=REPORT_TIMEOUT,
            # A goal's last step: a worker killed while writing it is noticed in seconds.
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=REPORT_RETRY,
            summary=f"report · {outcome}",
        )
        state.result = GoalResult(
            outcome=outcome,
            failure=failure,
            report=report.report,
            excerpt=report.excerpt,
            outputs={n.name: n.output for n in nodes if n.output is not None},
            past=past.chunks,
            failed_steps=[line.partition(": ")[0] for line in past.not_succeeded]
            + [n.name for n in nodes if n.status in ("failed", "abandoned")]
            + [_label(r) for r in setbacks if r.node.status in ("failed", "abandoned")],
            unfinished=unfinished,
            tokens=state.ledger.tokens,
            cost_usd=state.ledger.cost_usd,
            tool_cost_usd=state.ledger.tool_cost_usd,
            objects=owned_objects(state),
            own_calls=state.ledger.own_calls,
            lost_attempts=state.ledger.lost_attempts,
            lost_by_step=dict(state.ledger.lost_by_step),
            # A copy: a chunk stored after this changes the state's log, not what the goal returned.
            decisions=log.model_copy(deep=True),
        )
        state.phase = "failed" if outcome == "failed" else "finished"
        self._publish()
        self._ctx.metrics.add(metrics.GOALS_ENDED, 1, outcome=outcome)
        return state.result

    def fails_workflow(self, result: GoalResult) -> bool:
        """Whether the goal's workflow ends failed (its result in the failure's details, where
        `perdure result` and a parent goal read it): a goal that failed or was aborted, so that
        the Temporal UI's list, which shows a workflow's status and not perdure's outcome, does
        not call it Completed."""
        return bool(self._ctx.state.failure) or result.outcome in ("failed", "aborted")

    def _close_questions(self, outcome: Outcome) -> None:
        """No question stays open on an ended goal: each says why it was never answered."""
        for question in self._ctx.state.open_questions():
            question.status, question.answered_at = "closed", workflow.now()
            question.answer_text = f"not answered: the goal ended ({outcome}) first"

    def _current_nodes(self) -> list[Node]:
        """The current plan's steps that have a node, in topological order (a large plan's in
        plan order: ordering 100,000 steps topologically took most of a second); a large goal's
        steps stored in the past are not among them (the report reads their chunks), nor those
        that never got a node (counted by the caller)."""
        state = self._ctx.state
        if state.plan is None:
            return []
        if not frontier.is_large(len(state.plan.steps)):
            return [state.nodes[name] for name in graph.topological_order(state.plan)]
        index = self._ctx.index()
        return sorted(state.nodes.values(), key=lambda n: index.position(n.name))

    def _outcome(self, nodes: list[Node], setbacks: list[RetiredNode], past: PastLog, never: int = 0) -> Outcome:
        state = self._ctx.state
        if state.failure:
            return "failed"
        if state.pause.mode == "aborting":
            return "aborted"
        stored = {status: sum(kinds.values()) for status, kinds in past.counts.items()}
        succeeded = stored.get("succeeded", 0) + sum(n.status == "succeeded" for n in nodes)
        steps = past.count + len(nodes) + never
        # A step that failed in a plan version since left out still failed: not a success.
        if steps and succeeded == steps and not setbacks:
            return "succeeded"
        if steps and not succeeded:
            return "failed"  # nothing of the plan was done: not even part of it
        return "partial"

    def _notes(self) -> list[str]:
        state = self._ctx.state
        notes = [f"plan v{v.version} ({v.source}): {v.reason}" for v in state.plan_versions[1:]]
        notes += [f"guidance applied: {g}" for g in state.guidance]
        notes += [f"rejected path: {p.for_prompt()}" for p in state.rejected_paths]
        notes += [deadlines.report_note(q) for q in state.questions]
        notes += [_compensation_note(r) for r in state.compensations]
        notes += [f"{t.what}: {t.text()}" for t in state.timers if t.node is None]  # the park's timers
        notes += self._memory.notes()
        notes += lost_note(state.ledger)
        return notes


def _ending(outcome: Outcome, failure: str | None, unfinished: int) -> str:
    """The decision log's last entry: how the goal ended."""
    said = f"the goal ended {outcome}" + (f": {failure}" if failure else "")
    return said + (f"; {unfinished} step(s) unfinished" if unfinished else "")


def _unfinished(
    nodes: list[Node], past: PastLog, setbacks: list[RetiredNode], never: int, stopped: str | None
) -> tuple[list[str], int]:
    """'step: why' for each step that did not succeed, at most UNFINISHED_LISTED of them (a
    large goal's stored ones as far as its past names them: PastLog.not_succeeded), then how
    many more there are and the steps that never got a node, one line each; and the count."""
    stored = sum(n for status, kinds in past.counts.items() if status != "succeeded" for n in kinds.values())
    named = [
        *past.not_succeeded,
        *(f"{n.name}: {n.error or n.status}" for n in nodes if n.status != "succeeded"),
        *(f"{_label(r)}: {r.node.error or r.node.status}" for r in setbacks),
    ]
    count = stored - len(past.not_succeeded) + len(named)
    listed = named[:UNFINISHED_LISTED]
    if count > len(listed):
        listed.append(
            f"(and {count - len(listed)} more that did not succeed: the report counts them by status; "
            "each stored step is in a chunk of the result's `past`)"
        )
    if never > 0:
        untouched = f"abandoned, {stopped}" if stopped else "that never started"
        listed.append(f"(and {never} steps {untouched})")
    return listed, count + never


def _nothing_succeeded(nodes: list[Node], past: PastLog) -> str:
    """Why a goal with no failure of its own failed: how its steps ended, e.g.
    'no step succeeded (1 failed, 1 abandoned)'."""
    counts = Counter(n.status for n in nodes)
    for status, kinds in past.counts.items():
        counts[status] += sum(kinds.values())
    ended = [f"{counts[status]} {status}" for status in get_args(NodeStatus) if counts[status]]
    return f"no step succeeded ({', '.join(ended)})"


def lost_note(ledger: Ledger) -> list[str]:
    """How many attempts died with their worker, per step (workflows/goal/lost_workers.py)."""
    if not ledger.lost_attempts:
        return []
    steps = ", ".join(f"{step}: {count}" for step, count in ledger.lost_by_step.items())
    return [
        f"{ledger.lost_attempts} attempt(s) lost to worker deaths ({steps}): retried without counting "
        "against their calls' retries while the budget allowed (the gate log says when it did not); "
        "a lost model attempt is charged at its step's estimate, as it may have been billed"
    ]


def _compensation_note(record: CompensationRecord) -> str:
    undo = record.compensation.tool
    if record.status == "not_needed":
        return f"effect {record.effect_key} of {record.node} did not happen: nothing to undo"
    line = f"effect {record.effect_key} of {record.node}: undo by {undo} {record.status}"
    if record.effect == "maybe":
        line += f" (the effect may not have happened; {undo} is keyed, so it is safe either way)"
    return line + (f" ({record.note})" if record.note else "")


def _label(retired: RetiredNode) -> str:
    return f"{retired.node.name} (plan v{retired.plan_version})"


def _earlier_step(retired: RetiredNode) -> StepOutcome:
    step = StepOutcome.model_validate(retired.node, from_attributes=True)
    return step.model_copy(update={"plan_version": retired.plan_version})
