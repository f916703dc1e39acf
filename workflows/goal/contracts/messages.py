"""User messages to a running goal, their receipts, and the admission rules.

A message is admitted once per client request id: the same id with the same
content is the same message (a retry), the same id with other content is
refused. Two moments judge a message. At the door (`door_problem`), only what
holds whatever arrived before it: the payload is one well-formed message
(`parse_arguments`, for any number and shape of raw arguments), its id is not
reused for other content, the goal has not ended. At its turn (`turn_problem`),
in the order messages were sent, what depends on the goal's state: a resume
finds the park sent before it applied, a second answer finds the question
answered. Pure: the goal's inbox (workflows/goal/inbox.py) records what these
decide and keys retries by `content_digest`; nothing here touches Temporal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from perdure.workflows.goal.contracts.plan import STEP_NAME, describe_validation_error
from perdure.workflows.shared.canonical import digest_of
from perdure.workflows.shared.statuses import ENDED_PHASES, STARTED

if TYPE_CHECKING:  # the state holds the inbox, so it imports this module
    from perdure.workflows.goal.contracts.state import GoalState, Question

MAX_TEXT = 8_000
SIGNAL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
SIGNAL_RULE = "a signal name is letters, digits and . _ : - (no spaces), at most 64 characters"
REQUEST_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
# A refusal keeps at most this much of its reason, and the goal at most this many refusals.
MAX_REASON = 600
MAX_REFUSALS = 100
EXAMPLE = '{"request_id": "r1", "kind": "steer", "text": "..."}'


# The message format this code reads. 1: perdure 1.0, whose goals forbid any field they do not
# know. 2: `by`, Park's conditions, Signal, Answer.steps. A field added since 1.0 is left out of
# the payload while it has its default, so a message that uses nothing new reads as 1.0 wrote
# it; the client fits a message to a goal started before 2 (starters/client/message_delivery.py).
MESSAGE_FORMAT = 2


def _unset(value: Any) -> bool:
    return value is None


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(pattern=REQUEST_ID, description="Client-chosen id; a retry reuses it.")
    by: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        exclude_if=_unset,
        description="Who sent it (a user's name, `watchdog`): the decision log says who decided.",
    )


class Steer(_Message):
    """Guidance applied at the next model-turn boundary and kept for the rest of the goal."""

    kind: Literal["steer"] = "steer"
    text: str = Field(min_length=1, max_length=MAX_TEXT)


class Queue(_Message):
    """Follow-up work planned when the goal would otherwise be idle."""

    kind: Literal["queue"] = "queue"
    text: str = Field(min_length=1, max_length=MAX_TEXT)


class Answer(_Message):
    kind: Literal["answer"] = "answer"
    question_id: str = Field(min_length=1, max_length=64)
    choice: str = Field(min_length=1, max_length=64, description="One of the question's option ids.")
    text: str | None = Field(default=None, max_length=MAX_TEXT)
    steps: list[Annotated[str, Field(pattern=STEP_NAME)]] = Field(
        default_factory=list,
        max_length=500,
        # Left out when empty: an answer without steps is the message 1.0 goals (pinned to their
        # version, which forbids unknown fields) take from a newer client.
        exclude_if=lambda steps: not steps,
        description="approve_some / refuse_some on an approvals-ahead card: the step names it picks.",
    )


class Approve(_Message):
    kind: Literal["approve"] = "approve"
    question_id: str = Field(min_length=1, max_length=64)
    approved: bool = True
    text: str | None = Field(default=None, max_length=MAX_TEXT)


def _signal_name(value: str, what: str) -> str:
    if not re.match(SIGNAL_NAME, value):
        raise ValueError(f"{what} {value!r}: {SIGNAL_RULE}")
    return value


class Park(_Message):
    kind: Literal["park"] = "park"
    reason: str = Field(min_length=1, max_length=MAX_TEXT)
    until: datetime | None = Field(default=None, description="Wake at this time; otherwise wait for resume.")
    expiry_hours: float = Field(default=48, gt=0, le=24 * 365)
    # At most one condition that ends the park by itself (workflows/goal/park_conditions.py).
    until_file: str | None = Field(
        default=None, exclude_if=_unset, description="Resume once this workspace path exists."
    )
    until_command: str | None = Field(
        default=None,
        max_length=MAX_TEXT,
        exclude_if=_unset,
        description="Resume once this command (sandboxed, in the workspace) exits 0.",
    )
    until_signal: str | None = Field(
        default=None, exclude_if=_unset, description="Resume once `perdure signal GOAL NAME` names it."
    )
    poll_first_s: float = Field(
        default=2, ge=0.5, le=3600, exclude_if=lambda v: v == 2, description="First wait between checks; it doubles."
    )
    poll_max_s: float = Field(
        default=300, ge=0.5, le=86_400, exclude_if=lambda v: v == 300, description="Longest wait between checks."
    )

    @field_validator("until_file")
    @classmethod
    def _inside_workspace(cls, value: str | None) -> str | None:
        if value is None:
            return None
        path = PurePosixPath(value)
        if not value.strip() or path.is_absolute() or ".." in path.parts or "\x00" in value:
            raise ValueError(f"until_file must be a path inside the goal's workspace, relative to it (got {value!r})")
        return str(path)

    @field_validator("until_command")
    @classmethod
    def _command_given(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("until_command is an empty command")
        return value

    @field_validator("until_signal")
    @classmethod
    def _signal_name(cls, value: str | None) -> str | None:
        return None if value is None else _signal_name(value, "until_signal")

    @model_validator(mode="after")
    def _one_condition(self) -> Park:
        given = [c for c in (self.until_file, self.until_command, self.until_signal) if c is not None]
        if len(given) > 1:
            raise ValueError("a park waits for one condition: give one of until_file, until_command, until_signal")
        if self.poll_max_s < self.poll_first_s:
            raise ValueError("poll_max_s is shorter than poll_first_s")
        return self


class Signal(_Message):
    """A named event a user or a program sends (`perdure signal GOAL NAME`): it ends a park
    that waits for it (`perdure park --until-signal NAME`)."""

    kind: Literal["signal"] = "signal"
    name: str = Field(description="The signal's name.")

    @field_validator("name")
    @classmethod
    def _signal_name(cls, value: str) -> str:
        return _signal_name(value, "signal name")


class Resume(_Message):
    kind: Literal["resume"] = "resume"


class Narrow(_Message):
    kind: Literal["narrow"] = "narrow"
    premises: dict[str, str] = Field(min_length=1, description="Premise key -> new value.")
    why: str | None = Field(default=None, max_length=MAX_TEXT)


class Rewind(_Message):
    kind: Literal["rewind"] = "rewind"
    node: str = Field(min_length=1, max_length=64)
    why: str = Field(min_length=1, max_length=MAX_TEXT)


# The request id of the abort a parent goal sends a subgoal it stops.
PARENT_STOP = "stop-by-parent"


class Abort(_Message):
    kind: Literal["abort"] = "abort"
    reason: str = Field(default="aborted by the user", max_length=MAX_TEXT)
    rollback: bool = False


class Escalate(_Message):
    """From the watchdog: something needs a person's look; asked as a question on the goal."""

    kind: Literal["escalate"] = "escalate"
    finding: str = Field(min_length=1, max_length=64, description="What the watchdog classified, e.g. stalled.")
    detail: str = Field(min_length=1, max_length=MAX_TEXT)


