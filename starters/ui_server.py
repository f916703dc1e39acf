"""`perdure ui`: an HTTP server over the goals: each goal's event stream as server-sent
events, and a JSON API for reading goals and sending them messages.

    GET  /api/goals                     the goals (as `perdure ls`: ?query=, ?limit=)
    GET  /api/goals/{id}                a goal's progress snapshot (the `progress` query)
    GET  /api/goals/{id}/inbox          its inbox with receipts
    GET  /api/goals/{id}/events?from=N  its events as SSE from offset N (or the Last-Event-ID
                                        header + 1, so a browser's EventSource resumes by itself);
                                        every event's SSE id is its stream offset
    POST /api/goals/{id}/messages       a steering message, as JSON: {"kind": "steer", "text": ...};
                                        the same messages, request ids and receipts as the CLI
                                        (a request_id is made when the body has none)
    GET  /, /goals/{id}                 the page (starters/ui_assets/): the goals, and a goal's task
                                        graph live, its question cards as buttons, rewind on a node

Events come from the goal's Workflow Stream (workflows/goal/stream.py) through the SDK's
client, which follows continue-as-new; the server keeps no state of its own, so any
number may run. Client-side only.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowQueryFailedError
from temporalio.contrib.workflow_streams import PollInput, PollResult
from temporalio.converter import PayloadConverter
from temporalio.service import RPCError, RPCStatusCode

from starters import goals, steering
from workflows.events import EVENTS_TOPIC
from workflows.messages import parse_message

READ_EVERY = timedelta(milliseconds=100)
# Idle reads between looks at whether the goal has closed (a goal that ended without an
# `end` event: terminated, timed out).
CLOSED_CHECK_EVERY = 20
# The stream's poll, as a query (temporalio.contrib.workflow_streams registers it with its update).
POLL_QUERY = "__temporal_workflow_stream_poll"
MAX_BODY_BYTES = 256 * 1024
ASSETS = Path(__file__).parent / "ui_assets"
"""The page: plain HTML, CSS and an ES module, served as they are (no build step)."""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _rpc_error(err: RPCError) -> JSONResponse:
    if err.status == RPCStatusCode.NOT_FOUND:
        return _error(404, "no such goal")
    return _error(502, f"Temporal: {err.message}")


def build_app(client: Client, hosts: list[str] | None = None) -> Starlette:
    """The ASGI app, on a connected client (runtime.connect.connect). Only requests naming
    one of `hosts` are served (default: this machine's names), so a page elsewhere that
    rebinds a name to 127.0.0.1 cannot read goals through the user's browser."""

    async def list_goals(request: Request) -> JSONResponse:
        limit = _whole_number(request.query_params.get("limit", "50"))
        if limit is None or not 1 <= limit <= 1000:
            return _error(400, "`limit` must be a whole number from 1 to 1000")
        try:
            executions = await goals.list_goals(client, request.query_params.get("query"), limit=limit)
        except RPCError as err:
            if err.status == RPCStatusCode.INVALID_ARGUMENT:
                return _error(400, f"the query is not a visibility query Temporal understands: {err.message}")
            return _rpc_error(err)
        outcomes = await goals.outcomes(client, executions)
        return JSONResponse(
            [
                {
                    "id": e.id,
                    "status": e.status.name if e.status else None,
                    "started": e.start_time.isoformat() if e.start_time else None,
                    "outcome": outcomes.get(e.id),
                }
                for e in executions
            ]
        )

    async def goal(request: Request) -> JSONResponse:
        try:
            snapshot = await goals.progress(client, request.path_params["goal_id"])
        except RPCError as err:
            return _rpc_error(err)
        except WorkflowQueryFailedError as err:
            return _error(503, f"the goal did not answer: {err}")
        return JSONResponse(snapshot.model_dump(mode="json"))

    async def inbox(request: Request) -> JSONResponse:
        try:
            view = await steering.inbox(client, request.path_params["goal_id"])
        except RPCError as err:
            return _rpc_error(err)
        except WorkflowQueryFailedError as err:
            return _error(503, f"the goal did not answer: {err}")
        return JSONResponse(view.model_dump(mode="json"))

    async def send(request: Request) -> JSONResponse:
        goal_id = request.path_params["goal_id"]
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            # Also what makes another site's page unable to post here without a preflight.
            return _error(415, "send the message as JSON, with content-type: application/json")
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return _error(413, f"a message is at most {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return _error(400, 'the body must be a JSON object: a message such as {"kind": "steer", "text": "..."}')
        if isinstance(body, dict) and not body.get("request_id"):
            body = {**body, "request_id": steering.new_request_id()}
        message, problem = parse_message(body)
        if problem is not None:
            return _error(400, problem)
        try:
            receipt = await steering.send(client, goal_id, message)
        except steering.MessageRejected as err:
            return _error(422, str(err))
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND and "already completed" in err.message:
                return _error(409, "the goal has ended; it takes no more messages")
            return _rpc_error(err)
        if receipt is None:
            # No worker answered: stored durably by the server, judged in order once one runs.
            return JSONResponse(
                {"request_id": message.request_id, "kind": message.kind, "status": "pending", "via": "signal"},
                status_code=202,
            )
        return JSONResponse(receipt.model_dump(mode="json"))

    async def events(request: Request) -> EventSourceResponse | JSONResponse:
        goal_id = request.path_params["goal_id"]
        start = _start_offset(request)
        if start is None:
            return _error(400, "`from` (or Last-Event-ID) must be a whole number, the offset to read from")
        handle = client.get_workflow_handle(goal_id)
        try:
            await handle.describe()
        except RPCError as err:
            return _rpc_error(err)
        return EventSourceResponse(_read_events(handle, client.data_converter.payload_converter, start), ping=15)

    async def page(request: Request) -> FileResponse:
        del request
        return FileResponse(ASSETS / "index.html")

    allowed = hosts or ["127.0.0.1", "localhost"]
    return Starlette(
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=allowed)],
        routes=[
            Route("/", page),
            Route("/goals/{goal_id}", page),
            Mount("/assets", StaticFiles(directory=ASSETS), name="assets"),
            Route("/api/goals", list_goals),
            Route("/api/goals/{goal_id}", goal),
            Route("/api/goals/{goal_id}/inbox", inbox),
            Route("/api/goals/{goal_id}/events", events),
            Route("/api/goals/{goal_id}/messages", send, methods=["POST"]),
        ],
    )


