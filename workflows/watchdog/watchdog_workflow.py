"""WatchdogWorkflow: one pass of the watchdog over the open goals of a task queue.

A Temporal Schedule starts one run every interval (overlap: skip). A run
recalls the watchdog's memory, scans the goals (visibility, each goal's
`progress` query, the server's view of its pending activities), judges them
with the pure rules of `watchdog_rules`, signals the interventions, and stores
the memory again. The workflow only decides; every RPC and file is an activity.

Why the memory is a file and not workflow state: every Schedule action starts
a new, independent execution with the schedule's fixed arguments, so nothing
carries from one run to the next inside Temporal. The alternatives were a
long-lived memory workflow (an update every minute, its own continue-as-new)
or reading the previous run's result through the schedule (racy, and lost
with retention). The memory is small and derived, because the goals' inboxes
dedupe every intervention by its request id, so a JSON file under
`$PERDURE_HOME/watchdog/`, replaced atomically by an activity, is enough. It
lives where the artifact store lives, which workers already share.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import get_args

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

# Pure models and rules: passed through so the sandbox does not re-import pydantic per run.
with workflow.unsafe.imports_passed_through():
    from perdure.workflows.shared import metrics
    from perdure.workflows.shared.statuses import Phase
    from perdure.workflows.watchdog import watchdog_rules as rules
    from perdure.workflows.watchdog.watchdog_contracts import (
        INFRASTRUCTURE_KINDS,
        WATCHDOG_STATE_QUERY,
        WATCHDOG_WORKFLOW,
        Assessment,
        Finding,
        GoalObservation,
        InterveneInput,
        InterveneResult,
        JudgeInput,
        JudgeResult,
        RecallInput,
        RecallResult,
        RememberInput,
        RememberResult,
        ScanInput,
        ScanResult,
        Verdict,
        WatchdogActivities,
        WatchdogInput,
        WatchdogMemory,
        WatchdogResult,
        WatchdogRunState,
    )

RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10), maximum_attempts=5)
SHORT = timedelta(seconds=30)
DETAIL_LINES = 20


@workflow.defn(name=WATCHDOG_WORKFLOW)
class WatchdogWorkflow:
    @workflow.init
    def __init__(self, input: WatchdogInput) -> None:
        self._state = WatchdogRunState()

    @workflow.run
    async def run(self, input: WatchdogInput) -> WatchdogResult:
        state = self._state
        now = input.as_of or workflow.now()
        scope = input.task_queue
        workflow.set_current_details(f"**watchdog** · {scope} · recalling memory")
        recalled = await workflow.execute_activity(
            WatchdogActivities.RECALL,
            RecallInput(scope=scope),
            result_type=RecallResult,
            start_to_close_timeout=SHORT,
            retry_policy=RETRY,
            summary=f"recall memory · {scope}",
        )
        memory = recalled.memory
        state.phase = "scanning"
        # A scan of many goals can meet many silent ones, each waiting its query timeout.
        scan_timeout = timedelta(seconds=max(60.0, 4 * input.query_timeout_s + input.max_goals * 0.5))
        scan = await workflow.execute_activity(
            WatchdogActivities.SCAN,
            ScanInput(task_queue=scope, query_timeout_s=input.query_timeout_s, max_goals=input.max_goals),
            result_type=ScanResult,
            start_to_close_timeout=scan_timeout,
            heartbeat_timeout=timedelta(seconds=2 * input.query_timeout_s + 30),
            retry_policy=RETRY,
            summary=f"scan open goals · {scope}",
        )
        state.goals = len(scan.goals)
        assessment = rules.assess(scan.goals, memory, now, input.rules, recalled.rules)
        verdicts: list[Verdict] = []
        verdicts, judge_note = await self._judge(scan.goals, assessment, memory, now, input, recalled)
        state.findings = [f for f in assessment.findings if f.kind != "healthy"]
        record_scan(metrics.PerdureMeter(workflow.metric_meter()), scan.goals, state.findings, now)
        state.phase = "intervening"
        outcomes = []
        if assessment.interventions:
            nudges = sum(1 for i in assessment.interventions if i.action == "nudge")
            escalations = len(assessment.interventions) - nudges
            result = await workflow.execute_activity(
                WatchdogActivities.INTERVENE,
                InterveneInput(interventions=assessment.interventions),
                result_type=InterveneResult,
                start_to_close_timeout=timedelta(minutes=2),
                retry_policy=RETRY,
                summary=f"intervene · {nudges} nudge(s), {escalations} escalation(s)",
            )
            outcomes = result.outcomes
        state.sent = [o.request_id for o in outcomes if o.sent]
        state.failed = [f"{o.request_id}: {o.error}" for o in outcomes if not o.sent]
        previous = memory
        memory = rules.remember(
            memory, scan.goals, assessment, outcomes, now, workflow.info().workflow_id, scan.seconds
        )
        memory.verdicts, memory.judge_usage = dict(previous.verdicts), dict(previous.judge_usage)
        rules.remember_verdicts(memory, verdicts, judge_note, now)
        state.phase = "remembering"
        await workflow.execute_activity(
            WatchdogActivities.REMEMBER,
            RememberInput(scope=scope, memory=memory),
            result_type=RememberResult,
            start_to_close_timeout=SHORT,
            retry_policy=RETRY,
            summary=f"remember · {len(memory.open_incidents())} open incident(s)",
        )
        state.phase = "done"
        state.open_incidents = len(memory.open_incidents())
        result = WatchdogResult(
            as_of=now,
            goals=len(scan.goals),
            findings=state.findings,
            counts=rules.finding_counts(assessment.findings),
            sent=state.sent,
            failed=state.failed,
            open_incidents=memory.open_incidents(),
            resolved_incidents=[i for i in assessment.incidents if i.resolved_at is not None],
            scan_seconds=scan.seconds,
        )
        workflow.set_current_details(details_markdown(scope, result))
        return result

    async def _judge(
        self,
        goals: list[GoalObservation],
        assessment: Assessment,
        memory: WatchdogMemory,
        now: datetime,
        input: WatchdogInput,
        recalled: RecallResult,
    ) -> tuple[list[Verdict], str | None]:
        """One model call per ambiguous goal and episode, within the watchdog's own budget;
        each verdict adds its finding (replacing 'healthy') and its message to `assessment`."""
        budget_rules = rules.effective_rules(input.rules, recalled.rules)
        made: list[Verdict] = []
        note = None
        spent = memory.model_copy(deep=True)
        for goal in sorted(goals, key=lambda g: g.goal_id):
            why = rules.ambiguity(goal, assessment.findings, now)
            if why is None:
                # Recent conclusions that share no term with the goal's text: the model is asked too.
                why = rules.off_goal(goal, assessment.findings)
            if why is None:
                continue
            episode = rules.judge_episode(goal)
            verdict = memory.verdicts.get(f"{goal.goal_id}/{episode}")
            if verdict is None:
                note = rules.judge_budget_left(spent, budget_rules, now)
                if note is not None:
                    continue  # rules only; the report says why
                goal_rules = rules.effective_rules(input.rules, recalled.rules, goal.goal_id)
                try:
                    reply = await workflow.execute_activity(
                        WatchdogActivities.JUDGE,
                        JudgeInput(
                            goal_id=goal.goal_id, profile=goal_rules.judge_profile, prompt=rules.judge_prompt(goal, why)
                        ),
                        result_type=JudgeResult,
                        start_to_close_timeout=timedelta(minutes=2),
                        retry_policy=RetryPolicy(maximum_attempts=2),
                        summary=f"judge {goal.goal_id} · {episode}",
                    )
                except ActivityError as err:
                    reply = JudgeResult(raw=f"(no reply: {err.cause or err})")
                verdict = rules.parse_verdict(goal.goal_id, episode, reply.raw, reply.tokens, now)
                made.append(verdict)
                rules.remember_verdicts(spent, [verdict], None, now)
            finding, item = rules.verdict_step(goal.goal_id, verdict, memory)
            assessment.findings = [
                f for f in assessment.findings if not (f.goal_id == goal.goal_id and f.kind == "healthy")
            ] + [finding]
            if item is not None:
                assessment.interventions.append(item)
        return made, note

    @workflow.query(name=WATCHDOG_STATE_QUERY)
    def state(self) -> WatchdogRunState:
        return self._state


def record_scan(
    meter: metrics.PerdureMeter, goals: list[GoalObservation], findings: list[Finding], now: datetime
) -> None:
    """The scan as metrics (workflows/shared/metrics.py): its findings, and gauges of the open goals
    by phase and of the questions waiting for people. Every phase is set, to 0 when no goal
    is in it, so a phase the goals have left does not keep its last count."""
    for finding in findings:
        meter.add(metrics.WATCHDOG_FINDINGS, 1, finding=finding.kind)
    phases = [goal.phase or "unknown" for goal in goals]  # unknown: the goal did not answer its query
    for phase in (*get_args(Phase), "unknown"):
        meter.set(metrics.GOALS_OPEN, phases.count(phase), phase=phase)
    meter.set(metrics.QUESTIONS_WAITING, sum(len(goal.open_questions) for goal in goals))
    asked = [goal.oldest_question_at for goal in goals if goal.open_questions and goal.oldest_question_at]
    meter.set(metrics.OLDEST_QUESTION_AGE, max(((now - at).total_seconds() for at in asked), default=0.0))


def details_markdown(scope: str, result: WatchdogResult) -> str:
    """The run's summary as the Temporal UI shows it (current details)."""
    counts = " · ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in result.counts.items()) or "no goals"
    lines = [
        f"**watchdog** · {scope} · {result.goals} open goal(s) · scan {result.scan_seconds:.2f} s",
        counts,
    ]
    if result.sent:
        lines.append("sent: " + ", ".join(result.sent))
    if result.failed:
        lines.append("not sent: " + "; ".join(result.failed))
    for incident in result.open_incidents[:DETAIL_LINES]:
        lines.append(f"**incident** {incident.id}: {incident.detail}")
    for incident in result.resolved_incidents[:DETAIL_LINES]:
        lines.append(f"resolved {incident.id}: {incident.resolution}")
    for finding in [f for f in result.findings if f.kind not in INFRASTRUCTURE_KINDS][:DETAIL_LINES]:
        lines.append(f"{finding.goal_id}: **{finding.kind.replace('_', ' ')}**, {finding.detail}")
    return "\n\n".join(lines)
