"""The model activities: plan, generate (one llm step) and one turn of an agent loop.

Owns prompt assembly, the agent transcript and turning replies into typed
results; the decisions (how many repairs, which tool calls to run, when a loop
ends) stay in the workflow. Large text (replies, transcripts, tool arguments)
goes to the artifact store and results carry only references and a preview.
Stable prompt parts (marker, role, goal, constraints, tool catalogue) come
first so providers can cache them. This module must not log prompts or keys,
and must not retry: failures leave as `ApplicationError`s for Temporal.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, nullcontext
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from perdure.activities.artifacts import ArtifactCorrupt, ArtifactMissing, ArtifactStore, preview
from perdure.activities.faults import fault_point
from perdure.activities.heartbeat import Heartbeat
from perdure.activities.models import context_window
from perdure.activities.models.attempts import ModelAttemptState
from perdure.activities.models.compaction import ERROR_PREFIX, RESULT_PREFIX, CompactedPrompt, compact_prompt
from perdure.activities.models.live_text import LiveText
from perdure.activities.models.profiles import ModelConfig, ModelProfile, UnknownModelProfile
from perdure.activities.models.providers import ChatMessage, ChatRequest, ChatResponse, ChatTool, provider_for
from perdure.activities.models.usage_metrics import count_reply
from perdure.activities.quota.quota_admission import QuotaWaitError, admitted
from perdure.activities.spans import model_call_span
from perdure.activities.tools.catalogue import COMPACTION_TOOL, DEVICE_TOOLS, LOW_VALUE_TOOLS, TOOL_SPECS
from perdure.workflows.goal.contracts.goal_contracts import (
    Activities,
    AgentTurnInput,
    AgentTurnResult,
    ContextCompaction,
    DriftInput,
    DriftOutline,
    DriftResult,
    GenerateInput,
    GenerateResult,
    ModelContext,
    PlanInput,
    PlanResult,
    PlanRevision,
    ToolCall,
    Usage,
)
from perdure.workflows.goal.contracts.plan import MAX_PLANNED_STEPS, Plan, parse_plan
from perdure.workflows.goal.rules.evidence import statement_lines
from perdure.workflows.shared.contracts import ArtifactRef, ToolResult
from perdure.workflows.shared.mcp_tools import McpTool, tool_table
from perdure.workflows.shared.tool_specs import ToolSpec
from perdure.workflows.shared.user_tools import UserTool

# Markers let the scripted server (and a person reading a transcript) tell the calls apart.
PLANNER_MARKER = "PERDURE-PLANNER"
STEP_MARKER = "PERDURE-STEP"
AGENT_MARKER = "PERDURE-AGENT"

MAX_INPUT_CHARS = 64_000
# What the decision log keeps of a planner's rationale or of what an agent said beside its tool calls.
RATIONALE_CHARS = 400
DEGRADED_INPUT_CHARS = 8_000
DEGRADED_NOTE = (
    "[degraded: the goal's budget is running low] Inputs above are compacted and only core tools are offered; "
    "answer as briefly as the step allows."
)
DRIFT_MARKER = "PERDURE-DRIFT"
MAX_TOOL_RESULT_CHARS = 16_384
LAST_TURN_NOTE = (
    "This is your last turn: no tools are available any more. "
    "Answer now with the step's final output, using what you have."
)
NO_FINAL_ANSWER = "(no final answer: the agent's turns ran out while it still asked for tools)"

EXAMPLE_PLAN = {
    "steps": [
        {"name": "listing", "kind": "tool", "tool": "list_dir", "args": {"path": "."}},
        {
            "name": "survey",
            "kind": "agent",
            "prompt": "Read the files that matter and describe what the project does.",
            "tools": ["read_file"],
            "needs": ["listing"],
        },
        {"name": "summary", "kind": "llm", "prompt": "Write a one-page summary from the survey.", "needs": ["survey"]},
        {
            "name": "save",
            "kind": "tool",
            "tool": "write_file",
            "args": {"path": "SUMMARY.md", "content": "{{steps.summary}}"},
            "needs": ["summary"],
        },
    ]
}


class ModelActivities:
    """Register with a Worker as `activities=ModelActivities(config, store).activities()`."""

    def __init__(self, config: ModelConfig, store: ArtifactStore) -> None:
        self.config = config
        self.store = store

    def activities(self) -> list[Callable[..., Any]]:
        return [self.plan, self.generate, self.agent_turn, self.drift_check]

    @activity.defn(name=Activities.PLAN)
    async def plan(self, input: PlanInput) -> PlanResult:
        messages = [
            ChatMessage(
                role="system",
                content=planner_system_prompt(
                    input.context, input.allowed_tools, input.devices, input.mcp_tools, input.user_tools
                ),
            ),
            ChatMessage(
                role="user",
                content=goal_message(input.context, revision_block(input.revision) if input.revision else ""),
            ),
        ]
        if input.rejected is not None and input.rejection:
            messages += [
                ChatMessage(role="assistant", content=await self._text(input.rejected, "the rejected plan")),
                ChatMessage(
                    role="user",
                    content=f"Your plan was rejected: {input.rejection}. Reply with the corrected plan as JSON only.",
                ),
            ]
        purpose = f"{'replan' if input.revision else 'plan'}, reply {input.attempt}"
        async with self._attempt(input.context, purpose) as attempt:
            response, usage = await self._chat(input.context, ChatRequest(messages=messages, json_mode=True), attempt)
            raw = await self.store.aput_text(response.text)
            plan, error = parse_plan_reply(
                response.text, input.allowed_tools, input.device_tools, tool_table(input.mcp_tools, input.user_tools)
            )
            if error:
                activity.logger.info("plan rejected", extra={"attempt": input.attempt, "reason": preview(error)})
            rationale = plan_rationale(response.text) if plan is not None else None
            return attempt.result(
                PlanResult(plan=plan, error=error, raw=raw, usage=usage, model=response.model, rationale=rationale)
            )

    @activity.defn(name=Activities.GENERATE)
    async def generate(self, input: GenerateInput) -> GenerateResult:
        messages = [
            ChatMessage(role="system", content=step_system_prompt(input.context)),
            ChatMessage(
                role="user", content=await self._step_message(input.step, input.prompt, input.inputs, input.context)
            ),
        ]
        async with self._attempt(input.context, f"llm step {input.step}", live=input.step) as attempt:
            response, usage = await self._chat(input.context, ChatRequest(messages=messages), attempt)
            output = await self.store.aput_text(response.text)
            return attempt.result(
                GenerateResult(
                    output=output,
                    preview=preview(response.text),
                    usage=usage,
                    model=response.model,
                    statements=statement_lines(response.text),
                )
            )

    @activity.defn(name=Activities.DRIFT_CHECK)
    async def drift_check(self, input: DriftInput) -> DriftResult:
        """Would finishing the current plan satisfy the goal? One structured model call, shown
        a bounded outline of the plan."""
        shown = outline_block(input.outline)
        messages = [
            ChatMessage(role="system", content=drift_system_prompt(input.context)),
            ChatMessage(
                role="user",
                content=goal_message(
                    input.context, *shown, 'Reply with JSON only: {"on_track": true|false, "reason": "..."}'
                ),
            ),
        ]
        async with self._attempt(input.context, "drift check") as attempt:
            response, usage = await self._chat(input.context, ChatRequest(messages=messages, json_mode=True), attempt)
            on_track, reason = parse_drift_reply(response.text)
            return attempt.result(DriftResult(on_track=on_track, reason=reason, usage=usage, model=response.model))

    @activity.defn(name=Activities.AGENT_TURN)
    async def agent_turn(self, input: AgentTurnInput) -> AgentTurnResult:
        async with self._attempt(input.context, f"agent step {input.step}", input.turn, live=input.step) as attempt:
            return attempt.result(await self._agent_turn(input, attempt))

    async def _agent_turn(self, input: AgentTurnInput, attempt: ModelAttemptState) -> AgentTurnResult:
        last_turn = input.turn >= input.max_turns
        if input.transcript is None:
            messages = [
                ChatMessage(role="system", content=agent_system_prompt(input.context, input.max_turns)),
                ChatMessage(
                    role="user",
                    content=await self._step_message(input.step, input.prompt, input.inputs, input.context),
                ),
            ]
        else:
            messages = await self._transcript(input.transcript)
            messages += await self._tool_result_messages(messages, input.tool_results)
            if input.new_guidance:
                guidance = "\n".join(f"- {g}" for g in input.new_guidance)
                messages.append(
                    ChatMessage(role="user", content=f"New guidance from the user (applies from now on):\n{guidance}")
                )
        for note in input.notes:
            messages.append(ChatMessage(role="user", content=f"Note from the runtime: {note}"))
        if last_turn:
            messages.append(ChatMessage(role="user", content=LAST_TURN_NOTE))
        compacted = await self._compacted(input, messages)
        # A compacted prompt shows some outputs as one line with their digest; the model
        # may read one in full (the workflow allows the call on exactly these turns).
        offered = [*input.tools, COMPACTION_TOOL] if compacted and COMPACTION_TOOL not in input.tools else input.tools
        named = core_tools(offered) if input.context.degraded else offered
        tools = [] if last_turn else agent_tools(named, input.mcp_tools, input.user_tools)
        sent = compacted.messages if compacted else messages
        response, usage = await self._chat(input.context, ChatRequest(messages=sent, tools=tools), attempt)

        calls = [
            call if call.id else call.model_copy(update={"id": f"call_{input.turn}_{i}"})
            for i, call in enumerate(response.tool_calls)
        ]
        if last_turn:
            # No tools were offered; a call now could never get a next turn to see its result.
            calls = []
        messages.append(ChatMessage(role="assistant", content=response.text, tool_calls=calls))
        # The whole transcript, never the compacted prompt: the next turn compacts afresh from it.
        transcript = await self.store.aput_json([m.model_dump(exclude_defaults=True) for m in messages])
        compaction = (
            ContextCompaction(
                turn=input.turn,
                compacted_turns=compacted.turns,
                chars_before=compacted.chars_before,
                chars_after=compacted.chars_after,
                full_transcript=transcript,
                sent_prompt=await self.store.aput_json([m.model_dump(exclude_defaults=True) for m in sent]),
            )
            if compacted
            else None
        )

        if calls:
            tool_calls = [
                ToolCall(
                    call_id=c.id,
                    tool=c.name,
                    args=await self.store.aput_text(c.arguments, "application/json"),
                    preview=preview(c.arguments, 160),
                )
                for c in calls
            ]
            summary = "calls " + ", ".join(c.name for c in calls)
            return AgentTurnResult(
                transcript=transcript,
                tool_calls=tool_calls,
                reason=preview(response.text, RATIONALE_CHARS) if response.text.strip() else None,
                preview=preview(f"{summary}. {response.text}" if response.text else summary),
                usage=usage,
                model=response.model,
                compaction=compaction,
            )
        text = response.text or (NO_FINAL_ANSWER if response.tool_calls else "")
        return AgentTurnResult(
            transcript=transcript,
            final=await self.store.aput_text(text),
            preview=preview(text),
            usage=usage,
            model=response.model,
            compaction=compaction,
            statements=statement_lines(text),
        )

    # --- helpers ------------------------------------------------------------------

    @asynccontextmanager
    async def _attempt(
        self, context: ModelContext, purpose: str, turn: int | None = None, live: str | None = None
    ) -> AsyncIterator[ModelAttemptState]:
        """One attempt of a model activity, heartbeating what it waits for; whatever it
        raises leaves with this attempt's record and the earlier ones (activities/models/attempts.py).
        With `live` (the node's name), a streamed reply's text is shown on the goal's event
        stream as it is written (activities/models/live_text.py)."""
        attempt = ModelAttemptState(purpose, context.profile, turn)
        every_s = self._live_every_s(context.profile) if live is not None else 0.0
        shown = LiveText(live, turn, every_s) if live is not None and every_s else nullcontext()
        async with Heartbeat(attempt.details), shown as text:
            attempt.on_text = text.add if isinstance(text, LiveText) else None
            try:
                yield attempt
            except QuotaWaitError as wait:
                # Not a failed attempt: nothing was sent. Earlier attempts' records go with it.
                raise wait.application_error(attempt.details()["failed_attempts"]) from None
            except Exception as err:
                raise attempt.failure(err) from None

    def _live_every_s(self, name: str) -> float:
        """How often a profile's streamed replies are shown; 0 when its replies are not
        streamed (background calls, `stream = false`), the profile is unknown (the call
        itself says so) or there is no workflow to show them on."""
        try:
            profile = self.config.resolve(name)
        except UnknownModelProfile:
            return 0.0
        streamed = profile.stream and profile.mode == "sync" and activity.info().workflow_id is not None
        return profile.live_every_s if streamed and _has_client() else 0.0

    async def _chat(
        self, context: ModelContext, request: ChatRequest, attempt: ModelAttemptState
    ) -> tuple[ChatResponse, Usage]:
        profile = self._profile(context.profile)
        # Before the quota's slot and the request: a call that cannot fit costs nothing.
        context_window.ensure_fits(profile, request, attempt.what())
        prompt_chars = sum(len(m.content or "") for m in request.messages)
        async with admitted(self.config, profile, context, prompt_chars, on_wait=attempt.set_status):
            # Crash tests may kill the worker while this call is in flight (no-op unless PERDURE_FAULT is set).
            fault_point("model_call", profile.name, activity=activity.info().activity_type)
            with model_call_span(profile) as span:
                response = await provider_for(profile).chat(request, attempt)
                span.usage(response, profile.cost_usd(response.input_tokens, response.output_tokens))
        usage = Usage(
            input_tokens=response.input_tokens,
            output_tokens=response.output_tokens,
            cost_usd=profile.cost_usd(response.input_tokens, response.output_tokens),
            estimated=response.usage_estimated,
        )
        # From here on the reply is paid for: an error after this point is charged this.
        attempt.usage = usage
        count_reply(profile, usage.input_tokens, usage.output_tokens)
        activity.logger.info(
            "model call",
            extra={
                "profile": profile.name,
                "model": response.model,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cost_usd": usage.cost_usd,
            },
        )
        return response, usage

    async def _compacted(self, input: AgentTurnInput, messages: list[ChatMessage]) -> CompactedPrompt | None:
        """The prompt with older finished turns compacted, when it is over the goal's threshold
        or would not fit the model's context window (then whatever the goal's threshold)."""
        threshold = input.compact_after_chars
        if threshold is not None and input.context.degraded:
            # Past the soft budget gate the design asks for a compacted context.
            threshold = min(threshold, DEGRADED_INPUT_CHARS)
        profile = self._profile(input.context.profile)
        fits = context_window.prompt_chars_allowed(profile, profile.max_output_tokens)
        if fits is not None:
            # What the tools' schemas take of the window (the compaction tool's included) is not the messages'.
            fits -= context_window.tools_chars(
                agent_tools([*input.tools, COMPACTION_TOOL], input.mcp_tools, input.user_tools)
            )
            threshold = fits if threshold is None else min(threshold, fits)
        compacted = compact_prompt(messages, threshold)
        if compacted is None:
            return None
        # The prompt now shows these outputs only by digest; make sure each digest resolves.
        for text in compacted.archived:
            await self.store.aput_text(text)
        activity.logger.info(
            "agent prompt compacted",
            extra={
                "step": input.step,
                "turn": input.turn,
                "compacted_turns": compacted.turns,
                "chars_before": compacted.chars_before,
                "chars_after": compacted.chars_after,
            },
        )
        return compacted

    def _profile(self, name: str) -> ModelProfile:
        try:
            return self.config.resolve(name)
        except UnknownModelProfile as err:
            raise ApplicationError(str(err), type="UnknownModelProfile", non_retryable=True) from None

    async def _text(self, ref: ArtifactRef, what: str) -> str:
        try:
            return await self.store.aget_text(ref)
        except (ArtifactMissing, ArtifactCorrupt) as err:
            # The store is local to this machine; another attempt here would find the same thing.
            raise ApplicationError(f"{what}: {err}", type=type(err).__name__, non_retryable=True) from None

    async def _transcript(self, ref: ArtifactRef) -> list[ChatMessage]:
        text = await self._text(ref, "the agent transcript")
        try:
            return [ChatMessage.model_validate(m) for m in json.loads(text)]
        except ValueError as err:
            raise ApplicationError(
                f"the agent transcript {ref.digest} is not a list of messages: {err}",
                type="TranscriptInvalid",
                non_retryable=True,
            ) from None

    async def _step_message(
        self, step: str, prompt: str, inputs: dict[str, ArtifactRef], context: ModelContext | None = None
    ) -> str:
        parts = [f"step: {step}", prompt]
        for name in sorted(inputs):
            text = cap(await self._text(inputs[name], f"input from step '{name}'"), MAX_INPUT_CHARS)
            parts.append(f"--- input from step '{name}' ---\n{text}\n--- end of input from step '{name}' ---")
        text = "\n\n".join(parts)
        if context is not None and context.degraded:
            # Past the soft budget gate: compact the inputs and say so. The cap
            # comes before the steering, which is never cut (premises, guidance
            # and rejected paths reach the model verbatim).
            text = cap(text, DEGRADED_INPUT_CHARS)
        steering = steering_block(context) if context else ""
        degraded_note = DEGRADED_NOTE if context is not None and context.degraded else ""
        return "\n\n".join(part for part in (text, steering, degraded_note) if part)

    async def _tool_result_messages(
        self, transcript: list[ChatMessage], results: list[ToolResult]
    ) -> list[ChatMessage]:
        messages = [await self._tool_result_message(r) for r in results]
        # Providers reject a conversation in which a requested call has no
        # result, so a call the workflow did not run is answered as an error.
        pending = transcript[-1].tool_calls if transcript and transcript[-1].role == "assistant" else []
        answered = {r.call_id for r in results}
        for call in pending:
            if call.id not in answered:
                messages.append(
                    ChatMessage(
                        role="tool", tool_call_id=call.id, content=f"{ERROR_PREFIX}the call was not run (no result)"
                    )
                )
        return messages

    async def _tool_result_message(self, result: ToolResult) -> ChatMessage:
        text = await self._text(result.output, f"output of tool {result.tool}") if result.output else result.preview
        if not result.ok:
            text = f"{ERROR_PREFIX}{result.error or 'the tool failed'}" + (f"\n{text}" if text else "")
        text = cap(text, MAX_TOOL_RESULT_CHARS)
        if result.call_id:
            return ChatMessage(role="tool", tool_call_id=result.call_id, content=text)
        return ChatMessage(role="user", content=f"{RESULT_PREFIX}{result.tool}:\n{text}")


# --- prompts (pure) ------------------------------------------------------------------


def _has_client() -> bool:
    """Whether this activity can reach its workflow (not in the SDK's ActivityEnvironment without one)."""
    try:
        activity.client()
    except RuntimeError:
        return False
    return True


def constraints_block(constraints: list[str]) -> str:
    if not constraints:
        return "Constraints: none given."
    lines = "\n".join(f"- {c}" for c in constraints)
    return f"Constraints, verbatim from the user (every step must respect them):\n{lines}"


def steering_block(context: ModelContext) -> str:
    """The parts of the context the user changes while the goal runs (sent after the stable parts)."""
    parts = []
    if context.premises:
        parts.append(
            "Premises (current values):\n" + "\n".join(f"- {k} = {v}" for k, v in sorted(context.premises.items()))
        )
    if context.guidance:
        parts.append("Guidance from the user, oldest first:\n" + "\n".join(f"- {g}" for g in context.guidance))
    if context.rejected:
        parts.append(
            "Rejected paths (the user rejected these; do not repeat them):\n"
            + "\n".join(f"- {r}" for r in context.rejected)
        )
    return "\n\n".join(parts)


def goal_message(context: ModelContext, *parts: str) -> str:
    """The user message of a call about the whole goal: the goal, the steering, then the call's own parts."""
    return "\n\n".join(part for part in (f"Goal:\n{context.goal}", steering_block(context), *parts) if part)


def revision_block(revision: PlanRevision) -> str:
    finished = "\n".join(f"- {name}: {text}" for name, text in sorted(revision.finished.items())) or "(none)"
    requests = "\n".join(f"- {r}" for r in revision.requests) or "(none)"
    return (
        f"Revise the current plan. Reason: {revision.reason}\n\n"
        f"Current plan:\n{json.dumps(revision.current.model_dump(mode='json'), sort_keys=True)}\n\n"
        "Finished steps (a step kept unchanged reuses its output at no cost):\n"
        f"{finished}\n\nNew requests from the user:\n{requests}\n\n"
        "Reply with the complete revised plan (kept steps included) as one JSON object."
    )


def core_tools(names: list[str]) -> list[str]:
    """The tools kept in degraded mode: everything not marked low-value."""
    return [n for n in names if n not in LOW_VALUE_TOOLS]


def drift_system_prompt(context: ModelContext) -> str:
    return "\n\n".join(
        [
            f"[{DRIFT_MARKER}]\nYou check a long-running plan for drift: given the goal, its constraints, an "
            "outline of the plan and what has finished, decide whether finishing the plan as it stands will "
            "satisfy the goal.",
            constraints_block(context.constraints),
        ]
    )


def outline_block(outline: DriftOutline) -> list[str]:
    """The parts of a drift prompt that show the plan: its size, what runs next, what finished last."""
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(outline.kinds.items()))
    size = (
        f"The plan: {outline.steps} steps ({kinds}); {outline.finished} finished, {outline.failed} failed, "
        f"{outline.steps - outline.finished - outline.failed} to go."
    )
    upcoming = "\n".join(f"- {line}" for line in outline.upcoming) or "(none)"
    recent = "\n".join(f"- {name}: {text}" for name, text in outline.recent.items()) or "(none)"
    return [
        size,
        f"Next steps to run (the first {len(outline.upcoming)}):\n{upcoming}",
        f"Latest finished steps (the last {len(outline.recent)}) and their output:\n{recent}",
    ]


