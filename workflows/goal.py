"""GoalWorkflow: the deterministic body of one goal.

It plans (through a model activity, or from a declarative plan file), turns the
plan into a task graph, dispatches every ready node as activities (independent
nodes run concurrently), records outputs by artifact reference, and always
finishes with a report node. The workflow only decides: every model call, tool
call and file access is an activity called by its stable name, and the state it
keeps (one `GoalState`) holds digests and references, never transcripts.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

# Pydantic and our contracts are pure; passing them through keeps the sandbox
# from re-importing pydantic's machinery for every workflow run.
with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from workflows import graph
    from workflows import search_attributes as sa
    from workflows.contracts import (
        GOAL_WORKFLOW,
        Activities,
        AgentTurnInput,
        AgentTurnResult,
        ArtifactRef,
        GenerateInput,
        GenerateResult,
        GoalResult,
        ModelContext,
        NodeView,
        PlanInput,
        PlanResult,
        ProgressSnapshot,
        Queries,
        ReportInput,
        ReportResult,
        StepOutcome,
        ToolInput,
        ToolResult,
        Usage,
    )
    from workflows.plan import AgentStep, LlmStep, PlanStep, ToolStep, check_plan
    from workflows.state import GoalInput, GoalState, KindStats, Node, PlanVersion

MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=6,
    non_retryable_error_types=["ModelRequestRejected", "UnknownModelProfile"],
)
TOOL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_attempts=3,
    non_retryable_error_types=["WorkspaceMissing"],
)
REPORT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=10)
MODEL_TIMEOUT = timedelta(minutes=5)
TOOL_TIMEOUT = timedelta(minutes=2)
# Keeps the per-kind ledger bounded however long the goal runs.
LEDGER_SAMPLES = 200


class NodeFailed(Exception):
    """A node ended without an output; the message is shown to the user."""


class GoalFailed(Exception):
    """The goal cannot continue (no valid plan, planner unavailable)."""


@workflow.defn(name=GOAL_WORKFLOW, failure_exception_types=[ValidationError])
class GoalWorkflow:
    @workflow.init
    def __init__(self, input: GoalInput) -> None:
        self._state = input.state or GoalState(spec=input.spec)
        # Bumped whenever a node settles; the dispatch loop waits on it.
        self._settled = 0
        self._published: tuple[str, int] | None = None

    @workflow.run
    async def run(self, input: GoalInput) -> GoalResult:
        state = self._state
        try:
            if state.plan is None:
                await self._make_plan()
            self._materialise_nodes()
            state.phase = "running"
            self._publish()
            await self._run_graph()
        except GoalFailed as err:
            state.failure = str(err)
        result = await self._report()
        if state.failure:
            raise ApplicationError(
                state.failure,
                result.model_dump(mode="json"),
                type="GoalFailed",
                non_retryable=True,
            )
        return result

    @workflow.query(name=Queries.PROGRESS)
    def progress(self) -> ProgressSnapshot:
        state = self._state
        nodes = list(state.nodes.values())
        counts: dict[str, int] = {}
        for node in nodes:
            counts[node.status] = counts.get(node.status, 0) + 1
        return ProgressSnapshot(
            goal_id=workflow.info().workflow_id,
            phase=state.phase,
            plan_version=len(state.plan_versions),
            counts=counts,
            running=[n.name for n in nodes if n.status == "running"],
            percent_done=self._percent_done(),
            tokens=state.ledger.tokens,
            cost_usd=state.ledger.cost_usd,
            model_calls=state.ledger.model_calls,
            tool_calls=state.ledger.tool_calls,
            nodes=[
                NodeView(name=n.name, kind=n.kind, status=n.status, key=n.key, preview=n.preview, error=n.error)
                for n in nodes
            ],
            results={n.name: n.output.digest for n in nodes if n.output is not None},
            report=state.result.report if state.result else None,
            failure=state.failure,
        )

    # --- planning -----------------------------------------------------------

    def _model_context(self) -> ModelContext:
        spec = self._state.spec
        return ModelContext(profile=spec.model_profile, goal=spec.goal, constraints=spec.constraints)

    async def _make_plan(self) -> None:
        state, spec = self._state, self._state.spec
        if spec.plan is not None:
            problems = check_plan(spec.plan, spec.allowed_tools)
            if problems:
                raise GoalFailed("the plan file cannot run: " + "; ".join(problems))
            state.plan_versions.append(
                PlanVersion(version=1, plan=spec.plan, reason="declarative plan from the user", source="plan-file")
            )
            return
        rejected: ArtifactRef | None = None
        rejection: str | None = None
        attempts = spec.max_plan_repairs + 1
        for attempt in range(1, attempts + 1):
            try:
                result = await workflow.execute_activity(
                    Activities.PLAN,
                    PlanInput(
                        context=self._model_context(),
                        allowed_tools=spec.allowed_tools,
                        attempt=attempt,
                        rejected=rejected,
                        rejection=rejection,
                    ),
                    result_type=PlanResult,
                    start_to_close_timeout=MODEL_TIMEOUT,
                    retry_policy=MODEL_RETRY,
                    summary="plan" if attempt == 1 else f"plan · repair {attempt - 1} of {spec.max_plan_repairs}",
                )
            except ActivityError as err:
                raise GoalFailed(f"the planner call failed: {failure_message(err)}") from err
            self._charge_model_call(result.usage)
            if result.plan is not None:
                reason = "planned from the goal" if attempt == 1 else f"planned after {attempt - 1} repair(s)"
                state.plan_versions.append(
                    PlanVersion(version=len(state.plan_versions) + 1, plan=result.plan, reason=reason, source="planner")
                )
                return
            rejected, rejection = result.raw, result.error
            workflow.logger.info("plan rejected", extra={"attempt": attempt, "reason": rejection})
        raise GoalFailed(f"the planner gave no valid plan in {attempts} attempt(s); last problem: {rejection}")

    def _materialise_nodes(self) -> None:
        plan = self._state.plan
        assert plan is not None
        for step in plan.steps:
            if step.name not in self._state.nodes:
                self._state.nodes[step.name] = Node(name=step.name, kind=step.kind, needs=list(step.needs))

    # --- execution ------------------------------------------------------------

    async def _run_graph(self) -> None:
        state = self._state
        plan = state.plan
        assert plan is not None
        while True:
            for name in graph.ready_steps(plan, state.nodes):
                self._dispatch(plan.step(name))
            if not any(n.status == "running" for n in state.nodes.values()):
                return
            seen = self._settled
            await workflow.wait_condition(lambda seen=seen: self._settled != seen)

    def _dispatch(self, step: PlanStep) -> None:
        state = self._state
        node = state.nodes[step.name]
        deps = {}
        for dep in step.needs:
            output = state.nodes[dep].output
            assert output is not None  # ready_steps only yields steps whose deps succeeded
            deps[dep] = output.digest
        node.key = graph.node_key(step, deps)
        node.started_at = workflow.now()
        cached = state.outputs_by_key.get(node.key)
        if cached is not None:
            # Same kind, input and dependency outputs as finished work: reuse it.
            node.status, node.output, node.reused, node.finished_at = "succeeded", cached, True, node.started_at
            return
        node.status = "running"
        if any(
            n.key == node.key and n.status == "running" and not n.reused for n in state.nodes.values() if n is not node
        ):
            # The same work is in flight: share its outcome instead of paying twice.
            node.reused = True
            return
        asyncio.create_task(self._run_node(step, node))

    async def _run_node(self, step: PlanStep, node: Node) -> None:
        try:
            if isinstance(step, ToolStep):
                output, preview = await self._run_tool_step(step, node)
            elif isinstance(step, LlmStep):
                output, preview = await self._run_llm_step(step, node)
            else:
                output, preview = await self._run_agent_step(step, node)
            assert node.key is not None
            self._state.outputs_by_key[node.key] = output
            for settled in self._sharing(node):
                settled.status, settled.output, settled.preview = "succeeded", output, preview
        except (ActivityError, NodeFailed) as err:
            error = failure_message(err) if isinstance(err, ActivityError) else str(err)
            for settled in self._sharing(node):
                settled.status, settled.error = "failed", error
                self._abandon_downstream(settled.name)
        finally:
            node.finished_at = workflow.now()
            self._record_kind_stats(node)
            self._settled += 1
            self._publish()

    def _sharing(self, node: Node) -> list[Node]:
        """The node plus any node that waited on the same in-flight key."""
        followers = [
            n for n in self._state.nodes.values() if n is not node and n.key == node.key and n.status == "running"
        ]
        for follower in followers:
            follower.finished_at = workflow.now()
        return [node, *followers]

    def _abandon_downstream(self, failed: str) -> None:
        for name in graph.downstream(self._plan(), failed):
            blocked = self._state.nodes[name]
            if blocked.status == "pending":
                blocked.status, blocked.error = "abandoned", f"needs '{failed}', which failed"

    def _inputs(self, step: PlanStep) -> dict[str, ArtifactRef]:
        refs = {}
        for dep in step.needs:
            output = self._state.nodes[dep].output
            assert output is not None
            refs[dep] = output
        return refs

    async def _run_tool_step(self, step: ToolStep, node: Node) -> tuple[ArtifactRef, str]:
        result = await self._call_tool(
            ToolInput(
                goal_id=workflow.info().workflow_id,
                node_key=node.key or "",
                tool=step.tool,
                workspace=self._state.spec.workspace,
                args=step.args,
                inputs=self._inputs(step),
            ),
            summary=f"tool {step.tool} · {step.name} · {short_key(node.key)}",
        )
        if not result.ok or result.output is None:
            raise NodeFailed(f"{step.tool} failed: {result.error}")
        return result.output, result.preview

    async def _run_llm_step(self, step: LlmStep, node: Node) -> tuple[ArtifactRef, str]:
        result = await workflow.execute_activity(
            Activities.GENERATE,
            GenerateInput(context=self._model_context(), step=step.name, prompt=step.prompt, inputs=self._inputs(step)),
            result_type=GenerateResult,
            start_to_close_timeout=MODEL_TIMEOUT,
            retry_policy=MODEL_RETRY,
            summary=f"llm · {step.name} · {short_key(node.key)}",
        )
        self._charge_model_call(result.usage, node)
        return result.output, result.preview

    async def _run_agent_step(self, step: AgentStep, node: Node) -> tuple[ArtifactRef, str]:
        max_turns = step.max_turns or self._state.spec.max_agent_turns
        transcript: ArtifactRef | None = None
        tool_results: list[ToolResult] = []
        inputs = self._inputs(step)
        for turn in range(1, max_turns + 1):
            result = await workflow.execute_activity(
                Activities.AGENT_TURN,
                AgentTurnInput(
                    context=self._model_context(),
                    step=step.name,
                    prompt=step.prompt,
                    inputs=inputs,
                    tools=step.tools,
                    turn=turn,
                    max_turns=max_turns,
                    transcript=transcript,
                    tool_results=tool_results,
                ),
                result_type=AgentTurnResult,
                start_to_close_timeout=MODEL_TIMEOUT,
                retry_policy=MODEL_RETRY,
                summary=f"agent turn {turn}/{max_turns} · {step.name} · {short_key(node.key)}",
            )
            self._charge_model_call(result.usage, node)
            node.turns = turn
            transcript = result.transcript
            if result.final is not None:
                return result.final, result.preview
            tool_results = []
            for index, call in enumerate(result.tool_calls):
                if call.tool not in step.tools:
                    tool_results.append(
                        ToolResult(
                            call_id=call.call_id,
                            tool=call.tool,
                            ok=False,
                            error=f"tool '{call.tool}' is not available in this step; "
                            f"available: {', '.join(step.tools) or 'none'}",
                        )
                    )
                    continue
                tool_results.append(
                    await self._call_tool(
                        ToolInput(
                            goal_id=workflow.info().workflow_id,
                            node_key=f"{node.key}#turn{turn}.{index}",
                            tool=call.tool,
                            workspace=self._state.spec.workspace,
                            args_ref=call.args,
                            inputs=inputs,
                            call_id=call.call_id,
                        ),
                        summary=f"tool {call.tool} · {step.name} turn {turn} · {short_key(node.key)}",
                    )
                )
        raise NodeFailed(f"the agent used all {max_turns} turns without a final answer")

    async def _call_tool(self, tool_input: ToolInput, summary: str) -> ToolResult:
        result = await workflow.execute_activity(
            Activities.RUN_TOOL,
            tool_input,
            result_type=ToolResult,
            start_to_close_timeout=tool_timeout(tool_input),
            retry_policy=TOOL_RETRY,
            summary=summary,
        )
        self._state.ledger.tool_calls += 1
        return result

    # --- ledger, report, visibility ---------------------------------------------

    def _charge_model_call(self, usage: Usage, node: Node | None = None) -> None:
        ledger = self._state.ledger
        ledger.model_calls += 1
        ledger.input_tokens += usage.input_tokens
        ledger.output_tokens += usage.output_tokens
        ledger.cost_usd += usage.cost_usd
        if node is not None:
            node.tokens += usage.tokens
            node.cost_usd += usage.cost_usd

    def _record_kind_stats(self, node: Node) -> None:
        stats = self._state.ledger.by_kind.setdefault(node.kind, KindStats())
        stats.runs += 1
        if node.started_at and node.finished_at:
            stats.seconds = (stats.seconds + [(node.finished_at - node.started_at).total_seconds()])[-LEDGER_SAMPLES:]
        stats.costs_usd = (stats.costs_usd + [node.cost_usd])[-LEDGER_SAMPLES:]
        stats.tokens = (stats.tokens + [node.tokens])[-LEDGER_SAMPLES:]

    async def _report(self) -> GoalResult:
        state = self._state
        state.phase = "reporting"
        self._publish()
        nodes = [state.nodes[name] for name in graph.topological_order(state.plan)] if state.plan else []
        if state.failure:
            outcome = "failed"
        elif nodes and all(n.status == "succeeded" for n in nodes):
            outcome = "succeeded"
        else:
            outcome = "partial"
        report = await workflow.execute_activity(
            Activities.WRITE_REPORT,
            ReportInput(
                goal_id=workflow.info().workflow_id,
                goal=state.spec.goal,
                outcome=outcome,
                failure=state.failure,
                steps=[
                    StepOutcome(
                        name=n.name,
                        kind=n.kind,
                        status=n.status,
                        output=n.output,
                        error=n.error,
                        tokens=n.tokens,
                        cost_usd=n.cost_usd,
                    )
                    for n in nodes
                ],
                tokens=state.ledger.tokens,
                cost_usd=state.ledger.cost_usd,
            ),
            result_type=ReportResult,
            start_to_close_timeout=timedelta(minutes=1),
            retry_policy=REPORT_RETRY,
            summary=f"report · {outcome}",
        )
        state.result = GoalResult(
            outcome=outcome,
            failure=state.failure,
            report=report.report,
            excerpt=report.excerpt,
            outputs={n.name: n.output for n in nodes if n.output is not None},
            failed_steps=[n.name for n in nodes if n.status in ("failed", "abandoned")],
            tokens=state.ledger.tokens,
            cost_usd=state.ledger.cost_usd,
        )
        state.phase = "failed" if state.failure else "finished"
        self._publish()
        return state.result

    def _plan(self):
        plan = self._state.plan
        assert plan is not None
        return plan

    def _percent_done(self) -> int:
        state = self._state
        if state.phase in ("finished", "failed"):
            return 100
        if not state.nodes:
            return 0
        settled = sum(1 for n in state.nodes.values() if n.status in graph.TERMINAL)
        return int(100 * settled / len(state.nodes))

    def _publish(self) -> None:
        """Mirror phase and progress to search attributes and the UI's details.

        Search-attribute upserts are history events, so they are written only
        when the phase changes or progress crosses a ten-percent step.
        """
        state = self._state
        percent = self._percent_done()
        workflow.set_current_details(self._details_markdown(percent))
        marker = (state.phase, percent // 10)
        if marker == self._published:
            return
        self._published = marker
        workflow.upsert_search_attributes(
            [
                sa.GOAL_STATUS.value_set(state.phase),
                sa.PERCENT_DONE.value_set(percent),
                sa.COST_USD.value_set(round(state.ledger.cost_usd, 6)),
                sa.LAST_PROGRESS_AT.value_set(workflow.now()),
            ]
        )

    def _details_markdown(self, percent: int) -> str:
        state = self._state
        done = sum(1 for n in state.nodes.values() if n.status == "succeeded")
        running = [n.name for n in state.nodes.values() if n.status == "running"]
        lines = [
            f"**{state.phase}** · {percent}% · {done}/{len(state.nodes)} nodes succeeded",
            f"running: {', '.join(running) or '—'}",
            f"tokens {state.ledger.tokens} · ${state.ledger.cost_usd:.4f} · "
            f"{state.ledger.model_calls} model calls · {state.ledger.tool_calls} tool calls",
        ]
        if state.failure:
            lines.append(f"failure: {state.failure}")
        return "\n\n".join(lines)


def tool_timeout(tool_input: ToolInput) -> timedelta:
    """run_command carries its own timeout; leave room for start-up and output capture."""
    if tool_input.tool == "run_command" and tool_input.args:
        return timedelta(seconds=float(tool_input.args.get("timeout_s", 60)) + 30)
    if tool_input.tool == "run_command":
        # Model-written arguments are not visible here; allow the tool's maximum.
        return timedelta(seconds=600 + 30)
    return TOOL_TIMEOUT


def failure_message(err: ActivityError) -> str:
    """The innermost application message of an activity failure, with its type."""
    cause = err.cause
    while cause is not None and not isinstance(cause, ApplicationError) and cause.cause is not None:
        cause = cause.cause
    if isinstance(cause, ApplicationError):
        return f"{cause.message} ({cause.type})" if cause.type else cause.message
    return str(cause or err)


def short_key(key: str | None) -> str:
    return (key or "").removeprefix("node:")[:12]
