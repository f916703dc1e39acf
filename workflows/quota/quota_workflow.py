"""The quota service: one long-lived QuotaWorkflow per external resource (a model
profile or API key) that hands out slots, so every goal and every worker calling that
resource waits in one line instead of each backing off alone.

Why a workflow, and not Temporal's own limits (temporalio 1.35, the dev server of the
`temporal` CLI this repository pins). The options, judged against what the brief needs:
- Task-queue rate limits (`Worker(max_task_queue_activities_per_second=...)`) are per
  queue, not per resource: each model profile would need a queue of its own and a worker
  polling it; the limit is a per-second average, with no tokens per minute, and a call
  held by the server just sits scheduled, so a goal cannot show "next slot 12:01:05" and
  the watchdog and the estimates read the hold as a slow step. Fairness keys (task
  priority) order tasks within a queue; they share capacity, they do not enforce an
  external limit. Neither is used here, so neither was verified against the dev server.
- A token bucket in a shared store needs a store every worker reaches, and its "next
  allowed at" is in no goal's history.
- This workflow: a slot is decided in an update handler from `workflow.now()`, the
  caller's clock and the resource's cursors, so it is deterministic and durable (in this
  workflow's history and state across continue-as-new); a goal that must wait gets the
  slot's time back, sleeps on a durable timer until it, and shows it. Cost: one update per
  model call of a resource with a quota (none for resources without one). Measured by
  `make bench` (`quota_efficiency`, bench/quota.py) and tests/test_quota.py.

Concurrency (calls in flight at once) is a lease: a call given its slot holds one of the
resource's places until its activity signals `release` (or `hold_s` passes: its worker
died). With every place held, the caller is told its place in the line and when to ask
again (half a call's average time, 0.25-2 s), and asks from its activity; first come,
first served. A waiting call holds no update open: the server keeps few in flight per
workflow (10 on the dev server), fewer than the calls that may wait.

Slots are spaced, not bursted: requests `60 / requests_per_minute` s apart (times
`spacing`, a small margin for the jitter between a slot and its request reaching the
provider), and a call of N estimated tokens pushes the token cursor `N * 60 /
tokens_per_minute` s. A reservation is keyed by its caller (the goal, activity and
attempt), so asking again with the same key (a worker that died while it waited,
the goal's call coming back at its slot) gets the same slot, never a second one.

Workflow code: deterministic; continues as new with its cursors and recent keys.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field
from temporalio import workflow

from perdure.workflows.shared.run_boundary import continue_as_new_due, continue_on_current_version

QUOTA_WORKFLOW = "PerdureQuota"
RESERVE_UPDATE = "reserve"
RELEASE_SIGNAL = "release"
STATE_QUERY = "state"
# The error type of a model call whose slot is later: the goal waits for it.
QUOTA_WAIT = "QuotaWait"
CONTINUE_AS_NEW_AFTER_EVENTS = 2_000
# Keys kept for asking again: a reservation older than this is forgotten.
KEEP_KEYS = timedelta(minutes=30)
MAX_KEYS = 5_000
# Concurrency: a call waiting for a place asks again this often (half a call's average
# time, within these bounds); one that stopped asking this long ago lost its place.
POLL_MIN = timedelta(seconds=0.25)
POLL_MAX = timedelta(seconds=2)
WAITING_FORGOTTEN = timedelta(seconds=15)


def quota_workflow_id(resource: str, task_queue: str = "perdure") -> str:
    """One quota workflow per resource and orchestrator queue (tests run queues of their own)."""
    return f"perdure-quota-{resource}" if task_queue == "perdure" else f"{task_queue}-quota-{resource}"


class QuotaLimits(BaseModel):
    """One resource's declared quota (config.toml `[quotas.NAME]`); a key the service does
    not enforce is refused rather than ignored."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)
    concurrency: int | None = Field(
        default=None, ge=1, description="Calls in flight at once, across goals and workers."
    )
    hold_s: float = Field(
        default=360,
        gt=0,
        description="A call's lease on a concurrency place lapses after this long when its release never "
        "comes (its worker died mid-call): longer than the call's own timeout.",
    )
    spacing: float = Field(
        default=1.03,
        ge=1.0,
        le=2.0,
        description="Slots are this much further apart than the limit allows: the margin for a request's "
        "jitter between its slot and the provider.",
    )


class QuotaRequest(BaseModel):
    key: str = Field(description="The caller: goal, activity and attempt. The same key gets the same slot.")
    limits: QuotaLimits
    tokens: int = Field(default=0, ge=0, description="The call's estimated tokens (prompt and reply).")
    asked_at: datetime | None = Field(
        default=None,
        description="The caller's clock when it asked: a slot is never earlier (workflow.now() is the workflow "
        "task's start, which may be behind the moment a free slot's request is sent).",
    )


class QuotaSlot(BaseModel):
    resource: str
    at: datetime = Field(description="When the call may start: next allowed at.")
    ahead: int = Field(default=0, description="Reservations still waiting for their slot when this one was given.")
    queued: bool = Field(
        default=False,
        description="No concurrency place is free: no slot was given; ask again at `at` with the same key, "
        "which keeps its place in the line (`ahead` calls before it).",
    )
    in_flight: int = Field(default=0, description="Calls holding a concurrency place when this was answered.")


