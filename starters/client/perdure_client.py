"""`Client` (public as `perdure.Client`; `PerdureClient` inside perdure, apart from
temporalio's Client): the operations on goals that Python programs, the CLI, the web UI's
server and the MCP server share, over one temporalio Client, each implemented once (in the
modules beside this one) and typed: start a goal from text or a plan (idempotent by id),
send any steering message (each carries its request id; one method per verb in
steering_verbs.py), list and answer questions, read a goal's progress, inbox, events,
result, report and decision log, list goals, talk to the user's router, fork and compare goals.

It decides nothing a front end says: each one turns the results and the errors
(client_errors.py) into its own output (a line and an exit code, an HTTP status, an MCP
tool error, an exception a program catches).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime

from pydantic import BaseModel
from temporalio.client import Client as TemporalClient
from temporalio.client import WorkflowExecution, WorkflowExecutionDescription, WorkflowHistory

from perdure.runtime import settings
from perdure.runtime.connect import connect, settle_at_exit
from perdure.starters.client import (
    goal_decisions,
    goal_events,
    goal_forks,
    goal_reads,
    goal_specs,
    goal_starts,
    message_delivery,
    router_calls,
    start_checks,
)
from perdure.starters.client.client_errors import EndedWithoutResult
from perdure.starters.client.goal_decisions import DecisionRead
from perdure.starters.client.goal_events import StreamItem
from perdure.starters.client.goal_forks import GoalSide
from perdure.starters.client.goal_reads import ClosedReport, PendingActivity
from perdure.starters.client.goal_specs import PlanSource
from perdure.starters.client.goal_starts import StartAnswer
from perdure.starters.client.message_delivery import AdmittedMessage, Delivery, InboxResult
from perdure.starters.client.steering_verbs import SteeringVerbs
from perdure.workflows.goal.contracts.goal_contracts import GoalResult, GoalSpec, ProgressSnapshot, QuestionView
from perdure.workflows.goal.contracts.messages import InboxView
from perdure.workflows.goal.rules.forking import ForkPoint
from perdure.workflows.offers.worker_offers import PublishedOffer
from perdure.workflows.router.router_contracts import RouterView, Routing, Say


class Client(SteeringVerbs):
    """perdure's goals, as a program reaches them through Temporal.

    `await Client.connect()` connects as the `perdure` command does; `Client(temporal)`
    wraps a temporalio Client you connected yourself, with perdure's data converter
    (`perdure.connect()`, or `perdure.PerdurePlugin`). Every call that asks the server is a
    coroutine (`events` an async iterator); errors are `perdure.PerdureError`s that say why
    (`perdure.GoalNotFound`, ...).
    """

    def __init__(self, temporal: TemporalClient) -> None:
        self.temporal = temporal
        settle_at_exit()  # a client connected by the program itself, too

    @classmethod
    async def connect(cls, address: str | None = None, namespace: str | None = None) -> Client:
        """Connected as the CLI is: PERDURE_TEMPORAL (or the Temporal profile file and
        TEMPORAL_* variables), PERDURE_NAMESPACE, the payload keys and store; `address` and
        `namespace` override them. ServerUnavailable when no server answers."""
        return cls(await connect(address, namespace))

    # --- starting ---------------------------------------------------------------

    async def start(
        self,
        goal: str | None = None,
        *,
        plan: PlanSource | None = None,
        goal_id: str | None = None,
        request_id: str | None = None,
        workspace: str | os.PathLike = ".",
        profile: str = "default",
        tools: Sequence[str] | None = None,
        constraints: Sequence[str] = (),
        premises: Mapping[str, str] | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        max_wall: int | None = None,
        deadline: datetime | None = None,
        no_budget: bool = False,
        allow_network: bool = False,
        replace: bool = False,
        question_deadline: str | None = None,
        remind_before: str | None = None,
        on_expiry: str | None = None,
    ) -> StartAnswer:
        """Start a goal from its text, a plan, or both, with `perdure start`'s options.

        `plan` is a `perdure.Plan`, a plan file's content as a mapping, or a plan file's
        path (YAML or JSON); a plan's own `goal` is the text when `goal` is not given.
        Without `tools`, the goal may use the safe tools and those the plan names.
        Without a token or cost limit the goal gets the default token budget
        (`no_budget` for none). `workspace` is resolved here, and must be the same
        path on the workers' machine. Each question the goal asks waits
        `question_deadline` (a duration, default 48h), reminds `remind_before` it, then
        decides `on_expiry` (deny, park or abort; default: deny a write, park otherwise).

        Idempotent by id: with the same `goal_id` (or the same `request_id`, which
        names the goal when no id is given) and the same options, a start repeated
        names the goal already there (`started` False). Without either, each call
        starts a new goal under an id made from its text (`StartAnswer.goal_id`).

        Raises InvalidRequest (BadPlanFile for the plan) before anything is sent,
        NotOffered when the workers lack its profile, a tool or a device, and
        StartRefused for other options under a running goal's id, or a finished
        goal's id without `replace`.
        """
        body, where = goal_specs.start_request(
            plan,
            goal=goal,
            id=goal_id,
            request_id=request_id,
            workspace=os.fspath(workspace),
            profile=profile,
            tools=list(tools) if tools is not None else None,
            constraints=list(constraints),
            premises=dict(premises or {}),
            max_tokens=max_tokens,
            max_cost=max_cost,
            max_wall=max_wall,
            deadline=deadline,
            no_budget=no_budget,
            allow_network=allow_network,
            replace=replace,
            question_deadline=question_deadline,
            remind_before=remind_before,
            on_expiry=on_expiry,
        )
        spec, gid = goal_specs.start_spec(body, where)
        return await self.start_spec(spec, gid, replace=replace)

    async def start_spec(self, spec: GoalSpec, goal_id: str, *, replace: bool = False) -> StartAnswer:
        """Start a goal from a ready `perdure.GoalSpec` under `goal_id`, after checking it
        against what the workers offer (NotOffered when they lack its profile, a tool or a
        device); a start repeated with the same spec names the goal already there (`started`
        False). StartRefused for another spec under a live id, or a finished goal's id
        without `replace`. A spec gets what every start gets where it says nothing
        (goal_specs.with_start_defaults)."""
        spec = goal_specs.with_start_defaults(spec)
        warnings = await start_checks.start_warnings(self.temporal, spec)
        answer = await goal_starts.start_or_existing(self.temporal, spec, goal_id, replace)
        return dataclasses.replace(answer, warnings=tuple(warnings))

    async def offers(self) -> list[PublishedOffer]:
        """What the workers polling the goals' task queue offer (profiles, tools, MCP servers),
        newest first; NoWorkerAnswered, OffersUnreadable say why there is none."""
        return await start_checks.live_offers(self.temporal)

    async def worker_polls(self, goal_id: str) -> bool:
        """Whether a worker polls the goal's task queue: only then can the goal answer a
        query (else a query waits out its timeout). GoalNotFound when there is no goal."""
        desc = await self.describe(goal_id)
        return await start_checks.has_pollers(self.temporal, desc.task_queue)

    # --- steering ---------------------------------------------------------------

    @staticmethod
    def new_request_id(prefix: str = "cli") -> str:
        """A new request id, `PREFIX-` and 12 hex digits."""
        return message_delivery.new_request_id(prefix)

    async def send(self, goal_id: str, message: BaseModel) -> Delivery:
        """Send a steering message (a perdure.workflows.goal.contracts.messages model: steer,
        queue, answer, approve, park, resume, narrow, rewind, abort, escalate) under its
        request id: the goal's receipt when a worker judged it at once, else stored by the
        server and judged in its turn. Sent again with the same request id, it is the same
        message. GoalNotFound, GoalEnded, MessageRejected say why it was not taken. The
        verbs (`steer`, `approve`, ...) build the message and send it here. A message that
        does not say who sends it (`by`) is sent as this machine's user (PERDURE_USER, else
        the login name): the goal's decision log names them."""
        if getattr(message, "by", "") is None:
            message = message.model_copy(update={"by": settings.user()})
        delivery = await message_delivery.deliver(self.temporal, goal_id, message)
        return dataclasses.replace(delivery, request_id=getattr(message, "request_id", None))

    async def questions(self, goal_id: str, timeout_s: float = 5) -> list[QuestionView]:
        """The goal's open questions, each with its id, title and options (`option["id"]` is
        what `answer` takes; a confirmation's are approve / reject, see `approve`). A worker
        answers, as for `progress`."""
        return (await self.progress(goal_id, timeout_s)).questions

    # --- reading a goal ---------------------------------------------------------

    async def describe(self, goal_id: str) -> WorkflowExecutionDescription:
        """The server's facts of the goal (no worker needed); GoalNotFound when there is none."""
        return await goal_reads.describe(self.temporal, goal_id)

    async def progress(self, goal_id: str, timeout_s: float = 5) -> ProgressSnapshot:
        """The goal's progress snapshot, from the goal (a worker answers); GoalNotFound when
        there is no goal, RPCError when no worker answered in time."""
        return await goal_reads.progress(self.temporal, goal_id, timeout_s)

    async def stuck(self, desc: WorkflowExecutionDescription) -> str | None:
        """Why the goal cannot move (its workflow task fails: what the worker said), or None."""
        return await goal_reads.workflow_task_failure(self.temporal, desc)

    async def pending_activities(self, desc: WorkflowExecutionDescription) -> list[PendingActivity]:
        """The goal's activities running now: what each does, its attempt, its last heartbeat and failure."""
        return await goal_reads.pending_activities(self.temporal, desc)

    async def published_ending(self, desc: WorkflowExecutionDescription) -> GoalResult | EndedWithoutResult | None:
        """How a closed goal ended, from its close event (no worker needed); None when this
        machine cannot read it (a payload store or key it lacks)."""
        return await goal_reads.published_ending(self.temporal, desc)

    async def finished_text(self, goal_id: str) -> str:
        """How a closed goal ended, in a line: 'goal G has finished (outcome X); see ...'."""
        return await goal_reads.finished_text(self.temporal, await self.describe(goal_id))

    async def inbox(self, goal_id: str, timeout_s: float = 5) -> InboxView:
        """Every message the goal received with its receipt (a worker answers)."""
        return await message_delivery.inbox(self.temporal, goal_id, timeout_s)

    async def messages(self, goal_id: str, timeout_s: float = 5) -> InboxResult:
        """The inbox when a worker answers for the goal, else what the server admitted."""
        return await message_delivery.messages(self.temporal, goal_id, timeout_s)

    async def admitted(self, goal_id: str) -> list[AdmittedMessage]:
        """Every message the server holds in the goal's history, before any worker judged it."""
        return await message_delivery.admitted(self.temporal, goal_id)

    async def events(self, goal_id: str, offset: int = 0) -> AsyncIterator[StreamItem]:
        """The goal's events from `offset` (an item's `offset` + 1 resumes after it), until
        its `end` event; a `closed` notice ends a goal that ended without one, a `reset`
        notice says older events are no longer kept. `item.event` is the typed event. A
        worker answers the reads. GoalNotFound (at the first item) when there is no goal."""
        await self.describe(goal_id)
        async for item in goal_events.events(self.temporal, goal_id, offset):
            yield item

    async def result(self, goal_id: str, run_id: str | None = None) -> GoalResult:
        """Wait for the goal to end: its result however it ended (failed and aborted goals
        carry theirs); EndedWithoutResult when it was terminated, timed out or cancelled."""
        return await goal_reads.result(self.temporal, goal_id, run_id)

    async def report(self, goal_id: str) -> ClosedReport:
        """A closed goal's report and outcome; StillRunning, EndedWithoutResult or
        ResultUnreadable say why there is none."""
        return await goal_reads.closed_report(self.temporal, goal_id)

    async def decisions(self, goal_id: str, timeout_s: float = 5) -> DecisionRead:
        """The goal's decision log, every entry in order (`.entries`; `.of_kinds([...])` for some
        kinds): from the goal while it runs (a worker answers), from its result once it has
        ended (no worker needed); with no worker, what it carried into its current run, and
        `.notes` says what is missing and why. GoalNotFound when there is no goal."""
        return await goal_decisions.read(self.temporal, goal_id, timeout_s)

    async def history(self, goal_id: str, *, encoded: bool = False) -> WorkflowHistory:
        """The goal's event history, its payloads decrypted unless `encoded`."""
        await self.describe(goal_id)
        return await goal_reads.history(self.temporal, goal_id, encoded=encoded)

    # --- many goals -------------------------------------------------------------

    async def list_goals(self, query: str | None = None, limit: int = 50) -> list[WorkflowExecution]:
        """Goals, newest first, matching a visibility query (goal_reads.list_filters makes one)."""
        return await goal_reads.list_goals(self.temporal, query, limit)

    async def outcomes(self, executions: list[WorkflowExecution]) -> dict[str, str]:
        """Goal id -> how each closed goal of the listing ended ('?' where it cannot be read here)."""
        return await goal_reads.outcomes(self.temporal, executions)

    async def goal_texts(self, executions: list[WorkflowExecution]) -> dict[str, str]:
        """Goal id -> the goal's text, from the memo it started with."""
        return await goal_reads.goal_texts(self.temporal, executions)

    # --- the user's router ------------------------------------------------------

    async def say(self, message: Say, profile: str = "default") -> Routing | None:
        """What the router decided, or None when no worker decided in time (routed once one
        runs). SayRefused when the router refused the message."""
        return await router_calls.say(self.temporal, settings.user(), message, profile)

    async def router(self) -> RouterView:
        """The router's recent messages and decisions; RPCError when no worker answers, or
        NOT_FOUND when this user never said anything."""
        return await router_calls.view(self.temporal, settings.user())

    # --- forks ------------------------------------------------------------------

    async def fork_point(self, goal_id: str, node: str, premises: dict[str, str]) -> ForkPoint:
        """What a fork of the goal at `node` reuses and runs anew (ForkRefused, NoAnswer)."""
        return await goal_forks.read_fork_point(self.temporal, goal_id, node, premises)

    async def fork_side(self, goal_id: str) -> GoalSide:
        """A goal's snapshot and the steps it reused, for a comparison (NoAnswer)."""
        return await goal_forks.read_side(self.temporal, goal_id)
