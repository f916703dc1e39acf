"""Memory with sources (issue 21, section 2): what a memory is, and the payloads of the
`perdure.memory.*` activities. Pure pydantic, imported by the goal workflow, the memory
activities, the store (memory/) and the CLI alike; no I/O.

Three layers:
- working: what one node has in hand (the memories attached to its model input), per
  node; dropped when the node's prompt is compacted or the node settles;
- episodic: one goal's conclusions, failed attempts and rejected paths (scope goal);
- semantic: across goals, written only when a person confirms it at the end of a goal
  (scope project = the workspace, or global).

Every memory says where it came from (`source`), when it was made, how long it keeps
(`expires_at`), where it applies (`scope`, `scope_key`) and what it was derived from
(`derived_from`, memory ids). A forget revokes; a revoked memory is never live again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

Layer = Literal["working", "episodic", "semantic"]
Scope = Literal["goal", "project", "global"]
Status = Literal["live", "revoked"]
# conclusion / root_cause / failure / rejected: episodic, written by a goal; attached: a
# node's working set; summary: derived by a person's or a model's summary; note: written
# by a person (`perdure memory add`); convention / preference: promoted to semantic.
MemoryKind = Literal[
    "conclusion", "root_cause", "failure", "rejected", "attached", "summary", "note", "convention", "preference"
]
MEMORY_ID = r"^m-[0-9a-f]{12}$"
MAX_TEXT = 2_000
# What a node's model input shows of one memory.
SHOWN_CHARS = 400
# Memories attached to one node's model input, at most.
MAX_ATTACHED = 5
# How a person answers the end-of-goal card: keep them all for the workspace, everywhere,
# none, or the ones numbered (with "global" for everywhere).
CARD_CHOICES = ("project", "global", "skip", "choose")


class MemorySource(BaseModel):
    """Where a memory came from: a goal (and a step of it), a user message, a file (with
    its digest then), or a person at the command line."""

    kind: Literal["goal", "node", "message", "file", "person"]
    goal: str | None = None
    node: str | None = None
    node_key: str | None = None
    message: str | None = Field(default=None, description="The request id of the user message.")
    path: str | None = Field(default=None, description="A file source: its absolute path.")
    digest: str | None = Field(default=None, description="A file source: sha256:… of its bytes when read.")

    def label(self) -> str:
        if self.kind == "file":
            return f"file {self.path}" + (f" ({self.digest[:19]})" if self.digest else "")
        if self.kind == "message":
            return f"message {self.message} of goal {self.goal}" if self.goal else f"message {self.message}"
        if self.kind == "node":
            return f"goal {self.goal}, step '{self.node}'"
        if self.kind == "goal":
            return f"goal {self.goal}"
        return "a person (perdure memory)"


class NewMemory(BaseModel):
    """A memory to write. Its id is derived from what it is (layer, kind, scope, source,
    text), so writing it twice writes it once, and one revoked stays revoked."""

    layer: Layer
    kind: MemoryKind
    text: str = Field(min_length=1)
    source: MemorySource
    scope: Scope
    scope_key: str = Field(default="", description="The goal id (goal), the workspace path (project), '' (global).")
    derived_from: list[str] = Field(default_factory=list)
    made_at: datetime
    expires_at: datetime | None = None
    made_by: str | None = Field(default=None, description="A derived memory: the profile (or 'extract') that made it.")


class Memory(NewMemory):
    id: str = Field(pattern=MEMORY_ID)
    status: Status = "live"
    revoked_at: datetime | None = None
    revoked_why: str | None = None
    replaced_by: str | None = Field(default=None, description="Regenerated without a forgotten source: the new id.")
    redacted: int = Field(default=0, description="Secrets the scrubber took out of the text before it was stored.")

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def where(self) -> str:
        """Which goal or project it belongs to, as a prompt or a listing shows it."""
        if self.scope == "goal":
            return f"goal {self.scope_key}"
        if self.scope == "project":
            return f"project {self.scope_key}"
        return "global"


class Recalled(BaseModel):
    """One memory as a node's model input shows it (workflows/goal/rules/memory_rules.py renders it)."""

    id: str
    layer: Layer
    kind: MemoryKind
    text: str = Field(max_length=SHOWN_CHARS + 20)
    scope: Scope
    scope_key: str = ""
    source: str = Field(description="Its source, as a label.")
    made_at: datetime


class Revocation(BaseModel):
    """A memory this goal used that a forget revoked, as the goal is told it."""

    id: str
    why: str
    at: datetime
    replaced_by: str | None = None
    replacement: str | None = Field(default=None, description="The regenerated memory's text, as shown.")


# --- the activities' payloads ---------------------------------------------------------


