"""What a wait step hands its output activity, and gets back (activities/goal/timer_history.py)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from perdure.workflows.goal.rules.timing import TimerRecord
from perdure.workflows.shared.contracts import ToolResult


class WaitOutputInput(BaseModel):
    """A wait step acting on its time: what activities/goal/timer_history.py judges and keeps."""

    name: str
    planned: datetime
    acted: datetime = Field(description="workflow.now() when the goal acted.")
    parked: bool = False
    summary: str = Field(description="Its timer's summary, as the goal started it: how its events are found.")


class WaitOutput(BaseModel):
    record: TimerRecord
    stored: ToolResult