def beyond_format_1(message: BaseModel) -> str | None:
    """What in `message` a goal reading message format 1 (perdure 1.0) cannot take, as the end
    of "this goal runs perdure 1.0 code, which ..."; None when it can (once `by` is left out)."""
    if isinstance(message, Signal):
        return "takes no named signals"
    if isinstance(message, Park) and any(
        value is not None for value in (message.until_file, message.until_command, message.until_signal)
    ):
        return "cannot park until a file, a command or a signal (park it until a time or until resumed)"
    if isinstance(message, Answer) and message.steps:
        return "has no approvals-ahead card to answer step by step"
    return None


UserMessage = Annotated[
    Steer | Queue | Answer | Approve | Park | Resume | Signal | Narrow | Rewind | Abort | Escalate,
    Field(discriminator="kind"),
]
USER_MESSAGE = TypeAdapter(UserMessage)

ReceiptStatus = Literal["pending", "applied", "rejected"]


class InboxEntry(BaseModel):
    request_id: str
    kind: str
    digest: str
    message: UserMessage
    via: Literal["signal", "update"]
    status: ReceiptStatus = "pending"
    note: str | None = Field(default=None, description="What applying it did, or why it was rejected.")
    detail: dict[str, Any] = Field(default_factory=dict)
    received_at: datetime
    settled_at: datetime | None = None