class RecordInput(BaseModel):
    goal_id: str
    memories: list[NewMemory] = Field(default_factory=list)
    drop_working_of: list[str] = Field(
        default_factory=list, description="Nodes whose working memories go (compacted or settled)."
    )


class RecordResult(BaseModel):
    ids: list[str] = Field(default_factory=list, description="The id of each memory given, in order.")
    refused: list[str] = Field(
        default_factory=list, description="Of those, the ones revoked before (never written again) or derived from one."
    )
    dropped: int = 0


class RecallInput(BaseModel):
    goal_id: str
    node: str
    node_key: str | None = None
    workspace: str
    query: str = Field(description="The step's text: its kind, prompt, inputs and premises.")
    limit: int = Field(default=MAX_ATTACHED, ge=1, le=MAX_ATTACHED)
    at: datetime = Field(description="The workflow's now: what is expired by then is not recalled.")
    check: list[str] = Field(default_factory=list, description="Ids the goal used before: which are revoked now?")
    record: RecordInput | None = Field(default=None, description="Writes the goal had waiting, made first.")


class RecallResult(BaseModel):
    memories: list[Recalled] = Field(default_factory=list)
    working: str | None = Field(default=None, description="The working memory recording what was attached.")
    revoked: list[Revocation] = Field(default_factory=list, description="Of `check`, those revoked.")
    recorded: RecordResult | None = None


class RevocationsInput(BaseModel):
    ids: list[str]
    record: RecordInput | None = Field(default=None, description="Writes the goal had waiting, made first.")


class RevocationsResult(BaseModel):
    revoked: list[Revocation] = Field(default_factory=list)
    recorded: RecordResult | None = None


class PromoteInput(BaseModel):
    goal_id: str
    ids: list[str] = Field(description="Episodic memories a person confirmed.")
    scope: Literal["project", "global"]
    workspace: str
    at: datetime


class PromoteResult(BaseModel):
    promoted: dict[str, str] = Field(default_factory=dict, description="Episodic id -> its semantic memory's id.")
    refused: list[str] = Field(default_factory=list, description="Revoked or gone meanwhile: not promoted.")


# --- what a goal keeps of its memory (GoalState.memory) ---------------------------------


class WrittenMemory(BaseModel):
    """An episodic memory this goal wrote: what the end-of-goal card chooses from."""

    id: str
    kind: MemoryKind
    node: str | None = None
    node_key: str | None = None
    text: str = Field(max_length=SHOWN_CHARS + 20)
    claim: str | None = Field(default=None, description="A conclusion: its claim, normalised.")
    holds: bool | None = None
    expires_at: datetime | None = Field(default=None, description="Its shelf life's end, as written.")


class MemoryOffer(BaseModel):
    """The end-of-goal card as a goal sends it to its owner's router: the verified
    conclusions it offers for keeping across goals. The router holds it until a person
    answers (`perdure say --card GOAL:memory=CHOICE`) or until the shelf life of its
    memories ends."""

    goal_id: str = Field(min_length=1, max_length=200)
    workspace: str = Field(min_length=1, max_length=4_000)
    goal: str = Field(default="", max_length=300, description="The goal's text (cut): which goal it was.")
    candidates: list[WrittenMemory] = Field(min_length=1, max_length=50, description="Each with its memory id.")
    choices: list[str] = Field(default_factory=lambda: list(CARD_CHOICES), description="How it may be answered.")
    offered_at: datetime
    expires_at: datetime = Field(description="The shelf life of its memories ends: the router drops it then.")


class MemoryOffered(BaseModel):
    """What became of the goal's offer: where it went, or why it went nowhere."""

    candidates: int
    router: str | None = Field(default=None, description="The router that holds it.")
    problem: str | None = Field(default=None, description="Why no router holds it.")


class GoalMemory(BaseModel):
    """The goal's side of its memory, carried across continue-as-new: the ids its nodes
    were given (for revocations), what it was told was revoked, what it wrote."""

    used: dict[str, str] = Field(default_factory=dict, description="Memory id -> the first step given it.")
    revoked: list[Revocation] = Field(default_factory=list, description="Used memories a forget revoked.")
    told: int = Field(default=0, description="How many of `revoked` a model turn has been told.")
    written: list[WrittenMemory] = Field(default_factory=list)
    rejected_recorded: int = Field(default=0, description="Rejected paths already queued as memories.")
    outbox: list[NewMemory] = Field(
        default_factory=list, description="Episodic memories of settled steps, written with the next memory call."
    )
    drop_pending: list[str] = Field(
        default_factory=list, description="Nodes whose working memories go with the next memory call."
    )
    offered: MemoryOffered | None = Field(default=None, description="The card sent to the owner's router.")
    problems: int = Field(default=0, description="Memory calls that failed (the goal went on without them).")
    checked_at: datetime | None = Field(
        default=None, description="The workflow task that last asked for revocations: asked once per task."
    )