def parse_drift_reply(text: str) -> tuple[bool, str]:
    """(on_track, reason). A reply that cannot be read counts as on track: drift
    checks advise, and a garbled one must not trigger a replan."""
    try:
        data = json.loads(_unfenced(text))
        return bool(data["on_track"]), str(data.get("reason") or "no reason given")
    except (ValueError, KeyError, TypeError):
        return True, f"unreadable drift verdict, assumed on track: {preview(text, 120)}"


def tool_catalogue(allowed_tools: list[str], mcp_tools: list[McpTool] = (), user_tools: list[UserTool] = ()) -> str:
    allowed = set(allowed_tools)
    # Catalogue order, not the caller's order, keeps the prompt prefix stable for caching.
    entries = [
        f"- {spec.name} (risk: {spec.risk}): {spec.description}\n"
        f"  arguments (JSON schema): {json.dumps(spec.json_schema(), sort_keys=True)}"
        for spec in tool_table(mcp_tools, user_tools).values()
        if spec.name in allowed
    ]
    return "Tools the plan may use:\n" + ("\n".join(entries) if entries else "(none: use only llm steps)")


def device_catalogue(devices: dict[str, str] | None) -> str:
    """The devices a step may run on (`device: NAME`), or nothing when the goal was not told."""
    if not devices:
        return ""
    lines = [f"- {name}: {text}" for name, text in sorted(devices.items())]
    return (
        "Devices: a tool or agent step may say `device: NAME` to run its tool calls on that machine (a "
        "person's own computer, its directory instead of the workspace); only these tools run there: "
        f"{', '.join(DEVICE_TOOLS)}. Known devices:\n" + "\n".join(lines)
    )


