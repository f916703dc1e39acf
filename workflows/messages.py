"""User messages to a running goal, their receipts, and the admission rules.

A message is admitted once per client request id: the same id with the same
content is the same message (a retry), the same id with other content is
refused. Pure: the workflow's signal and update handlers call `admission_problem`
and `content_digest`; nothing here touches Temporal.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from workflows.canonical import digest_of

MAX_TEXT = 8_000
REQUEST_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(pattern=REQUEST_ID, description="Client-chosen id; a retry reuses it.")


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


class Approve(_Message):
    kind: Literal["approve"] = "approve"
    question_id: str = Field(min_length=1, max_length=64)
    approved: bool = True
    text: str | None = Field(default=None, max_length=MAX_TEXT)


class Park(_Message):
    kind: Literal["park"] = "park"
    reason: str = Field(min_length=1, max_length=MAX_TEXT)
    until: datetime | None = Field(default=None, description="Wake at this time; otherwise wait for resume.")
    expiry_hours: float = Field(default=48, gt=0, le=24 * 365)


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


class Abort(_Message):
    kind: Literal["abort"] = "abort"
    reason: str = Field(default="aborted by the user", max_length=MAX_TEXT)
    rollback: bool = False


class Escalate(_Message):
    """From the watchdog: something needs a person's look; asked as a question on the goal."""

    kind: Literal["escalate"] = "escalate"
    finding: str = Field(min_length=1, max_length=64, description="What the watchdog classified, e.g. stalled.")
    detail: str = Field(min_length=1, max_length=MAX_TEXT)


UserMessage = Annotated[
    Steer | Queue | Answer | Approve | Park | Resume | Narrow | Rewind | Abort | Escalate,
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
    """Digest of everything but the request id: what makes two sends the same message."""
    return digest_of(message.model_dump(mode="json", exclude={"request_id"}))


def parse_message(raw: Any) -> tuple[Any, str | None]:
    """Validate an untrusted payload. Returns (message, None) or (None, reason)."""
    try:
        return USER_MESSAGE.validate_python(raw), None
    except ValidationError as err:
        parts = []
        for e in err.errors(include_url=False):
            loc = ".".join(str(p) for p in e["loc"]) or "(message)"
            parts.append(f"{loc}: {e['msg']}")
        return None, "malformed message: " + "; ".join(parts)


def receipt_of(entry: InboxEntry) -> Receipt:
    return Receipt(
        request_id=entry.request_id, kind=entry.kind, status=entry.status, note=entry.note, detail=entry.detail
    )
