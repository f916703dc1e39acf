"""How late a timer was: a wait step's or a park's planned time against the time the goal
acted, judged exact or late, and the sentence the model, the status and the report show
("checked at 09:00:04 UTC, 4 s late, exact"). Pure: the goal hands in its clock.

A durable timer fires on the server; the goal acts only when a worker runs its next
workflow task. With a worker up that is well under a second; a larger gap means no worker
ran (or the server was down), or the goal was parked at the planned time.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field

# Past this, the timer did not fire while a worker was there to act on it. Generous for a
# loaded machine's task pickup; an outage or a park is minutes at least.
EXACT_WITHIN = timedelta(seconds=5)
# The timer records a goal keeps (newest last); the oldest are dropped.
TIMERS_KEPT = 200

_DURATION_PART = re.compile(r"(\d+)(d|h|m|s)")
_UNITS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
DURATION_FORMAT = "a number and a unit, or several: 90s, 15m, 2h, 1d, 1h30m"


def parse_duration(text: str) -> timedelta:
    """`90s`, `15m`, `2h`, `1d` or a sum of them (`1h30m`); ValueError otherwise."""
    cleaned = text.strip().lower()
    parts = _DURATION_PART.findall(cleaned)
    if not cleaned or "".join(n + u for n, u in parts) != cleaned:
        raise ValueError(f"'{text}' is not a duration ({DURATION_FORMAT})")
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"'{text}' is not a positive duration")
    return timedelta(seconds=seconds)


class TimerRecord(BaseModel):
    """One timer the goal acted on: what it was for, when it was planned and when the goal acted."""

    what: str = Field(description="'wait step NAME', 'park wake time' or 'park expiry'.")
    node: str | None = Field(default=None, description="The wait step's name, for a wait step.")
    planned: datetime
    acted: datetime
    late_s: float = Field(ge=0, description="Seconds between the planned time and the goal acting.")
    timing: Literal["exact", "late"]
    cause: str | None = Field(default=None, description="Why it was late, when known.")

    def text(self, verb: str = "checked") -> str:
        same_day = self.acted.date() == self.planned.date()
        acted = f"{self.acted:%H:%M:%S}" if same_day else f"{self.acted:%Y-%m-%d %H:%M:%S}"
        cause = f" ({self.cause})" if self.cause and self.timing == "late" else ""
        return (
            f"{verb} at {acted} UTC, {lateness_text(self.late_s)}, {self.timing}{cause}; "
            f"planned {self.planned:%Y-%m-%d %H:%M:%S} UTC"
        )


class TimerEvents(BaseModel):
    """What the goal's history says of one timer: when the server fired it, and when a
    worker took the workflow task that acted on it (activities/goal/timer_history.py)."""

    fired_at: datetime | None = None
    taken_at: datetime | None = None


UNKNOWN_CAUSE = "no worker ran the goal then, or the server was down"


def late_cause(planned: datetime, events: TimerEvents) -> str | None:
    """Why a timer was acted on late, read off its history: the server fired it late (it was
    down, or behind), or it fired on time and no worker took the goal. None when the history
    does not tell (no such timer, e.g. its time had passed before the wait began)."""
    if events.fired_at is None:
        return None
    fired_late = events.fired_at - planned
    if fired_late >= EXACT_WITHIN:
        late = lateness_text(fired_late.total_seconds())
        return f"the server fired the timer at {events.fired_at:%H:%M:%S} UTC, {late}: it was down or behind"
    if events.taken_at is not None and events.taken_at - events.fired_at >= EXACT_WITHIN:
        return f"the timer fired on time; no worker took the goal until {events.taken_at:%H:%M:%S} UTC"
    return None


def judge(
    what: str,
    planned: datetime,
    acted: datetime,
    *,
    node: str | None = None,
    parked: bool = False,
    cause: str | None = None,
) -> TimerRecord:
    """The record of acting at `acted` on a timer planned for `planned`. `parked`: the goal
    was parked when the time came, so it acted only on resume. `cause`: why it was late, when
    the goal's history told (late_cause)."""
    late = max(acted - planned, timedelta(0))
    exact = late < EXACT_WITHIN and not parked
    if exact:
        cause = None
    elif parked:
        cause = "the goal was parked"
    else:
        cause = cause or UNKNOWN_CAUSE
    return TimerRecord(
        what=what,
        node=node,
        planned=planned,
        acted=acted,
        late_s=round(late.total_seconds(), 3),
        timing="exact" if exact else "late",
        cause=cause,
    )


def record(timers: list[TimerRecord], entry: TimerRecord) -> None:
    """Keep `entry`, in the order the goal acted and, among timers acted on at once (a goal
    catching up after an outage), in planned order; bounded."""
    timers.append(entry)
    timers.sort(key=lambda t: (t.acted, t.planned))
    del timers[:-TIMERS_KEPT]


def lateness_text(seconds: float) -> str:
    """'on time', '4 s late', '2 min 5 s late', '3 h 10 min late', '2 d 1 h late'."""
    whole = int(seconds)
    if whole < 1:
        return "on time"
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        parts = [f"{days} d", f"{hours} h" if hours else ""]
    elif hours:
        parts = [f"{hours} h", f"{minutes} min" if minutes else ""]
    elif minutes:
        parts = [f"{minutes} min", f"{secs} s" if secs else ""]
    else:
        parts = [f"{secs} s"]
    return " ".join(p for p in parts if p) + " late"
