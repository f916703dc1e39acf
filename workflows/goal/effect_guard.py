"""The effect rules around every tool call: a remote write is prepared before it is
sent (its arguments resolved, its effect key and compensation recorded in the
state), an irreversible tool waits for a person's confirmation of the resolved
arguments, an outcome that cannot be known becomes a question (never a guess), a
write in flight is never abandoned, an effect that already happened is never sent
again, and an abort with rollback undoes every effect that happened or may have. A
paid tool's call the cost budget could not pay is refused first (Spend.tool_call_refused).
A shell command whose run was interrupted is asked about too, unless it is
replay-safe (the activity judges that from its arguments; a plan step's
`replay: safe` travels in them). A command's sandbox keeps the network only when
the goal allows it or the plan step says `network: true` (ToolInput.network; an
agent's calls have only the goal's permission).

Workflow code. How the call itself runs (local or regular activity, timeouts,
retries, what an exhausted write becomes) is the ToolRunner's (tool_runner.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, TimeoutError

from perdure.activities.tools.catalogue import COMMAND_TOOLS
from perdure.workflows.goal.context import GoalContext, NodeStopped, NodeWaiting
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.state import CompensationRecord, EffectRecord, Node, Question, RejectedPath
from perdure.workflows.goal.device_placement import Devices
from perdure.workflows.goal.rules import approvals_ahead, questions
from perdure.workflows.goal.spend import Spend
from perdure.workflows.goal.tool_runner import ToolRunner, failure_message
from perdure.workflows.shared.contracts import PreparedEffect, ToolInput, ToolResult
from perdure.workflows.shared.effects import command_key, prepared_in_workflow
from perdure.workflows.shared.tool_specs import WRITE_RISKS, ToolSpec

COMMAND_TOOL = "run_command"
PREPARE_TIMEOUT = timedelta(seconds=30)
PREPARE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.5), maximum_attempts=3)


class EffectGuard:
    def __init__(self, ctx: GoalContext, tools: ToolRunner, devices: Devices, spend: Spend) -> None:
        self._ctx = ctx
        self._tools = tools
        self._devices = devices
        self._spend = spend

    async def call(self, tool_input: ToolInput, summary: str, node: Node, what: str, why: str) -> ToolResult:
        """One tool call for `node`; `what` and `why` are shown to a person asked to confirm it."""
        spec = self._ctx.tools().get(tool_input.tool)
        if spec is not None and (unpaid := self._unaffordable(tool_input, spec, node)) is not None:
            # First, before a person is asked to approve it or anything is prepared.
            return unpaid
        for entry in self._ctx.mcp_tools([tool_input.tool]):
            # The activity checks and calls it by the catalogue the goal planned with; the
            # description is for models only, and every call's input is kept in history.
            tool_input = tool_input.model_copy(update={"mcp": entry.model_copy(update={"description": ""})})
        device = self._devices.runs_on(node, tool_input.tool)
        if spec is not None and device is not None:
            on_device = await self._for_device(spec, tool_input, node, device, what)
            if isinstance(on_device, ToolResult):
                return on_device
            tool_input = on_device
        if tool_input.tool in COMMAND_TOOLS:
            tool_input = self._with_network(tool_input, node)
        if spec is not None and spec.risk in WRITE_RISKS:
            return await self._write(spec, tool_input, summary, node, why)
        if spec is not None and tool_input.tool == COMMAND_TOOL:
            return await self._command(spec, tool_input, summary, node)
        # Reads and local writes: nothing to prepare, confirm or undo.
        return await self._tools.execute(tool_input, summary, node)

    async def _for_device(
        self, spec: ToolSpec, tool_input: ToolInput, node: Node, device: str, what: str
    ) -> ToolInput | ToolResult:
        """A call for a device: once it is online, its arguments resolved here (the device has
        no artifact store) and approved by a person where its policy says so; then it goes
        through the same rules as any call, and runs there (ToolRunner -> Devices)."""
        presence = await self._devices.ready(node, device)
        root = self._devices.root_for(device, presence)
        if root is None:
            return self._refused(tool_input, spec, self._devices.not_held(device, presence))
        tool_input = tool_input.model_copy(update={"workspace": root})
        resolved = await self._devices.resolve(tool_input)
        if resolved.error is not None or resolved.args is None:
            return self._refused(tool_input, spec, resolved.error or f"{tool_input.tool} has no arguments")
        tool_input = tool_input.model_copy(
            update={"args": resolved.args, "args_ref": None, "inputs": {}, "resolved": True}
        )
        refused = await self._devices.approved(node, device, tool_input, presence)
        if refused is not None:
            return self._person_refused(tool_input, spec, node, refused, f"{what} on device {device}")
        return tool_input

    async def _command(self, spec: ToolSpec, tool_input: ToolInput, summary: str, node: Node) -> ToolResult:
        """A shell command: an attempt after an interrupted one re-runs it only when it is
        replay-safe; otherwise the outcome is uncertain and a person answers: `happened`
        settles the call as done with its output unknown, `not_happened` runs it once more."""
        tool_input = self._with_step_replay(tool_input, node)
        key = command_key(self._ctx.goal_id, tool_input.node_key, node.started_at)
        earlier = self._ctx.question_about(node, key, "uncertain_effect")
        if earlier is not None:
            # The node runs again after its question was answered: act on the answer.
            result = ToolResult(
                call_id=tool_input.call_id, tool=tool_input.tool, risk=spec.risk, ok=False, uncertain=True,
                error=earlier.stuck,
            )  # fmt: skip
        else:
            result = await self._run_command(spec, tool_input, summary, node)
        if not result.uncertain:
            return result

        async def again(resolved: ToolInput, said: str) -> ToolResult:
            return await self._run_command(spec, resolved, said, node)

        return await self._ask_what_happened(result, tool_input, summary, node, key, earlier, again, "run")

    async def _ask_what_happened(
        self,
        result: ToolResult,
        tool_input: ToolInput,
        summary: str,
        node: Node,
        key: str,
        earlier: Question | None,
        again: Callable[[ToolInput, str], Awaitable[ToolResult]],
        verb: str,
    ) -> ToolResult:
        """An outcome nobody can know: a stopping node ends here (uncertain); otherwise a
        person says whether it happened (the card asked before, if the node runs again
        after the answer) and the call is sent `again` with that resolution."""
        if node.name in self._ctx.stopping:
            raise NodeStopped(f"{tool_input.tool} may or may not have {verb}: {result.error}", uncertain=True)
        question = earlier or questions.uncertain_effect(
            self._ctx.state, workflow.now(), node.name, tool_input.tool, key, result.error or ""
        )
        answer = await self._ctx.ask(node, question, status="uncertain")
        if answer in ("happened", "not_happened"):
            resolved = tool_input.model_copy(update={"resolution": answer})
            result = await again(resolved, f"{summary} · {answer.replace('_', ' ')}")
        return result

    async def _run_command(self, spec: ToolSpec, tool_input: ToolInput, summary: str, node: Node) -> ToolResult:
        """The command's activity; its last attempt timing out (a worker lost every time)
        leaves the outcome as unknown as an interrupted attempt does."""
        try:
            return await self._tools.execute(tool_input, summary, node)
        except ActivityError as err:
            if not isinstance(err.cause, TimeoutError):
                raise
            return ToolResult(
                call_id=tool_input.call_id,
                tool=tool_input.tool,
                risk=spec.risk,
                ok=False,
                uncertain=True,
                error=f"{tool_input.tool} did not complete and may or may not have run: {failure_message(err)}",
            )

    def _with_network(self, tool_input: ToolInput, node: Node) -> ToolInput:
        """The goal's `allow_network`, or a plan tool step's `network: true`, for the sandbox.
        Not from the call's arguments: a model must not grant itself the network."""
        allowed = self._ctx.state.spec.allow_network
        if not allowed and node.kind == "tool":
            try:
                allowed = getattr(self._ctx.plan().step(node.name), "network", False)
            except KeyError:
                pass
        return tool_input.model_copy(update={"network": True}) if allowed else tool_input

    def _with_step_replay(self, tool_input: ToolInput, node: Node) -> ToolInput:
        """A plan step's `replay: safe` as the call's own argument, where the activity reads it."""
        if node.kind != "tool" or tool_input.args is None or tool_input.args.get("replay") == "safe":
            return tool_input
        try:
            step = self._ctx.plan().step(node.name)
        except KeyError:
            return tool_input
        if getattr(step, "replay", None) != "safe":
            return tool_input
        return tool_input.model_copy(update={"args": {**tool_input.args, "replay": "safe"}})

    async def _write(self, spec: ToolSpec, tool_input: ToolInput, summary: str, node: Node, why: str) -> ToolResult:
        state = self._ctx.state
        self._ctx.stop_point(node)
        # Prepared here when nothing of it is in the artifact store: the same function the
        # activity runs, so the same key, without a local activity's round trip per write.
        prepared = prepared_in_workflow(tool_input)
        if prepared is None:
            prepared = await workflow.execute_local_activity(
                Activities.PREPARE_EFFECT,
                tool_input,
                result_type=PreparedEffect,
                start_to_close_timeout=PREPARE_TIMEOUT,
                retry_policy=PREPARE_RETRY,
                summary=f"prepare · {summary.removeprefix('tool ')}",
            )
        if prepared.error or prepared.effect_key is None:
            return self._refused(tool_input, spec, prepared.error or f"{tool_input.tool} has no effect to prepare")
        key = prepared.effect_key
        done = state.effects.get(key)
        if done is not None:
            # This very effect happened already (its node was voided and runs again).
            return ToolResult(
                call_id=tool_input.call_id,
                tool=tool_input.tool,
                risk=spec.risk,
                ok=True,
                output=done.output,
                preview=done.preview,
                effect_key=key,
                receipt={"reused": f"already done by step '{done.node}'; not sent again"},
            )
        if spec.risk == "irreversible":
            # The person confirms the arguments as they will be sent, templates resolved.
            what = f"{tool_input.tool} {prepared.arguments[:600]}"
            ahead = await self._approved_ahead(node, tool_input, prepared)
            if isinstance(ahead, Question):
                return self._person_refused(tool_input, spec, node, ahead, what)
            if ahead is None or isinstance(ahead, str):
                changed = f" (approved earlier as {ahead}; now different)" if ahead else ""
                question = self._ctx.question_about(node, key, "confirm_effect") or questions.confirm_effect(
                    state, workflow.now(), node.name, tool_input.tool, what + changed, why, effect_key=key
                )
                if await self._ctx.ask(node, question) != "approve":
                    return self._person_refused(tool_input, spec, node, question, what)
            self._ctx.stop_point(node)
            tool_input = tool_input.model_copy(update={"confirmed": True})
        record = next((r for r in state.compensations if r.effect_key == key), None)
        if record is None and prepared.compensation is not None:
            # In the state before the activity is scheduled: a rollback can undo it even
            # if the goal stops while the write is still on its way.
            record = CompensationRecord(
                node=node.name,
                effect_key=key,
                compensation=prepared.compensation,
                effect="in_flight",
                device=self._devices.runs_on(node, tool_input.tool),
            )
            state.compensations.append(record)
        earlier = self._ctx.question_about(node, key, "uncertain_effect")
        if earlier is not None:
            # An earlier run of this node asked whether the effect happened: act on that answer.
            result = ToolResult(
                call_id=tool_input.call_id, tool=tool_input.tool, risk=spec.risk, ok=False, uncertain=True,
                effect_key=key, error=earlier.stuck,
            )  # fmt: skip
        else:
            result = await self._send(tool_input, summary, node, key, record)
        if not result.uncertain:
            return result

        async def again(resolved: ToolInput, said: str) -> ToolResult:
            return await self._send(resolved, said, node, key, record)

        return await self._ask_what_happened(result, tool_input, summary, node, key, earlier, again, "happened")

    async def _approved_ahead(
        self, node: Node, tool_input: ToolInput, prepared: PreparedEffect
    ) -> bool | str | Question | None:
        """What the approvals-ahead card says for this call: True (approved with exactly these
        arguments), the card (refused there), the arguments an approval was bound to when
        they differ now, or None (ask as usual). An open card listing the step is waited on."""
        found = approvals_ahead.latest(self._ctx.state, node.name)
        if found is None:
            return None
        question, entry = found
        if question.status == "open":
            # Waited on by a step "asked when known" too: the card may refuse it.
            await self._ctx.ask(node, question)
        if entry.decision == "refused":
            return question
        if entry.decision != "approved":
            return None
        return (
            True
            if approvals_ahead.matches(entry, tool_input.tool, tool_input.args, prepared.arguments_digest)
            else entry.arguments
        )

    async def _send(
        self, tool_input: ToolInput, summary: str, node: Node, key: str, record: CompensationRecord | None
    ) -> ToolResult:
        """The write itself, counted in flight while it runs, and what its outcome says."""
        self._ctx.writes_in_flight.setdefault(node.name, []).append(tool_input.tool)
        try:
            result = await self._tools.execute(tool_input, summary, node, undoable=record is not None)
        except NodeWaiting as waiting:
            # Its device went offline before the write was sent, or while it ran (its
            # replay policy lets it run again then): nothing is in flight while it waits.
            if record is not None and record.effect == "in_flight":
                record.effect = "maybe" if waiting.maybe_ran else "not_happened"
            raise
        finally:
            # Whatever ended the call (an answer, a wait, an error), it is no longer in
            # flight: an entry left behind would hold an abort forever.
            self._landed(node, tool_input.tool)
        if result.ok:
            self._ctx.state.effects[key] = EffectRecord(
                node=node.name, tool=tool_input.tool, output=result.output, preview=result.preview
            )
        if record is not None:
            record.effect = "happened" if result.ok else "maybe" if result.uncertain else "not_happened"
        return result

    def _landed(self, node: Node, tool: str) -> None:
        flights = self._ctx.writes_in_flight
        flights[node.name].remove(tool)
        if not flights[node.name]:
            del flights[node.name]
        self._ctx.wake()  # a stopping goal waits for its writes to settle

    def _unaffordable(self, tool_input: ToolInput, spec: ToolSpec, node: Node) -> ToolResult | None:
        """A paid call the cost budget cannot pay, refused before it is confirmed or sent."""
        refused = self._spend.tool_call_refused(tool_input.tool, spec, node)
        if refused is None:
            return None
        self._ctx.log_gate(f"{node.name}: {refused}")
        return self._refused(tool_input, spec, refused)

    def _person_refused(
        self, tool_input: ToolInput, spec: ToolSpec, node: Node, question: Question, what: str
    ) -> ToolResult:
        """A refused confirmation: a rejected path (shown to the model) and a failed call. One
        nobody answered by its deadline says so: an expiry is not a person's refusal."""
        if question.status == "expired":
            reason = f"{tool_input.tool} not run: {question.id} {question.answer_text}"
        else:
            reason = f"a person refused {tool_input.tool}: {question.answer_text or 'no reason given'}"
        self._ctx.state.rejected_paths.append(
            RejectedPath(node=node.name, why=reason, output_preview=what, at=workflow.now())
        )
        return self._refused(tool_input, spec, reason)

    def _refused(self, tool_input: ToolInput, spec: ToolSpec, error: str) -> ToolResult:
        return ToolResult(call_id=tool_input.call_id, tool=tool_input.tool, risk=spec.risk, ok=False, error=error)

    async def roll_back(self, changed: Callable[[], None] = lambda: None) -> None:
        """Abort with rollback: undo, newest first, every effect that happened or may have
        happened; each compensation is a keyed call, safe to send for one that did not.
        `changed` is called as each undo starts and settles (the event stream says so)."""
        state = self._ctx.state
        for record in reversed(state.compensations):
            if record.status in ("done", "not_needed"):
                continue
            if record.effect == "not_happened":
                record.status, record.note = "not_needed", "the effect did not happen"
                continue
            comp = record.compensation
            undo = ToolInput(
                goal_id=self._ctx.goal_id,
                node_key=f"compensate:{record.effect_key}",
                tool=comp.tool,
                workspace=state.spec.workspace,
                args=comp.args,
                confirmed=True,
            )
            summary = f"compensate · {comp.tool} · {record.node} · {record.effect_key[:15]}"
            self._ctx.undoing = record.effect_key
            changed()
            try:
                if record.device is not None:
                    result = await self._devices.undo(undo, summary, record.device)
                    self._tools.charged(result)
                else:
                    result = await self._tools.execute(undo, summary=summary)
            except ActivityError as err:
                record.status, record.note = "failed", failure_message(err)
            else:
                record.status = "done" if result.ok else "failed"
                record.note = result.preview if result.ok else result.error
            finally:
                self._ctx.undoing = None
            changed()
