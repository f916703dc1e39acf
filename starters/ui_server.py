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

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.service import RPCError, RPCStatusCode

from starters import goals, steering
from workflows.events import EVENTS_TOPIC
from workflows.messages import parse_message

POLL_COOLDOWN = timedelta(milliseconds=50)
ASSETS = Path(__file__).parent / "ui_assets"
"""The page: plain HTML, CSS and an ES module, served as they are (no build step)."""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _rpc_error(err: RPCError) -> JSONResponse:
    if err.status == RPCStatusCode.NOT_FOUND:
        return _error(404, "no such goal")
    return _error(502, f"Temporal: {err.message}")


def build_app(client: Client) -> Starlette:
    """The ASGI app, on a connected client (runtime.connect.connect)."""

    async def list_goals(request: Request) -> JSONResponse:
        limit = int(request.query_params.get("limit", "50"))
        executions = await goals.list_goals(client, request.query_params.get("query"), limit=limit)
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
        try:
            body = await request.json()
        except ValueError:
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
        stream = WorkflowStreamClient.create(client, goal_id)

        async def items() -> AsyncIterator[dict[str, Any]]:
            async for item in stream.subscribe(EVENTS_TOPIC, start, poll_cooldown=POLL_COOLDOWN):
                kind = item.data.get("type", "event") if isinstance(item.data, dict) else "event"
                yield {"id": str(item.offset), "event": kind, "data": json.dumps(item.data)}
                if kind == "end":
                    return

        return EventSourceResponse(items(), ping=15)

    async def page(request: Request) -> FileResponse:
        del request
        return FileResponse(ASSETS / "index.html")

    return Starlette(
        routes=[
            Route("/", page),
            Route("/goals/{goal_id}", page),
            Mount("/assets", StaticFiles(directory=ASSETS), name="assets"),
            Route("/api/goals", list_goals),
            Route("/api/goals/{goal_id}", goal),
            Route("/api/goals/{goal_id}/inbox", inbox),
            Route("/api/goals/{goal_id}/events", events),
            Route("/api/goals/{goal_id}/messages", send, methods=["POST"]),
        ]
    )


def _start_offset(request: Request) -> int | None:
    """`?from=N`, else the offset after the browser's Last-Event-ID, else 0."""
    text = request.query_params.get("from")
    if text is None:
        last = request.headers.get("last-event-id")
        if last is None:
            return 0
        return int(last) + 1 if last.isdigit() else None
    return int(text) if text.isdigit() else None
