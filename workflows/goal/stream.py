"""The goal's durable event stream (workflows/goal/contracts/events.py): what it publishes and when, on
its Workflow Stream, and the stream's state carried across continue-as-new.

Publishing from the workflow adds nothing to history (the log lives in the workflow),
and neither does reading it: subscribers read with the stream's poll query
(starters/client/goal_events.py); the SDK's poll update is refused before it is accepted
(`_refuse_poll_update`). From outside, only model activities publish, and
only live text (TOKENS_TOPIC) of a node that is running: their publish signals are
checked here before the SDK's handler takes them (its dedup by publisher and sequence
crosses continue-as-new in the carried state), and anything else is refused without
being decoded into the workflow. Those signals are history events, counted in the
goal's budget like any other. The log is truncated to the last STREAM_EVENTS_KEPT
events, so memory and the carried state stay bounded; a subscriber behind that starts
from the goal's progress query instead.

Workflow code. The hooks are called by the rooms that change what they report: a node's
status (GoalContext.set_status), a gate decision (GoalContext.log_gate), a settled
message (Inbox.settle); plans, questions and progress are compared at each publish.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.contrib.workflow_streams import PublishEntry, PublishInput, WorkflowStream, WorkflowStreamState
from temporalio.exceptions import ApplicationError

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts.events import (
    EVENTS_TOPIC,
    STREAM_EVENTS_KEPT,
    TOKEN_EVENT_ADAPTER,
    TOKENS_TOPIC,
    AbortChanged,
    GateDecision,
    GoalEnded,
    GoalEvent,
    NodeChanged,
    PlanVersioned,
    ProgressChanged,
    QuestionChanged,
    Receipt,
    TokenDelta,
    TokenRetry,
)
from perdure.workflows.goal.contracts.messages import InboxEntry
from perdure.workflows.goal.contracts.state import Node, Question
from perdure.workflows.shared.statuses import TERMINAL

# The SDK's publish signal, offset query and poll update (temporalio.contrib.workflow_streams).
PUBLISH_SIGNAL = "__temporal_workflow_stream_publish"
OFFSET_QUERY = "__temporal_workflow_stream_offset"
POLL_UPDATE = "__temporal_workflow_stream_poll"
# What a publish signal sent with no argument is given. The handler takes one RawValue
# and nothing else: the SDK decodes by the handler's type hints only when every
# parameter is positional, and drops a signal with more arguments than that itself.
NO_ARGUMENT = RawValue(Payload())
# The metadata of a payload from the pydantic converter (temporalio.contrib.pydantic).
_JSON_PLAIN = {"encoding": b"json/plain"}


def event_payload(event: GoalEvent) -> Payload:
    """The payload perdure's converter makes of an event, made here: a goal publishes two
    events per node, and the SDK's converter chain costs about as much as building one."""
    return Payload(metadata=_JSON_PLAIN, data=event.__pydantic_serializer__.to_json(event))


# The most items one publish may carry (a model activity sends one or two).
MAX_PUBLISHED_ITEMS = 100


def _refuse_poll_update(_poll: Any = None) -> None:
    """The SDK's long-poll update, refused by its validator, so it never enters history.
    An update accepted in the workflow task that follows one which recorded only a local
    activity's result is replayed in another order than it ran (sdk-core issue 1146, its
    v1 history chunking; the v2 chunker that fixes it is not released): the goal could no
    longer be replayed, and every later workflow task would fail. A goal runs a local
    activity for nearly every step, and a watcher polled continuously; tests/test_event_stream.py
    replays such a history. The same read is the poll query, which adds nothing to history."""
    raise ApplicationError(
        "a goal's stream is read with its poll query (perdure.Client.events), not the poll update",
        type="PollByQuery",
        non_retryable=True,
    )


