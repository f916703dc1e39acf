"""What an abort has done so far, as the progress snapshot and the event stream carry it:
requested (the goal waits for work still running and for compensations), then achieved
(nothing runs, every undo has settled), with what was undone and what could not be, and why.

Pure data, shared by the workflow (workflows/goal/rules/abort_view.py works it out) and every
reader (`perdure status`, `perdure abort`, the page).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

AbortStage = Literal["requested", "achieved"]
# pending: waits its turn (or for its write to land); running: its undo is on its way;
# done: undone; failed: its undo failed; no_undo: its tool declares none; uncertain: whether it
# happened is unknown and nothing can undo it; kept: no rollback was asked.
UndoStatus = Literal["pending", "running", "done", "failed", "no_undo", "uncertain", "kept"]


class AbortStep(BaseModel):
    """A step the abort found at work: one it waits for, or one it stopped at once."""

    node: str
    kind: str
    tools: list[str] = Field(default_factory=list, description="The tools it has in flight, as far as the goal knows.")
    note: str = ""


class AbortEffect(BaseModel):
    """One effect in the world the abort undoes, undid, or leaves in place."""

    effect: str = Field(description="The effect key (empty for a step whose effect key is not known).")
    node: str
    tool: str | None = Field(default=None, description="The tool that made the effect.")
    undo: str | None = Field(default=None, description="The tool that undoes it (its compensation), if any.")
    status: UndoStatus
    why: str | None = None


class AbortProgress(BaseModel):
    stage: AbortStage
    requested_at: datetime | None = None
    achieved_at: datetime | None = None
    by: str = Field(default="", description="Who asked: a message (its request id), an answer, the budget, ...")
    reason: str = ""
    rollback: bool = False
    emergency: bool = Field(default=False, description="A budget ran out: the plan's wrap-up steps still run.")
    running: list[AbortStep] = Field(default_factory=list, description="Work it waits for: writes in flight, subgoals.")
    stopped: list[AbortStep] = Field(default_factory=list, description="Work it cancelled at once.")
    to_undo: list[AbortEffect] = Field(default_factory=list, description="Compensations pending or running.")
    undone: list[AbortEffect] = Field(default_factory=list)
    not_undone: list[AbortEffect] = Field(default_factory=list, description="What stays done, with why.")
