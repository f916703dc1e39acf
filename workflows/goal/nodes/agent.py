"""An agent node: a bounded loop of model turns, each an activity, and the tool
calls each turn asks for, run under the effect rules; the stall ladder judges
every turn (remind, switch tool, ask a person, abandon the path).

Workflow code. One turn's data stays in this room: the turn's result, its tool
calls (consecutive local reads run concurrently), the stall verdict, the notes
for the next turn.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow

from workflows import questions, segments, stall
from workflows.contracts import (
    Activities,
    AgentTurnInput,
    AgentTurnResult,
    ArtifactRef,
    ToolCall,
    ToolInput,
    ToolResult,
)
from workflows.goal.context import NodeFailed, short_key
from workflows.goal.nodes.base import NodeDeps
from workflows.plan import AgentStep
from workflows.state import Node, RejectedPath
from workflows.tool_specs import COMPACTION_TOOL


class AgentNode:
    def __init__(self, deps: NodeDeps) -> None:
        self._ctx = deps.ctx
        self._calls = deps.calls
        self._guard = deps.guard
        self._tools = deps.tools
        self._pause = deps.pause

    async def run(self, step: AgentStep, node: Node) -> tuple[ArtifactRef, str]:
        spec = self._ctx.state.spec
        max_turns = step.max_turns or spec.max_agent_turns
        transcript: ArtifactRef | None = None
        tool_results: list[ToolResult] = []
        notes: list[str] = []
        inputs = self._ctx.inputs(step)
        for turn in range(1, max_turns + 1):
            self._ctx.stop_point(node)
            await self._pause.hold_while_parked(node)
            summary = f"agent turn {turn}/{max_turns} · {step.name} · {short_key(node.key)}"
            context = self._calls.context(summary, node)
            # Turn 1 sees all guidance in its prompt; later turns are told what is new.
            new_guidance = context.guidance[node.guidance_seen :] if turn > 1 else []
            node.guidance_seen = len(context.guidance)
            payload = AgentTurnInput(
                context=context,
                step=step.name,
                prompt=step.prompt,
                inputs=inputs,
                tools=step.tools,
                turn=turn,
                max_turns=max_turns,
                transcript=transcript,
                tool_results=tool_results,
                new_guidance=new_guidance,
                notes=notes,
                compact_after_chars=spec.compact_context_after_chars,
            )
            result = await self._calls.run(Activities.AGENT_TURN, payload, AgentTurnResult, summary, node)
            node.turns = turn
            if result.compaction is not None:
                node.compactions.append(result.compaction)
            transcript = result.transcript
            if result.final is not None:
                return result.final, result.preview
            # read_artifact is offered on exactly the turns whose prompt was compacted.
            compacted = result.compaction is not None and COMPACTION_TOOL not in step.tools
            offered = [*step.tools, COMPACTION_TOOL] if compacted else step.tools
            tool_results = await self._tool_calls(step, node, turn, result.tool_calls, offered)
            notes = await self._judge_stall(step, node, result, tool_results)
        raise NodeFailed(f"the agent used all {max_turns} turns without a final answer")

    async def _tool_calls(
        self, step: AgentStep, node: Node, turn: int, calls: list[ToolCall], offered: list[str]
    ) -> list[ToolResult]:
        """The tool calls of one model turn, in the model's order; consecutive calls that
        run as local activities (independent reads) run concurrently. `offered`: the
        tools this turn's model saw (the step's, plus read_artifact after a compaction)."""
        if not self._tools.segments_enabled():
            return [await self._tool_call(step, node, turn, i, c, offered) for i, c in enumerate(calls)]
        local = [c.tool in offered and self._tools.placement(c.tool).local for c in calls]
        results: list[ToolResult | None] = [None] * len(calls)
        for group in segments.batches(local):
            done = await asyncio.gather(*(self._tool_call(step, node, turn, i, calls[i], offered) for i in group))
            for index, tool_result in zip(group, done, strict=True):
                results[index] = tool_result
        return [r for r in results if r is not None]

    async def _tool_call(
        self, step: AgentStep, node: Node, turn: int, index: int, call: ToolCall, offered: list[str]
    ) -> ToolResult:
        if call.tool not in offered:
            return ToolResult(
                call_id=call.call_id,
                tool=call.tool,
                ok=False,
                error=f"tool '{call.tool}' is not available in this step; available: {', '.join(offered) or 'none'}",
            )
        return await self._guard.call(
            ToolInput(
                goal_id=self._ctx.goal_id,
                node_key=f"{node.key}#turn{turn}.{index}",
                tool=call.tool,
                workspace=self._ctx.state.spec.workspace,
                args_ref=call.args,
                inputs=self._ctx.inputs(step),
                call_id=call.call_id,
            ),
            summary=f"tool {call.tool} · {step.name} turn {turn} · {short_key(node.key)}",
            node=node,
            what=f"{call.tool} {call.preview}",
            why=f"the agent in step '{step.name}' asked for it (turn {turn}): {step.prompt[:200]}",
        )

    async def _judge_stall(
        self, step: AgentStep, node: Node, turn: AgentTurnResult, results: list[ToolResult]
    ) -> list[str]:
        """Feed the stall ladder one step; return notes for the model's next turn."""
        state = self._ctx.state
        threshold = state.spec.stall_threshold
        outputs = [r.preview if r.ok else f"error: {r.error}" for r in results] or [turn.preview]
        calls = [stall.describe_call(c.tool, c.preview) for c in turn.tool_calls]
        node.stall, action = stall.observe_step(node.stall, outputs, threshold=threshold, calls=calls)
        if action is None:
            return []
        self._ctx.log_gate(f"{step.name}: stalled, {action.kind.replace('_', ' ')} ({action.reason})")
        if action.kind == "remind":
            return [stall.remind_message(action.tried, threshold)]
        if action.kind == "switch_tool":
            return [stall.switch_tool_message(action.tried, step.tools)]
        if action.kind == "ask_human":
            message = stall.ask_human_message(step.name, action.tried)
            question = questions.stalled(state, workflow.now(), step.name, message)
            if await self._ctx.ask(node, question) == "continue":
                return [f"A person reviewed the stall and said to continue. {question.answer_text or ''}".strip()]
        state.rejected_paths.append(
            RejectedPath(
                node=step.name,
                why=f"abandoned after repeated steps without new information: {'; '.join(action.tried[-3:])}",
                output_preview=node.preview,
                at=workflow.now(),
            )
        )
        raise NodeFailed(f"abandoned: {action.reason}")