# Kinds applied at the next model-turn boundary or when the goal would be idle, not at the
# loop's safe point: their receipt is "pending" until then.
LATER_KINDS = ("steer", "queue")


class Refusal(BaseModel):
    """A message refused at the door (malformed, or an id reused with other content)."""

    request_id: str | None
    reason: str
    received_at: datetime


class Receipt(BaseModel):
    request_id: str
    kind: str
    status: ReceiptStatus
    note: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class InboxView(BaseModel):
    entries: list[Receipt]
    refused: list[Refusal]


def content_digest(message: BaseModel) -> str:
    """Digest of everything but the request id and the sender: what makes two sends the same
    message (a digest kept before messages said who sent them stays the same)."""
    return digest_of(message.model_dump(mode="json", exclude={"request_id", "by"}))


def parse_message(raw: Any) -> tuple[Any, str | None]:
    """Validate an untrusted payload. Returns (message, None) or (None, reason)."""
    if not isinstance(raw, dict):
        return None, f"malformed message: expected a JSON object with request_id and kind, got {_json_type(raw)}"
    try:
        return USER_MESSAGE.validate_python(raw), None
    except ValidationError as err:
        return None, bounded("malformed message: " + describe_validation_error(err, root="(message)"))


def parse_arguments(args: Sequence[Any], handler: str) -> tuple[Any, str | None]:
    """A message from a handler's raw, decoded arguments, however many came (a signal
    sent with no input, or with two, is the easiest mistake with the Temporal CLI).
    Returns (message, None) or (None, reason)."""
    if len(args) != 1:
        got = "no argument" if not args else f"{len(args)} arguments"
        return None, (
            f"the {handler} carries {got}; it takes exactly one JSON object, e.g. "
            f"{EXAMPLE} (with the temporal CLI: --input '<that object>')"
        )
    return parse_message(args[0])


def request_id_of(raw: Any) -> str | None:
    """The request id of an untrusted payload, for a refusal's record, if it has a valid one."""
    value = raw.get("request_id") if isinstance(raw, dict) else None
    return value if isinstance(value, str) and re.match(REQUEST_ID, value) else None


def bounded(reason: str) -> str:
    """A refusal reason as it is kept in the goal's state: a payload of any size names
    its fields in the reason, so the reason is cut, never the state grown."""
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 1] + "…"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}
    return names.get(type(value), type(value).__name__)


def receipt_of(entry: InboxEntry) -> Receipt:
    return Receipt(
        request_id=entry.request_id, kind=entry.kind, status=entry.status, note=entry.note, detail=entry.detail
    )


def find_entry(inbox: list[InboxEntry], request_id: str) -> InboxEntry | None:
    return next((e for e in inbox if e.request_id == request_id), None)


def chosen_option(message: Answer | Approve) -> str:
    """The option id an answer or an approval picks."""
    if isinstance(message, Answer):
        return message.choice
    return "approve" if message.approved else "reject"