class QuotaState(BaseModel):
    resource: str
    next_request_at: datetime | None = None
    next_token_at: datetime | None = None
    slots: dict[str, datetime] = Field(default_factory=dict, description="Key -> its slot, recent ones.")
    given: int = 0
    leases: dict[str, datetime] = Field(
        default_factory=dict, description="Concurrency: key of a call in flight -> when its lease lapses."
    )
    waiting: dict[str, datetime] = Field(
        default_factory=dict, description="Concurrency: keys waiting for a place, first come first -> last asked."
    )
    call_s: float = Field(default=2.0, description="Concurrency: how long a call holds its place, on average.")


@workflow.defn(name=QUOTA_WORKFLOW)
class QuotaWorkflow:
    @workflow.init
    def __init__(self, state: QuotaState) -> None:
        self._state = state

    @workflow.run
    async def run(self, state: QuotaState) -> None:
        del state
        await workflow.wait_condition(self._continue_as_new_due)
        await workflow.wait_condition(workflow.all_handlers_finished)
        continue_on_current_version(self._state)

    def _continue_as_new_due(self) -> bool:
        return continue_as_new_due(CONTINUE_AS_NEW_AFTER_EVENTS)

    @workflow.query(name=STATE_QUERY)
    def state(self) -> QuotaState:
        """The cursors and the recent reservations (their keys and slots)."""
        return self._state

    @workflow.update(name=RESERVE_UPDATE)
    def reserve(self, request: QuotaRequest) -> QuotaSlot:
        now = workflow.now()
        state = self._state
        ahead = sum(1 for at in state.slots.values() if at > now)
        if request.key in state.slots:
            return QuotaSlot(resource=state.resource, at=state.slots[request.key], ahead=ahead)
        limits = request.limits
        if request.key.endswith("/late"):
            # Its caller came back too late for the slot it held: the place goes with the new key.
            state.leases.pop(request.key.removesuffix("/late"), None)
        if limits.concurrency:
            queued = self._queue(request.key, limits.concurrency, now)
            if queued is not None:
                return queued
        at = max([now, *(t for t in (request.asked_at, state.next_request_at, state.next_token_at) if t is not None)])
        if limits.concurrency:
            state.leases[request.key] = at + timedelta(seconds=limits.hold_s)
        if limits.requests_per_minute:
            state.next_request_at = at + timedelta(seconds=60 / limits.requests_per_minute * limits.spacing)
        if limits.tokens_per_minute and request.tokens:
            per_token = 60 / limits.tokens_per_minute * limits.spacing
            state.next_token_at = at + timedelta(seconds=request.tokens * per_token)
        state.slots[request.key] = at
        state.given += 1
        self._forget(now)
        return QuotaSlot(resource=state.resource, at=at, ahead=ahead)

    @workflow.signal(name=RELEASE_SIGNAL)
    def release(self, key: str) -> None:
        """A call that held a concurrency place ended (answered, failed or cancelled)."""
        state = self._state
        if state.leases.pop(key, None) is not None and key in state.slots:
            held = (workflow.now() - state.slots[key]).total_seconds()
            state.call_s = 0.8 * state.call_s + 0.2 * max(held, 0.0)

    def _queue(self, key: str, concurrency: int, now: datetime) -> QuotaSlot | None:
        """None when `key` may take a concurrency place now; else its place in the line. First
        come, first served: a place goes to the longest waiting key still asking."""
        state = self._state
        for lapsed in [k for k, until in state.leases.items() if until <= now]:
            del state.leases[lapsed]
        for gone in [k for k, seen in state.waiting.items() if seen < now - WAITING_FORGOTTEN]:
            del state.waiting[gone]
        line = list(state.waiting)
        place = line.index(key) if key in state.waiting else len(line)
        free = concurrency - len(state.leases)
        if place < free:
            state.waiting.pop(key, None)
            return None
        state.waiting[key] = now
        again = min(max(state.call_s / 2, POLL_MIN.total_seconds()), POLL_MAX.total_seconds())
        return QuotaSlot(
            resource=state.resource,
            at=now + timedelta(seconds=again),
            ahead=place,
            queued=True,
            in_flight=len(state.leases),
        )

    def _forget(self, now: datetime) -> None:
        slots = self._state.slots
        for key in [k for k, at in slots.items() if at < now - KEEP_KEYS]:
            del slots[key]
        while len(slots) > MAX_KEYS:
            del slots[next(iter(slots))]


# The node's placement that holds its quota wait (`Node.placements`, beside risk order's):
# while it waits, where its slot is; once its call went, how long it waited and behind how
# many calls (the serialization quota chose), kept on the graph across recovery.
QUOTA_KEY = "quota"
_WAITED = re.compile(r"^waited (?P<s>[0-9.]+) s for quota ")


def slot_text(resource: str, at: datetime) -> str:
    """What a step waiting for its slot shows."""
    return f"waiting for quota {resource} (next slot {at.astimezone(UTC):%H:%M:%S})"


def waited_text(resource: str, seconds: float, ahead: int) -> str:
    behind = f", serialized behind {ahead} other call{'s' if ahead != 1 else ''}" if ahead else ""
    return f"waited {seconds:.1f} s for quota {resource}{behind}"


def waited_seconds(placements: dict[str, str]) -> float:
    """How long a node's model calls waited for quota (0 if it never did)."""
    match = _WAITED.match(placements.get(QUOTA_KEY, ""))
    return float(match["s"]) if match else 0.0
