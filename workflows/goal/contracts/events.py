"""The goal's event stream: one pydantic model per event type, versioned, published on
the goal's Workflow Stream (temporalio.contrib.workflow_streams) under topic EVENTS_TOPIC.

A consumer (the web UI, `perdure watch`, a test) subscribes from any offset it has seen
and reduces the events into a view. Reduction is idempotent: every event carries an
`id` that names what it reports (a node's run and status, a plan version, a question
and its state), so an event seen twice, or published twice, changes nothing the
second time. The stream says what happened; the goal's state (the progress query)
stays the truth, and a consumer that missed events can always start from it.

Pure data and a pure reducer; shared by the workflow and every consumer. An abort's
progress is one `abort` event per change (requested, then achieved).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, TypeAdapter

from perdure.workflows.goal.contracts.abort_contracts import AbortProgress, AbortStage

EVENTS_TOPIC = "goal"
TOKENS_TOPIC = "tokens"
"""Live model output, published by model activities (the only topic the goal accepts
from outside): batched text deltas and retry markers, shown while a node runs."""
MAX_TOKEN_DELTA_CHARS = 4_000
"""The most text one delta may carry; a longer one is refused by the goal."""
STREAM_EVENTS_KEPT = 1_000
"""Events the goal keeps for subscribers (older ones are truncated): the stream stays
bounded in memory and in the state carried across continue-as-new."""


class _Event(BaseModel):
    v: int = Field(default=1, description="Version of this event type's fields.")
    id: str = Field(description="What the event reports; the same id twice is the same fact.")
    at: datetime


class NodeChanged(_Event):
    type: Literal["node"] = "node"
    node: str
    kind: str
    status: str
    key: str | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float | None = None
    placement: str | None = Field(default=None, description="Where its calls ran (the latest placement).")
    preview: str = ""
    error: str | None = None
    waiting_for_device: str | None = None


class PlanVersioned(_Event):
    type: Literal["plan"] = "plan"
    version: int
    source: str
    reason: str
    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    steps: int = 0


class QuestionChanged(_Event):
    type: Literal["question"] = "question"
    question: str
    topic: str
    title: str
    status: str
    options: list[str] = Field(default_factory=list)
    answer: str | None = None
    asked_at: datetime | None = None
    deadline_at: datetime | None = Field(default=None, description="When it expires unanswered (None: never).")
    on_expiry: str | None = None
    reminded_at: datetime | None = Field(default=None, description="Set on the event its reminder publishes.")
    expired_at: datetime | None = Field(default=None, description="Set once its deadline passed unanswered.")


class Receipt(_Event):
    type: Literal["receipt"] = "receipt"
    request_id: str
    kind: str
    status: str
    note: str | None = None


class GateDecision(_Event):
    type: Literal["gate"] = "gate"
    entry: str


class ProgressChanged(_Event):
    type: Literal["progress"] = "progress"
    phase: str
    percent_done: int
    tokens: int
    cost_usd: float
    budget: dict[str, float] = Field(default_factory=dict)
    eta: str | None = None
    eta_confidence: str | None = None


class GoalEnded(_Event):
    type: Literal["end"] = "end"
    outcome: str
    failure: str | None = None
    report: str | None = Field(default=None, description="The report's artifact digest.")


class AbortChanged(_Event):
    """An abort's progress: published when it is requested, as what it waits for settles,
    and once it is achieved (nothing runs, every undo has settled), before the goal's end."""

    type: Literal["abort"] = "abort"
    stage: AbortStage
    progress: AbortProgress


class TokenDelta(_Event):
    """Text a running model call has produced since its previous delta. Only for showing:
    the node's output is its activity's result, never this."""

    type: Literal["tokens"] = "tokens"
    node: str = Field(min_length=1, max_length=200)
    turn: int = Field(default=0, ge=0, description="The agent turn (0 for a single call).")
    attempt: int = Field(default=1, ge=1, description="The activity attempt that produced it.")
    seq: int = Field(ge=0, description="This attempt's deltas in order, from 0.")
    text: str = Field(max_length=MAX_TOKEN_DELTA_CHARS)