def planner_system_prompt(
    context: ModelContext,
    allowed_tools: list[str],
    devices: dict[str, str] | None = None,
    mcp_tools: list[McpTool] = (),
    user_tools: list[UserTool] = (),
) -> str:
    return "\n\n".join(
        [
            f"[{PLANNER_MARKER}]\nYou are the planner of perdure, a durable runtime that carries out one goal "
            "as a graph of steps. You write the plan; the runtime runs it.",
            constraints_block(context.constraints),
            tool_catalogue(allowed_tools, mcp_tools, user_tools),
            *([device_catalogue(devices)] if devices else []),
            "Step kinds:\n"
            "- llm: one model call with `prompt`; its text output goes to the steps that need it.\n"
            "- agent: a bounded loop in which a model calls `tools` (a subset of the tools above) "
            "until it answers; optional `max_turns`.\n"
            "- tool: one call of `tool` with fixed `args`. A string argument may contain {{steps.NAME}}, "
            "which is replaced by the text output of step NAME; NAME must be listed in `needs`.\n"
            "- subgoal: a large part that does not depend on the rest, run as a goal of its own with its "
            "`goal` text (its own planner plans it) and `budget_share` (0-1) of this goal's budget; its "
            "output is its report. `join: fail_fast` stops the other fail_fast subgoals when it fails. "
            "Use it only for a part worth many steps of its own.\n"
            "- wait: wait for a time before the steps that need it run: `until` (a time with its timezone, "
            "e.g. 2026-12-02T09:00:00Z) or `after` (a duration after its needs are done: 90s, 15m, 2h, 1d), "
            "never both. Its output says when the goal acted and how late (exact, or late when no worker "
            "ran then).\n"
            "`needs` lists the steps whose outputs a step receives and must wait for; steps that do not "
            "need each other run in parallel. No cycles. Step names are unique, lower-case, "
            f"matching ^[a-z][a-z0-9_-]{{0,63}}$. At most {MAX_PLANNED_STEPS} steps.",
            "Optional flags: `wrap_up: true` marks wrap-up work (list what is unfinished, notify the owner): "
            "it runs even when the budget is spent, once its needs have ended however they ended. On a "
            'run_command tool step, `replay: "safe"` says the command may run again after an interruption '
            "(tests, builds; never for commands that send, push or append), and `network: true` lets it use "
            "the network (commands run without it otherwise).",
            f"Plan JSON schema:\n{json.dumps(Plan.model_json_schema(), sort_keys=True)}",
            "Example (illustrative only: use just the tools listed above):\n" + json.dumps(EXAMPLE_PLAN, indent=1),
            'Beside "steps", give "rationale": in a sentence or two, why this plan, and what you considered '
            "and left out.",
            "Reply with the plan as one JSON object only: no prose, no code fences.",
        ]
    )


