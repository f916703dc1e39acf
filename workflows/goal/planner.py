"""Plans: the first plan (a plan file, or the planner model with repairs), the drift
check every few finished nodes, the re-plan on evidence (workflows/goal/rules/evidence.py judges
the settled steps; this room feeds it and acts on its trigger), and the follow-up plan
for queued work.

Workflow code: it calls model activities through ModelCalls and hands every new
plan to the scheduler, which adopts it (reusing finished work by key).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.workflows.devices.device_contracts import DevicePresence
from perdure.workflows.goal.context import GoalContext, GoalFailed
from perdure.workflows.goal.contracts.decision_contracts import MODEL
from perdure.workflows.goal.contracts.goal_contracts import (
    Activities,
    DriftInput,
    DriftResult,
    PlanInput,
    PlanResult,
    PlanRevision,
)
from perdure.workflows.goal.contracts.messages import InboxEntry
from perdure.workflows.goal.contracts.plan import Plan, ToolStep, check_plan, graph_checks
from perdure.workflows.goal.contracts.state import Node, PlanVersion
from perdure.workflows.goal.decision_log import plan_adopted
from perdure.workflows.goal.device_placement import Devices
from perdure.workflows.goal.inbox import Inbox
from perdure.workflows.goal.model_calls import ModelCalls
from perdure.workflows.goal.rules import drift_outline, evidence, frontier
from perdure.workflows.goal.rules.evidence import EvidenceTrigger
from perdure.workflows.goal.scheduler import Scheduler
from perdure.workflows.goal.spend import Spend
from perdure.workflows.goal.tool_runner import failure_message
from perdure.workflows.shared.contracts import ArtifactRef
from perdure.workflows.shared.host_workspaces import workspace_problem
from perdure.workflows.shared.mcp_tools import McpCatalogue, McpCatalogueInput, is_mcp_tool, names_mcp_tools
from perdure.workflows.shared.statuses import IN_FLIGHT
from perdure.workflows.shared.user_tools import UserToolCatalogue, UserToolCatalogueInput, user_tools_named

T = TypeVar("T", bound=BaseModel)

MCP_CATALOGUE_TIMEOUT = timedelta(seconds=90)
MCP_CATALOGUE_HEARTBEAT = timedelta(seconds=10)
# The activity answers a server it cannot reach as a problem; only a lost worker retries.
CATALOGUE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.5), maximum_attempts=3)
# A worker answers from memory: the tools it loaded at start.
USER_TOOLS_TIMEOUT = timedelta(seconds=30)
# Between two parts of a stored plan's checks: each in a workflow task of its own.
CHECK_PAUSE = timedelta(milliseconds=1)


class Planner:
    def __init__(
        self,
        ctx: GoalContext,
        calls: ModelCalls,
        scheduler: Scheduler,
        inbox: Inbox,
        devices: Devices,
        spend: Spend,
    ) -> None:
        self._ctx = ctx
        self._calls = calls
        self._spend = spend
        self._scheduler = scheduler
        self._inbox = inbox
        self._devices = devices
        # Re-planning on evidence: the nodes in flight at the last look, so what settled
        # since is found without a scan of every node per pass (nothing has a task at
        # continue-as-new, so a run starts with none); the steps a waiting trigger waits for.
        self._watched: dict[str, None] = {}
        self._waited_for: list[str] = []

    async def make_plan(self) -> None:
        state, spec = self._ctx.state, self._ctx.state.spec
        if (bound := self._devices.bound()) is not None:
            # A workspace no host offers is refused as a device no one announced is: before any work.
            listing = await self._devices.listing()
            if listing.error is None and (problem := workspace_problem(bound, listing.hosts())) is not None:
                raise GoalFailed(f"workspace {bound}: {problem}")
        if names_mcp_tools(spec.allowed_tools) and state.mcp is None:
            await self._list_mcp_tools()
        if user_tools_named(spec.allowed_tools, TOOL_SPECS) and state.user_tools is None:
            await self._list_user_tools()
        if spec.plan is not None:
            if spec.stored_plan is not None:
                await self._check_stored_graph(spec.plan)
            devices = await self._devices.check_plan_devices(spec.plan)
            missing = self._mcp_problems() | self._user_tool_problems()
            # A step naming a tool no catalogue has is said once, by the catalogue (why it is missing).
            said = tuple(
                f"step '{step.name}': unknown tool '{step.tool}'"
                for step in spec.plan.steps
                if isinstance(step, ToolStep) and step.tool in missing
            )
            checked = await self._checked(spec.plan, spec.allowed_tools, devices, spec.stored_plan is not None)
            problems = list(missing.values()) + [p for p in checked if not p.startswith(said)]
            if problems:
                raise GoalFailed("the plan file cannot run: " + "; ".join(problems))
            # A stored plan file was loaded into the spec as the run started (past.py): its refs go on.
            self._adopt_first(
                PlanVersion(
                    version=1,
                    plan=spec.plan,
                    reason="declarative plan from the user",
                    source="plan-file",
                    stored=spec.stored_plan,
                )
            )
            return
        plan, repairs = await self._ask(None)
        reason = "planned from the goal" if not repairs else f"planned after {repairs} repair(s)"
        self._adopt_first(PlanVersion(version=1, plan=plan, reason=reason, source="planner"))

    async def _check_stored_graph(self, plan: Plan) -> None:
        """A plan file the client stored was loaded chunk by chunk without its graph checked
        (past.py): each check in a workflow task of its own."""
        for problem in graph_checks(plan):
            if problem:
                raise GoalFailed(f"the plan file cannot run: {problem}")
            await workflow.sleep(CHECK_PAUSE)

    async def _checked(
        self, plan: Plan, allowed: list[str], devices: dict[str, list[str]] | None, in_chunks: bool
    ) -> list[str]:
        """check_plan's problems; a stored plan's a chunk of steps per workflow task."""
        tools = self._ctx.tools()
        if not in_chunks:
            return check_plan(plan, allowed, devices, tools)
        problems: dict[str, None] = {}
        size = frontier.PLAN_CHUNK_STEPS
        for i in range(0, len(plan.steps), size):
            part = Plan.model_construct(steps=plan.steps[i : i + size], question_deadline=plan.question_deadline)
            problems.update(dict.fromkeys(check_plan(part, allowed, devices, tools)))
            await workflow.sleep(CHECK_PAUSE)
        return list(problems)

    def _adopt_first(self, version: PlanVersion) -> None:
        self._ctx.state.plan_versions.append(version)
        plan_adopted(self._ctx, version)

    async def _list_mcp_tools(self) -> None:
        """The tools of the MCP servers the goal names, once: kept in the state, so every
        replay and later run plans and checks against the same catalogue. A server that
        cannot be reached is a problem the plan check states, not a retry loop."""
        servers = names_mcp_tools(self._ctx.state.spec.allowed_tools)
        self._ctx.state.mcp = await self._catalogue(
            Activities.MCP_CATALOGUE,
            McpCatalogueInput(servers=servers),
            McpCatalogue,
            f"mcp catalogue · {', '.join(servers)}",
            f"the tools of MCP servers {', '.join(servers)}",
            start_to_close_timeout=MCP_CATALOGUE_TIMEOUT,
            heartbeat_timeout=MCP_CATALOGUE_HEARTBEAT,
        )
        for server, problem in self._ctx.state.mcp.problems.items():
            self._ctx.log_gate(f"MCP server {server} offers no tools: {problem}")

    async def _list_user_tools(self) -> None:
        """The user's own tools the goal names, as a worker declares them, once: kept in the
        state like the MCP catalogue. A name no worker loads is a problem the plan check states."""
        names = user_tools_named(self._ctx.state.spec.allowed_tools, TOOL_SPECS)
        self._ctx.state.user_tools = await self._catalogue(
            Activities.USER_TOOLS_CATALOGUE,
            UserToolCatalogueInput(names=names),
            UserToolCatalogue,
            f"user tools · {', '.join(names)}",
            f"the tools {', '.join(names)}",
            start_to_close_timeout=USER_TOOLS_TIMEOUT,
        )

    async def _catalogue(
        self, name: str, arg: BaseModel, result_type: type[T], summary: str, what: str, **timeouts: timedelta
    ) -> T:
        """A catalogue of tools only a worker knows, listed by an activity; a worker lost every
        time ends the goal, saying `what` could not be listed."""
        try:
            return await workflow.execute_activity(
                name, arg, result_type=result_type, retry_policy=CATALOGUE_RETRY, summary=summary, **timeouts
            )
        except ActivityError as err:
            raise GoalFailed(f"{what} could not be listed: {failure_message(err)}") from err

    def _user_tool_problems(self) -> dict[str, str]:
        """Allowed user tools no worker loads: name -> why."""
        catalogue = self._ctx.state.user_tools
        if catalogue is None:
            return {}
        named = user_tools_named(self._ctx.state.spec.allowed_tools, TOOL_SPECS)
        return {tool: catalogue.unknown(tool) for tool in named if tool not in catalogue.tools}

    def _mcp_problems(self) -> dict[str, str]:
        """Allowed MCP tools the catalogue does not have, each with why (its server could
        not be reached, or does not offer it)."""
        catalogue = self._ctx.state.mcp
        if catalogue is None:
            return {}
        return {
            tool: catalogue.unknown(tool)
            for tool in self._ctx.state.spec.allowed_tools
            if is_mcp_tool(tool) and tool not in catalogue.tools
        }

    def drift_check_due(self) -> bool:
        state = self._ctx.state
        if state.evidence.pending is not None:
            return False  # a re-plan on evidence is under way: its plan comes first
        return drift_outline.drift_check_due(state.spec.drift_every, state.drift_checks, self._ctx.index())

    async def check_drift(self) -> None:
        """Does finishing this plan still satisfy the goal? If not, replan. The call is shown
        a bounded outline of the plan (workflows/goal/rules/drift_outline.py), and is not sent when the
        budget cannot afford it."""
        state = self._ctx.state
        state.drift_checks += 1
        summary = f"drift check {state.drift_checks}"
        outline = drift_outline.outline(self._ctx.plan(), state.nodes)
        tokens = drift_outline.call_tokens(outline, state)
        refused = self._spend.own_call_refused(summary, self._spend.call_estimate(tokens))
        if refused is not None:
            self._ctx.log_gate(refused)
            return
        payload = DriftInput(context=self._calls.context(summary), outline=outline)
        try:
            verdict = await self._calls.run(Activities.DRIFT_CHECK, payload, DriftResult, summary, own="drift check")
        except ActivityError as err:
            self._ctx.log_gate(f"{summary} could not run: {failure_message(err)}")
            return
        self._ctx.log_gate(f"{summary}: {'on track' if verdict.on_track else 'drifting'} ({verdict.reason})")
        if verdict.on_track:
            return
        # A plan change judges a large goal's stored steps too, and the planner is told them (past.py).
        if not await self._ctx.restore_past():
            return  # parked, saying why
        revision = PlanRevision(
            reason=f"a drift check found: {verdict.reason}", current=self._ctx.plan(), finished=self._finished()
        )
        try:
            plan, _ = await self._ask(revision)
        except GoalFailed as err:
            self._ctx.log_gate(f"replanning after the drift check failed: {err}")
            return
        self._scheduler.adopt_plan(plan, "drift", f"drift check: {verdict.reason}")

    # --- re-planning on evidence ---------------------------------------------------

    def evidence_trigger(self) -> EvidenceTrigger | None:
        """Take in the steps that settled since the last look; the re-plan on evidence due
        now, if a trigger holds and the spacing since the last one allows it. Only a goal
        the planner planned: a plan file is the user's plan, revised on their word (queue)
        or the drift check's, not on the runtime's heuristics."""
        state = self._ctx.state
        if not state.plan_versions or state.plan_versions[0].source != "planner":
            return None
        self._take_in_settled()
        log, spec = state.evidence, state.spec
        if log.pending is not None:
            return log.pending.trigger  # answered: it waits for the steps it lets finish
        found = evidence.trigger(log, spec.evidence_window, spec.min_new_information)
        if found is None:
            return None
        held = evidence.spacing_left(log, spec.evidence_window, spec.evidence_spacing_s, workflow.now())
        if held is not None:
            note = f"{found.kind}: {found.evidence}"
            if log.deferred != note:
                log.deferred = note
                self._ctx.log_gate(f"re-plan on evidence held off ({held}): {note}")
            return None
        return found

    def watch_in_flight(self) -> None:
        """After dispatching: the nodes now in flight are looked at again next time."""
        self._watched.update(dict.fromkeys(self._ctx.index().names(IN_FLIGHT)))

    def may_replan_now(self, trigger: EvidenceTrigger) -> bool:
        """A write in flight is never cut off; a trigger that waits lets the work in flight
        settle; an answered re-plan waits for the steps it lets finish and discard."""
        pending = self._ctx.state.evidence.pending
        if pending is not None:
            return not self._scheduler.finishing(pending.let_finish)
        if self._ctx.writes_in_flight and trigger.in_flight != "cancel":
            # A write in flight is never cut off: a trigger that cancels lets it finish (and
            # discards its step); any other waits for it to settle.
            return False
        if trigger.in_flight == "wait" and self._scheduler.busy():
            running = self._ctx.index().names(("running",))
            if running != self._waited_for:
                self._waited_for = running
                self._ctx.log_gate(
                    f"re-plan on evidence ({trigger.kind}) waits for the steps in flight: {', '.join(running)}"
                )
            return False
        return True

    async def replan_on_evidence(self, trigger: EvidenceTrigger) -> None:
        """Ask the planner for a plan that answers the evidence. What it keeps: finished
        steps it leaves unchanged (reused by key), the conclusions that still hold (it is
        told them), rejected paths (in every model context) and the constraints (the
        spec's, never the plan's). The steps in flight go as the trigger's policy says,
        per step under one that cancels (evidence.in_flight_choice): a step with an effect
        of its own in the air is let finish and discarded, and the new plan is adopted
        once those have settled (this is called again then)."""
        state = self._ctx.state
        log = state.evidence
        # A plan change judges a large goal's stored steps too, and the planner is told them (past.py).
        if not await self._ctx.restore_past():
            return  # parked, saying why: tried again once resumed
        if log.pending is not None:
            self._adopt_pending()
            return
        current = self._ctx.plan()
        valid = evidence.standing(log, self._is_current)
        revision = PlanRevision(
            reason=evidence.revision_reason(trigger, log, valid), current=current, finished=self._finished()
        )
        waited, self._waited_for = self._waited_for, []
        try:
            plan, _ = await self._ask(revision)
        except GoalFailed as err:
            # Counted as a re-plan: the spacing keeps a failing planner from being asked every pass.
            evidence.note_replanned(log, workflow.now(), len(state.plan_versions))
            self._ctx.log_gate(f"re-planning on evidence ({trigger.kind}) failed: {err}")
            return
        if trigger.in_flight != "cancel":
            done = f"waited for {', '.join(waited)}" if waited else "nothing was in flight"
            self._adopt(trigger, plan, done, valid)
            return
        choices = self._choices(current, plan)
        said = {name: f"{choice}: {why}" for name, (choice, why) in choices.items()}
        let_finish = [name for name, (choice, _) in choices.items() if choice == "let finish and discard"]
        if not let_finish:
            self._adopt(trigger, plan, describe_choices(said), valid)
            return
        # What may be cut off now is; what may not settles first, then the plan is adopted.
        cut = [name for name, (choice, _) in choices.items() if choice == "cancel"]
        self._scheduler.cancel_nodes(cut, f"cancelled by the re-plan on evidence ({trigger.kind})")
        self._scheduler.let_finish(let_finish)
        log.pending = evidence.PendingReplan(trigger=trigger, plan=plan, choices=said, let_finish=let_finish)
        self._ctx.log_gate(
            f"re-plan on evidence ({trigger.kind}) waits for {', '.join(let_finish)} to settle before its new plan: "
            f"{describe_choices(said)}"
        )

    def _adopt_pending(self) -> None:
        """The steps an answered re-plan let finish have settled, void (what they did kept on
        the node): its plan is adopted. Nothing else changes the plan meanwhile (the drift
        check waits, follow-up work waits for an idle goal); a rewind or narrow only voids
        nodes, and the plan adopted reuses what still stands by key."""
        log = self._ctx.state.evidence
        pending = log.pending
        assert pending is not None
        log.pending = None
        self._scheduler.end_discarding(pending.let_finish)
        valid = evidence.standing(log, self._is_current)
        self._adopt(pending.trigger, pending.plan, describe_choices(pending.choices), valid)

    def _adopt(self, trigger: EvidenceTrigger, plan: Plan, done: str, valid: list[evidence.Conclusion]) -> None:
        """Make the plan current, its reason saying what happened to the steps in flight
        (`done`) and what it keeps."""
        state = self._ctx.state
        log = state.evidence
        old = {s.name: s for s in self._ctx.plan().steps}
        new = {s.name: s for s in plan.steps}
        kept = [n for n in self._ctx.index().names(("succeeded",)) if new.get(n) == old[n]]
        reason = (
            f"{trigger.kind}: {trigger.evidence}; in flight: {trigger.in_flight} ({trigger.why}): {done}; "
            f"kept {len(kept)} finished step(s), {len(valid)} conclusion(s) that hold, "
            f"{len(state.rejected_paths)} rejected path(s)"
        )
        self._scheduler.adopt_plan(plan, "evidence", reason)
        evidence.note_replanned(log, workflow.now(), len(state.plan_versions))
        # The plan version is in the decision log already (adopt_plan).
        self._ctx.log_gate(f"re-planned on evidence as plan v{len(state.plan_versions)}: {reason}", kind=None)

    def _choices(self, current: Plan, plan: Plan) -> dict[str, tuple[evidence.InFlightChoice, str]]:
        """Step in flight -> what happens to it and why, under a trigger that cancels."""
        old = {s.name: s for s in current.steps}
        new = {s.name: s for s in plan.steps}
        return {
            name: evidence.in_flight_choice(changed=new.get(name) != old[name], effect_in_air=self._in_air(name))
            for name in self._ctx.index().names(IN_FLIGHT)
        }

    def _in_air(self, name: str) -> str | None:
        """What of this step's own is on its way outside and cannot be called back: a
        write it sent that has not landed (a tool step's own, or one of an agent's tools)."""
        if not self._ctx.writes_in_flight.get(name):
            return None
        step = self._ctx.plan().step(name)
        tool = getattr(step, "tool", None)
        if tool is None:
            return "a remote write of one of its tools"
        spec = self._ctx.tools().get(tool)
        return "an irreversible effect" if spec is not None and spec.risk == "irreversible" else "a remote write"

    def _take_in_settled(self) -> None:
        """The watched nodes that settled by their own work (not reused), in the order they settled."""
        state = self._ctx.state
        settled: list[Node] = []
        for name in self._watched:
            node = state.nodes.get(name)
            if node is not None and node.status in ("succeeded", "failed") and not node.reused:
                settled.append(node)
        self._watched = dict.fromkeys(self._ctx.index().names(IN_FLIGHT))
        settled.sort(key=lambda n: (n.finished_at or workflow.now(), n.name))
        for node in settled:
            failed = node.status == "failed"
            evidence.record_settled(
                state.evidence,
                node=node.name,
                node_key=node.key,
                status="failed" if failed else "succeeded",
                text=(node.error or "") if failed else node.preview,
                states_findings=node.kind in ("llm", "agent"),
                at=node.finished_at or workflow.now(),
                plan_version=len(state.plan_versions),
                is_current=self._is_current,
                statements=None if failed else node.statements,
            )
            node.statements = None  # read: not carried in the state any longer

    def _is_current(self, name: str, key: str | None) -> bool:
        """Whether a step's output still stands: it did not run again or get voided since.
        A step a plan change left out after it finished still stands (its work is kept)."""
        node = self._ctx.state.nodes.get(name)
        return node is None or (node.status == "succeeded" and node.key == key)

    async def plan_follow_up(self, queued: list[InboxEntry]) -> None:
        """The goal would be idle: plan the queued follow-up work as a new plan version."""
        # A plan change judges a large goal's stored steps too, and the planner is told them (past.py).
        if not await self._ctx.restore_past():
            return  # parked, saying why: planned once resumed
        revision = PlanRevision(
            reason="the user queued follow-up work",
            current=self._ctx.plan(),
            finished=self._finished(),
            requests=[e.message.text for e in queued],
        )
        try:
            plan, _ = await self._ask(revision)
        except GoalFailed as err:
            for entry in queued:
                self._inbox.settle(entry, "rejected", f"could not plan it: {err}")
            return
        diff = self._scheduler.adopt_plan(plan, "queue", "planned queued follow-up work")
        version = len(self._ctx.state.plan_versions)
        for entry in queued:
            self._inbox.settle(entry, "applied", f"planned as plan v{version}", {"added": diff.added})

    async def _ask(self, revision: PlanRevision | None) -> tuple[Plan, int]:
        """A valid plan and how many repairs it took; GoalFailed when there is none."""
        spec = self._ctx.state.spec
        rejected: ArtifactRef | None = None
        rejection: str | None = None
        attempts = spec.max_plan_repairs + 1
        label = "replan" if revision else "plan"
        # The planner is told which devices exist; a plan naming another is refused.
        listing = await self._devices.listing()
        offered = listing.offered()
        described = {d.name: describe_device(d) for d in listing.devices} if offered is not None else None
        for attempt in range(1, attempts + 1):
            summary = label if attempt == 1 else f"{label} · repair {attempt - 1} of {spec.max_plan_repairs}"
            own = "repair" if attempt > 1 else "re-planning" if revision else "planning"
            try:
                result = await self._calls.run(
                    Activities.PLAN,
                    PlanInput(
                        context=self._calls.context(summary),
                        allowed_tools=spec.allowed_tools,
                        revision=revision,
                        attempt=attempt,
                        rejected=rejected,
                        rejection=rejection,
                        devices=described,
                        device_tools=offered,
                        mcp_tools=self._ctx.mcp_tools(spec.allowed_tools),
                        user_tools=self._ctx.user_tools(spec.allowed_tools),
                    ),
                    PlanResult,
                    summary,
                    own=own,
                )
            except ActivityError as err:
                raise GoalFailed(f"the planner call failed: {failure_message(err)}") from err
            if result.plan is not None:
                if result.rationale:
                    # The model's own words for its choice, before the plan is adopted (or not).
                    self._ctx.decide("reason", f"the planner's reason ({label}): {result.rationale}", MODEL)
                return result.plan, attempt - 1
            rejected, rejection = result.raw, result.error
            workflow.logger.info("plan rejected", extra={"attempt": attempt, "reason": rejection})
        raise GoalFailed(f"the planner gave no valid plan in {attempts} attempt(s); last problem: {rejection}")

    def _finished(self) -> dict[str, str]:
        return {n.name: n.preview for n in self._ctx.state.nodes.values() if n.status == "succeeded"}


def describe_choices(choices: dict[str, str]) -> str:
    """What happened to each step in flight, and why: `fix-a: let finish and discard: …`."""
    return "; ".join(f"{name}: {choice}" for name, choice in choices.items()) or "nothing was in flight"


def describe_device(device: DevicePresence) -> str:
    """One device for the planner: whether it is online, where it works, what it offers."""
    state = "online" if device.online else "offline (its steps wait until it is back)"
    network = "commands may use the network" if device.network else "no network for commands"
    if device.workspaces:
        # A host: a goal whose workspace it holds sends its steps there without `device`.
        held = ", ".join(sorted(device.workspaces))
        return f"{state}; a host holding workspaces {held} (a goal on one runs its file steps there by itself)"
    return f"{state}; works in {device.root}; offers {', '.join(device.tools) or 'nothing'}; {network}"