class TokenRetry(_Event):
    """A model call was retried: the live text of its earlier attempts is void."""

    type: Literal["retry"] = "retry"
    node: str = Field(min_length=1, max_length=200)
    turn: int = Field(default=0, ge=0)
    attempt: int = Field(ge=2)


TokenEvent = Annotated[Union[TokenDelta, TokenRetry], Field(discriminator="type")]  # noqa: UP007
TOKEN_EVENT_ADAPTER: TypeAdapter[TokenEvent] = TypeAdapter(TokenEvent)


def token_delta_id(node: str, turn: int, attempt: int, seq: int, call: str = "") -> str:
    """`call` names the activity the text came from: a node run again (a rewind, a new
    run of the goal) counts its turns, attempts and deltas from the start again."""
    return f"tokens:{node}:{turn}:{attempt}:{seq}" + (f":{call}" if call else "")


def token_retry_id(node: str, turn: int, attempt: int, call: str = "") -> str:
    return f"retry:{node}:{turn}:{attempt}" + (f":{call}" if call else "")


GoalEvent = Annotated[
    Union[  # noqa: UP007
        NodeChanged,
        PlanVersioned,
        QuestionChanged,
        Receipt,
        GateDecision,
        ProgressChanged,
        GoalEnded,
        TokenDelta,
        TokenRetry,
        AbortChanged,
    ],
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[GoalEvent] = TypeAdapter(GoalEvent)


def parse_event(data: object) -> GoalEvent:
    """An event from its JSON form (what a subscriber receives)."""
    return EVENT_ADAPTER.validate_python(data)


class LiveText(BaseModel):
    """A running node's model output so far, from one turn's one attempt."""

    turn: int
    attempt: int
    text: str = ""


class GoalView(BaseModel):
    """What the events say, reduced: the latest of each node, plan, question and receipt,
    and the live text of the model calls running now."""

    nodes: dict[str, NodeChanged] = Field(default_factory=dict)
    plans: dict[int, PlanVersioned] = Field(default_factory=dict)
    questions: dict[str, QuestionChanged] = Field(default_factory=dict)
    receipts: dict[str, Receipt] = Field(default_factory=dict)
    gates: list[str] = Field(default_factory=list)
    progress: ProgressChanged | None = None
    ended: GoalEnded | None = None
    abort: AbortChanged | None = None
    live: dict[str, LiveText] = Field(default_factory=dict)
    seen: set[str] = Field(default_factory=set)


def reduce(view: GoalView, event: GoalEvent) -> GoalView:
    """Fold one event into the view; an event already seen (by id) changes nothing."""
    if event.id in view.seen:
        return view
    view.seen.add(event.id)
    if isinstance(event, NodeChanged):
        view.nodes[event.node] = event
        if event.status != "running":
            view.live.pop(event.node, None)  # its output is the node's now
    elif isinstance(event, TokenDelta | TokenRetry):
        _reduce_live(view, event)
    elif isinstance(event, PlanVersioned):
        view.plans[event.version] = event
    elif isinstance(event, QuestionChanged):
        view.questions[event.question] = event
    elif isinstance(event, Receipt):
        view.receipts[event.request_id] = event
    elif isinstance(event, GateDecision):
        view.gates.append(event.entry)
    elif isinstance(event, ProgressChanged):
        view.progress = event
    elif isinstance(event, AbortChanged):
        view.abort = event
    else:
        view.ended = event
    return view


def _reduce_live(view: GoalView, event: TokenDelta | TokenRetry) -> None:
    """Text of a later turn or attempt replaces the text before it; text of an earlier
    one (a delta that arrived late) is dropped; a retry marker empties the text."""
    live = view.live.get(event.node)
    at = (event.turn, event.attempt)
    if live is not None and at < (live.turn, live.attempt):
        return
    if live is None or at > (live.turn, live.attempt) or isinstance(event, TokenRetry):
        live = view.live[event.node] = LiveText(turn=event.turn, attempt=event.attempt)
    if isinstance(event, TokenDelta):
        live.text += event.text
