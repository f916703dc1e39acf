"""Fault points for crash tests: SIGKILL this worker process at a named point, when asked to.

Off unless the environment variable PERDURE_FAULT is set; then `fault_point`
returns at once and changes nothing, so production code may call it on its hot
paths. It must never decide anything else: the code around a fault point runs
the same with or without it.

    PERDURE_FAULT = POINT[:SUBJECT]:N[+DELAY_S]

kills the process the N-th time (counted in this process) that POINT is reached
for SUBJECT, DELAY_S seconds later when given (default: at once). SUBJECT is a
tool name, or an effect key (`fx-...`) to aim at one logical effect; without it
any subject counts. The points:

- `before_effect:TOOL`  after the intent heartbeat, before the external call;
- `after_effect:TOOL`   right after the service accepted the effect, before the
                        activity heartbeats its receipt or completes;
- `after_receipt:TOOL`  after the receipt heartbeat, before the activity completes;
- `model_call`          when a model request is about to go out; with a delay the
                        process dies while the call is in flight;
- `tool_done:TOOL`      a tool without an outside effect (a read, a workspace write)
                        has its result, before the activity returns it;
- `report`              the goal's report is about to be written (its last step).

Examples: `after_effect:send_email:4`, `before_effect:fx-0123…:1`, `model_call:2+0.5`.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

FAULT_ENV = "PERDURE_FAULT"
POINTS = frozenset({"before_effect", "after_effect", "after_receipt", "model_call", "tool_done", "report"})

_reached: Counter[tuple[str, str | None]] = Counter()
_lock = threading.Lock()


@dataclass(frozen=True)
class Fault:
    point: str
    subject: str | None
    nth: int
    delay_s: float = 0.0

    def __str__(self) -> str:
        subject = f":{self.subject}" if self.subject else ""
        delay = f"+{self.delay_s:g}" if self.delay_s else ""
        return f"{self.point}{subject}:{self.nth}{delay}"


def parse_fault(text: str) -> Fault:
    """Parse a PERDURE_FAULT value; ValueError says what is wrong."""
    parts = text.strip().split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"{FAULT_ENV}={text!r}: expected POINT[:SUBJECT]:N[+DELAY_S]")
    point, count = parts[0], parts[-1]
    subject = parts[1] if len(parts) == 3 else None
    if point not in POINTS:
        raise ValueError(f"{FAULT_ENV}={text!r}: unknown point {point!r} (known: {', '.join(sorted(POINTS))})")
    nth_text, _, delay_text = count.partition("+")
    try:
        nth = int(nth_text)
        delay = float(delay_text) if delay_text else 0.0
    except ValueError:
        raise ValueError(f"{FAULT_ENV}={text!r}: N must be an integer and DELAY_S a number") from None
    if nth < 1 or delay < 0:
        raise ValueError(f"{FAULT_ENV}={text!r}: N must be >= 1 and DELAY_S >= 0")
    return Fault(point, subject or None, nth, delay)


def fault_point(point: str, subject: str | None = None, **context: Any) -> None:
    """SIGKILL this process here if PERDURE_FAULT names this point; otherwise do nothing."""
    text = os.environ.get(FAULT_ENV)
    if not text:
        return
    fault = parse_fault(text)
    if fault.point != point or fault.subject not in (None, subject, context.get("effect_key")):
        return
    with _lock:
        _reached[(point, fault.subject)] += 1
        if _reached[(point, fault.subject)] != fault.nth:
            return
    details = " ".join(f"{k}={v}" for k, v in sorted(context.items()))
    when = f" in {fault.delay_s:g}s" if fault.delay_s else ""
    # Written straight to fd 2: a logger's buffer would die with the process.
    os.write(2, f"perdure fault: SIGKILL{when} at {fault} ({point} {subject or ''} {details})\n".encode())
    if fault.delay_s:
        timer = threading.Timer(fault.delay_s, _kill)
        timer.daemon = True
        timer.start()
    else:
        _kill()


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
