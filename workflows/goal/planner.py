"""Plans: the first plan (a plan file, or the planner model with repairs), the drift
check every few finished nodes, and the follow-up plan for queued work.

Workflow code: it calls model activities through ModelCalls and hands every new
plan to the scheduler, which adopts it (reusing finished work by key).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.contracts import Activities, ArtifactRef, DriftInput, DriftResult, PlanInput, PlanResult, PlanRevision
from workflows.device_contracts import DevicePresence
from workflows.goal.context import GoalContext, GoalFailed
from workflows.goal.devices import Devices
from workflows.goal.inbox import Inbox
from workflows.goal.model_calls import ModelCalls
from workflows.goal.scheduler import Scheduler
from workflows.goal.tool_runner import failure_message
from workflows.messages import InboxEntry
from workflows.plan import Plan, check_plan
from workflows.state import PlanVersion


class Planner:
    def __init__(
        self, ctx: GoalContext, calls: ModelCalls, scheduler: Scheduler, inbox: Inbox, devices: Devices
    ) -> None:
        self._ctx = ctx
        self._calls = calls
        self._scheduler = scheduler
        self._inbox = inbox
        self._devices = devices

    async def make_plan(self) -> None:
        state, spec = self._ctx.state, self._ctx.state.spec
        if spec.plan is not None:
            devices = await self._devices.check_plan_devices(spec.plan) if self._ctx.lists_devices else None
            problems = check_plan(spec.plan, spec.allowed_tools, devices)
            if problems:
                raise GoalFailed("the plan file cannot run: " + "; ".join(problems))
            state.plan_versions.append(
                PlanVersion(version=1, plan=spec.plan, reason="declarative plan from the user", source="plan-file")
            )
            return
        plan, repairs = await self._ask(None)
        reason = "planned from the goal" if not repairs else f"planned after {repairs} repair(s)"
        state.plan_versions.append(PlanVersion(version=1, plan=plan, reason=reason, source="planner"))

    def drift_check_due(self) -> bool:
        state = self._ctx.state
        every = state.spec.drift_every
        return bool(every) and self._ctx.index().count(("succeeded",)) >= (state.drift_checks + 1) * every

    async def check_drift(self) -> None:
        """Does finishing this plan still satisfy the goal? If not, replan."""
        state = self._ctx.state
        state.drift_checks += 1
        finished = self._finished()
        summary = f"drift check {state.drift_checks}"
        try:
            verdict = await self._calls.run(
                Activities.DRIFT_CHECK,
                DriftInput(context=self._calls.context(summary), plan=self._ctx.plan(), finished=finished),
                DriftResult,
                summary,
            )
        except ActivityError as err:
            self._ctx.log_gate(f"{summary} could not run: {failure_message(err)}")
            return
        self._ctx.log_gate(f"{summary}: {'on track' if verdict.on_track else 'drifting'} ({verdict.reason})")
        if verdict.on_track:
            return
        revision = PlanRevision(
            reason=f"a drift check found: {verdict.reason}", current=self._ctx.plan(), finished=finished
        )
        try:
            plan, _ = await self._ask(revision)
        except GoalFailed as err:
            self._ctx.log_gate(f"replanning after the drift check failed: {err}")
            return
        self._scheduler.adopt_plan(plan, "drift", f"drift check: {verdict.reason}")

    async def plan_follow_up(self, queued: list[InboxEntry]) -> None:
        """The goal would be idle: plan the queued follow-up work as a new plan version."""
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
        described: dict[str, str] | None = None
        offered: dict[str, list[str]] | None = None
        if self._ctx.lists_devices:
            # The planner is told which devices exist; a plan naming another is refused.
            listing = await self._devices.listing()
            offered = listing.offered()
            described = {d.name: describe_device(d) for d in listing.devices} if offered is not None else None
        for attempt in range(1, attempts + 1):
            summary = label if attempt == 1 else f"{label} · repair {attempt - 1} of {spec.max_plan_repairs}"
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
                    ),
                    PlanResult,
                    summary,
                )
            except ActivityError as err:
                raise GoalFailed(f"the planner call failed: {failure_message(err)}") from err
            if result.plan is not None:
                return result.plan, attempt - 1
            rejected, rejection = result.raw, result.error
            workflow.logger.info("plan rejected", extra={"attempt": attempt, "reason": rejection})
        raise GoalFailed(f"the planner gave no valid plan in {attempts} attempt(s); last problem: {rejection}")

    def _finished(self) -> dict[str, str]:
        return {n.name: n.preview for n in self._ctx.state.nodes.values() if n.status == "succeeded"}


def describe_device(device: DevicePresence) -> str:
    """One device for the planner: whether it is online, where it works, what it offers."""
    state = "online" if device.online else "offline (its steps wait until it is back)"
    network = "commands may use the network" if device.network else "no network for commands"
    return f"{state}; works in {device.root}; offers {', '.join(device.tools) or 'nothing'}; {network}"
