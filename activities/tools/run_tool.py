"""The `run_tool` activity: one call of any tool, built-in, from an MCP server or a user's own
(`perdure.tool`, activities/tools/user/).

Owns what every call goes through on this machine, whatever the tool: its arguments
resolved (`{{steps.NAME}}` templates filled in from the artifact store, a model's JSON
read) and validated, its workspace resolved, its fencing token claimed, then the tool's
implementation (activities/tools/catalogue/: one module per tool) run under a
heartbeat, its output put in the artifact store (the workflow only sees a reference and
a preview) and its fingerprints taken. A superseded call of a tool that is
`refused_when_superseded` is not started (activities/tools/workspace_versions.py).

Failures a model can act on (bad arguments, a missing file, a non-zero exit, a
404) come back as `ToolResult(ok=False, error=...)`. Only goal-level problems
raise `ApplicationError`: a missing workspace, a lost artifact, a malformed
`ToolInput`. Effect tools run through `perdure.activities.tools.effect_runner.run_effect`,
which owns effect keys, the retry decision and the confirmation check for
irreversible tools; this module only dispatches to it. A shell command's attempt
after an interrupted one runs only when the command is replay-safe
(`perdure.activities.tools.catalogue.command_tool.decide_command_retry`) and is `uncertain`
otherwise. Asking a human stays with the workflow.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from perdure.activities.artifacts import ArtifactCorrupt, ArtifactMissing, ArtifactStore, preview
from perdure.activities.faults import fault_point
from perdure.activities.heartbeat import Heartbeat
from perdure.activities.mcp.mcp_calls import McpEffectTool, McpReadTool, McpServers
from perdure.activities.spans import tool_call_span
from perdure.activities.tools import sandbox
from perdure.activities.tools.batch_journal import BatchJournal
from perdure.activities.tools.catalogue import TOOL_SPECS, TOOLS
from perdure.activities.tools.catalogue.command_tool import RunCommandArgs, decide_command_retry
from perdure.activities.tools.catalogue.file_tools import ReadFileArgs, WriteFileArgs
from perdure.activities.tools.catalogue.tool_base import CallMeter, EffectTool, LocalCall, LocalTool
from perdure.activities.tools.catalogue.tool_errors import ToolError
from perdure.activities.tools.effect_runner import run_effect
from perdure.activities.tools.fingerprints import fingerprints_of
from perdure.activities.tools.workspace import WorkspaceMissing, workspace_root
from perdure.activities.tools.workspace_files import FileCall
from perdure.activities.tools.workspace_versions import FenceToken, WorkspaceVersions, superseded_message
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.plan import TEMPLATE, describe_validation_error
from perdure.workflows.goal.rules import segments
from perdure.workflows.quota.quota_workflow import QuotaLimits
from perdure.workflows.shared.contracts import (
    ArtifactRef,
    Fingerprint,
    PreparedEffect,
    ToolBatchEntry,
    ToolBatchInput,
    ToolBatchResult,
    ToolInput,
    ToolResult,
)
from perdure.workflows.shared.effects import prepared_effect
from perdure.workflows.shared.mcp_tools import schema_problems, schema_summary
from perdure.workflows.shared.tool_specs import WRITE_RISKS, Tool, ToolArgs, ToolSpec

# A batch's calls start in its order, this many at a time, each holding its place until it
# ends or for HELD_PLACE_S at most. Started all at once, 100 small reads each queue for
# the worker's few threads behind the others (their arguments, their read, their output's
# put): all of them are answered, and kept (activities/tools/batch_journal.py), ~30 ms
# after the first read, so a worker killed meanwhile loses reads that had run. A call
# that outlasts its place (a slow or blocked read) stops holding back the ones after it.
BATCH_CALLS_AT_ONCE = 4
HELD_PLACE_S = 0.01
MAX_ERROR_CHARS = 2_000
"""Errors travel in workflow history and into prompts; keep them short."""


class _BadArguments(Exception):
    """Arguments the model or plan got wrong; becomes ok=False."""


class ToolActivities:
    """Worker-side tool runner. Register `ToolActivities(store).run_tool` with the worker."""

    def __init__(
        self,
        store: ArtifactStore,
        quotas: Callable[[], dict[str, QuotaLimits]] | None = None,
        mcp: McpServers | None = None,
        user_tools: Mapping[str, Tool] | None = None,
    ) -> None:
        self.store = store
        # The declared quotas (config.toml, reloaded): http_get draws on its host's.
        self._quotas = quotas or dict
        # The MCP servers config.toml names: a goal's MCP tools are called through them.
        self._mcp = mcp or McpServers({})
        self.versions = WorkspaceVersions(store)
        self.journal = BatchJournal.beside(store)
        # The built-in tools this worker runs (a test may put its own implementation in), and
        # the user's own it loads (their names never clash with a built-in one's).
        self.tools: dict[str, Tool] = {**TOOLS, **(user_tools or {})}

    @activity.defn(name=Activities.RUN_TOOLS)
    async def run_tools(self, input: ToolBatchInput) -> ToolBatchResult:
        """Replay-safe calls a goal made together (workflows/goal/read_batch.py), side by side.
        A call that raises is answered with its error, not raised: the goal runs that one
        alone with its own retries, and the others' results stand."""

        real_roots: dict[str, Path] = {}
        # What a killed worker's run of this very batch answered: those calls are not run again.
        kept, run_id = None, activity.info().workflow_run_id
        if input.batch is not None and run_id:
            kept = self.journal.open(run_id, input.batch, input.recorded_below)

        places = asyncio.Semaphore(BATCH_CALLS_AT_ONCE)

        async def one(index: int, call: ToolInput, summary: str) -> ToolBatchEntry:
            answered = kept.answer(index, call) if kept is not None else None
            if answered is not None:
                return answered
            try:
                entry = ToolBatchEntry(call=summary, result=await _in_order(places, self._run(call, real_roots)))
            except Exception as err:  # noqa: BLE001 - the goal re-runs this call alone
                return ToolBatchEntry(call=summary, error=f"{type(err).__name__}: {err}"[:2000])
            if kept is not None:
                kept.keep(index, call, entry)
            return entry

        summaries = input.summaries + [""] * (len(input.calls) - len(input.summaries))
        try:
            entries = await asyncio.gather(*(one(i, call, summaries[i]) for i, call in enumerate(input.calls)))
        finally:
            if kept is not None:
                kept.close()
        if kept is not None and kept.served:
            activity.logger.info("batch answers taken from the journal", extra={"served": kept.served})
        size = sum(len(entry.model_dump_json().encode()) for entry in entries)
        return ToolBatchResult(entries=list(entries), size_bytes=size)

    def _spec(self, input: ToolInput) -> ToolSpec | None:
        """A built-in tool's spec, an MCP tool's from the goal's catalogue entry (with the
        graver risk class of the goal's and this worker's config), or a user tool's as this
        worker declares it."""
        if input.tool in TOOL_SPECS:
            return TOOL_SPECS[input.tool]
        if input.mcp is not None and input.mcp.name == input.tool:
            return self._mcp.graver(input.mcp).spec()
        if input.tool in self.tools:
            return self.tools[input.tool].spec
        return None

    def _implementation(self, input: ToolInput, spec: ToolSpec) -> Tool:
        if input.mcp is None or input.tool in self.tools:
            return self.tools[input.tool]
        tool = self._mcp.graver(input.mcp)
        if spec.replay == "safe" and spec.risk in ("read", "local-write"):
            # Safe to run again: called directly, like a local tool.
            return McpReadTool(self._mcp, tool)
        return McpEffectTool(self._mcp, tool)

    @activity.defn(name=Activities.RUN_TOOL)
    async def run_tool(self, input: ToolInput) -> ToolResult:
        return await self._run(input, {})

    async def _run(self, input: ToolInput, real_roots: dict[str, Path]) -> ToolResult:
        """One call; `real_roots` holds the workspaces already resolved by the calls it runs beside."""
        spec = self._spec(input)
        if spec is None or (input.tool not in self.tools and input.mcp is None):
            known = ", ".join(sorted(self.tools))
            return ToolResult(
                call_id=input.call_id, tool=input.tool, ok=False, error=f"unknown tool '{input.tool}' (known: {known})"
            )

        if not_local := _not_for_a_local_activity(input, spec):
            return not_local

        meter = CallMeter()

        async def failed(message: str, output: str | None = None) -> ToolResult:
            ref = await self.store.aput_text(output) if output is not None else None
            return ToolResult(
                call_id=input.call_id,
                tool=input.tool,
                risk=spec.risk,
                ok=False,
                output=ref,
                preview=preview(output) if output is not None else "",
                error=_clip(message),
                cost_usd=meter.cost_usd,
            )

        root = Path(input.workspace)
        if spec.needs_workspace:
            try:
                # Resolved once here: the tool confines its paths under this real root.
                if input.workspace not in real_roots:
                    real_roots[input.workspace] = workspace_root(root)
                root = real_roots[input.workspace]
            except WorkspaceMissing as err:
                # The goal points at a workspace this machine does not have: no
                # model turn or retry can fix that.
                raise ApplicationError(str(err), type="WorkspaceMissing", non_retryable=True) from None

        try:
            if input.args_ref is None and not input.inputs:
                # Nothing to read from the store: validated here, without a thread's hand-off.
                args = self._arguments(input, spec)
            else:
                # Off the loop: templates and a model's arguments are read from the store.
                args = await asyncio.to_thread(self._arguments, input, spec)
        except _BadArguments as err:
            return await failed(str(err))

        token = _fence_token(input) if spec.needs_workspace else None
        if token is not None:
            superseded = await asyncio.to_thread(self.versions.claim, token)
            if superseded is not None and spec.refused_when_superseded:
                activity.logger.warning("superseded call refused", extra={"tool": input.tool, "why": superseded})
                return await failed(superseded_message(input.tool, token, superseded))
        if spec.runs_commands:
            settled = await self._command_not_run(input, args, spec)
            if settled is not None:
                return settled
        implementation = self._implementation(input, spec)
        file_call = FileCall(self.versions, token, input.based_on) if spec.needs_workspace else None
        async with Heartbeat() as beat:
            if isinstance(implementation, EffectTool):
                with tool_call_span(spec):
                    return await run_effect(implementation, spec, input, args, self.store, beat)
            assert isinstance(implementation, LocalTool), f"{input.tool} has no implementation"
            call = LocalCall(
                root=root,
                store=self.store,
                file=file_call,
                quotas=self._quotas,
                goal_id=input.goal_id,
                tool=input.tool,
                beat=beat,
                meter=meter,
            )
            if spec.runs_commands:
                call.network, call.hidden = input.network, tuple(sandbox.hidden_paths(self.store.local_dir))
            try:
                with tool_call_span(spec) as span:
                    text = await implementation.run(call, args)
                    span.set_attribute("perdure.output_chars", len(text))
            except ToolError as err:
                activity.logger.info("tool failed", extra={"tool": input.tool, "error": err.message})
                return await failed(err.message, err.output)
            fault_point("tool_done", input.tool)
        ref = await self.store.aput_text(text)
        seen = file_call.seen.digest if file_call is not None and file_call.seen is not None else None
        if seen is not None:
            # The version the call read or wrote, digested from its own open: no second one.
            fingerprints = fingerprints_of(input.tool, root, args, text, digest=seen)
        else:
            fingerprints = await asyncio.to_thread(fingerprints_of, input.tool, root, args, text)
        return ToolResult(
            call_id=input.call_id,
            tool=input.tool,
            risk=spec.risk,
            ok=True,
            output=ref,
            preview=preview(text),
            fingerprints=_as_seen(fingerprints, file_call, args),
            cost_usd=meter.cost_usd,
        )

    async def _command_not_run(self, input: ToolInput, args: RunCommandArgs, spec: ToolSpec) -> ToolResult | None:
        """A command call answered without running it: a person said its interrupted run
        happened, or this attempt follows an interrupted one and the command is not
        replay-safe. None: run it."""
        if input.resolution == "happened":
            text = (
                f"$ {args.command}\n[not run again: a person answered that the interrupted run happened; "
                "its output and exit code were lost with that run]"
            )
            ref = await self.store.aput_text(text)
            return ToolResult(
                call_id=input.call_id, tool=input.tool, risk=spec.risk, ok=True, output=ref, preview=preview(text)
            )
        attempt = activity.info().attempt if activity.in_activity() else 1
        if decide_command_retry(attempt, args) == "run":
            return None
        activity.logger.warning("command uncertain", extra={"attempt": attempt, "command": args.command[:200]})
        return _not_run(
            input,
            spec,
            f"an earlier attempt of run_command was interrupted (its worker was lost or it timed out) "
            f"and may have run `{preview(args.command, 300)}`; a command that is neither declared "
            'replay: "safe" nor read-only is never run twice on its own: a person must check and decide',
            uncertain=True,
        )

    @activity.defn(name=Activities.PREPARE_EFFECT)
    async def prepare_effect(self, input: ToolInput) -> PreparedEffect:
        """Resolve a remote write's arguments without sending anything: what it will do,
        its effect key and its compensation, for the goal to record (and a person to
        confirm) before the effect can happen. Reads the artifact store only."""
        spec = self._spec(input)
        if spec is None:
            return PreparedEffect(tool=input.tool, error=f"unknown tool '{input.tool}'")
        try:
            args = await asyncio.to_thread(self._arguments, input, spec)
        except _BadArguments as err:
            return PreparedEffect(tool=input.tool, error=_clip(str(err)))
        return prepared_effect(input.goal_id, input.tool, args, input.workspace, self.tools.get(input.tool))

    def resolved_arguments(self, input: ToolInput) -> tuple[dict | None, str | None]:
        """A call's arguments resolved here (templates filled in from this store, a model's
        JSON read) and validated, as JSON to send elsewhere; or why they cannot be used."""
        spec = self._spec(input)
        if spec is None:
            return None, f"unknown tool '{input.tool}' (known: {', '.join(sorted(TOOL_SPECS))})"
        try:
            return self._arguments(input, spec).model_dump(mode="json"), None
        except _BadArguments as err:
            return None, _clip(str(err))

    def _arguments(self, input: ToolInput, spec: ToolSpec) -> ToolArgs:
        """The call's arguments, resolved and validated; _BadArguments says what is wrong."""
        raw = self._raw_args(input)
        # Templates belong to plan steps; a model writes literal text, and
        # `{{steps.x}}` in a file it writes must stay as written.
        resolved = self._resolve_templates(raw, input.inputs) if input.args_ref is None and not input.resolved else raw
        try:
            args = spec.args_model.model_validate(resolved)
        except ValidationError as err:
            raise _BadArguments(
                f"bad arguments for {input.tool}: {describe_validation_error(err)}; {_expected_fields(spec.args_model)}"
            ) from None
        if spec.input_schema is not None:
            # An MCP tool's own schema: checked here, so a wrong call goes back to the model
            # without reaching its server.
            problems = schema_problems(spec.input_schema, args.model_dump(mode="json"))
            if problems:
                summary = schema_summary(spec.input_schema)
                raise _BadArguments(f"bad arguments for {input.tool}: {'; '.join(problems)}; {summary}")
        return args

    def _raw_args(self, input: ToolInput) -> dict:
        if input.args is not None and input.args_ref is not None:
            raise ApplicationError(
                f"tool call {input.tool} got both args and args_ref; the workflow must send one",
                type="BadToolInput",
                non_retryable=True,
            )
        if input.args_ref is None:
            return dict(input.args or {})
        text = self._load(input.args_ref, f"the arguments of {input.tool}").decode("utf-8", errors="replace")
        try:
            value = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as err:
            raise _BadArguments(f"arguments for {input.tool} are not valid JSON: {err}") from None
        if not isinstance(value, dict):
            raise _BadArguments(f"arguments for {input.tool} must be a JSON object, got {type(value).__name__}")
        return value

    def _resolve_templates(self, value: Any, inputs: dict[str, ArtifactRef]) -> Any:
        """Replace `{{steps.NAME}}` in every string with that step's output text."""
        if isinstance(value, dict):
            return {k: self._resolve_templates(v, inputs) for k, v in value.items()}
        if isinstance(value, list):
            return [self._resolve_templates(v, inputs) for v in value]
        if not isinstance(value, str):
            return value
        missing = [name for name in TEMPLATE.findall(value) if name not in inputs]
        if missing:
            available = ", ".join(sorted(inputs)) or "none"
            raise _BadArguments(
                f"argument uses {{{{steps.{missing[0]}}}}} but no output of step '{missing[0]}' "
                f"was passed to this tool call (available: {available})"
            )

        def output_text(match: re.Match[str]) -> str:
            name = match.group(1)
            return self._load(inputs[name], f"the output of step '{name}'").decode("utf-8", errors="replace")

        return TEMPLATE.sub(output_text, value)

    def _load(self, ref: ArtifactRef, what: str) -> bytes:
        try:
            return self.store.get_bytes(ref)
        except (ArtifactMissing, ArtifactCorrupt) as err:
            # The store is this machine's disk: retrying here will not bring the
            # blob back. The workflow decides (re-run the producer, or fail).
            raise ApplicationError(f"cannot load {what}: {err}", type=type(err).__name__, non_retryable=True) from None


