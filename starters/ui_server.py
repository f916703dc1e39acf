"""`perdure ui`: an HTTP server over the goals: each goal's event stream as server-sent
events, and a JSON API for reading goals and sending them messages.

    GET  /api/goals                     the goals, as `perdure ls` filters them (?status=, ?phase=,
                                        ?needs_human=1, ?parked=1, ?query= a visibility query,
                                        ?limit=), with their text and outcome; those waiting on a
                                        person first
    GET  /api/filters                   the values ?status= and ?phase= take
    POST /api/goals                     start a goal, as JSON ({"goal": text} or {"plan": {...}},
                                        optional "id", "request_id" and `perdure start`'s options):
                                        the CLI's checks and its answer to a start repeated
    GET  /api/goals/{id}                a goal's progress snapshot (the `progress` query)
    GET  /api/goals/{id}/inbox          its inbox with receipts
    GET  /api/goals/{id}/report         a closed goal's report (markdown) and outcome, as `perdure result`
    GET  /api/goals/{id}/decisions      its decision log, every entry in order, as `perdure log` reads it
                                        (with notes on what could not be read: no worker, a chunk elsewhere)
    GET  /api/goals/{id}/events?from=N  its events as SSE from offset N (or the Last-Event-ID
                                        header + 1, so a browser's EventSource resumes by itself);
                                        every event's SSE id is its stream offset
    POST /api/goals/{id}/messages       a steering message, as JSON: {"kind": "steer", "text": ...};
                                        the same messages, request ids and receipts as the CLI
                                        (a request_id is made when the body has none)
    POST /api/say                       a message to the user's router (workflows/router/router_workflow.py), as JSON:
                                        {"text": ...} and optionally `perdure say`'s fields (goal_id,
                                        new, queue, pick, card, workspace, request_id): the decision,
                                        or 202 when no worker answered (routed once one runs)
    GET  /api/router                    the router's recent messages, decisions and reasons
    GET  /, /goals/{id}                 the page (starters/ui_assets/): the goals, and a goal's task
                                        graph live with its plan versions, live model output, question
                                        cards, inbox, premises with narrow, rewind on a node, the decisions, the report

Every route reads or steers goals through the one client (starters/client/, as the CLI and
the MCP server do): the events from both of a goal's topics, its own events and the model
activities' live output, in the stream's order, following continue-as-new. The server
keeps no state of its own, so any number may run. Client-side only.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from rich.markup import escape
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from perdure.starters.client import PerdureClient
from perdure.starters.client.client_errors import (
    EndedWithoutResult,
    GoalEnded,
    GoalNotFound,
    MessageRejected,
    NotOffered,
    ResultUnreadable,
    SayRefused,
    StartRefused,
    StillRunning,
)
from perdure.starters.client.goal_events import StreamItem
from perdure.starters.client.goal_reads import EXECUTION_STATUSES, PHASES, list_filters
from perdure.starters.client.goal_specs import StartRequest, start_spec
from perdure.starters.consoles import cli_console
from perdure.workflows.goal.contracts.messages import parse_message
from perdure.workflows.goal.contracts.plan import describe_validation_error
from perdure.workflows.router.router_contracts import Say
from perdure.workflows.shared import search_attributes as sa

MAX_BODY_BYTES = 256 * 1024
ASSETS = Path(__file__).parent / "ui_assets"
"""The page: plain HTML, CSS and an ES module, served as they are (no build step)."""
# What a start could not check (no worker's offer yet) is said where the server runs, as `perdure start` says it.
_warnings = cli_console(stderr=True)


async def _queried(query: Awaitable[BaseModel]) -> JSONResponse:
    """A goal's answer to a query as JSON, or why there is none (no worker, no such goal)."""
    try:
        answer = await query
    except GoalNotFound:
        return _error(404, "no such goal")
    except RPCError as err:
        return _rpc_error(err)
    except WorkflowQueryFailedError as err:
        return _error(503, f"the goal did not answer: {err}")
    return JSONResponse(answer.model_dump(mode="json"))


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _rpc_error(err: RPCError) -> JSONResponse:
    if err.status == RPCStatusCode.NOT_FOUND:
        return _error(404, "no such goal")
    return _error(502, f"Temporal: {err.message}")


def _waiting_on_a_person(execution: Any) -> str | None:
    """What a listed goal waits on a person for, from its search attributes (no query)."""
    if execution.status != WorkflowExecutionStatus.RUNNING:
        return None
    attrs = execution.typed_search_attributes
    if attrs.get(sa.NEEDS_HUMAN):
        return "answer"
    if attrs.get(sa.PARKED):
        return "parked"
    return None


