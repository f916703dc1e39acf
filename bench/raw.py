"""The raw Temporal baseline: plain workflows that call perdure's own tool activity
(`perdure.tool.run`, the `run_tool` the orchestrator worker registers) with the
same `ToolInput` a goal sends, and nothing else: no graph, no state, no ledger.
The raw agent loop does the same with perdure's agent-turn activity
(`perdure.model.agent_turn`) and the tool calls each turn asks for, as local
activities, with the options a goal gives them.

Every perdure figure is judged against one of these, measured in the same run on
the same server. They must stay this plain; a baseline that grows features stops
being the floor.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy

# The contracts are pure pydantic; passing them through avoids re-importing
# pydantic in the sandbox for every run, exactly as workflows/goal/goal_workflow.py does.
with workflow.unsafe.imports_passed_through():
    from perdure.workflows.goal.contracts.goal_contracts import (
        Activities,
        AgentTurnInput,
        AgentTurnResult,
        ModelContext,
    )
    from perdure.workflows.shared.contracts import ToolInput, ToolResult
    from perdure.workflows.shared.retries import MODEL_OPTIONS

RawMode = Literal["sequential", "local", "concurrent"]


class RawToolsInput(BaseModel):
    calls: list[ToolInput]
    mode: RawMode
    start_to_close_s: float = 120
    heartbeat_s: float | None = None
    maximum_attempts: int = 3


class RawToolsResult(BaseModel):
    calls: int
    ok: int


@workflow.defn(name="bench.RawTools")
class RawToolsWorkflow:
    """Runs the calls one after another (as activities or local activities) or all at once."""

    @workflow.run
    async def run(self, input: RawToolsInput) -> RawToolsResult:
        options = dict(
            result_type=ToolResult,
            start_to_close_timeout=timedelta(seconds=input.start_to_close_s),
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=input.maximum_attempts),
        )
        if input.mode == "local":
            results = [await workflow.execute_local_activity(Activities.RUN_TOOL, c, **options) for c in input.calls]
        else:
            if input.heartbeat_s:
                options["heartbeat_timeout"] = timedelta(seconds=input.heartbeat_s)
            if input.mode == "sequential":
                results = [await workflow.execute_activity(Activities.RUN_TOOL, c, **options) for c in input.calls]
            else:
                results = await asyncio.gather(
                    *(workflow.execute_activity(Activities.RUN_TOOL, c, **options) for c in input.calls)
                )
        return RawToolsResult(calls=len(results), ok=sum(1 for r in results if r.ok))


class RawAgentInput(BaseModel):
    profile: str
    step: str
    prompt: str
    tools: list[str]
    max_turns: int
    workspace: str
    tool_start_to_close_s: float = 120


@workflow.defn(name="bench.RawAgent")
class RawAgentWorkflow:
    """Turns until the model answers: each an agent-turn activity, then its tool calls one
    after another as local activities, their results sent with the next turn. Returns the
    number of turns."""

    @workflow.run
    async def run(self, input: RawAgentInput) -> int:
        context = ModelContext(profile=input.profile, goal=f"bench: {input.step}")
        transcript, results = None, []
        for turn in range(1, input.max_turns + 1):
            payload = AgentTurnInput(
                context=context,
                step=input.step,
                prompt=input.prompt,
                tools=input.tools,
                turn=turn,
                max_turns=input.max_turns,
                transcript=transcript,
                tool_results=results,
            )
            reply = await workflow.execute_activity(
                Activities.AGENT_TURN, payload, result_type=AgentTurnResult, **MODEL_OPTIONS
            )
            if reply.final is not None:
                return turn
            transcript, results = reply.transcript, []
            for i, call in enumerate(reply.tool_calls):
                tool_input = ToolInput(
                    goal_id=workflow.info().workflow_id,
                    node_key=f"raw:{turn}.{i}",
                    tool=call.tool,
                    workspace=input.workspace,
                    args_ref=call.args,
                    call_id=call.call_id,
                )
                result = await workflow.execute_local_activity(
                    Activities.RUN_TOOL,
                    tool_input,
                    result_type=ToolResult,
                    start_to_close_timeout=timedelta(seconds=input.tool_start_to_close_s),
                )
                results.append(result)
        return input.max_turns


HOLD_ACTIVITY = "bench.hold"


@workflow.defn(name="bench.RawHold")
class RawHoldWorkflow:
    """One local activity that sleeps `hold_s`: its workflow task stays open, and the SDK
    heartbeats it at 80 % of the task timeout (bench/task_timeout.py)."""

    @workflow.run
    async def run(self, hold_s: float) -> None:
        await workflow.execute_local_activity(
            HOLD_ACTIVITY, hold_s, start_to_close_timeout=timedelta(seconds=hold_s + 60)
        )


RAW_WORKFLOWS = [RawToolsWorkflow, RawAgentWorkflow]
