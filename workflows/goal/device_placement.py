"""Devices, from the goal's side: which device a node's tool calls run on, what the goal
knows of each device (the registry's signals), a node waiting while its device is
offline, the approval a call on someone's machine needs, and the call itself with
its fencing check.

Offline is a state, not an error. A node whose device is offline, or was lost while
the node ran, ends its task with status `offline` and no activity in flight: it
spends no active time, the watchdog does not judge it, continue-as-new carries it,
and the scheduler runs it again when the registry signals that the device is back.
No timer polls the device; the only timer is the step's `device_wait_s`, after which
a person is asked (wait longer, another device, skip).

A goal whose workspace is on a host (`HOST:NAME`, workflows/shared/host_workspaces.py) runs
every workspace call of its tool and agent steps on that host, which is a device holding
named workspaces: the same waits, cards and fencing. A person answering a host's card with
another host that holds the same workspace moves all the goal's workspace steps there
(GoalState.device_moves[WORKSPACE_MOVE]), not only the step that asked.

A lost attempt (the device's heartbeat timed out) re-runs when the call is
replay-safe; a command that is not becomes uncertain and the effect guard asks. A
result from a device session older than the newest the goal has heard of is refused
the same way: that session was replaced, so nothing it says is trusted.

Workflow code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError, TimeoutError, TimeoutType

from perdure.activities.tools.catalogue.command_tool import RunCommandArgs, decide_command_retry
from perdure.workflows.devices.device_contracts import (
    DeviceActivities,
    DeviceListingResult,
    DeviceOutput,
    DevicePresence,
    DeviceToolInput,
    DeviceToolResult,
    RegistrySignals,
    ResolvedCall,
    WatchDevices,
    device_queue,
    needs_approval,
    registry_id,
)
from perdure.workflows.goal.context import GoalContext, NodeFailed, NodeWaiting
from perdure.workflows.goal.contracts.goal_contracts import Activities, AheadApproval
from perdure.workflows.goal.contracts.plan import AgentStep, Plan, PlanStep, ToolStep, devices_named
from perdure.workflows.goal.contracts.state import DeviceWait, Node, Question
from perdure.workflows.goal.rules import approvals_ahead, questions
from perdure.workflows.goal.tool_runner import tool_timeout
from perdure.workflows.shared.canonical import canonical_json, digest_of
from perdure.workflows.shared.contracts import ToolInput, ToolResult
from perdure.workflows.shared.host_workspaces import (
    WORKSPACE_MOVE,
    HostWorkspace,
    find_workspace,
    host_workspace,
    workspace_name,
)

WRITES = ("remote-write", "irreversible")

LOCAL_TIMEOUT = timedelta(seconds=30)
LOCAL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.5), maximum_attempts=3)
# A call not picked up this long after it was sent (the device died before the goal heard,
# or is busy) is sent again: it never started, so that is safe for any call.
PICKUP_AFTER = timedelta(seconds=30)
# Asking the registry to be told about devices, when it cannot be reached: retried after.
WATCH_RETRY_FIRST, WATCH_RETRY_MAX = timedelta(seconds=5), timedelta(minutes=5)
WAITING_PREFIX = "device:"


class Devices:
    def __init__(self, ctx: GoalContext) -> None:
        self._ctx = ctx
        # Devices the registry was asked about in this run (each run asks again: the
        # registry may have dropped this goal while it was between runs).
        self._watched: set[str] = set()
        self._named: tuple[int, list[str]] = (-1, [])  # (plan version, devices it names)

    # --- which device ------------------------------------------------------------------

    def device_of(self, node: Node | None) -> str | None:
        """The device a node's calls run on: a person's choice, else its plan step's, else the
        host of the goal's workspace (None: the workers)."""
        if node is None or node.kind not in ("tool", "agent"):
            return None
        return self._own_device(node.name) or self.host()

    def _own_device(self, name: str) -> str | None:
        """The device a person or the plan step put this node on (not the workspace's host)."""
        moved = self._ctx.state.device_moves.get(name)
        if moved:
            return moved
        try:
            step = self._ctx.plan().step(name)
        except KeyError:
            return None
        return step.device if isinstance(step, ToolStep | AgentStep) else None

    def runs_on(self, node: Node | None, tool: str) -> str | None:
        """The device this call of `tool` runs on, or None (a worker): an agent's
        read_artifact reads the workers' artifact store, so it stays there; on the goal's
        host, every call that needs the workspace (a user tool declared `workspace=True` too)."""
        return self._placed(self.device_of(node), tool)

    def approvals_ahead(self, steps: Iterable[PlanStep]) -> dict[str, tuple[str, str | None]]:
        """Step -> the device (or host) a plan's tool step will run on, and its root if the goal
        has heard of it, for each step whose call there waits for a person's approval as far as
        the goal knows at adoption: the device's own rules once it has announced them, else the
        goal's (approvals collected ahead, rules/approvals_ahead.py). A step on no device, in a
        goal with no host, is passed over at once: at 100,000 steps, looking each one up again
        made the adoption's workflow task the goal's longest."""
        host, moves = self.host(), self._ctx.state.device_moves
        found = {}
        for step in steps:
            if not isinstance(step, ToolStep) or (step.device is None and host is None and step.name not in moves):
                continue
            where = self._approval_ahead(step, moves.get(step.name) or step.device or host)
            if where is not None:
                found[step.name] = where
        return found

    def _approval_ahead(self, step: ToolStep, device: str | None) -> tuple[str, str | None] | None:
        name = self._placed(device, step.tool)
        if name is None:
            return None
        presence = self._ctx.state.devices.get(name)
        rules = presence.approval if presence is not None else {}
        if not needs_approval(step.tool, step.args, rules, self._ctx.state.spec.device_approval, self._ctx.tools()):
            return None
        return name, self.root_for(name, presence) if presence is not None else None

    def asks(self, entry: AheadApproval) -> bool:
        """Whether a call of an approvals-ahead card's step waits for a person on the device it
        was listed for: True until that device has announced its own rules."""
        presence = self._ctx.state.devices.get(entry.on or "")
        if presence is None:
            return True
        try:
            args = getattr(self._ctx.plan().step(entry.step), "args", None)
        except KeyError:
            args = None
        return needs_approval(
            entry.tool, args, presence.approval, self._ctx.state.spec.device_approval, self._ctx.tools()
        )

    def _placed(self, name: str | None, tool: str) -> str | None:
        spec = self._ctx.tools().get(tool)
        if not name or spec is None:
            return None
        return name if spec.on_devices or (spec.needs_workspace and name == self.host()) else None

    # --- the host of the goal's workspace ------------------------------------------------

    def bound(self) -> HostWorkspace | None:
        """The host and workspace the goal's spec names (`HOST:NAME`), or None (a path on the workers)."""
        return host_workspace(self._ctx.state.spec.workspace)

    def host(self) -> str | None:
        """The host the goal's workspace steps run on: the one a person moved them to, else the spec's."""
        bound = self.bound()
        if bound is None:
            return None
        return self._ctx.state.device_moves.get(WORKSPACE_MOVE) or bound.host

    def workspace_name(self) -> str:
        """The name of the goal's workspace, which every host holding it gives it (the spec may
        name it by its path on its first host)."""
        bound = self.bound()
        assert bound is not None
        first = self._ctx.state.devices.get(bound.host)
        return workspace_name(bound, first.workspaces if first is not None else None)

    def root_for(self, name: str, presence: DevicePresence) -> str | None:
        """Where a call on device `name` works: its root; on the goal's host, that host's path
        of the goal's workspace (None when it holds no workspace of that name)."""
        if self.bound() is None or name != self.host():
            return presence.root
        found = find_workspace(presence.workspaces, self.workspace_name())
        return found[1] if found else None

    def not_held(self, name: str, presence: DevicePresence) -> str:
        holds = ", ".join(f"{n} ({p})" for n, p in sorted(presence.workspaces.items())) or "none"
        return f"host {name} holds no workspace '{self.workspace_name()}' (it holds: {holds}); nothing was sent"

    def _kind(self, name: str) -> str:
        return "host" if self.bound() is not None and name == self.host() else "device"

    def _moves_workspace(self, node: Node, device: str) -> bool:
        """Whether moving this node off `device` moves the goal's workspace: it waits for the
        workspace's host, not for a device of its own."""
        return self.bound() is not None and device == self.host() and self._own_device(node.name) is None

    # --- presence ----------------------------------------------------------------------

    def on_presence(self, args: Sequence[RawValue]) -> None:
        """The registry's signal: keep the newest presence of each device (by `seq`; an equal
        one is the answer to asking again after a lost call, and may say it is online)."""
        if len(args) != 1:
            workflow.logger.warning("device presence refused: it takes one argument", extra={"got": len(args)})
            return
        try:
            presence = workflow.payload_converter().from_payload(args[0].payload, DevicePresence)
        except Exception as err:  # noqa: BLE001 - any undecodable payload is refused, never a failed task
            workflow.logger.warning("device presence refused", extra={"error": str(err)[:300]})
            return
        known = self._ctx.state.devices.get(presence.name)
        if known is None and presence.name not in self._watched:
            # Only devices this goal asked about: a stray signal must not grow the state.
            workflow.logger.warning("device presence ignored: not this goal's", extra={"device": presence.name})
            return
        if known is not None and presence.seq < known.seq:
            return
        self._ctx.state.devices[presence.name] = presence
        self._ctx.wake()

    def watch(self) -> None:
        """Ask the registry about every device the plan names (or a person moved a step to)
        that this run has not asked about yet."""
        state = self._ctx.state
        if state.plan is None:
            return
        version = len(state.plan_versions)
        if self._named[0] != version:
            self._named = (version, devices_named(state.plan))
        names = set(self._named[1]) | set(state.device_moves.values())
        bound = self.bound()
        if bound is not None:
            names.add(bound.host)  # its presence names the workspace even after a move
        new = sorted(names - self._watched)
        if new:
            self._watched.update(new)
            asyncio.create_task(self._ask_registry(new))

    async def _ask_registry(self, names: list[str]) -> None:
        delay = WATCH_RETRY_FIRST
        while True:
            try:
                await workflow.get_external_workflow_handle(registry_id(workflow.info().task_queue)).signal(
                    RegistrySignals.WATCH, WatchDevices(goal_id=self._ctx.goal_id, names=names)
                )
                return
            except (ApplicationError, FailureError) as err:
                # No registry: no device ever announced itself (or it was terminated).
                self._ctx.log_gate(f"devices {', '.join(names)}: the device registry cannot be told ({err}); retrying")
                await workflow.sleep(delay)
                delay = min(delay * 2, WATCH_RETRY_MAX)

    async def listing(self) -> DeviceListingResult:
        return await workflow.execute_local_activity(
            Activities.LIST_DEVICES,
            result_type=DeviceListingResult,
            start_to_close_timeout=LOCAL_TIMEOUT,
            retry_policy=LOCAL_RETRY,
            summary="devices · list",
        )

    async def check_plan_devices(self, plan: Plan) -> dict[str, list[str]] | None:
        """Name -> tools of every known device, for a plan that names devices; None when it
        names none or the registry could not be asked (dispatch then says what is wrong)."""
        if not devices_named(plan):
            return None
        return (await self.listing()).offered()

    # --- waiting -----------------------------------------------------------------------

    async def ready(self, node: Node, name: str) -> DevicePresence:
        """The device's presence once it is online. While it is not, the node waits as
        state: its task ends (NodeWaiting) and `verdict` says when it runs again."""
        self.watch()
        state = self._ctx.state
        presence = state.devices.get(name)
        kind = self._kind(name)
        if presence is not None and not presence.known:
            self.forget(node.name)
            raise NodeFailed(f"no {kind} named '{name}' has announced itself (see `perdure devices`)")
        if presence is not None and presence.online:
            self._end_wait(node, f"{kind} {name} is online")
            return presence
        self._ctx.stop_point(node)
        wait = state.device_waits.get(node.name)
        if wait is None or wait.device != name:
            state.device_waits[node.name] = DeviceWait(device=name, since=workflow.now())
        node.waiting_on = WAITING_PREFIX + name
        self._ctx.set_status(node, "offline")
        self._ctx.wake()
        raise NodeWaiting(f"waiting for {kind} {name}")

    def verdict(self, node: Node) -> str | None:
        """For a node waiting for its device: `resume` (the device is back, or a person chose
        another, or it never existed and the node fails saying so), `skip` (a person said
        so), or None (keep waiting)."""
        state = self._ctx.state
        wait = state.device_waits.get(node.name)
        question = self._question(wait)
        if wait is not None and question is not None and question.decided:
            answer = question.answer or ""
            wait.question = None
            if answer == "skip":
                return "skip"
            if answer.startswith(WAITING_PREFIX):
                # A host's card moves the goal's workspace: every later workspace step goes there too.
                moved = WORKSPACE_MOVE if self._moves_workspace(node, wait.device) else node.name
                state.device_moves[moved] = answer.removeprefix(WAITING_PREFIX)
                state.device_waits.pop(node.name, None)
                self.watch()
                return "resume"
            wait.since = workflow.now()  # "wait": another device_wait_s from now
        name = self.device_of(node)
        presence = state.devices.get(name or "")
        if presence is not None and (presence.online or not presence.known):
            return "resume"
        return None

    def deadline(self) -> datetime | None:
        """When the earliest wait passes its limit and a person is asked; None without such a wait."""
        state = self._ctx.state
        due = [
            self._deadline(name, wait)
            for name, wait in state.device_waits.items()
            if not wait.question and name in state.nodes and state.nodes[name].status == "offline"
        ]
        return min(due, default=None)

    async def on_deadline(self) -> None:
        """Ask a person about every wait longer than its limit (one card per wait), with the
        other devices that could take the step as options."""
        state, now = self._ctx.state, workflow.now()
        due = [
            (name, wait)
            for name, wait in state.device_waits.items()
            if not wait.question
            and (node := state.nodes.get(name)) is not None
            and node.status == "offline"
            and now >= self._deadline(name, wait)
        ]
        if not due:
            return
        known = (await self.listing()).devices
        for name, wait in due:
            waited = (now - wait.since).total_seconds()
            node = state.nodes[name]
            others = self._alternatives(node, wait.device, known)
            workspace = self.workspace_name() if self._moves_workspace(node, wait.device) else None
            card = questions.device_offline(state, now, name, wait.device, waited, others, workspace)
            state.questions.append(card)
            wait.question = card.id
        self._ctx.wake()

    def _deadline(self, node_name: str, wait: DeviceWait) -> datetime:
        limit = self._ctx.state.spec.device_wait_s
        try:
            step = self._ctx.plan().step(node_name)
            limit = getattr(step, "device_wait_s", None) or limit
        except KeyError:
            pass
        return wait.since + timedelta(seconds=limit)

    def _alternatives(self, node: Node, device: str, known: list[DevicePresence]) -> list[tuple[str, bool]]:
        """Other known devices offering every device tool the node's step uses: (name, online);
        for a step waiting for the workspace's host, the other hosts holding that workspace."""
        try:
            step = self._ctx.plan().step(node.name)
        except KeyError:
            return []
        tools = [step.tool] if isinstance(step, ToolStep) else list(getattr(step, "tools", []))
        table = self._ctx.tools()
        needed = {t for t in tools if t in table and table[t].on_devices}
        holding = self.workspace_name() if self._moves_workspace(node, device) else None
        return [
            (p.name, p.online)
            for p in sorted(known, key=lambda p: p.name)
            if p.known
            and p.name != device
            and needed <= set(p.tools)
            and (holding is None or find_workspace(p.workspaces, holding) is not None)
        ]

    def _question(self, wait: DeviceWait | None) -> Question | None:
        if wait is None or wait.question is None:
            return None
        return next((q for q in self._ctx.state.questions if q.id == wait.question), None)

    def _end_wait(self, node: Node, why: str) -> None:
        wait = self._ctx.state.device_waits.pop(node.name, None)
        question = self._question(wait)
        if question is not None and question.status == "open":
            question.status, question.answered_at = "closed", workflow.now()
            question.answer_text = f"not needed: {why}"

    def forget(self, node_name: str) -> None:
        """A node voided or left out: its wait (and its card) are over."""
        wait = self._ctx.state.device_waits.pop(node_name, None)
        question = self._question(wait)
        if question is not None and question.status == "open":
            question.status, question.answered_at = "closed", workflow.now()
            question.answer_text = f"not needed: step '{node_name}' no longer waits for device {wait.device}"

    # --- approval ----------------------------------------------------------------------

    async def approved(self, node: Node, name: str, tool_input: ToolInput, presence: DevicePresence) -> Question | None:
        """None when the call may run on the device; the refused card when a person said no.
        The device's rule for the tool wins over the goal's (device_contracts.needs_approval)."""
        args = tool_input.args or {}
        rules = self._ctx.state.spec.device_approval
        if not needs_approval(tool_input.tool, args, presence.approval, rules, self._ctx.tools()):
            return None
        root = self.root_for(name, presence)
        ahead = approvals_ahead.latest(self._ctx.state, node.name)
        changed = ""
        if ahead is not None:
            card, entry = ahead
            if card.status == "open":
                await self._ctx.ask(node, card)  # the step waits for the card that lists it
            if entry.decision == "refused":
                return card
            if entry.decision == "approved":
                _, digest = approvals_ahead.bound_arguments(tool_input.tool, args)
                if (
                    entry.on == name
                    and entry.root in (None, root)
                    and approvals_ahead.matches(entry, tool_input.tool, args, digest)
                ):
                    # Bound to the root it first runs in: the same call in another root asks again.
                    entry.root = root
                    return None
                changed = f" (approved earlier as {entry.line_of_call()}; now different)"
        call = {"call": tool_input.node_key, "tool": tool_input.tool, "args": args, "on": name, "in": root}
        key = "device-call:" + digest_of(call)
        question = self._ctx.question_about(node, key, "confirm_device_call") or questions.confirm_device_call(
            self._ctx.state,
            workflow.now(),
            node.name,
            tool_input.tool,
            f"{tool_input.tool} {canonical_json(args)[:600]}{changed}",
            name,
            root or presence.root,
            key,
        )
        answer = await self._ctx.ask(node, question)
        return None if answer == "approve" else question

    # --- the call ----------------------------------------------------------------------

    async def resolve(self, tool_input: ToolInput) -> ResolvedCall:
        """The call's arguments resolved on a worker (templates, a model's JSON): the device
        has no artifact store."""
        return await workflow.execute_local_activity(
            Activities.RESOLVE_DEVICE_CALL,
            tool_input,
            result_type=ResolvedCall,
            start_to_close_timeout=LOCAL_TIMEOUT,
            retry_policy=LOCAL_RETRY,
            summary=f"resolve · {tool_input.tool}",
        )

    async def call(self, tool_input: ToolInput, summary: str, node: Node, name: str) -> ToolResult:
        """Run one call (arguments resolved) on the device, waiting while it is offline.

        `tool_input.workspace` is the root the call was resolved, keyed and approved for:
        a device now serving another root does not get it. A NodeWaiting raised here says
        whether an attempt may have run (`maybe_ran`), for the effect guard's record."""
        maybe_ran = False
        spec = self._ctx.tools().get(tool_input.tool)
        write = spec is None or spec.risk in WRITES  # a tool it does not know: the graver
        while True:
            try:
                presence = await self.ready(node, name)
            except NodeWaiting as waiting:
                waiting.maybe_ran = maybe_ran
                raise
            if tool_input.tool not in presence.tools:
                offers = ", ".join(presence.tools) or "nothing"
                return self._failed(tool_input, f"device {name} does not offer {tool_input.tool} (it offers: {offers})")
            root = self.root_for(name, presence)
            if root is None:
                return self._failed(tool_input, self.not_held(name, presence))
            if root != tool_input.workspace:
                return self._failed(
                    tool_input,
                    f"{self._kind(name)} {name} now works in {root}, not in {tool_input.workspace} where this call "
                    "was meant (and approved) to run; nothing was sent",
                )
            node.placements[tool_input.tool] = f"{self._kind(name)} {name}: the step runs there"
            try:
                result = await self._send(tool_input, summary, name, presence)
            except ActivityError as err:
                lost = _lost(err)
                if lost is None:
                    if not write:
                        raise
                    # A write whose call failed on the device: whether it landed is unknown.
                    return self._uncertain(
                        tool_input, f"{tool_input.tool} on device {name} failed and may have happened: {err.cause}"
                    )
                self._lost(name, presence, f"{summary}: {lost}")
                if lost != "not started":
                    maybe_ran = True
                if node.name in self._ctx.stopping:
                    # The goal is stopping: no waiting for the device to come back.
                    if maybe_ran:
                        return self._uncertain(tool_input, f"{tool_input.tool} on device {name} was interrupted")
                    return self._failed(tool_input, f"{tool_input.tool} was not sent: the goal is stopping")
                if lost == "not started" or self._replay_safe(tool_input):
                    continue  # waits for the device, then runs it again
                return self._uncertain(
                    tool_input, f"{tool_input.tool} on device {name} was interrupted ({lost}) and may have run"
                )
            newest = self._ctx.state.devices.get(name, presence)
            if result.generation < newest.generation:
                maybe_ran = True
                self._ctx.log_gate(
                    f"{node.name}: refused a result from device {name} session {result.generation}: "
                    f"session {newest.generation} started since"
                )
                if self._replay_safe(tool_input) and node.name not in self._ctx.stopping:
                    continue
                return self._uncertain(
                    tool_input,
                    f"{tool_input.tool} on device {name} answered from session {result.generation}, replaced by "
                    f"session {newest.generation} since; its result is not trusted "
                    f"(it said: {'ok' if result.ok else result.error})",
                )
            return await self._kept(tool_input, name, result)

    async def undo(self, tool_input: ToolInput, summary: str, name: str) -> ToolResult:
        """A compensation for an effect on a device (abort with rollback): run there once if
        the device is online; otherwise it is left for a person, saying what to undo."""
        presence = self._ctx.state.devices.get(name)
        what = f"{tool_input.tool} {canonical_json(tool_input.args or {})[:300]}"
        if presence is None or not presence.online:
            return self._failed(tool_input, f"{self._kind(name)} {name} is offline: undo it there by hand ({what})")
        root = self.root_for(name, presence)
        if root is None:
            return self._failed(tool_input, self.not_held(name, presence))
        tool_input = tool_input.model_copy(update={"workspace": root, "resolved": True})
        try:
            result = await self._send(tool_input, summary, name, presence)
        except ActivityError as err:
            lost = _lost(err)
            if lost is None:
                raise
            return self._failed(tool_input, f"device {name} was lost during the undo ({lost}): check {what} there")
        return await self._kept(tool_input, name, result)

    async def _kept(self, tool_input: ToolInput, name: str, result: DeviceToolResult) -> ToolResult:
        """The device's outcome as the goal's result; its output kept in the workers' store."""
        # A compensation from a catalogue listed before compensations were in it has no spec.
        spec = self._ctx.tools().get(tool_input.tool)
        risk = spec.risk if spec is not None else None
        if result.output is None:
            return ToolResult(
                call_id=tool_input.call_id,
                tool=result.tool,
                risk=risk,
                ok=result.ok,
                error=result.error,
                effect_key=result.effect_key,
                uncertain=result.uncertain,
                receipt=result.receipt,
                compensation=result.compensation,
                cost_usd=result.cost_usd,
                fingerprints=result.fingerprints,
            )
        return await workflow.execute_local_activity(
            Activities.STORE_DEVICE_OUTPUT,
            DeviceOutput(call_id=tool_input.call_id, risk=risk, result=result),
            result_type=ToolResult,
            start_to_close_timeout=LOCAL_TIMEOUT,
            retry_policy=LOCAL_RETRY,
            summary=f"keep output · {tool_input.tool} on {name}",
        )

    async def _send(self, tool_input: ToolInput, summary: str, name: str, presence: DevicePresence) -> DeviceToolResult:
        # One attempt: the goal decides what a lost one means (wait for the device, ask).
        # The heartbeat outlasts the device's lease, so by the time a call is judged lost
        # the registry has usually said the device is offline.
        return await workflow.execute_activity(
            DeviceActivities.RUN_TOOL,
            DeviceToolInput(
                goal_id=tool_input.goal_id,
                node_key=tool_input.node_key,
                call_id=tool_input.call_id,
                tool=tool_input.tool,
                args=tool_input.args or {},
                root=tool_input.workspace,
                generation=presence.generation,
                network=tool_input.network,
                confirmed=tool_input.confirmed,
                resolution=tool_input.resolution,
                fence=tool_input.fence,
                based_on=tool_input.based_on,
            ),
            result_type=DeviceToolResult,
            task_queue=device_queue(name, workflow.info().task_queue),
            schedule_to_start_timeout=PICKUP_AFTER,
            start_to_close_timeout=tool_timeout(tool_input, self._ctx.tools().get(tool_input.tool)),
            heartbeat_timeout=timedelta(seconds=presence.lease_s * 1.5),
            retry_policy=RetryPolicy(maximum_attempts=1),
            summary=f"{summary} · on device {name}",
        )

    def _lost(self, name: str, presence: DevicePresence, why: str) -> None:
        """Believe the device offline until the registry says otherwise, and ask it again
        (it answers with the current presence, which may still be online)."""
        self._ctx.log_gate(f"{self._kind(name)} {name} lost a call ({why})")
        current = self._ctx.state.devices.get(name, presence)
        self._ctx.state.devices[name] = current.model_copy(update={"online": False})
        self._watched.discard(name)
        self.watch()

    def _replay_safe(self, tool_input: ToolInput) -> bool:
        """Whether a call whose attempt was lost may simply run again."""
        if tool_input.tool == "run_command":
            try:
                args = RunCommandArgs.model_validate(tool_input.args or {})
            except ValueError:
                return False
            return decide_command_retry(2, args) == "run"
        spec = self._ctx.tools().get(tool_input.tool)
        return spec is not None and spec.replay != "once"

    async def check_on_host(self, tool_input: ToolInput, summary: str) -> ToolResult | None:
        """A park's check (park_conditions) where the goal's workspace lives: None when it lives
        on the workers. One attempt, never a wait: while the host is offline, holds no such
        workspace or loses the call, the condition does not hold yet and is checked again later."""
        name = self.host()
        if name is None:
            return None
        self.watch()
        presence = self._ctx.state.devices.get(name)
        if presence is None or not presence.online:
            return self._failed(tool_input, f"host {name} is offline; checked again later")
        root = self.root_for(name, presence)
        if root is None:
            return self._failed(tool_input, self.not_held(name, presence))
        try:
            result = await self._send(tool_input.model_copy(update={"workspace": root}), summary, name, presence)
        except ActivityError as err:
            return self._failed(tool_input, f"the check on host {name} did not answer: {err.cause}")
        # Only whether it held matters: its output is not kept.
        return ToolResult(call_id=tool_input.call_id, tool=tool_input.tool, ok=result.ok, error=result.error)

    def _failed(self, tool_input: ToolInput, error: str) -> ToolResult:
        spec = self._ctx.tools().get(tool_input.tool)
        return ToolResult(
            call_id=tool_input.call_id, tool=tool_input.tool, risk=spec.risk if spec else None, ok=False, error=error
        )

    def _uncertain(self, tool_input: ToolInput, error: str) -> ToolResult:
        result = self._failed(tool_input, error)
        return result.model_copy(update={"uncertain": True})


def _lost(err: ActivityError) -> str | None:
    """How a device call was lost, or None for a failure of the call itself."""
    cause = err.cause
    if isinstance(cause, TimeoutError):
        if cause.type == TimeoutType.SCHEDULE_TO_START:
            return "not started"
        return "the device stopped answering"
    if isinstance(cause, ApplicationError) and cause.type in ("DeviceSuperseded", "DeviceNotReady"):
        return "not started"  # a replaced (or re-announcing) daemon refused it before running anything
    return None
