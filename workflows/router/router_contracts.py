"""What the router (workflows/router/router_workflow.py) takes, keeps and shows: the user's messages, the
goals they may be meant for, and each routing decision with its reason. Shared by the
router workflow, its activities (activities/router/router_activities.py) and the CLI."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from perdure.workflows.goal.contracts.memory_contracts import MemoryOffer
from perdure.workflows.goal.contracts.messages import MAX_TEXT, REQUEST_ID

ROUTER_WORKFLOW = "RouterWorkflow"
ROUTER_SCHEMA_VERSION = 1


class RouterActivities:
    """Stable activity names: histories and replay depend on them."""

    CANDIDATES = "perdure.router.candidates"
    CHOOSE = "perdure.router.choose"
    ANSWER = "perdure.router.answer"


class RouterHandlers:
    SAY = "say"  # the update (a receipt with the decision) and the signal (durable, no worker needed)
    VIEW = "view"  # the query
    MEMORY_CARD = "memory_card"  # a goal's end-of-goal card (a signal): held until a person answers it
    # A goal's reminder of a question nearing its deadline (a signal): held until answered or past it.
    QUESTION_REMINDER = "question_reminder"


def router_id(user: str) -> str:
    return f"router-{user}"


# --- what the user sends -----------------------------------------------------------


class CardAction(BaseModel):
    """A press on a question card: the answer goes to the goal that asked."""

    model_config = ConfigDict(extra="forbid")

    goal_id: str = Field(min_length=1, max_length=200)
    question_id: str = Field(min_length=1, max_length=64)
    choice: str = Field(min_length=1, max_length=64)


class Pick(BaseModel):
    """The user's answer to the router's own question (a message it could not place)."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(pattern=REQUEST_ID, description="The message the router asked about.")
    choice: str = Field(min_length=1, max_length=200, description="A goal id, `new`, or `answer`.")


class Say(BaseModel):
    """One message to the router. Only `request_id` and `text` are needed; the rest says
    where it goes when the user already knows."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(pattern=REQUEST_ID, description="Client-chosen id; a retry reuses it.")
    text: str = Field(min_length=1, max_length=MAX_TEXT)
    goal_id: str | None = Field(default=None, min_length=1, max_length=200, description="Send it to this goal.")
    new: bool = Field(default=False, description="Start a new goal with it.")
    queue: bool = Field(default=False, description="To a goal: as follow-up work (queue), not guidance (steer).")
    card: CardAction | None = None
    pick: Pick | None = None
    workspace: str | None = Field(default=None, max_length=4_000, description="Where a new goal works.")


# --- what the router knows of the user's goals --------------------------------------


class Candidate(BaseModel):
    """One of the user's goals, as the router weighs it."""

    goal_id: str
    goal: str = Field(description="Its goal text (cut).")
    status: str = Field(description="running, parked, needs a person, or how it ended.")
    open: bool
    workspace: str = ""
    objects: list[str] = Field(default_factory=list, description="Files and artifacts it owns (paths, digests).")


class RouteChoice(BaseModel):
    """The model's choice for a message nothing explicit placed."""

    target: str = Field(description="A candidate's goal id, `new` or `answer` (a light request).")
    mode: Literal["steer", "queue"] = "steer"
    confidence: float = Field(ge=0, le=1)
    reason: str = Field(max_length=600)


class ChooseInput(BaseModel):
    profile: str
    text: str
    candidates: list[Candidate]
    recent: list[str] = Field(default_factory=list, description="The user's last messages and where they went.")


class ChooseResult(BaseModel):
    reply: str = Field(
        description="The model's reply as it came (cut); the router reads it (workflows/router/routing.py)."
    )
    tokens: int = 0
    cost_usd: float = 0.0


class Turn(BaseModel):
    role: Literal["user", "router"]
    text: str


class AnswerInput(BaseModel):
    profile: str
    turns: list[Turn]


class AnswerResult(BaseModel):
    text: str
    needs_goal: str | None = Field(default=None, description="Why it needs a goal (tools, several steps), if so.")
    tokens: int = 0
    cost_usd: float = 0.0


# --- what the router keeps ------------------------------------------------------------

RoutedBy = Literal["explicit goal", "bound object", "card", "model", "person", "thread", "new"]
Action = Literal["steer", "queue", "answer", "new goal", "follow-up goal", "answered", "upgraded", "asked", "kept"]


