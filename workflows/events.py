"""The goal's event stream: one pydantic model per event type, versioned, published on
the goal's Workflow Stream (temporalio.contrib.workflow_streams) under topic EVENTS_TOPIC.

A consumer (the web UI, `perdure watch`, a test) subscribes from any offset it has seen
and reduces the events into a view. Reduction is idempotent: every event carries an
`id` that names what it reports (a node's run and status, a plan version, a question
and its state), so an event seen twice, or published twice, changes nothing the
second time. The stream says what happened; the goal's state (the progress query)
stays the truth, and a consumer that missed events can always start from it.

Pure data and a pure reducer; shared by the workflow and every consumer.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, TypeAdapter

EVENTS_TOPIC = "goal"
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


GoalEvent = Annotated[
    Union[NodeChanged, PlanVersioned, QuestionChanged, Receipt, GateDecision, ProgressChanged, GoalEnded],  # noqa: UP007
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[GoalEvent] = TypeAdapter(GoalEvent)


def parse_event(data: object) -> GoalEvent:
    """An event from its JSON form (what a subscriber receives)."""
    return EVENT_ADAPTER.validate_python(data)


class GoalView(BaseModel):
    """What the events say, reduced: the latest of each node, plan, question and receipt."""

    nodes: dict[str, NodeChanged] = Field(default_factory=dict)
    plans: dict[int, PlanVersioned] = Field(default_factory=dict)
    questions: dict[str, QuestionChanged] = Field(default_factory=dict)
    receipts: dict[str, Receipt] = Field(default_factory=dict)
    gates: list[str] = Field(default_factory=list)
    progress: ProgressChanged | None = None
    ended: GoalEnded | None = None
    seen: set[str] = Field(default_factory=set)


def reduce(view: GoalView, event: GoalEvent) -> GoalView:
    """Fold one event into the view; an event already seen (by id) changes nothing."""
    if event.id in view.seen:
        return view
    view.seen.add(event.id)
    if isinstance(event, NodeChanged):
        view.nodes[event.node] = event
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
    else:
        view.ended = event
    return view
