"""After a lost worker: the goal's next workflow task goes to any worker at once.

A worker caches each goal it runs, and the server sends that goal's next workflow
task to the worker's own sticky queue. When the worker is SIGKILLed while one of the
goal's activities runs on it (activities are dispatched eagerly to the worker whose
workflow task scheduled them), the activity's retry runs on another worker after the
heartbeat timeout, but the workflow task that records its result still goes to the
dead worker's sticky queue and waits out `sticky_queue_schedule_to_start_timeout`
there before any other worker may take it (the server judges a sticky worker gone
only after 10 s without its polls, a constant).

So an activity attempt that follows a timed-out attempt (the server saw no heartbeat
or no result: the worker is most likely dead) first asks the server to forget the
goal's sticky queue (ResetStickyTaskQueue). The cost when the worker holding the goal
was in fact alive is one replay of the goal on whichever worker takes the next task.
An attempt that follows an ordinary failure (a service said 503) changes nothing.
This must never fail or delay the activity by more than a bounded wait: errors are
logged and the attempt goes on.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
from temporalio.service import RPCError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

log = structlog.get_logger(__name__)

# The two calls take milliseconds; a server slower than this is not waited for.
RELEASE_WAIT_S = 5.0


class ReleaseAfterLostWorker(Interceptor):
    """Worker interceptor (workers/orchestrator.py) that runs `release_if_lost` before a retried attempt."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        if info.attempt > 1 and info.workflow_id and not info.is_local:
            try:
                await asyncio.wait_for(release_if_lost(info), RELEASE_WAIT_S)
            except (RPCError, RuntimeError, TimeoutError) as err:
                log.warning("could not release the goal from a lost worker", workflow_id=info.workflow_id, error=err)
        return await self.next.execute_activity(input)


async def release_if_lost(info: activity.Info) -> bool:
    """Reset the workflow's sticky queue when this activity's previous attempt timed out;
    True when it did."""
    client = activity.client()
    handle = client.get_workflow_handle(info.workflow_id or "", run_id=info.workflow_run_id)
    description = await handle.describe()
    pending = next(
        (p for p in description.raw_description.pending_activities if p.activity_id == info.activity_id), None
    )
    if pending is None or not pending.last_failure.HasField("timeout_failure_info"):
        return False
    await client.workflow_service.reset_sticky_task_queue(
        ResetStickyTaskQueueRequest(
            namespace=info.namespace,
            execution=WorkflowExecution(workflow_id=info.workflow_id, run_id=info.workflow_run_id or ""),
        )
    )
    log.info("goal released from a lost worker's sticky queue", workflow_id=info.workflow_id, attempt=info.attempt)
    return True
