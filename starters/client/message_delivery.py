"""Sending user messages to a goal: always a signal, which the server stores durably
whether or not a worker runs, and then, while a worker answers, its receipt read from
the goal's inbox query (a bad message is refused with its reason). The goal judges
messages in the order they were sent, and a request id sent twice is one message.

Not an update, though the goal takes one (`submit`, for other clients): an update
accepted in the workflow task after one that recorded only a local activity's result
is replayed in another order than it ran (sdk-core issue 1146: its v1 history chunking;
the v2 chunker is not released), and the goal can then no longer be replayed. A goal
runs a local activity before nearly every step, and steering while it ran made such
histories (tests/test_steering_delivery.py). A signal is an event of its own workflow
task and replays where it was.

And reading what a goal received: its inbox with receipts, or what the server admitted
when no worker answers.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from perdure.starters.client import goal_reads
from perdure.starters.client import start_checks as capabilities
from perdure.starters.client.client_errors import GoalEnded, MessageRejected
from perdure.workflows.goal.contracts.goal_contracts import GOAL_MEMO, MESSAGE_FORMAT_MEMO, Signals, Updates
from perdure.workflows.goal.contracts.messages import LATER_KINDS, InboxView, Receipt, Refusal, beyond_format_1
from perdure.workflows.goal.goal_workflow import GoalWorkflow

# How long a send waits for the goal's receipt, and how often it looks.
UPDATE_WAIT = timedelta(seconds=5)
RECEIPT_EVERY = timedelta(milliseconds=50)
# How long a send looks at the goal's refusals before it signals.
REFUSALS_WAIT = timedelta(seconds=1)


def new_request_id(prefix: str = "cli") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Delivery:
    """How a message got in: the goal's receipt when a worker judged it at once, else None:
    the server stored it by signal, and the goal judges it in the order it was sent once a
    worker runs it. `stuck` is why a worker cannot (its workflow task fails), when so.
    `request_id` is the message's: send it again under it to retry safely."""

    receipt: Receipt | None
    stuck: str | None = None
    request_id: str | None = None


async def deliver(client: Client, goal_id: str, message: BaseModel) -> Delivery:
    """Send a message to a goal that exists and is open, as every front end does (the CLI,
    the web UI, the MCP server). GoalNotFound, GoalEnded, MessageRejected say why it was not taken."""
    desc = await goal_reads.describe(client, goal_id)
    if goal_reads.is_open(desc):
        try:
            return await _deliver_to_open(client, desc, message)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            # The goal may have finished between the describe and the send: the server then
            # says "workflow execution already completed", or "workflow update was aborted by
            # closing workflow" for an update it had taken. Answer as for an ended goal.
            again = await goal_reads.describe(client, goal_id)
            if goal_reads.is_open(again) and again.run_id != desc.run_id:
                # A new run under the id (a goal started again after it ended): send to it.
                return await _deliver_to_open(client, again, message)
            if goal_reads.is_open(again):
                raise
            desc = again
    return await _answer_ended(client, desc, message)


def fitted(desc: WorkflowExecutionDescription, message: BaseModel) -> BaseModel:
    """The message as the goal's code reads it. A goal that perdure 1.0's front ends started
    (its memo has the goal's text but no message format) runs 1.0 code, pinned to its
    workers, which refuses any field it does not know: the sender's name is left out (its
    decision log says "user"), and what it cannot take at all is refused here, in one line,
    before anything is sent. A goal started with no memo (a program's own start) is taken
    to run this code."""
    memo = desc.raw_description.workflow_execution_info.memo.fields
    if MESSAGE_FORMAT_MEMO in memo or GOAL_MEMO not in memo:
        return message
    problem = beyond_format_1(message)
    if problem is not None:
        raise MessageRejected(f"goal {desc.id} runs perdure 1.0 code, which {problem}")
    return message.model_copy(update={"by": None}) if getattr(message, "by", None) is not None else message


async def _deliver_to_open(client: Client, desc: WorkflowExecutionDescription, message: BaseModel) -> Delivery:
    message = fitted(desc, message)
    failure = await goal_reads.workflow_task_failure(client, desc)
    if failure is not None:
        # The server takes no update while the goal's workflow task fails; a signal is
        # still stored, and applied in its turn once a worker can run the goal again.
        await send_by_signal(client, desc.id, message)
        return Delivery(None, stuck=failure)
    if not await capabilities.has_pollers(client, desc.task_queue):
        # No worker polls the goal's queue: an update would only wait out its timeout first.
        await send_by_signal(client, desc.id, message)
        return Delivery(None)
    return Delivery(await send(client, desc.id, message))


async def _answer_ended(client: Client, desc: WorkflowExecutionDescription, message: BaseModel) -> Delivery:
    earlier = (
        await earlier_receipt(client, desc.id, message)
        if await capabilities.has_pollers(client, desc.task_queue)
        else None
    )
    if earlier is not None:
        return Delivery(earlier)  # a retry of a message the goal took before it ended
    raise GoalEnded(f"{await goal_reads.finished_text(client, desc)}; it takes no more messages")


async def earlier_receipt(client: Client, goal_id: str, message: BaseModel) -> Receipt | None:
    """The receipt of this very message (its request id and kind) from the ended goal's
    inbox: a client retrying a send whose answer it lost, after the goal went on to finish,
    gets the answer it missed (a worker answers the query by replaying the goal). None when
    the goal never took it, or nobody answered."""
    request_id = getattr(message, "request_id", None)
    if not request_id:
        return None
    try:
        view = await inbox(client, goal_id, timeout_s=2)
    except (RPCError, WorkflowQueryFailedError):
        return None
    kind = getattr(message, "kind", None)
    return next((r for r in view.entries if r.request_id == request_id and r.kind == kind), None)


