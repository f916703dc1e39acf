"""How the goal runs one tool call: where (a local activity in a read segment, or
an activity with its own checkpoint), with which timeouts and retries, and what
a write that ran out of attempts becomes (uncertain, never failed; scheduled again when dead
workers used them up and a second run is harmless, lost_workers.py), what failed attempts
of a paid read cost (charged as they end the activity: `failed_cost`), and what a node's
call carries for the workspace's versions: its fencing token (the node's run and the
workflow task making the call), and for a versioned write the version of each file the
node, or a step it needs, last read or wrote (from their fingerprints).

Workflow code: it schedules activities. The effect rules around a call
(confirmation of irreversible tools, questions about uncertain outcomes,
compensations) are the effect guard's (effect_guard.py), which calls this.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

from perdure.activities.tools.catalogue import TOOL_SPECS, VERSIONED_WRITES
from perdure.activities.tools.catalogue.command_tool import RunCommandArgs, command_replay
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.state import GoalState, Node
from perdure.workflows.goal.lost_workers import LostWorkers, last_attempt_lost
from perdure.workflows.goal.read_batch import ReadBatcher
from perdure.workflows.goal.rules import segments
from perdure.workflows.shared.contracts import ToolInput, ToolResult, WorkspaceFence
from perdure.workflows.shared.retries import (
    HEARTBEAT_TIMEOUT,
    ONCE_HEARTBEAT,
    RETRY_BY_POLICY,
    TOOL_RETRY,
    TOOL_TIMEOUT,
)
from perdure.workflows.shared.tool_specs import FAILED_COST, ToolSpec

if TYPE_CHECKING:
    from perdure.workflows.goal.device_placement import Devices

# run_command is `once` unless replay-safe, and the activity tells which: a safe command
# keeps the retries it had as a `safe` tool; one that is not answers uncertain on its
# second attempt, so the third is never reached.
RETRY_BY_TOOL = {"run_command": TOOL_RETRY}
# A regular tool activity whose spec names no heartbeat timeout (a read run outside a
# segment) still lets a lost worker be noticed in seconds.
TOOL_HEARTBEAT = HEARTBEAT_TIMEOUT
# Files a node's fingerprints name at most (an agent may read hundreds).
MAX_FINGERPRINTS = 200
# Versions a write's call names at most: an agent's write may be of any file it saw, so
# it carries them all (the node's own, then its upstream steps'), the newest first kept.
MAX_BASED_ON = MAX_FINGERPRINTS
FILE_SOURCE = "file:"


class ToolRunner:
    def __init__(
        self,
        state: GoalState,
        devices: Devices | None = None,
        tools: Callable[[], Mapping[str, ToolSpec]] = lambda: TOOL_SPECS,
        lost: LostWorkers | None = None,
        charge: Callable[[float, Node | None], None] | None = None,
    ) -> None:
        self._state = state
        # Books what a call reported it cost on the goal's budget (Spend.charge_tool).
        self._charge = charge
        self._devices = devices
        # Calls whose attempts dead workers used up are scheduled again (None: never).
        self._lost = lost
        # The goal's tool table (GoalContext.tools): the built-in tools and its MCP ones.
        self._tools = tools
        self._batches = ReadBatcher(state)

    def placement(
        self, tool: str, node: Node | None = None, call: ToolInput | None = None, undoable: bool = False
    ) -> segments.Placement:
        """Where a call of `tool` runs; a harmless write runs locally only when its `call` is
        known and not `undoable` (segments.intent_needed)."""
        if self._devices is not None and self._devices.runs_on(node, tool):
            # On a device: an activity on its queue, never in a read segment of the workers'.
            return segments.Placement(where="activity", why="runs on the step's device")
        spec = self._state.spec
        return segments.place(
            self._tools().get(tool), spec.local_activities_up_to_s, spec.local_keyed_writes, call, undoable
        )

    async def check(self, tool_input: ToolInput, summary: str) -> ToolResult:
        """A call of no step (a park's check): on the goal's host when its workspace lives on
        one, else on the workers."""
        if self._devices is not None:
            on_host = await self._devices.check_on_host(tool_input, summary)
            if on_host is not None:
                return on_host
        return await self.execute(tool_input, summary)

    async def execute(
        self, tool_input: ToolInput, summary: str, node: Node | None = None, undoable: bool = False
    ) -> ToolResult:
        """The call, where its placement says; `undoable`: the effect guard recorded a
        compensation for it (such a write keeps its activity)."""
        device = self._devices.runs_on(node, tool_input.tool) if self._devices is not None else None
        if device is not None and node is not None:
            self._batches.forget_ahead()
            on_host = device == self._devices.host()
            if on_host:
                # The goal's workspace: its writes are versioned and fenced there, as on a worker.
                tool_input = self._fenced(tool_input, node)
            # Resolved and approved by the effect guard; it runs there, or waits for it.
            try:
                result = await self._devices.call(tool_input, summary, node, device)
            except ActivityError as err:
                self._charge_failed(err, node)  # its one attempt may have billed (a paid read)
                raise
            self._state.ledger.tool_calls += 1
            self.charged(result, node)
            if on_host and result.fingerprints:
                keep_fingerprints(node, result)
            return result
        spec = self._tools().get(tool_input.tool)
        retry = RETRY_BY_TOOL.get(tool_input.tool) or (RETRY_BY_POLICY[spec.replay] if spec else TOOL_RETRY)
        placement = self.placement(tool_input.tool, call=tool_input, undoable=undoable)
        if node is not None:
            node.placements[tool_input.tool] = placement.describe()
        try:
            if placement.alone:
                # A write whose re-run is harmless, in this workflow task: no intent recorded
                # before it, so a crash before the task completes sends it again (its effect key
                # dedups it, or its lookup finds it). Alone: never beside reads (ordered around it).
                # Its retries wait in the worker, inside the task (the SDK heartbeats a task whose
                # local activities run at 80 % of its timeout), while a wait is shorter than the
                # SDK's local_retry_threshold (60 s): the keyed policy's own waits are (0.1 to
                # 8.1 s, workflows/shared/retries.py), a service's Retry-After need not be (the
                # built-in HTTP tools clamp it to 300 s, a user tool's passes as given). A longer
                # wait is a durable timer: the task completes with what it holds, and the SDK
                # schedules the next attempt after the timer (its attempt count kept).
                self._batches.forget_ahead()
                result = await workflow.execute_local_activity(
                    Activities.RUN_TOOL,
                    self._fenced(tool_input, node),
                    result_type=ToolResult,
                    start_to_close_timeout=tool_timeout(tool_input, spec),
                    retry_policy=retry,
                    summary=summary,
                )
            elif placement.in_segment:
                # Part of a read segment: the result is written to history with the next
                # workflow task; a crash before then re-runs the (free) read.
                result = self._batches.read_ahead(node, tool_input)
                self._batches.forget_ahead(tool_input.tool)  # a local write voids what was read ahead
                if result is None:
                    fenced = self._fenced(tool_input, node)
                    # With the other reads of this activation, as one local activity.
                    result = await self._batches.run(fenced, summary, tool_timeout(tool_input, spec), node)
                if result is None:
                    result = await workflow.execute_local_activity(
                        Activities.RUN_TOOL,
                        fenced,
                        result_type=ToolResult,
                        start_to_close_timeout=tool_timeout(tool_input, spec),
                        retry_policy=retry,
                        summary=summary,
                    )
            else:
                self._batches.forget_ahead()
                result = await self._activity(tool_input, spec, retry, summary, node)
        except (ActivityError, ApplicationError) as err:
            # A local activity's own failure is raised bare (an ApplicationError), an
            # activity's, and a local activity's timeout, as an ActivityError around it.
            if spec is None or spec.risk not in ("remote-write", "irreversible"):
                raise
            # Out of attempts (or time) on a write to the outside world: whether it
            # landed is unknown, and that is a question for a person, not a failure.
            details = getattr(_cause(err), "details", None) or [{}]
            key = details[0].get("effect_key") if isinstance(details[0], dict) else None
            result = ToolResult(
                call_id=tool_input.call_id,
                tool=tool_input.tool,
                risk=spec.risk,
                ok=False,
                uncertain=True,
                effect_key=key,
                error=f"{tool_input.tool} did not complete and may or may not have happened: {failure_message(err)}",
            )
        self._state.ledger.tool_calls += 1
        self.charged(result, node)
        if node is not None and result.fingerprints:
            keep_fingerprints(node, result)
        return result

    def charged(self, result: ToolResult, node: Node | None = None) -> None:
        """What the call reported it cost, on the goal's budget: before anything else is admitted."""
        if result.cost_usd and self._charge is not None:
            self._charge(result.cost_usd, node)

    def _charge_failed(self, err: ActivityError, node: Node | None) -> None:
        cost = failed_cost(err)
        if cost and self._charge is not None:
            self._charge(cost, node)

    async def _activity(
        self, tool_input: ToolInput, spec: ToolSpec | None, retry: RetryPolicy, summary: str, node: Node | None
    ) -> ToolResult:
        """The call as an activity with its own checkpoint. One whose last attempt died with
        its worker is scheduled again, while the goal allows it, when a second run is
        harmless (lost_workers.py); it gets its whole retry policy again (a tool's attempts
        leave no record of why each ended), and counts one attempt lost: the last."""
        lost = 0
        while True:
            try:
                return await workflow.execute_activity(
                    Activities.RUN_TOOL,
                    self._fenced(tool_input, node),
                    result_type=ToolResult,
                    start_to_close_timeout=tool_timeout(tool_input, spec),
                    heartbeat_timeout=tool_heartbeat(tool_input, spec),
                    retry_policy=retry,
                    summary=summary,
                )
            except ActivityError as err:
                # Before it is run again or given up: the attempts a paid read billed.
                self._charge_failed(err, node)
                if self._lost is None or not last_attempt_lost(err):
                    raise
                if not runs_again_harmlessly(tool_input, spec):
                    raise
                lost += 1
                self._lost.count(node, 1)
                if not self._lost.again(node, summary, lost, "tool"):
                    raise

    def _fenced(self, tool_input: ToolInput, node: Node | None) -> ToolInput:
        """The call as a node makes it in this workflow task: with its fencing token, and for
        a versioned write with the versions it is based on. Taken right before the call is
        scheduled, so a call made again in a later task (its worker lost) has a newer token."""
        if node is None:
            return tool_input
        spec = self._tools().get(tool_input.tool)
        if node.kind == "tool" and spec is not None and spec.risk == "read":
            # A plan step's one call, a read: nothing of its node writes, so there is nothing
            # for its token to fence, and presenting one costs a locked write of the node's
            # fence record per read (most of a small read's time in the activity).
            return tool_input
        info = workflow.info()
        fence = WorkspaceFence(
            chain=info.first_execution_run_id, node=node.name, run=node.runs, task=info.get_current_history_length()
        )
        update: dict = {"fence": fence}
        if tool_input.tool in VERSIONED_WRITES:
            update["based_on"] = versions_seen(self._state, node, tool_input)
        return tool_input.model_copy(update=update)


def keep_fingerprints(node: Node, result: ToolResult) -> None:
    """What the call read or wrote, the latest per file; at most MAX_FINGERPRINTS a node
    (the oldest go: a check then covers what the node saw last)."""
    latest = {(p.kind, p.source): p for p in node.fingerprints}
    for print_ in result.fingerprints:
        latest.pop((print_.kind, print_.source), None)
        latest[(print_.kind, print_.source)] = print_
    node.fingerprints = list(latest.values())[-MAX_FINGERPRINTS:]


def versions_seen(state: GoalState, node: Node, tool_input: ToolInput) -> dict[str, str | None]:
    """Each file's version as `node` last read or wrote it, else as the steps it needs
    (directly or not) last did: their work happened before this node's, so a write based
    on it passes over nothing this node's inputs do not reflect. A parallel branch's reads
    and writes never count: a write from one branch to a file another wrote is a conflict.
    A plan step's write names its one path; an agent's (whose arguments the goal does not
    see) all, at most MAX_BASED_ON."""
    plan = state.plan

    def needs(name: str) -> list[str]:
        try:
            return plan.step(name).needs if plan is not None else []
        except KeyError:  # a step the current plan no longer has
            return []

    upstream: list[str] = []
    todo, reached = list(needs(node.name)), set()
    while todo:
        name = todo.pop()
        if name in reached or name not in state.nodes:
            continue
        reached.add(name)
        upstream.append(name)
        todo.extend(needs(name))
    versions: dict[str, str | None] = {}
    for prints in (
        sorted((p for name in upstream for p in state.nodes[name].fingerprints), key=lambda p: p.at),
        sorted(node.fingerprints, key=lambda p: p.at),
    ):
        for print_ in prints:
            if print_.source.startswith(FILE_SOURCE):
                path = posixpath.normpath(print_.source.removeprefix(FILE_SOURCE))
                versions.pop(path, None)  # the newest last, so the cap keeps it
                versions[path] = print_.digest
    wanted = (tool_input.args or {}).get("path")
    if isinstance(wanted, str) and "{{" not in wanted:
        path = posixpath.normpath(wanted)
        return {path: versions[path]} if path in versions else {}
    return dict(list(versions.items())[-MAX_BASED_ON:])


def tool_timeout(tool_input: ToolInput, spec: ToolSpec | None) -> timedelta:
    """Each tool's own start-to-close timeout; run_command carries its own limit, plus
    room for start-up and output capture."""
    if tool_input.tool == "run_command":
        # Model-written arguments are not visible here; allow the tool's maximum.
        limit = float(tool_input.args.get("timeout_s", 60)) if tool_input.args else 600
        return timedelta(seconds=limit + 30)
    return timedelta(seconds=spec.start_to_close_s) if spec else TOOL_TIMEOUT


def tool_heartbeat(tool_input: ToolInput, spec: ToolSpec | None) -> timedelta:
    """Every tool activity heartbeats, so a killed worker is noticed in seconds, not at the
    start-to-close timeout (up to 630 s for a command). A call whose second attempt only
    asks a person (a `once` tool, a command not known here to be replay-safe) gets at
    least ONCE_HEARTBEAT: a live worker judged dead would cost a question."""
    timeout = timedelta(seconds=spec.heartbeat_timeout_s) if spec and spec.heartbeat_timeout_s else TOOL_HEARTBEAT
    if spec is not None and spec.replay == "once" and not _replay_safe_command(tool_input):
        return max(timeout, ONCE_HEARTBEAT)
    return timeout


def runs_again_harmlessly(tool_input: ToolInput, spec: ToolSpec | None) -> bool:
    """A second run of the call, as a new activity (attempt 1 again, no earlier heartbeat),
    can do no harm: a read or workspace write (`safe`), a write re-sent under its key
    (`keyed`) or looked up first (`check`), a replay-safe command. Never a `once` tool: its
    new first attempt would send it again."""
    if tool_input.tool == "run_command":
        return _replay_safe_command(tool_input)
    return spec is not None and spec.replay in ("safe", "keyed", "check")


def _replay_safe_command(tool_input: ToolInput) -> bool:
    """A run_command call whose own arguments say a second run is harmless (workflows/shared/effects.py);
    arguments stored by reference or still holding templates are not looked into."""
    if tool_input.tool != "run_command" or tool_input.args is None:
        return False
    try:
        args = RunCommandArgs.model_validate(tool_input.args)
    except ValueError:
        return False
    return command_replay(args) is not None


def failed_cost(err: ActivityError) -> float:
    """What the failed attempts of a tool activity reported they cost (a user's paid read,
    FAILED_COST): in its last failure's details, or, when its last attempt was lost, in
    that attempt's last heartbeat. 0.0 when none is recorded."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        details = cause.details
    elif isinstance(cause, TimeoutError):
        details = cause.last_heartbeat_details
    else:
        return 0.0
    first = details[0] if details else None
    cost = first.get(FAILED_COST) if isinstance(first, dict) else None
    if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost) or cost <= 0:
        return 0.0
    return float(cost)


def _cause(err: ActivityError | ApplicationError) -> BaseException | None:
    return err if isinstance(err, ApplicationError) else err.cause


def failure_message(err: ActivityError | ApplicationError) -> str:
    """The innermost application message of an activity failure (or a local activity's own
    ApplicationError), with its type."""
    cause = _cause(err)
    while cause is not None and not isinstance(cause, ApplicationError) and cause.cause is not None:
        cause = cause.cause
    if isinstance(cause, ApplicationError):
        return f"{cause.message} ({cause.type})" if cause.type else cause.message
    return str(cause or err)