async def _read_events(
    handle: WorkflowHandle, converter: PayloadConverter, offset: int
) -> AsyncIterator[dict[str, Any]]:
    """The goal's events from `offset`, read with the stream's poll QUERY every READ_EVERY:
    a query takes none of the workflow's ten update slots (a long-poll update per open tab
    would, and stay in flight after the tab closed) and adds nothing to its history. The
    handle names no run, so each read goes to the latest run: continue-as-new is followed.
    A reader behind the retained log gets a `reset` event (re-read the snapshot); a goal
    that closed without an `end` event gets a `closed` one; then the response ends."""
    idle = 0
    while True:
        try:
            poll = PollInput(topics=[EVENTS_TOPIC], from_offset=offset)
            batch = await handle.query(POLL_QUERY, poll, result_type=PollResult)
        except (RPCError, WorkflowQueryFailedError) as err:
            yield {"event": "closed", "data": json.dumps({"reason": f"the goal cannot be read: {err}"})}
            return
        if batch.items and batch.items[0].offset > offset:
            yield {"event": "reset", "data": json.dumps({"from": offset, "kept_from": batch.items[0].offset})}
        for item in batch.items:
            payload = Payload()
            payload.ParseFromString(base64.b64decode(item.data))
            data = converter.from_payloads([payload])[0]
            kind = data.get("type", "event") if isinstance(data, dict) else "event"
            yield {"id": str(item.offset), "event": kind, "data": json.dumps(data)}
            if kind == "end":
                return
        offset = max(offset, batch.next_offset)
        if batch.more_ready:
            continue
        idle = 0 if batch.items else idle + 1
        if idle and idle % CLOSED_CHECK_EVERY == 0:
            desc = await handle.describe()
            if desc.status != WorkflowExecutionStatus.RUNNING:
                status = desc.status.name if desc.status else "closed"
                yield {"event": "closed", "data": json.dumps({"reason": f"the goal is {status.lower()}"})}
                return
        await asyncio.sleep(READ_EVERY.total_seconds())


def _whole_number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def _start_offset(request: Request) -> int | None:
    """The offset after the browser's Last-Event-ID (a reconnecting EventSource resumes),
    else `?from=N`, else 0."""
    last = request.headers.get("last-event-id")
    if last is not None:
        seen = _whole_number(last)
        return seen + 1 if seen is not None else None
    text = request.query_params.get("from")
    return 0 if text is None else _whole_number(text)