async def send(client: Client, goal_id: str, message: BaseModel) -> Receipt | None:
    """The receipt, or None when no worker answered within UPDATE_WAIT (the server holds
    the message; the goal judges it in its turn). A receipt may say "rejected": the message
    was admitted, and at its turn (after every message sent before it) it could not apply;
    the note says why. MessageRejected: the goal refused it at the door (malformed, a
    request id reused with other content, a question it does not have)."""
    request_id = getattr(message, "request_id", None)
    # Looked at first, briefly, so that an earlier refusal of the same id is not taken for this
    # one's; the signal is never held up longer than that.
    refused_before = await _refusals(client, goal_id, request_id)
    await send_by_signal(client, goal_id, message)
    return await _judged(client, goal_id, message, refused_before)


async def _refusals(client: Client, goal_id: str, request_id: str | None) -> int | None:
    """How many of the goal's refusals carry this request id; None when no worker answers at once."""
    try:
        view = await inbox(client, goal_id, timeout_s=REFUSALS_WAIT.total_seconds())
    except (RPCError, WorkflowQueryFailedError):
        return None
    return sum(1 for r in view.refused if r.request_id == request_id)


async def _judged(client: Client, goal_id: str, message: BaseModel, refused_before: int | None) -> Receipt | None:
    """The message's receipt once the goal has judged it (steer and queue: once admitted,
    they apply later by design), read from the inbox every RECEIPT_EVERY; None after UPDATE_WAIT."""
    request_id, kind = getattr(message, "request_id", None), getattr(message, "kind", None)
    deadline = asyncio.get_running_loop().time() + UPDATE_WAIT.total_seconds()
    while True:
        try:
            view = await inbox(client, goal_id, timeout_s=UPDATE_WAIT.total_seconds())
        except (RPCError, WorkflowQueryFailedError):
            return None
        refusals = [r for r in view.refused if r.request_id == request_id]
        entry = next((e for e in view.entries if e.request_id == request_id and e.kind == kind), None)
        if refused_before is None:
            # No count from before: a refusal of this id counts unless the goal took a message under it.
            rejected = bool(refusals) and entry is None
        else:
            rejected = len(refusals) > refused_before
        if rejected:
            raise MessageRejected(refusals[-1].reason)
        if entry is not None and (entry.status != "pending" or entry.kind in LATER_KINDS):
            return entry
        if asyncio.get_running_loop().time() >= deadline:
            return entry
        await asyncio.sleep(RECEIPT_EVERY.total_seconds())


async def send_by_signal(client: Client, goal_id: str, message: BaseModel) -> None:
    """Durable admission: the server stores the message whether or not a worker runs."""
    handle = client.get_workflow_handle(goal_id)
    await handle.signal(GoalWorkflow.message_signal, message.model_dump(mode="json"))


class AdmittedMessage(BaseModel):
    """A message as the server holds it in the goal's history, before any worker judged it."""

    request_id: str
    kind: str
    via: str  # "signal" or "update"
    at: datetime | None = None


async def admitted(client: Client, goal_id: str) -> list[AdmittedMessage]:
    """Every `message` signal and accepted `submit` update in the goal's history, decoded
    with the client's data converter (so encrypted payloads read too): what `inbox` shows
    when no worker answers its query. A payload that is not a message object is listed
    with a kind of '?'."""
    history = await client.get_workflow_handle(goal_id).fetch_history()
    found = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            attrs = event.workflow_execution_signaled_event_attributes
            if attrs.signal_name != Signals.MESSAGE:
                continue
            payloads, via = attrs.input.payloads, "signal"
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if request.input.name != Updates.SUBMIT:
                continue
            payloads, via = request.input.args.payloads, "update"
        else:
            continue
        values = await client.data_converter.decode(list(payloads)) if payloads else []
        fields = values[0] if len(values) == 1 and isinstance(values[0], dict) else {}
        found.append(
            AdmittedMessage(
                request_id=str(fields.get("request_id") or "(no id)"),
                kind=str(fields.get("kind") or "?"),
                via=via,
                at=event.event_time.ToDatetime(tzinfo=UTC),
            )
        )
    return found


async def inbox(client: Client, goal_id: str, timeout_s: float = 5) -> InboxView:
    handle = client.get_workflow_handle(goal_id)
    return await handle.query(GoalWorkflow.inbox, rpc_timeout=timedelta(seconds=timeout_s))


class InboxResult(BaseModel):
    """Every message sent to a goal with its receipt, from the goal; or, when no worker
    answers for it, what the server admitted (its history holds every message)."""

    goal_id: str
    source: Literal["goal", "server history"] = Field(
        description="goal: the goal's own receipts; server history: what the server admitted (no worker answered)."
    )
    entries: list[Receipt] = Field(default_factory=list)
    refused: list[Refusal] = Field(default_factory=list)
    admitted: list[AdmittedMessage] = Field(default_factory=list)


async def messages(client: Client, goal_id: str, timeout_s: float = 5) -> InboxResult:
    """The goal's inbox when a worker answers for it, else what the server admitted.
    GoalNotFound when there is no such goal."""
    desc = await goal_reads.describe(client, goal_id)
    # Only a worker answers the query: with none polling, it would only wait out its timeout.
    if await capabilities.has_pollers(client, desc.task_queue):
        try:
            view = await inbox(client, goal_id, timeout_s=timeout_s)
        except (RPCError, WorkflowQueryFailedError):
            pass  # no worker answered in time: the history still holds every message admitted
        else:
            return InboxResult(goal_id=goal_id, source="goal", entries=view.entries, refused=view.refused)
    return InboxResult(goal_id=goal_id, source="server history", admitted=await admitted(client, goal_id))
