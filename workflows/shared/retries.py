"""Timeouts and retry policies of the goal's activities, in one place, and what a failed
model attempt cost (`ModelAttempt`), as both sides of a model activity read it.

Recovery after a worker dies mid-step = the heartbeat timeout (when the server
notices) + the first retry interval (docs/guide/recovery.md). A retry
that follows a lost worker needs no back-off; later ones (a failing service)
still back off.

How short a heartbeat timeout may be is set by the SDK's throttling: it sends an
activity's heartbeats to the server at most every min(80 % of the heartbeat timeout,
the worker's `max_heartbeat_throttle_interval`). perdure's workers set that interval
to HEARTBEAT_THROTTLE (workers/orchestrator.py), so a live worker's heartbeats reach the
server about every second whatever the timeout, and a timeout of T leaves T - 1 s for a
heartbeat that is late (a busy event loop, a loaded machine) before a live worker is
judged dead. Every perdure activity that waits heartbeats from a task on the worker's
event loop (activities/heartbeat.py), never from the work itself (a command is a
subprocess, a model reply is awaited), so a busy call does not delay its heartbeats.

A model attempt that fails is billed by the provider all the same. The activity keeps
one record per failed attempt in its heartbeat details (the next attempt reads them
back), puts them on its result (`failed_attempts`) or, when it fails for good, in its
error's details; the workflow charges each record (workflows/goal/model_calls.py).
"""

from __future__ import annotations

from datetime import timedelta
from functools import cache
from typing import Any

from pydantic import BaseModel, Field, create_model
from temporalio.common import RetryPolicy

# The first retry follows at once: after a lost worker, it is what recovery waits for
# beyond the heartbeat timeout. Later retries (a failing service) back off threefold:
# 0.1, 0.3, 0.9, 2.7, 8.1 s (12.1 s in all over six attempts; before, 0.5 s doubling, 15.5 s).
RETRY_FIRST = timedelta(seconds=0.1)
RETRY_BACKOFF = 3.0
RETRY_LONGEST = timedelta(seconds=60)
_BACKOFF: dict[str, Any] = dict(
    initial_interval=RETRY_FIRST, backoff_coefficient=RETRY_BACKOFF, maximum_interval=RETRY_LONGEST
)
MODEL_RETRY = RetryPolicy(
    **_BACKOFF,
    maximum_attempts=6,
    non_retryable_error_types=["ModelRequestRejected", "UnknownModelProfile", "ModelReplyTimedOut"],
)
TOOL_RETRY = RetryPolicy(**_BACKOFF, maximum_attempts=3, non_retryable_error_types=["WorkspaceMissing"])
# Retries by replay policy: re-sending a keyed effect or re-checking one is safe,
# so those get more attempts; a `once` tool's second attempt only reports uncertain.
RETRY_BY_POLICY = {
    "safe": TOOL_RETRY,
    "keyed": RetryPolicy(**_BACKOFF, maximum_attempts=6),
    "check": RetryPolicy(**_BACKOFF, maximum_attempts=6),
    "once": RetryPolicy(**_BACKOFF, maximum_attempts=2),
}
REPORT_RETRY = RetryPolicy(**_BACKOFF, maximum_attempts=10)
# One attempt of a model activity. The model client's wait for a reply is derived from
# it (activities/models/timeouts.py: this less MODEL_REPLY_MARGIN), never the other way
# round: a client that gave up earlier would end a request the activity still waits
# for, and the retry would send (and pay for) it again. A sync call may take this long;
# a background call (a handle that is polled) goes on across attempts.
MODEL_TIMEOUT = timedelta(minutes=5)
# What an attempt keeps after the client's wait to report the failure (and the usage
# it knows) itself, before the server's start-to-close timeout would.
MODEL_REPLY_MARGIN = timedelta(seconds=5)
# What the SDK's heartbeat throttling is capped at on perdure's workers (module docstring):
# a live worker's heartbeats reach the server about this often.
HEARTBEAT_THROTTLE = timedelta(seconds=1)
# The heartbeat timeout of a call whose retry is harmless or paid for once more at most
# (a keyed or checked write, a replay-safe command, a model call): a killed worker is
# noticed this long after its last heartbeat, and a live one has this less
# HEARTBEAT_THROTTLE (1 s) of slack for a late heartbeat. The server's default throttling
# (80 % of the timeout) would leave 0.4 s of it.
HEARTBEAT_TIMEOUT = timedelta(seconds=2)
# A call whose second attempt only reports `uncertain` (a `once` tool, a command that is
# not replay-safe): a false "dead" becomes a question for a person, so 4 s of slack.
ONCE_HEARTBEAT = timedelta(seconds=5)
# Model activities heartbeat while they wait: a dead worker is noticed in seconds instead
# of the full start-to-close timeout. A false "dead" re-sends (and pays for) the call, so
# a live worker gets 4 s of slack, as a `once` call does: with 1 s, a worker whose event
# loop stalled under load (2 cores, a CI run) paid for a slow reply twice.
MODEL_HEARTBEAT = ONCE_HEARTBEAT
TOOL_TIMEOUT = timedelta(minutes=2)

