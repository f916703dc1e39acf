"""How long a model client waits, derived from the activity's attempt in this one place.

The attempt (workflows/shared/retries.py MODEL_TIMEOUT, or whatever start-to-close the
activity was scheduled with) is the outer limit; the client's wait for a reply is what
is left of it less MODEL_REPLY_MARGIN. Never the other way round: a client that gave
up first would end a request the activity still waits for, and the retry would send
it, and pay for it, again. The profile's `timeout_s` bounds only how long the provider
may take to accept the request (connect, send, a free connection), which is safe to
retry because nothing was accepted. Nothing here reads a key or decides a retry.
"""

from __future__ import annotations

import time

import httpx2
from temporalio import activity

from perdure.activities.models.profiles import ModelProfile
from perdure.workflows.shared.retries import MODEL_REPLY_MARGIN, MODEL_TIMEOUT

# The shortest wait ever given, so a late start still gets a real request.
MIN_REPLY_WAIT_S = 1.0


def attempt_deadline() -> float:
    """The monotonic time by which this attempt must have reported (its start-to-close less the margin)."""
    limit = MODEL_TIMEOUT
    if activity.in_activity() and activity.info().start_to_close_timeout:
        limit = activity.info().start_to_close_timeout
    return time.monotonic() + max(MIN_REPLY_WAIT_S, (limit - MODEL_REPLY_MARGIN).total_seconds())


def request_timeout(profile: ModelProfile, deadline: float) -> httpx2.Timeout:
    """The SDK timeout of one request: accepted within `timeout_s`, answered by the deadline."""
    reply_s = max(MIN_REPLY_WAIT_S, deadline - time.monotonic())
    accept_s = min(profile.timeout_s, reply_s)
    return httpx2.Timeout(connect=accept_s, read=reply_s, write=accept_s, pool=accept_s)


def reply_timed_out(err: BaseException) -> bool:
    """Whether a client timeout came after the provider accepted the request: the read of
    the reply timed out. Judged by class name, because the SDKs wrap their own HTTP
    libraries' exceptions (httpx, httpx2) as the cause."""
    return type(err.__cause__).__name__ == "ReadTimeout"