class EventStream:
    def __init__(self, ctx: GoalContext, prior: WorkflowStreamState | None) -> None:
        # Constructed from the workflow's @workflow.init (the SDK checks the caller is an __init__).
        self._stream = WorkflowStream(prior)
        # The SDK's handlers, registered by WorkflowStream: its publish signal takes a batch
        # only after _on_publish has checked it (a malformed publish must never fail the
        # goal's workflow tasks, and nobody may put goal events in the goal's name); its
        # offset query says where the log ends.
        self._accept = workflow.get_signal_handler(PUBLISH_SIGNAL)
        self._end = workflow.get_query_handler(OFFSET_QUERY)
        workflow.set_signal_handler(PUBLISH_SIGNAL, self._on_publish)
        workflow.set_update_handler(POLL_UPDATE, _refuse_poll_update, validator=_refuse_poll_update)
        self._topic = self._stream.topic(EVENTS_TOPIC)
        self._dirty: dict[str, Node] = {}
        self._ctx = ctx
        self._base = prior.base_offset if prior else 0
        state = ctx.state
        # What earlier runs published is in the carried log: only changes from here on.
        self._plans = len(state.plan_versions)
        self._questions = {q.id: _question_mark(q) for q in state.questions}
        self._progress: tuple | None = None
        # The abort progress last published (abort_changed), as JSON.
        self._abort: dict | None = None
        # What `sync` was last asked to compare, and the task that does it once this
        # activation's other work is done (None: nothing asked since).
        self._asked: tuple[Callable[[], int], Callable[[], tuple]] | None = None
        self._at_rest: asyncio.Task | None = None

    def get_state(self) -> WorkflowStreamState:
        """For continue-as-new: subscribers are let go (they follow the chain to the next run).
        Live text is carried without its text: no node runs a model call across the
        boundary, so nobody needs it, and 2,000 deltas of text would outgrow the input."""
        self.sync_now()
        self._stream.detach_pollers()
        state = self._stream.get_state()
        state.log = [self._without_text(item) if item.topic == TOKENS_TOPIC else item for item in state.log]
        return state

    @staticmethod
    def _without_text(item: Any) -> Any:
        """The same delta (id, node, turn, attempt, offset) with empty text; anything else as it was."""
        try:
            event = _token_event(item.data)
        except Exception:  # noqa: BLE001 - it was checked on the way in; keep what cannot be read as it is
            return item
        if not isinstance(event, TokenDelta) or not event.text:
            return item
        emptied = workflow.payload_converter().to_payload(event.model_copy(update={"text": ""}))
        return dataclasses.replace(item, data=base64.b64encode(emptied.SerializeToString()).decode())

    @property
    def _offset(self) -> int:
        """Where the log ends: the offset the next event gets."""
        assert self._end is not None
        return self._end()

    def _on_publish(self, raw: RawValue = NO_ARGUMENT) -> None:
        """A model activity's live text. A raw value, decoded here under a catch-all: no
        payload can fail the workflow task. Items for another topic, of another shape, or
        for a node that is not running are dropped; the rest go to the SDK's handler."""
        try:
            if raw is NO_ARGUMENT:
                raise ValueError("no argument")
            batch = workflow.payload_converter().from_payload(raw.payload, PublishInput)
            kept = [item for item in batch.items[:MAX_PUBLISHED_ITEMS] if self._live_text_of_running_node(item)]
        except Exception as err:  # noqa: BLE001 - anything unreadable is refused, never raised
            reason = f"{type(err).__name__}: {err}"[:300]
            workflow.logger.warning(f"stream publish refused: {reason}", extra={"reason": reason})
            return
        if len(kept) < len(batch.items):
            workflow.logger.info("stream publish: items dropped", extra={"dropped": len(batch.items) - len(kept)})
        if kept and self._accept is not None:
            self._accept(PublishInput(items=kept, publisher_id=batch.publisher_id, sequence=batch.sequence))
            self._truncate()

    def _live_text_of_running_node(self, item: PublishEntry) -> bool:
        if item.topic != TOKENS_TOPIC:
            return False
        event = _token_event(item.data)
        node = self._ctx.state.nodes.get(event.node)
        return node is not None and node.status == "running"

    def release_subscribers(self) -> None:
        """Before the goal ends: a subscriber's poll in flight must not hold it open."""
        self._stream.detach_pollers()

    def _publish(self, event: GoalEvent) -> None:
        self._topic.publish(event_payload(event))
        self._truncate()

    def _truncate(self) -> None:
        end = self._offset
        if end - self._base >= 2 * STREAM_EVENTS_KEPT:
            self._base = end - STREAM_EVENTS_KEPT
            self._stream.truncate(self._base)

    # --- hooks -------------------------------------------------------------------------

    def on_status(self, node: Node) -> None:
        """A node changed status: published at the next flush, with the fields its room sets
        just after the status (an error, a finish time), its latest status only."""
        self._dirty[node.name] = node

    def flush(self) -> None:
        dirty, self._dirty = self._dirty, {}
        for node in dirty.values():
            self._node_event(node)

    def _node_event(self, node: Node) -> None:
        duration = None
        if node.started_at and node.status in TERMINAL:
            # A settling node's finish time is set just after its status: the time is now.
            duration = max(0.0, ((node.finished_at or workflow.now()) - node.started_at).total_seconds())
        placement = next(reversed(node.placements.values()), None) if node.placements else None
        waiting = node.waiting_on or ""
        self._publish(
            NodeChanged(
                id=f"node:{node.name}:{self._offset}",
                at=workflow.now(),
                node=node.name,
                kind=node.kind,
                status=node.status,
                key=node.key,
                tokens=node.tokens,
                cost_usd=node.cost_usd,
                duration_s=duration,
                placement=placement,
                preview=node.preview[:200],
                error=(node.error or None) and node.error[:300],
                waiting_for_device=waiting.removeprefix("device:") if waiting.startswith("device:") else None,
            )
        )

    def on_gate(self, entry: str) -> None:
        self._publish(GateDecision(id=f"gate:{self._offset}", at=workflow.now(), entry=entry))

    def on_receipt(self, entry: InboxEntry) -> None:
        self._publish(
            Receipt(
                id=f"receipt:{entry.request_id}:{entry.status}",
                at=workflow.now(),
                request_id=entry.request_id,
                kind=entry.kind,
                status=entry.status,
                note=entry.note,
            )
        )

    # --- compared at each publish ------------------------------------------------------

    def sync(self, percent: Callable[[], int], progress: Callable[[], tuple]) -> None:
        """Publish what changed, once this activation's other work is done: a read segment
        settles hundreds of nodes in one activation, and a subscriber reads the log only
        after it anyway. A node that started and settled within it is published once, settled."""
        self._asked = (percent, progress)
        if self._at_rest is None or self._at_rest.done():
            self._at_rest = asyncio.create_task(self._sync_at_rest())

    async def _sync_at_rest(self) -> None:
        # Resolved once every coroutine made ready in this activation has run.
        await workflow.wait_condition(lambda: True)
        self.sync_now()

    def sync_now(self) -> None:
        """What `sync` was asked to publish, now (before the run ends or continues as new)."""
        if self._asked is not None:
            percent, progress = self._asked
            self._asked = None
            self._sync(percent(), progress)
        self.flush()

    def _sync(self, percent: int, progress: Callable[[], tuple[dict[str, float], str | None, str | None]]) -> None:
        """Publish what changed since the last publish: new plan versions, questions asked or
        answered, progress (`progress()` gives budget fractions, ETA and its confidence,
        worked out only when the phase, percent or tokens changed)."""
        self.flush()
        state = self._ctx.state
        for version in state.plan_versions[self._plans :]:
            plan = version.plan
            self._publish(
                PlanVersioned(
                    id=f"plan:{version.version}",
                    at=workflow.now(),
                    version=version.version,
                    source=version.source,
                    reason=version.reason,
                    added=list(version.diff.added),
                    removed=list(version.diff.removed),
                    steps=len(plan.steps) if plan else 0,
                )
            )
        self._plans = len(state.plan_versions)
        for question in state.questions:
            mark = _question_mark(question)
            if self._questions.get(question.id) == mark:
                continue
            self._questions[question.id] = mark
            self._publish(
                QuestionChanged(
                    id=f"question:{question.id}:{mark}",
                    at=workflow.now(),
                    question=question.id,
                    topic=question.topic,
                    title=question.title,
                    status=question.status,
                    options=[o.id for o in question.options],
                    answer=question.answer,
                    asked_at=question.asked_at,
                    deadline_at=question.deadline_at,
                    on_expiry=question.on_expiry,
                    reminded_at=question.reminded_at,
                    expired_at=question.expired_at,
                )
            )
        marker = (state.phase, percent, state.ledger.tokens)
        if marker != self._progress:
            self._progress = marker
            budget, eta, confidence = progress()
            self._publish(
                ProgressChanged(
                    id=f"progress:{state.runs}:{self._offset}",
                    at=workflow.now(),
                    phase=state.phase,
                    percent_done=percent,
                    tokens=state.ledger.tokens,
                    cost_usd=state.ledger.cost_usd,
                    budget=budget,
                    eta=eta,
                    eta_confidence=confidence,
                )
            )
        self.abort_changed()

    def abort_changed(self) -> None:
        """An abort's progress, when it changed since it was last published: each stage and
        each step of it (a write landed, an undo started or settled) is one event."""
        progress = self._ctx.abort_progress()
        if progress is None:
            return
        seen = progress.model_dump(mode="json")
        if seen == self._abort:
            return
        self._abort = seen
        event = AbortChanged(
            id=f"abort:{progress.stage}:{self._offset}", at=workflow.now(), stage=progress.stage, progress=progress
        )
        self._publish(event)

    def ended(self, outcome: str, failure: str | None, report: str | None) -> None:
        self.sync_now()
        self._publish(GoalEnded(id="end", at=workflow.now(), outcome=outcome, failure=failure, report=report))


def _question_mark(question: Question) -> str:
    """What a question's event reports: its status, and for an open one whether its reminder
    went out or its deadline parked the goal (workflows/goal/question_deadlines.py)."""
    if question.status == "open" and question.expired_at is not None:
        return "open:expired"
    if question.status == "open" and question.reminded_at is not None:
        return "open:reminded"
    return question.status


def _token_event(data: str) -> TokenDelta | TokenRetry:
    """A stream item's live-text event, from its wire form (base64 of a Payload); raises
    when it is not one."""
    payload = Payload.FromString(base64.b64decode(data, validate=True))
    return TOKEN_EVENT_ADAPTER.validate_python(workflow.payload_converter().from_payload(payload))
