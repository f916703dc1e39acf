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

from perdure.activities.tools.catalogue import COMPACTION_TOOL
from perdure.workflows.goal.context import NodeFailed, short_key
from perdure.workflows.goal.contracts.decision_contracts import MODEL
from perdure.workflows.goal.contracts.goal_contracts import Activities, AgentTurnInput, AgentTurnResult, ToolCall
from perdure.workflows.goal.contracts.plan import AgentStep
from perdure.workflows.goal.contracts.state import AgentProgress, Node, RejectedPath
from perdure.workflows.goal.goal_memory import GoalMemoryRoom
from perdure.workflows.goal.nodes.base import NodeDeps
from perdure.workflows.goal.rules import questions, segments, stall
from perdure.workflows.shared import metrics
from perdure.workflows.shared.contracts import ArtifactRef, ToolInput, ToolResult


class AgentNode:
    def __init__(self, deps: NodeDeps) -> None:
        self._ctx = deps.ctx
        self._calls = deps.calls
        self._guard = deps.guard
        self._tools = deps.tools
        self._pause = deps.pause
        self._memory = GoalMemoryRoom(deps.ctx)

    async def run(self, step: AgentStep, node: Node) -> tuple[ArtifactRef, str]:
        """The loop, from where `node.agent` says it stands: a node that stopped to wait
        for a person (or a park) goes on with the same turn, its model call not repeated
        and the tool calls that already returned not run again."""
        spec = self._ctx.state.spec
        max_turns = step.max_turns or spec.max_agent_turns
        progress = node.agent = node.agent or AgentProgress()
        inputs = self._ctx.inputs(step)
        while True:
            if progress.pending is None:
                if progress.turn >= max_turns:
                    raise NodeFailed(f"the agent used all {max_turns} turns without a final answer")
                turn = progress.turn + 1
                self._ctx.stop_point(node)
                await self._pause.hold_while_parked(node)
                summary = f"agent turn {turn}/{max_turns} · {step.name} · {short_key(node.key)}"
                # Turn 1's prompt carries the memories the scheduler attached; any turn is told
                # of memories this goal used that were revoked since.
                untold = await self._memory.untold_revocations(node)
                context = self._calls.context(summary, node)
                # Turn 1 sees all guidance in its prompt; later turns are told what is new.
                new_guidance = context.guidance[node.guidance_seen :] if turn > 1 else []
                node.guidance_seen = len(context.guidance)
                payload = AgentTurnInput(
                    context=context,
                    step=step.name,
                    prompt=self._memory.prompt_for(step.prompt, node, untold if turn == 1 else []),
                    inputs=inputs,
                    tools=step.tools,
                    turn=turn,
                    max_turns=max_turns,
                    transcript=progress.transcript,
                    tool_results=progress.tool_results,
                    new_guidance=new_guidance,
                    notes=progress.notes + (self._memory.revocation_note(untold) if turn > 1 else []),
                    compact_after_chars=spec.compact_context_after_chars,
                    mcp_tools=self._ctx.mcp_tools(step.tools),
                    user_tools=self._ctx.user_tools(step.tools),
                )
                result = await self._calls.run(Activities.AGENT_TURN, payload, AgentTurnResult, summary, node)
                node.turns = progress.turn = turn
                if result.compaction is not None:
                    node.compactions.append(result.compaction)
                    self._memory.compacted(node)
                progress.transcript = result.transcript
                if result.final is not None:
                    node.statements = result.statements  # what its whole answer states, for the evidence log
                    return result.final, result.preview
                progress.pending, progress.done = result, {}
                if result.reason:
                    # The model's stated reason for its choice of tools, once per turn.
                    called = ", ".join(dict.fromkeys(c.tool for c in result.tool_calls))
                    text = f"{step.name}, turn {turn}: calls {called}: {result.reason}"
                    self._ctx.decide("reason", text, MODEL, [step.name])
            result = progress.pending
            # read_artifact is offered on exactly the turns whose prompt was compacted.
            compacted = result.compaction is not None and COMPACTION_TOOL not in step.tools
            offered = [*step.tools, COMPACTION_TOOL] if compacted else step.tools
            tool_results = await self._tool_calls(step, node, progress, offered)
            notes = await self._judge_stall(step, node, progress, tool_results)
            progress.pending, progress.done, progress.stall_action, progress.stall_question = None, {}, None, None
            progress.tool_results, progress.notes = tool_results, notes

    async def _tool_calls(
        self, step: AgentStep, node: Node, progress: AgentProgress, offered: list[str]
    ) -> list[ToolResult]:
        """The pending turn's tool calls, in the model's order, each result kept in
        `progress` as it returns; consecutive calls that run as local activities
        (independent reads) run concurrently. `offered`: the tools this turn's model saw
        (the step's, plus read_artifact after a compaction)."""
        assert progress.pending is not None
        calls, turn = progress.pending.tool_calls, progress.turn

        async def one(index: int) -> ToolResult:
            if index not in progress.done:
                progress.done[index] = await self._tool_call(step, node, turn, index, calls[index], offered)
            return progress.done[index]

        # A device's calls are not batched: one that waits for its device ends the node's
        # task, and a sibling still running under gather would be left without one.
        # Nor is a write (a model's keyed write keeps its activity, segments.intent_needed):
        # it keeps its place between them.
        local = [c.tool in offered and self._tools.placement(c.tool, node).in_segment for c in calls]
        for group in segments.batches(local):
            await asyncio.gather(*(one(i) for i in group))
        return [progress.done[i] for i in range(len(calls))]

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
        self, step: AgentStep, node: Node, progress: AgentProgress, results: list[ToolResult]
    ) -> list[str]:
        """Feed the stall ladder the pending turn; return notes for the model's next turn.
        A turn that asked a person (and was left to wait) is judged once: its rung and
        question are in `progress`."""
        state = self._ctx.state
        threshold = state.spec.stall_threshold
        action, question = progress.stall_action, None
        if action is not None and progress.stall_question is not None:
            question = next(q for q in state.questions if q.id == progress.stall_question)
        if action is None:
            turn = progress.pending
            assert turn is not None
            outputs = [r.preview if r.ok else f"error: {r.error}" for r in results] or [turn.preview]
            calls = [stall.describe_call(c.tool, c.preview) for c in turn.tool_calls]
            node.stall, action = stall.observe_step(node.stall, outputs, threshold=threshold, calls=calls)
            if action is None:
                return []
            self._ctx.log_gate(
                f"{step.name}: stalled, {action.kind.replace('_', ' ')} ({action.reason})", about=[step.name]
            )
            self._ctx.metrics.add(metrics.STALL_RUNGS, 1, rung=action.kind)
            if action.kind == "remind":
                return [stall.remind_message(action.tried, threshold)]
            if action.kind == "switch_tool":
                return [stall.switch_tool_message(action.tried, step.tools)]
            if action.kind == "ask_human":
                message = stall.ask_human_message(step.name, action.tried)
                question = questions.stalled(state, workflow.now(), step.name, message)
                progress.stall_action, progress.stall_question = action, question.id
        if question is not None:
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