# What lets the goal re-plan on evidence (workflows/goal/rules/evidence.py): it reads these lines at
# the start of a step's output.
STATEMENTS_NOTE = (
    "If the step establishes or refutes a claim, begin the output with one line per claim: "
    "`CONCLUSION: <claim> = true` or `= false`; if you find the cause of a failure, add a line "
    "`ROOT CAUSE: <cause>`. Otherwise begin with the output itself."
)


def step_system_prompt(context: ModelContext) -> str:
    return "\n\n".join(
        [
            f"[{STEP_MARKER}]\nYou carry out one step of a plan toward the goal below. Reply with the step's "
            "output only; it is passed verbatim to the steps that need it.",
            STATEMENTS_NOTE,
            constraints_block(context.constraints),
            f"Goal:\n{context.goal}",
        ]
    )


def agent_system_prompt(context: ModelContext, max_turns: int) -> str:
    return "\n\n".join(
        [
            f"[{AGENT_MARKER}]\nYou carry out one step of a plan toward the goal below, using the tools "
            "offered. Call tools when you need information or need to act; their results come back as "
            "messages, and a failed call comes back as 'ERROR: ...' for you to work around. When the step "
            "is done, reply with its final output as plain text and no tool calls. "
            f"You have at most {max_turns} turns.",
            STATEMENTS_NOTE,
            constraints_block(context.constraints),
            f"Goal:\n{context.goal}",
        ]
    )