def door_problem(state: GoalState, message: Any, load_problem: str | None = None) -> str | None:
    """Why a well-formed message is refused at the door, or None: what is true whatever
    arrived before it and whenever it is read (a request id reused for other content,
    a goal that has ended, a carried state that cannot load, where only an abort gets in).
    A retry of an admitted message (same id, same content) is not a problem."""
    existing = find_entry(state.inbox, message.request_id)
    if existing is not None:
        if existing.digest != content_digest(message):
            return (
                f"request id '{message.request_id}' was already used for a different {existing.kind} message; "
                "use a new request id for a new message"
            )
        return None
    if state.phase in ENDED_PHASES:
        return f"the goal has ended ({state.phase}); it takes no more messages"
    if load_problem and message.kind != "abort":
        return f"{load_problem}; it can only be aborted"
    return None


def steps_problem(question: Question, choice: str, steps: list[str]) -> str | None:
    """Why an answer's `steps` cannot apply: only an approvals-ahead card's `*_some` options
    name steps, and only steps that card lists."""
    if question.topic != "approvals_ahead":
        return f"{question.id} takes no steps (only an approvals-ahead card does)" if steps else None
    listed = ", ".join(a.step for a in question.ahead)
    if choice.endswith("_some") != bool(steps):
        if steps:
            return f"{choice} is about every step on {question.id}; name steps with approve_some or refuse_some"
        return f"{choice} names the steps it is about (steps on {question.id}: {listed})"
    unknown = [s for s in steps if s not in {a.step for a in question.ahead}]
    if unknown:
        return f"step(s) {', '.join(unknown)} are not on {question.id} (its steps: {listed})"
    return None


# The steps an unknown step's refusal names (a goal may have thousands).
STEPS_LISTED = 40


def turn_problem(state: GoalState, message: Any) -> str | None:
    """Why an admitted message cannot apply when its turn comes, or None. Judged on the
    state every message before it left, so a resume sent right after a park finds the
    goal parked however the two arrived; the message is then settled "rejected" with
    this reason."""
    if state.pause.mode == "aborting" and message.kind != "abort":
        return "the goal is being aborted"
    kind = message.kind
    if kind == "rewind":
        # A large goal's pending step may have no node yet (workflows/goal/rules/frontier.py): it is pending.
        known_steps = {s.name for s in state.plan.steps} if state.plan is not None else set()
        if message.node not in state.nodes and message.node not in known_steps:
            known = ", ".join(list(state.nodes)[:STEPS_LISTED]) or "none yet"
            more = " …" if len(state.nodes) > STEPS_LISTED else ""
            return f"unknown step '{message.node}' (steps: {known}{more})"
        status = state.nodes[message.node].status if message.node in state.nodes else "pending"
        if status not in STARTED:
            return f"step '{message.node}' has not run yet ({status}); nothing to rewind"
    elif kind == "narrow":
        unknown = sorted(set(message.premises) - set(state.premises))
        if unknown:
            known = ", ".join(f"{k}={v}" for k, v in sorted(state.premises.items())) or "none"
            return f"unknown premise key(s): {', '.join(unknown)} (this goal's premises: {known})"
    elif kind in ("answer", "approve"):
        question = next((q for q in state.questions if q.id == message.question_id), None)
        if question is None:
            return f"no question '{message.question_id}' on this goal"
        if question.status == "closed":
            return (
                f"question '{message.question_id}' is closed ({question.answer_text or 'the goal no longer asks it'})"
            )
        if question.status != "open":
            return f"question '{message.question_id}' is already answered"
        choice = chosen_option(message)
        if choice not in {o.id for o in question.options}:
            options = ", ".join(o.id for o in question.options)
            return f"'{choice}' is not an option of {question.id} (options: {options})"
        return steps_problem(question, choice, getattr(message, "steps", []))
    elif kind == "park" and state.pause.mode == "parked":
        return f"the goal is already parked ({state.pause.reason})"
    elif kind == "resume" and state.pause.mode != "parked":
        return "the goal is not parked"
    elif kind == "signal":
        condition = state.pause.condition if state.pause.mode == "parked" else None
        if condition is None or condition.kind != "signal":
            return f"the goal is not parked waiting for a signal (signal {message.name} not used)"
        if condition.target != message.name:
            return f"the goal waits for signal {condition.target}, not {message.name}"
    return None
