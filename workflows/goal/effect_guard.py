"""The effect rules around every tool call: an irreversible tool waits for a person's
confirmation, an outcome that cannot be known becomes a question (never a guess),
an effect that can be undone has its compensation recorded, and an abort with
rollback runs those compensations newest first.

Workflow code. How the call itself runs (local or regular activity, timeouts,
retries, what an exhausted write becomes) is the ToolRunner's (tool_runner.py).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import questions
from workflows.contracts import ToolInput, ToolResult
from workflows.goal.context import GoalContext
from workflows.goal.tool_runner import ToolRunner, failure_message
from workflows.state import CompensationRecord, Node, RejectedPath
from workflows.tool_specs import TOOL_SPECS


class EffectGuard:
    def __init__(self, ctx: GoalContext, tools: ToolRunner) -> None:
        self._ctx = ctx
        self._tools = tools

    async def call(self, tool_input: ToolInput, summary: str, node: Node, what: str, why: str) -> ToolResult:
        """One tool call for `node`; `what` and `why` are shown to a person asked to confirm it."""
        state = self._ctx.state
        spec = TOOL_SPECS.get(tool_input.tool)
        if spec is not None and spec.risk == "irreversible":
            question = questions.confirm_effect(state, workflow.now(), node.name, tool_input.tool, what, why)
            if await self._ctx.ask(node, question) != "approve":
                reason = f"a person refused {tool_input.tool}: {question.answer_text or 'no reason given'}"
                state.rejected_paths.append(
                    RejectedPath(node=node.name, why=reason, output_preview=what, at=workflow.now())
                )
                return ToolResult(
                    call_id=tool_input.call_id, tool=tool_input.tool, risk=spec.risk, ok=False, error=reason
                )
            tool_input = tool_input.model_copy(update={"confirmed": True})
        result = await self._tools.execute(tool_input, summary, node)
        if result.uncertain:
            question = questions.uncertain_effect(
                state, workflow.now(), node.name, tool_input.tool, result.effect_key or "?", result.error or ""
            )
            answer = await self._ctx.ask(node, question, status="uncertain")
            if answer in ("happened", "not_happened"):
                resolved = tool_input.model_copy(update={"resolution": answer})
                result = await self._tools.execute(resolved, f"{summary} · {answer.replace('_', ' ')}", node)
        if result.ok and result.compensation is not None and result.effect_key:
            state.compensations.append(
                CompensationRecord(node=node.name, effect_key=result.effect_key, compensation=result.compensation)
            )
        return result

    async def roll_back(self) -> None:
        """Abort with rollback: undo registered effects newest first, each a keyed tool call."""
        state = self._ctx.state
        for record in reversed(state.compensations):
            if record.status == "done":
                continue
            comp = record.compensation
            try:
                result = await self._tools.execute(
                    ToolInput(
                        goal_id=self._ctx.goal_id,
                        node_key=f"compensate:{record.effect_key}",
                        tool=comp.tool,
                        workspace=state.spec.workspace,
                        args=comp.args,
                        confirmed=True,
                    ),
                    summary=f"compensate · {comp.tool} · {record.node} · {record.effect_key[:15]}",
                )
            except ActivityError as err:
                record.status, record.note = "failed", failure_message(err)
                continue
            record.status = "done" if result.ok else "failed"
            record.note = result.preview if result.ok else result.error