def _flag(text: str | None) -> bool | None:
    """A checkbox-like query parameter; None when it is neither yes nor no."""
    if text is None or text.lower() in ("", "0", "false", "no"):
        return False
    return True if text.lower() in ("1", "true", "yes", "on") else None


async def _json_body(request: Request) -> tuple[Any, JSONResponse | None]:
    """The request's JSON body, or the 4xx that says why there is none: not sent as JSON,
    too large (read no further than the limit), empty, or not JSON."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        # Also what makes another site's page unable to post here without a preflight.
        return None, _error(415, "send the body as JSON, with content-type: application/json")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            return None, _error(413, f"a request body is at most {MAX_BODY_BYTES} bytes")
    if not raw.strip():
        return None, _error(400, "the body is empty: send a JSON object")
    try:
        return json.loads(raw), None
    except (ValueError, RecursionError):
        return None, _error(400, "the body must be a JSON object")


def build_app(temporal: Client, hosts: list[str] | None = None) -> Starlette:
    """The ASGI app, on a connected client (perdure.runtime.connect.connect). Only requests naming
    one of `hosts` are served (default: this machine's names), so a page elsewhere that
    rebinds a name to 127.0.0.1 cannot read goals through the user's browser."""
    client = PerdureClient(temporal)

    async def list_goals(request: Request) -> JSONResponse:
        params = request.query_params
        limit = _whole_number(params.get("limit", "50"))
        if limit is None or not 1 <= limit <= 1000:
            return _error(400, "`limit` must be a whole number from 1 to 1000")
        needs_human, parked = _flag(params.get("needs_human")), _flag(params.get("parked"))
        if needs_human is None or parked is None:
            return _error(400, "`needs_human` and `parked` are 1 or 0")
        try:
            filters = list_filters(
                status=params.get("status") or None,
                phase=params.get("phase") or None,
                needs_human=needs_human,
                parked=parked,
            )
        except ValueError as err:
            return _error(400, str(err).replace("--", ""))
        if params.get("query"):
            filters.append(f"({params['query']})")
        query = " AND ".join(filters) or None
        # Goals waiting on a person come first, even when older than the newest `limit`:
        # a second listing of those alone (search attributes the goal keeps, no query).
        waiting = f"ExecutionStatus = 'Running' AND ({sa.NEEDS_HUMAN.name} = true OR {sa.PARKED.name} = true)"
        try:
            first, newest = await asyncio.gather(
                client.list_goals(f"{query} AND {waiting}" if query else waiting, limit=limit),
                client.list_goals(query, limit=limit),
            )
        except RPCError as err:
            if err.status == RPCStatusCode.INVALID_ARGUMENT:
                return _error(400, f"the query is not a visibility query Temporal understands: {err.message}")
            return _rpc_error(err)
        listed = {e.id: e for e in first if _waiting_on_a_person(e)}
        for e in newest:
            listed.setdefault(e.id, e)
        executions = sorted(listed.values(), key=lambda e: _waiting_on_a_person(e) is None)[:limit]
        outcomes, texts = await asyncio.gather(client.outcomes(executions), client.goal_texts(executions))
        return JSONResponse([_goal_row(e, outcomes.get(e.id), texts.get(e.id)) for e in executions])

    async def filter_values(request: Request) -> JSONResponse:
        del request
        return JSONResponse({"statuses": list(EXECUTION_STATUSES), "phases": list(PHASES)})

    async def start(request: Request) -> JSONResponse:
        raw, refusal = await _json_body(request)
        if refusal is not None:
            return refusal
        if not isinstance(raw, dict):
            return _error(400, 'the body must be a JSON object, e.g. {"goal": "summarise notes/"}')
        try:
            body = StartRequest.model_validate(raw)
        except ValidationError as err:
            return _error(400, describe_validation_error(err, root="(start)"))
        try:
            spec, goal_id = start_spec(body)
        except ValueError as err:
            return _error(400, str(err))
        try:
            answer = await client.start_spec(spec, goal_id, replace=body.replace)
        except NotOffered as err:  # a profile or tool the worker lacks
            return _error(422, str(err))
        except StartRefused as err:
            return _error(409, str(err))
        except RPCError as err:
            return _rpc_error(err)
        for warning in answer.warnings:
            _warnings.print(f"[yellow]warning:[/yellow] {escape(warning)}")
        return JSONResponse(
            {"goal_id": answer.goal_id, "started": answer.started, "text": answer.text, "page": f"/goals/{goal_id}"},
            status_code=201 if answer.started else 200,
        )

    async def goal(request: Request) -> JSONResponse:
        return await _queried(client.progress(request.path_params["goal_id"]))

    async def inbox(request: Request) -> JSONResponse:
        return await _queried(client.inbox(request.path_params["goal_id"]))

    async def decisions(request: Request) -> JSONResponse:
        return await _queried(client.decisions(request.path_params["goal_id"]))

    async def report(request: Request) -> JSONResponse:
        try:
            found = await client.report(request.path_params["goal_id"])
        except GoalNotFound:
            return _error(404, "no such goal")
        except StillRunning as err:
            return _error(409, str(err))
        except EndedWithoutResult as ended:
            return _error(404, f"the goal ended without a report: {ended}")
        except ResultUnreadable as err:
            return _error(502, str(err))
        except RPCError as err:
            return _rpc_error(err)
        return JSONResponse(found.model_dump(mode="json"))

    async def send(request: Request) -> JSONResponse:
        goal_id = request.path_params["goal_id"]
        body, refusal = await _json_body(request)
        if refusal is not None:
            return refusal
        if isinstance(body, dict) and not body.get("request_id"):
            body = {**body, "request_id": client.new_request_id()}
        message, problem = parse_message(body)
        if problem is not None:
            return _error(400, problem)
        try:
            delivery = await client.send(goal_id, message)
        except GoalNotFound:
            return _error(404, "no such goal")
        except MessageRejected as err:
            return _error(422, str(err))
        except GoalEnded as err:
            return _error(409, str(err))
        except RPCError as err:
            return _rpc_error(err)
        receipt = delivery.receipt
        if receipt is None:
            # No worker answered (or its workflow task fails): stored durably by the server,
            # judged in order once a worker can run the goal.
            return JSONResponse(
                {"request_id": message.request_id, "kind": message.kind, "status": "pending", "via": "signal"},
                status_code=202,
            )
        return JSONResponse(receipt.model_dump(mode="json"))

    async def say(request: Request) -> JSONResponse:
        body, refusal = await _json_body(request)
        if refusal is not None:
            return refusal
        if not isinstance(body, dict):
            return _error(400, 'the body must be a JSON object, e.g. {"text": "make the poster a bit warmer"}')
        # As POST /api/goals: a new goal works where this server was started unless told.
        body = {"request_id": client.new_request_id(), "workspace": str(Path.cwd()), **body}
        try:
            message = Say.model_validate(body)
        except ValidationError as err:
            return _error(400, describe_validation_error(err, root="(say)"))
        try:
            routing = await client.say(message)
        except SayRefused as err:
            return _error(422, str(err))
        except RPCError as err:
            return _rpc_error(err)
        if routing is None:
            return JSONResponse({"request_id": message.request_id, "status": "pending", "via": "signal"}, 202)
        return JSONResponse(routing.model_dump(mode="json"))

    async def router(request: Request) -> JSONResponse:
        return await _queried(client.router())

    async def events(request: Request) -> EventSourceResponse | JSONResponse:
        goal_id = request.path_params["goal_id"]
        start = _start_offset(request)
        if start is None:
            return _error(400, "`from` (or Last-Event-ID) must be a whole number, the offset to read from")
        try:
            await client.describe(goal_id)
        except GoalNotFound:
            return _error(404, "no such goal")
        except RPCError as err:
            return _rpc_error(err)
        return EventSourceResponse(_server_sent(client.events(goal_id, start)), ping=15)

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
            Route("/api/goals", start, methods=["POST"]),
            Route("/api/filters", filter_values),
            Route("/api/goals/{goal_id}", goal),
            Route("/api/goals/{goal_id}/inbox", inbox),
            Route("/api/goals/{goal_id}/report", report),
            Route("/api/goals/{goal_id}/decisions", decisions),
            Route("/api/goals/{goal_id}/events", events),
            Route("/api/goals/{goal_id}/messages", send, methods=["POST"]),
            Route("/api/say", say, methods=["POST"]),
            Route("/api/router", router),
        ],
    )


async def _server_sent(items: AsyncIterator[StreamItem]) -> AsyncIterator[dict[str, Any]]:
    """The goal's stream as server-sent events: each event's SSE id is its stream offset (a
    reconnecting EventSource resumes after it); a `reset` or `closed` notice has none, and
    after `end` or `closed` the response ends."""
    async for item in items:
        event = {"event": item.kind, "data": json.dumps(item.data)}
        yield event if item.offset is None else {"id": str(item.offset), **event}


def _goal_row(execution: Any, outcome: str | None, goal: str | None) -> dict[str, Any]:
    attrs = execution.typed_search_attributes
    return {
        "id": execution.id,
        "goal": goal,
        "status": execution.status.name if execution.status else None,
        "phase": attrs.get(sa.GOAL_STATUS),
        "percent_done": attrs.get(sa.PERCENT_DONE),
        "cost_usd": attrs.get(sa.COST_USD),
        "started": execution.start_time.isoformat() if execution.start_time else None,
        "outcome": outcome,
        "waiting_on_you": _waiting_on_a_person(execution),
    }


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