def _not_for_a_local_activity(input: ToolInput, spec: ToolSpec) -> ToolResult | None:
    """The answer to a call this worker's declaration says a local activity may not run
    (segments.may_run_locally), made in one: the goal placed it by the declaration it
    planned with (a user tool redeclared since, say `once` where it was `keyed`). A local
    activity has no attempt count that outlives its worker, so a `once` call's retry could
    not know an earlier worker sent it: nothing is sent, and a write is uncertain (as a
    `once` activity's second attempt is), a question for a person. None: run it."""
    if not activity.in_activity() or not activity.info().is_local or segments.may_run_locally(spec):
        return None
    if input.resolution == "happened":
        return None  # a person said it happened: recorded without sending (run_effect)
    write = spec.risk in WRITE_RISKS
    activity.logger.warning("call refused in a local activity", extra={"tool": input.tool, "replay": spec.replay})
    return _not_run(
        input,
        spec,
        f"{input.tool} is declared {spec.risk}, replay {spec.replay} on this worker, which a local activity "
        "may not run (the goal placed it by the declaration it planned with): not sent"
        + (" by this attempt; an earlier attempt on another worker may have sent it" if write else ""),
        uncertain=write,
    )


def _not_run(input: ToolInput, spec: ToolSpec, why: str, uncertain: bool) -> ToolResult:
    """A call answered without running it: `uncertain` when an earlier attempt may have."""
    return ToolResult(
        call_id=input.call_id, tool=input.tool, risk=spec.risk, ok=False, uncertain=uncertain, error=_clip(why)
    )


