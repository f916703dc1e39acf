"""`PerdureClient`: the operations on goals that the CLI, the web UI's server and the MCP
server share, over one temporalio Client, each implemented once (in the modules beside
this one) and typed: start a goal (idempotent by id), send any steering message (each
carries its request id), read a goal's progress, inbox, events, result and report, list
goals, talk to the user's router, fork and compare goals.

The seed of issue 36's public `perdure.Client`; not exported yet. It decides nothing a
front end says: each one turns the results and the errors (client_errors.py) into its own
output (a line and an exit code, an HTTP status, an MCP tool error).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionDescription, WorkflowHistory

from perdure.runtime import settings
from perdure.runtime.connect import connect
from perdure.starters.client import (
    goal_events,
    goal_forks,
    goal_reads,
    goal_starts,
    message_delivery,
    router_calls,
    start_checks,
)
from perdure.starters.client.client_errors import EndedWithoutResult
from perdure.starters.client.goal_events import StreamItem
from perdure.starters.client.goal_forks import GoalSide
from perdure.starters.client.goal_reads import ClosedReport, PendingActivity
from perdure.starters.client.goal_starts import StartAnswer
from perdure.starters.client.message_delivery import AdmittedMessage, Delivery, InboxResult
from perdure.workflows.goal.contracts.goal_contracts import GoalResult, GoalSpec, ProgressSnapshot
from perdure.workflows.goal.contracts.messages import InboxView
from perdure.workflows.goal.rules.forking import ForkPoint
from perdure.workflows.offers.worker_offers import PublishedOffer
from perdure.workflows.router.router_contracts import RouterView, Routing, Say


class PerdureClient:
    """perdure's goals, as a program reaches them through Temporal (`temporal`: a connected
    temporalio Client, perdure.runtime.connect's, whose data converter is the workers')."""

    def __init__(self, temporal: Client) -> None:
        self.temporal = temporal

    @classmethod
    async def connect(cls, address: str | None = None, namespace: str | None = None) -> PerdureClient:
        """Connected as the CLI is: PERDURE_TEMPORAL (or a Temporal profile), PERDURE_NAMESPACE,
        the payload keys and store. ServerUnavailable when no server answers."""
        return cls(await connect(address, namespace))

    # --- starting ---------------------------------------------------------------

    async def start(self, spec: GoalSpec, goal_id: str, *, replace: bool = False) -> StartAnswer:
        """Start the goal under `goal_id` after checking it against what the workers offer
        (NotOffered when they lack its profile, a tool or a device); a start repeated with
        the same spec names the goal already there (`started` False). StartRefused for
        another spec under a live id, or a finished goal's id without `replace`."""
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
        return message_delivery.new_request_id(prefix)

    async def send(self, goal_id: str, message: BaseModel) -> Delivery:
        """Send a steering message (a perdure.workflows.goal.contracts.messages model: steer,
        queue, answer, approve, park, resume, narrow, rewind, abort) under its request id:
        the goal's receipt when a worker judged it at once, else stored by the server and
        judged in its turn. Sent again with the same request id, it is the same message.
        GoalNotFound, GoalEnded, MessageRejected say why it was not taken."""
        return await message_delivery.deliver(self.temporal, goal_id, message)

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
        return await goal_reads.pending_activities(self.temporal, desc)

    async def published_ending(self, desc: WorkflowExecutionDescription) -> GoalResult | EndedWithoutResult | None:
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
        return await message_delivery.admitted(self.temporal, goal_id)

    def events(self, goal_id: str, offset: int = 0) -> AsyncIterator[StreamItem]:
        """The goal's events from `offset` until it ends (look it up first: a goal that is
        not there ends the iteration with a `closed` notice)."""
        return goal_events.events(self.temporal, goal_id, offset)

    async def result(self, goal_id: str, run_id: str | None = None) -> GoalResult:
        """Wait for the goal to end: its result however it ended (failed and aborted goals
        carry theirs); EndedWithoutResult when it was terminated, timed out or cancelled."""
        return await goal_reads.result(self.temporal, goal_id, run_id)

    async def report(self, goal_id: str) -> ClosedReport:
        """A closed goal's report and outcome; StillRunning, EndedWithoutResult or
        ResultUnreadable say why there is none."""
        return await goal_reads.closed_report(self.temporal, goal_id)

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
