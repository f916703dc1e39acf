"""What the event stream costs and how fast it is seen (`ui_event_latency_ms`,
`stream_events_per_node`).

A perdure worker and `perdure ui`'s app (uvicorn on a free port) in this process. A goal
of NODES sequential reads (regular activities, so each node settles in its own
workflow task) is watched through the SSE endpoint by an httpx client. For every `node`
event that says a node succeeded, the latency is

    the moment the client read the event - the event's `at` (workflow.now() of the
    workflow task that settled the node, the server's clock, on this machine)

The same goal run again with nobody subscribed gives the history the stream adds:
(history events with a subscriber - without) / NODES. Median and P95 latency are
printed; the median is the headline.

Live model output: a goal of MODEL_NODES llm steps whose (scripted, streamed) replies
take ~2 s each, run with the profile's default `live_every_s` (1 s) and again with it
0; (history events with live text - without) / MODEL_NODES is `token_events_per_node`.

    .venv/bin/python -m bench.ui_events [--nodes 40]
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime
from pathlib import Path

import httpx
import uvicorn
from temporalio.client import Client

from bench.common import (
    Section,
    goal_spec,
    make_workspace,
    median,
    new_id,
    p95,
    parse_options,
    perdure_worker,
    run_standalone,
)
from bench.common import start_goal as start_bench_goal
from perdure.activities.models.profiles import ModelConfig, ModelProfile
from perdure.activities.models.scripted import ScriptedServer
from perdure.starters.ui_server import build_app

KEYS = ("ui_event_latency_ms", "stream_events_per_node", "token_events_per_node")
MODEL_NODES = 5
# Each reply: 20 words, one every 0.1 s.
SLOW_REPLY = {"content": " ".join(f"word{i}" for i in range(20)), "chunk_delay_s": 0.1}


async def _watch(url: str) -> list[float]:
    """Milliseconds from each succeeded node's event time to its arrival here."""
    latencies: list[float] = []
    fields: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=120) as http, http.stream("GET", url) as response:
        async for line in response.aiter_lines():
            if line.startswith(":"):
                continue
            if line:
                key, _, value = line.partition(": ")
                fields[key] = value
                continue
            if fields.get("event") == "node":
                data = json.loads(fields["data"])
                if data["status"] == "succeeded":
                    at = datetime.fromisoformat(data["at"]).timestamp()
                    latencies.append((time.time() - at) * 1000)
            elif fields.get("event") == "end":
                return latencies
            fields = {}
    return latencies


async def measure(client: Client, workdir: Path, nodes: int = 40) -> Section:
    task_queue = new_id("bench-ui")
    home = workdir / "ui-events"
    workspace = make_workspace(home / "ws", {"notes.md": "a note\n"})
    steps = [
        {"name": f"r{i:03d}", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md", "max_bytes": 100 + i}}
        | ({"needs": [f"r{i - 1:03d}"]} if i else {})
        for i in range(nodes)
    ]
    spec = goal_spec(workspace, steps, allowed_tools=["read_file"], local_activities_up_to_s=0, label="ui events")
    server = uvicorn.Server(uvicorn.Config(build_app(client), host="127.0.0.1", port=0, log_level="warning"))
    async with perdure_worker(client, task_queue, home):
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            watched = await start_bench_goal(client, task_queue, spec, "ui-watched")
            latencies = await asyncio.wait_for(_watch(f"http://127.0.0.1:{port}/api/goals/{watched.id}/events"), 300)
            await watched.result()
            alone = await start_bench_goal(client, task_queue, spec, "ui-alone")
            await alone.result()
        finally:
            server.should_exit = True
            await serving
        with_stream = len((await watched.fetch_history()).events)
        without = len((await alone.fetch_history()).events)
    if len(latencies) != nodes:
        raise RuntimeError(f"the subscriber saw {len(latencies)} of {nodes} nodes succeed")
    per_node = (with_stream - without) / nodes
    live, quiet = await _token_events(client, home)
    token_per_node = (live - quiet) / MODEL_NODES
    notes = [
        f"node settled -> its SSE event read: median {median(latencies):.1f} ms, P95 {p95(latencies):.1f} ms, "
        f"max {max(latencies):.1f} ms over {nodes} nodes",
        f"history: {with_stream} events with a subscriber, {without} without: {per_node:.2f} more per node "
        "(the events endpoint reads the stream by query: none expected)",
        f"live model output: {live} events with live text every 1 s, {quiet} without, over {MODEL_NODES} "
        f"~2 s replies: {token_per_node:.2f} more per model node",
    ]
    figures = {
        "ui_event_latency_ms": round(median(latencies), 1),
        "stream_events_per_node": round(per_node, 2),
        "token_events_per_node": round(token_per_node, 2),
    }
    return Section(figures=figures, notes=notes, extra={"ui_event_latency_p95_ms": round(p95(latencies), 1)})


async def _token_events(client: Client, home: Path) -> tuple[int, int]:
    """History events of the same slow-reply goal with live text sent every 1 s, and with none."""
    steps = [
        {"name": f"m{i}", "kind": "llm", "prompt": f"Write part {i}."} | ({"needs": [f"m{i - 1}"]} if i else {})
        for i in range(MODEL_NODES)
    ]
    counts = []
    with ScriptedServer({"replies": [SLOW_REPLY]}) as server:
        for every_s in (1.0, 0.0):
            profile = ModelProfile(
                name="slow", provider="openai", model="scripted", base_url=server.openai_base_url, live_every_s=every_s
            )
            task_queue = new_id("bench-tokens")
            workspace = make_workspace(home / f"tokens-{every_s}", {})
            spec = goal_spec(workspace, steps, model_profile="slow", label="live tokens")
            async with perdure_worker(client, task_queue, home, ModelConfig(profiles={"slow": profile})):
                handle = await start_bench_goal(client, task_queue, spec, "ui-tokens")
                result = await handle.result()
            if result.outcome != "succeeded":
                raise RuntimeError(f"the slow-reply goal ended {result.outcome}")
            counts.append(len((await handle.fetch_history()).events))
    return counts[0], counts[1]


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, nodes=40))


if __name__ == "__main__":
    main()
