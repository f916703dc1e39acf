"""The router's I/O (workflows/router/router_workflow.py): the user's goals as candidates, read from
Temporal's visibility and each goal's own progress or result, and the router's two model
calls, the choice of a goal for a message and the quick answer to a light request.

The model's replies go back as text: the router reads them itself (workflows/router/routing.py),
so a reply that does not parse is judged in the workflow, from history, the same on replay.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus, WorkflowHistoryEventFilterType
from temporalio.service import RPCError

from perdure.activities.heartbeat import Heartbeat
from perdure.activities.models.one_call import ask_once
from perdure.activities.models.profiles import ModelConfig
from perdure.workflows.goal.contracts.goal_contracts import GOAL_WORKFLOW, GoalResult, ProgressSnapshot, Queries
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.router.router_contracts import (
    AnswerInput,
    AnswerResult,
    Candidate,
    ChooseInput,
    ChooseResult,
    RouterActivities,
)
from perdure.workflows.shared import search_attributes as sa

CLOSE_EVENT = WorkflowHistoryEventFilterType.CLOSE_EVENT
# Goals that ended longer ago than this are no longer candidates.
ENDED_WITHIN = timedelta(days=30)
MAX_CANDIDATES = 30
QUERY_TIMEOUT = timedelta(seconds=5)
REPLY_CHARS = 4_000
GOAL_CHARS = 300
ROUTER_MARK = "[PERDURE-ROUTER]"
ANSWER_MARK = "[PERDURE-ROUTER-ANSWER]"
NEEDS_GOAL = "NEEDS_GOAL:"

CHOOSE_PROMPT = f"""{ROUTER_MARK} You route a user's message to the goal it is meant for.
The candidates are the user's goals (id, status, goal, files it owns). Choose:
- a candidate's id, when the message is about that goal's work (an ended goal gets a follow-up);
- "new", when it asks for new work that none of them covers;
- "answer", when it is a light request (a question, a one-off text) you could answer in one reply;
- the id of an open light conversation, when the message follows it up.
mode: "steer" when it corrects or guides the goal's current work, "queue" when it adds work for later.
confidence: how sure you are, 0 to 1; below 0.6 the user is asked instead.
Reply with JSON only: {{"target": "...", "mode": "steer", "confidence": 0.0, "reason": "..."}}"""

ANSWER_PROMPT = f"""{ANSWER_MARK} Answer the user's request briefly, in one reply, without tools.
If answering needs tools, files, browsing or several steps of work, reply with exactly one line:
{NEEDS_GOAL} <why, in a few words>"""


class RouterIO:
    """Register with a Worker as `activities=RouterIO(client, config).activities()`."""

    def __init__(self, client: Client, config: ModelConfig) -> None:
        self.client = client
        self.config = config

    def activities(self) -> list:
        return [self.candidates, self.choose, self.answer]

    @activity.defn(name=RouterActivities.CANDIDATES)
    async def candidates(self, user: str) -> list[Candidate]:
        """The user's goals (PerdureOwner): open ones and those that ended in the last 30
        days, newest first; subgoals are reached through their parents and are left out."""
        since = (datetime.now(UTC) - ENDED_WITHIN).strftime("%Y-%m-%dT%H:%M:%SZ")
        query = (
            f"WorkflowType = '{GOAL_WORKFLOW}' AND ExecutionStatus != 'ContinuedAsNew' "
            f"AND (ExecutionStatus = 'Running' OR CloseTime > '{since}') "
            # A goal started before goals had owners is taken as the user's.
            f"AND ({sa.OWNER.name} = '{user}' OR {sa.OWNER.name} IS NULL)"
        )
        found: list[WorkflowExecution] = []
        async with Heartbeat(lambda: f"listing the goals of {user}"):
            async for execution in self.client.list_workflows(query, limit=MAX_CANDIDATES * 2):
                if "--" not in execution.id:  # PARENT--STEP-RUN: a subgoal
                    found.append(execution)
                if len(found) >= MAX_CANDIDATES:
                    break
            return list(await asyncio.gather(*(self._candidate(e) for e in found)))

    async def _candidate(self, execution: WorkflowExecution) -> Candidate:
        handle = self.client.get_workflow_handle(execution.id, run_id=execution.run_id)
        if execution.status == WorkflowExecutionStatus.RUNNING:
            try:
                snap: ProgressSnapshot = await handle.query(
                    Queries.PROGRESS, result_type=ProgressSnapshot, rpc_timeout=QUERY_TIMEOUT
                )
            except RPCError:
                return Candidate(goal_id=execution.id, goal="", status="running (not answering)", open=True)
            status = "parked" if snap.parked else "needs a person" if snap.questions else snap.phase
            return Candidate(
                goal_id=execution.id,
                goal=snap.goal,
                status=status,
                open=True,
                workspace=snap.workspace,
                objects=snap.objects,
            )
        goal, workspace, objects = "", "", []
        async for event in handle.fetch_history_events(page_size=1):  # the start event only
            started = await self._decoded(event.workflow_execution_started_event_attributes.input.payloads, GoalInput)
            if started is not None:
                goal, workspace = started.spec.goal[:GOAL_CHARS], started.spec.workspace
            break
        async for event in handle.fetch_history_events(event_filter_type=CLOSE_EVENT):
            payloads = None
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
                payloads = event.workflow_execution_completed_event_attributes.result.payloads
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
                # A failed or aborted goal's result is the failure's details (GoalFailed).
                failure = event.workflow_execution_failed_event_attributes.failure
                payloads = failure.application_failure_info.details.payloads
            if payloads:
                result = await self._decoded(payloads[:1], GoalResult)
                objects = result.objects if result is not None else []
        status = execution.status.name.lower() if execution.status else "ended"
        return Candidate(
            goal_id=execution.id, goal=goal, status=status, open=False, workspace=workspace, objects=objects
        )

    async def _decoded(self, payloads, kind):
        try:
            [value] = await self.client.data_converter.decode(payloads, [kind])
        except Exception:  # noqa: BLE001 - an unreadable old goal is still a candidate, by its summary
            return None
        # A worker without the client's payload key gets an UndecryptedInput for a GoalInput.
        return value if isinstance(value, kind) else None

    @activity.defn(name=RouterActivities.CHOOSE)
    async def choose(self, input: ChooseInput) -> ChooseResult:
        listed = [
            {"id": c.goal_id, "status": c.status, "goal": c.goal, "owns": c.objects[:20]} for c in input.candidates
        ]
        user = "\n\n".join(
            [
                f"Message: {input.text}",
                "Candidates:\n" + (json.dumps(listed, ensure_ascii=False, indent=1) if listed else "(none)"),
                "Recent:\n" + ("\n".join(f"- {line}" for line in input.recent) or "(nothing)"),
            ]
        )
        text, tokens, cost = await self._ask(input.profile, CHOOSE_PROMPT, user, "route a message", json_mode=True)
        return ChooseResult(reply=text[:REPLY_CHARS], tokens=tokens, cost_usd=cost)

    @activity.defn(name=RouterActivities.ANSWER)
    async def answer(self, input: AnswerInput) -> AnswerResult:
        conversation = "\n".join(f"{t.role}: {t.text}" for t in input.turns)
        text, tokens, cost = await self._ask(input.profile, ANSWER_PROMPT, conversation, "answer a light request")
        first = text.strip().splitlines()[0] if text.strip() else ""
        needs = None
        if first.startswith(NEEDS_GOAL):
            needs = first.removeprefix(NEEDS_GOAL).strip() or "it asks for work"
        return AnswerResult(text=text[:REPLY_CHARS], needs_goal=needs, tokens=tokens, cost_usd=cost)

    async def _ask(
        self, profile_name: str, system: str, user: str, purpose: str, json_mode: bool = False
    ) -> tuple[str, int, float]:
        profile = self.config.resolve(profile_name)
        response = await ask_once(profile, system, user, purpose, json_mode=json_mode)
        tokens = response.input_tokens + response.output_tokens
        return response.text, tokens, profile.cost_usd(response.input_tokens, response.output_tokens)
