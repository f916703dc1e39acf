"""Timeouts and retry policies of the goal's activities, in one place.

Recovery after a worker dies mid-step = the heartbeat timeout (when the server
notices) + the first retry interval (README, "Checkpoints and recovery"). A retry
that follows a lost worker needs no back-off; later ones (a failing service)
still back off.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

RETRY_FIRST = timedelta(seconds=0.5)
MODEL_RETRY = RetryPolicy(
    initial_interval=RETRY_FIRST,
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=6,
    non_retryable_error_types=["ModelRequestRejected", "UnknownModelProfile"],
)
TOOL_RETRY = RetryPolicy(
    initial_interval=RETRY_FIRST,
    maximum_attempts=3,
    non_retryable_error_types=["WorkspaceMissing"],
)
# Retries by replay policy: re-sending a keyed effect or re-checking one is safe,
# so those get more attempts; a `once` tool's second attempt only reports uncertain.
RETRY_BY_POLICY = {
    "safe": TOOL_RETRY,
    "keyed": RetryPolicy(initial_interval=RETRY_FIRST, maximum_attempts=6),
    "check": RetryPolicy(initial_interval=RETRY_FIRST, maximum_attempts=6),
    "once": RetryPolicy(initial_interval=RETRY_FIRST, maximum_attempts=2),
}
REPORT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=10)
MODEL_TIMEOUT = timedelta(minutes=5)
# Model activities heartbeat while they wait: a dead worker is noticed in this
# long instead of the full start-to-close timeout. The SDK sends heartbeats at most
# every 80% of it, so a shorter timeout risks judging a busy worker dead.
MODEL_HEARTBEAT = timedelta(seconds=4)
TOOL_TIMEOUT = timedelta(minutes=2)

# How every model activity is scheduled (planner, drift check, llm node, agent turn).
MODEL_OPTIONS: dict = {
    "start_to_close_timeout": MODEL_TIMEOUT,
    "heartbeat_timeout": MODEL_HEARTBEAT,
    "retry_policy": MODEL_RETRY,
}
REPORT_TIMEOUT = timedelta(minutes=1)
