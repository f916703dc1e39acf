"""Reading a goal's events: both of its topics (its own events and the model activities'
live output, workflows/goal/contracts/events.py EVENTS_TOPIC and TOKENS_TOPIC) from an
offset, in the stream's order, until the goal ends.

Read from the goal's Workflow Stream (workflows/goal/stream.py) with the stream's poll
QUERY: a query takes none of the workflow's ten update slots (a long-poll update per
reader would, and stay in flight after the reader left) and adds nothing to its history.
The handle names no run, so each read goes to the latest run: continue-as-new is
followed. Client-side only; keeps no state between calls.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.contrib.workflow_streams import PollInput, PollResult
from temporalio.service import RPCError

from perdure.workflows.goal.contracts.events import EVENTS_TOPIC, TOKENS_TOPIC, GoalEvent, parse_event

READ_EVERY = timedelta(milliseconds=100)
# Idle reads between looks at whether the goal has closed (a goal that ended without an
# `end` event: terminated, timed out).
CLOSED_CHECK_EVERY = 20
# The stream's poll, as a query (temporalio.contrib.workflow_streams registers it with its update).
POLL_QUERY = "__temporal_workflow_stream_poll"


class StreamItem(BaseModel):
    """One thing read from a goal's stream: an event at its offset, or a notice with none:
    `reset` (the reader was behind the retained log: re-read the snapshot) or `closed`
    (the goal ended without an `end` event, or cannot be read)."""

    offset: int | None = Field(description="The event's stream offset; None for a notice.")
    kind: str = Field(description="The event's type (node, plan, question, end, ...), or reset / closed.")
    data: Any

    @property
    def event(self) -> GoalEvent | None:
        """The event as its model in workflows/goal/contracts/events.py (NodeChanged,
        QuestionChanged, GoalEnded, ...); None for a notice, or a shape this version does not know."""
        if self.offset is None:
            return None
        try:
            return parse_event(self.data)
        except ValidationError:
            return None


async def events(client: Client, goal_id: str, offset: int = 0) -> AsyncIterator[StreamItem]:
    """The goal's events from `offset`, read every READ_EVERY; the iteration ends after the
    `end` event, or after a `closed` notice (also when there is no such goal: look first)."""
    handle = client.get_workflow_handle(goal_id)
    converter = client.data_converter.payload_converter
    idle = 0
    while True:
        try:
            poll = PollInput(topics=[EVENTS_TOPIC, TOKENS_TOPIC], from_offset=offset)
            batch = await handle.query(POLL_QUERY, poll, result_type=PollResult)
        except (RPCError, WorkflowQueryFailedError) as err:
            yield StreamItem(offset=None, kind="closed", data={"reason": f"the goal cannot be read: {err}"})
            return
        if batch.items and batch.items[0].offset > offset:
            yield StreamItem(offset=None, kind="reset", data={"from": offset, "kept_from": batch.items[0].offset})
        for item in batch.items:
            payload = Payload()
            payload.ParseFromString(base64.b64decode(item.data))
            data = converter.from_payloads([payload])[0]
            kind = data.get("type", "event") if isinstance(data, dict) else "event"
            yield StreamItem(offset=item.offset, kind=kind, data=data)
            if kind == "end":
                return
        offset = max(offset, batch.next_offset)
        if batch.more_ready:
            continue
        idle = 0 if batch.items else idle + 1
        if idle and idle % CLOSED_CHECK_EVERY == 0:
            desc = await handle.describe()
            if desc.status != WorkflowExecutionStatus.RUNNING:
                status = desc.status.name if desc.status else "closed"
                yield StreamItem(offset=None, kind="closed", data={"reason": f"the goal is {status.lower()}"})
                return
        await asyncio.sleep(READ_EVERY.total_seconds())