class Routing(BaseModel):
    """One message and what became of it."""

    request_id: str
    text: str = Field(description="The message (cut).")
    at: datetime
    digest: str = Field(description="Of the message but its request id: a retry sends the same.")
    status: Literal["pending", "routed", "asked", "failed"] = "pending"
    by: RoutedBy | None = None
    action: Action | None = None
    goal_id: str | None = None
    reason: str = ""
    candidates: list[str] = Field(default_factory=list, description="The goal ids it was weighed against.")
    confidence: float | None = None
    reply: str | None = Field(default=None, description="The router's answer, or its question.")
    choices: list[str] = Field(default_factory=list, description="When asked: what the user may pick.")
    thread: str | None = Field(default=None, description="The light conversation it belongs to.")


class Thread(BaseModel):
    """A light request and its follow-ups, answered by the router itself until it grows."""

    id: str
    turns: list[Turn] = Field(default_factory=list)
    last_at: datetime
    goal_id: str | None = Field(default=None, description="The goal it grew into.")


class KeptMemories(BaseModel):
    """A memory card the user answered: what was kept across goals, and where."""

    goal_id: str
    request_id: str = Field(description="The message that answered it.")
    answer: str
    scope: Literal["project", "global"] | None = Field(default=None, description="None: nothing was kept.")
    workspace: str
    promoted: dict[str, str] = Field(default_factory=dict, description="Episodic id -> its semantic memory's id.")
    not_kept: list[str] = Field(
        default_factory=list, description="Chosen but not kept: revoked, gone or past their shelf life."
    )
    at: datetime


class QuestionReminder(BaseModel):
    """A goal's question nobody has answered, its deadline near (workflows/goal/question_deadlines.py):
    the router shows it in the user's inbox; `perdure say --card GOAL:QUESTION=CHOICE` answers it."""

    goal_id: str = Field(min_length=1, max_length=200)
    question_id: str = Field(min_length=1, max_length=64)
    title: str = Field(max_length=MAX_TEXT)
    options: list[str] = Field(default_factory=list, max_length=20)
    deadline_at: datetime
    on_expiry: str = Field(max_length=20, description="What the question decides at its deadline if unanswered.")
    at: datetime = Field(description="When the goal sent the reminder.")


class RouterRefusal(BaseModel):
    at: datetime
    reason: str


class RouterState(BaseModel):
    schema_version: int = ROUTER_SCHEMA_VERSION
    user: str
    profile: str = "default"
    messages: list[Routing] = Field(default_factory=list, description="Newest last (bounded).")
    pending: list[Say] = Field(default_factory=list, description="Admitted, not yet routed, in order.")
    asked: list[Say] = Field(default_factory=list, description="Messages waiting for the user's pick.")
    workspace: str | None = Field(default=None, description="Where new goals work when a message names none.")
    threads: list[Thread] = Field(default_factory=list, description="Newest last (bounded).")
    refusals: list[RouterRefusal] = Field(default_factory=list)
    cards: list[MemoryOffer] = Field(
        default_factory=list, description="Goals' memory cards not answered yet, oldest first (bounded)."
    )
    kept: list[KeptMemories] = Field(default_factory=list, description="Memory cards answered, newest last (bounded).")
    reminders: list[QuestionReminder] = Field(
        default_factory=list, description="Goals' questions near their deadline, oldest first (bounded)."
    )
    routed: int = Field(default=0, description="Messages routed so far, all runs.")
    runs: int = 1
    tokens: int = 0
    cost_usd: float = 0.0


class RouterInput(BaseModel):
    user: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    profile: str = "default"
    state: RouterState | None = None
    continue_after: int = Field(default=100, ge=2, description="Messages routed per run before continue-as-new.")


class RouterView(BaseModel):
    user: str
    messages: list[Routing]
    pending: int
    asked: list[Routing] = Field(description="Messages waiting for the user's pick.")
    refusals: list[RouterRefusal]
    runs: int
    tokens: int
    cost_usd: float
    cards: list[MemoryOffer] = Field(default_factory=list, description="Memory cards waiting for an answer.")
    kept: list[KeptMemories] = Field(default_factory=list, description="Memory cards answered lately.")
    reminders: list[QuestionReminder] = Field(
        default_factory=list, description="Goals' questions unanswered as their deadline nears."
    )