# How every model activity is scheduled (planner, drift check, llm node, agent turn).
MODEL_OPTIONS: dict = {
    "start_to_close_timeout": MODEL_TIMEOUT,
    "heartbeat_timeout": MODEL_HEARTBEAT,
    "retry_policy": MODEL_RETRY,
}
REPORT_TIMEOUT = timedelta(minutes=1)


class ModelAttempt(BaseModel):
    """One attempt of a model activity that failed, and what the provider billed for it."""

    attempt: int = Field(ge=1)
    outcome: str = Field(description="Why it failed, for a person: 'HTTP 503', 'worker lost', ...")
    # Plain fields rather than a contracts.Usage: perdure.workflows.shared.contracts imports this module.
    known: bool = Field(default=False, description="False: cannot be known (charged at the kind's P80, estimated).")
    lost: bool = Field(
        default=False, description="It died with its worker (no record of its own): not a failure of the call."
    )
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0)


class Attempted(BaseModel):
    """The fields a model activity's result carries beside its own (see `with_attempts`)."""

    failed_attempts: list[ModelAttempt] = Field(default_factory=list)


@cache
def with_attempts(result_type: type[BaseModel]) -> type[BaseModel]:
    """`result_type` with `failed_attempts`: what the activity returns and the workflow
    decodes. A result without the field (a faked activity) decodes with none."""
    return create_model(f"{result_type.__name__}WithAttempts", __base__=(result_type, Attempted))


def failed_attempts_in(details: Any) -> list[ModelAttempt]:
    """The records in a heartbeat's or an error's details (a dict, or a sequence whose
    first item is one); anything else holds none."""
    if isinstance(details, (list, tuple)):
        details = details[0] if details else None
    if not isinstance(details, dict):
        return []
    records = []
    for record in details.get("failed_attempts") or []:
        try:
            records.append(ModelAttempt.model_validate(record))
        except ValueError:
            continue
    return records


def unaccounted_attempts(details: Any, through: int, *, handle_pays: bool) -> list[ModelAttempt]:
    """Attempts up to `through` that left no record in `details` (the last heartbeat of
    an attempt): they died with their worker, so what they cost cannot be known. An
    attempt after the one that created a live handle (a background response) only
    polled it and cost nothing of its own; the handle's call itself is one unknown
    attempt when `handle_pays` (nobody will fetch it), else it is still being paid for
    by whoever resumes it."""
    info = details[0] if isinstance(details, (list, tuple)) and details else details
    info = info if isinstance(info, dict) else {}
    recorded = {r.attempt for r in failed_attempts_in(info)}
    handle_from = info.get("handle_attempt") if info.get("handle") else None
    lost = []
    for attempt in range(1, through + 1):
        if attempt in recorded:
            continue
        if isinstance(handle_from, int) and attempt >= handle_from:
            if handle_pays and attempt == handle_from:
                lost.append(
                    ModelAttempt(attempt=attempt, outcome=f"its background call {info['handle']} was lost", lost=True)
                )
            continue
        lost.append(ModelAttempt(attempt=attempt, outcome="worker lost while the call was in flight", lost=True))
    return lost
