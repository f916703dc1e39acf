"""Sending a message to the user's router (workflows/router/router_workflow.py) and reading what it decided.

The router is started on first use (start with id-conflict policy USE_EXISTING, so two
first messages at once start one router). A message goes as an update when a worker
answers (the decision comes back) and else as a signal, stored durably by the server and
routed once a worker runs; both carry the same request id, so a message that lands both
ways is routed once. Every wait is bounded: the server holds an update no worker has
taken (stage ADMITTED) and the SDK asks again for as long as it is let, so without a
bound `say` would wait for a worker forever.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.client import (
    Client,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
    WorkflowUpdateStage,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from perdure.runtime import settings
from perdure.starters.client.client_errors import SayRefused
from perdure.workflows.router.router_contracts import RouterHandlers, RouterInput, RouterView, Routing, Say, router_id
from perdure.workflows.router.router_workflow import RouterWorkflow

# A running worker takes an update at its next workflow task, well within this; past it
# no worker is there to take the message. (Whether one polls is no answer: a worker that
# stopped lately is still listed, one that has just started not yet.)
ACCEPT_WAIT = timedelta(seconds=5)
# A routing may take a model call: wait this long for the decision before saying "admitted".
DECISION_WAIT = timedelta(seconds=30)
FALLBACK = (
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.CANCELLED,
    RPCStatusCode.FAILED_PRECONDITION,
    RPCStatusCode.RESOURCE_EXHAUSTED,
)


async def ensure_router(client: Client, user: str, profile: str = "default") -> str:
    workflow_id = router_id(user)
    await client.start_workflow(
        RouterWorkflow.run,
        RouterInput(user=user, profile=profile),
        id=workflow_id,
        task_queue=settings.task_queue(),
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"router of {user}",
    )
    return workflow_id


async def say(client: Client, user: str, message: Say, profile: str = "default") -> Routing | None:
    """What the router decided, or None when no worker answered in time and the message
    was admitted by signal (it is routed once a worker runs)."""
    handle = client.get_workflow_handle(await ensure_router(client, user, profile))
    payload = message.model_dump(mode="json", exclude_none=True)
    routing = await _decided(handle, payload)
    if routing is not None:
        return routing
    await handle.signal(RouterHandlers.SAY, payload)
    return None


async def _decided(handle: WorkflowHandle, payload: dict) -> Routing | None:
    """The decision by update, or None when no worker took it or decided in time."""
    try:
        update = await asyncio.wait_for(
            handle.start_update(
                RouterHandlers.SAY, payload, wait_for_stage=WorkflowUpdateStage.ACCEPTED, result_type=Routing
            ),
            ACCEPT_WAIT.total_seconds(),
        )
        return await asyncio.wait_for(update.result(), DECISION_WAIT.total_seconds())
    except WorkflowUpdateFailedError as err:
        raise SayRefused(getattr(err.cause, "message", None) or str(err.cause or err)) from None
    except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
        return None  # an update the server still holds carries the same request id: routed once
    except RPCError as err:
        if err.status not in FALLBACK:
            raise
        return None


async def view(client: Client, user: str) -> RouterView:
    """The router's messages and decisions. RPCError when no worker answers, or (NOT_FOUND)
    when the user has never sent it anything."""
    handle = client.get_workflow_handle(router_id(user))
    return await handle.query(RouterHandlers.VIEW, result_type=RouterView, rpc_timeout=timedelta(seconds=5))