async def _in_order(places: asyncio.Semaphore, call: Coroutine[Any, Any, ToolResult]) -> ToolResult:
    """The call's result, started once it has a place (BATCH_CALLS_AT_ONCE), which it gives up
    when it ends or after HELD_PLACE_S."""
    async with places:
        running = asyncio.ensure_future(call)
        try:
            await asyncio.wait({running}, timeout=HELD_PLACE_S)
        except asyncio.CancelledError:
            running.cancel()
            raise
    return await running


def _fence_token(input: ToolInput) -> FenceToken | None:
    """The call's fencing token: what the goal says (node, run, workflow task) and this attempt."""
    fence = input.fence
    if fence is None:
        return None
    attempt = activity.info().attempt if activity.in_activity() else 1
    return FenceToken(
        goal=input.goal_id,
        chain=fence.chain,
        node=fence.node,
        run=fence.run,
        task=fence.task,
        attempt=attempt,
        call=input.node_key,
    )


def _as_seen(fingerprints: list[Fingerprint], call: FileCall | None, args: ToolArgs) -> list[Fingerprint]:
    """A file tool's fingerprint with the digest of the version it read or wrote, not of the
    file a moment later: a person's save in between must not count as seen by the step."""
    if call is None or call.seen is None or not isinstance(args, ReadFileArgs | WriteFileArgs):
        return fingerprints
    source = f"file:{args.path}"
    return [p.model_copy(update={"digest": call.seen.digest}) if p.source == source else p for p in fingerprints]


def _expected_fields(model: type[ToolArgs]) -> str:
    fields = [f"{name} (required)" if field.is_required() else name for name, field in model.model_fields.items()]
    return "expected fields: " + ", ".join(fields)


def _clip(message: str) -> str:
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 1] + "…"