def agent_tools(names: list[str], mcp_tools: list[McpTool] = (), user_tools: list[UserTool] = ()) -> list[ChatTool]:
    table = tool_table(mcp_tools, user_tools)
    return [
        ChatTool(name=spec.name, description=f"{spec.description} (risk: {spec.risk})", json_schema=spec.json_schema())
        for name in names
        if (spec := table.get(name)) is not None
    ]


_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def _unfenced(text: str) -> str:
    """A reply without the code fence models often put around JSON."""
    match = _FENCE.match(text)
    return (match.group(1) if match else text).strip()


def parse_plan_reply(
    text: str,
    allowed_tools: list[str],
    devices: dict[str, list[str]] | None = None,
    tools: dict[str, ToolSpec] | None = None,
) -> tuple[Plan | None, str | None]:
    """The plan in a model's reply, or the reason it is not one (fit to show the model).
    Its `rationale`, if any, is not the plan's (plan_rationale reads it)."""
    data, problem = _reply_object(text)
    if problem is not None:
        return None, problem
    if isinstance(data, dict):
        data = {key: value for key, value in data.items() if key != "rationale"}
    steps = data.get("steps") if isinstance(data, dict) else None
    if isinstance(steps, list) and len(steps) > MAX_PLANNED_STEPS:
        return None, f"the plan has {len(steps)} steps; at most {MAX_PLANNED_STEPS}: merge steps or plan a first stage"
    return parse_plan(data, allowed_tools, devices, tools if tools is not None else TOOL_SPECS)


def plan_rationale(text: str) -> str | None:
    """What the planner said of its plan (`rationale`: why these steps, what it left out), cut;
    None when it said nothing."""
    data, _ = _reply_object(text)
    said = data.get("rationale") if isinstance(data, dict) else None
    return preview(said, RATIONALE_CHARS) if isinstance(said, str) and said.strip() else None


def _reply_object(text: str) -> tuple[Any, str | None]:
    """The JSON value of a model's reply (fenced, or wrapped in a sentence), or why there is none."""
    body = _unfenced(text)
    try:
        return json.loads(body), None
    except ValueError as err:
        # Models sometimes wrap the object in a sentence; take the outermost braces.
        start, end = body.find("{"), body.rfind("}")
        try:
            data = json.loads(body[start : end + 1]) if 0 <= start < end else None
        except ValueError:
            data = None
        return (None, f"reply is not JSON: {err}") if data is None else (data, None)


def cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[truncated: {len(text) - limit} more characters]"
