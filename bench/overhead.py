"""Per-step cost of a goal against raw Temporal, on one server, in one run.

- Read chain: a goal of N `read_file` steps of tiny files, each needing the one
  before, against a raw workflow calling the same `perdure.tool.run` activity N
  times with the same `ToolInput` shape, as activities and as local activities.
  Per-step cost is the slope between an N-step and a smaller run, so the fixed
  cost of a goal (start, report) and of a workflow cancels out. Gives
  `read_step_ms`, `raw_activity_ms`, `raw_local_activity_ms` and their ratio
  `node_overhead_ratio`; the N-step goal's history gives `events_per_node` and
  `max_payload_bytes`.
- Write chain: the same with `http_request` POSTs carrying an Idempotency-Key to
  the fake ledger service (`write_step_ms`; a keyed write runs as a local activity,
  GoalSpec.local_keyed_writes), against the raw workflow's activity and local activity
  with the same call (`raw_write_activity_ms`, `raw_local_write_ms`), per step read
  off the histories of the largest chains: the median time from one write to the next
  (an activity scheduled to the next; a local activity's completion, in its marker, to
  the next). And with `notify_webhook` POSTs to a fake webhook, a `once` write, which
  keeps its activity (`once_write_step_ms`, against `raw_once_write_activity_ms`).
- Fan-out: 100 independent read steps against 100 concurrent raw activities
  (`fanout_ratio` = raw time / goal time).

    .venv/bin/python -m bench.overhead [--nodes 50] [--small 10] [--fanout 100] [--repeats 3]
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.common import (
    Section,
    chain_steps,
    event_seconds,
    goal_spec,
    make_workspace,
    max_payload_bytes,
    median,
    new_id,
    parse_options,
    perdure_worker,
    raw_worker,
    run_chain,
    run_goal,
    run_standalone,
    slope_ms,
)
from bench.raw import RawMode, RawToolsInput, RawToolsWorkflow
from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.testing.fakes import LedgerAPI, WebhookReceiver
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.shared.contracts import ToolInput

KEYS = (
    "node_overhead_ratio",
    "events_per_node",
    "max_payload_bytes",
    "read_step_ms",
    "raw_local_activity_ms",
    "raw_activity_ms",
    "write_step_ms",
    "raw_write_activity_ms",
    "raw_local_write_ms",
    "once_write_step_ms",
    "raw_once_write_activity_ms",
    "fanout_ratio",
)


def read_args(count: int) -> list[dict]:
    return [{"path": f"f{i:05d}.txt"} for i in range(count)]


def write_args(ledger: LedgerAPI, count: int, tag: str) -> list[dict]:
    # A distinct body per step and per run: the same request under another goal's key
    # would be a different effect anyway, but identical steps would share a node key.
    return [
        {"method": "POST", "url": f"{ledger.base_url}/entries", "body": {"bench": tag, "n": i}} for i in range(count)
    ]


async def run_raw(
    client: Client,
    task_queue: str,
    workspace: Path,
    tool: str,
    args: list[dict],
    mode: RawMode,
    workflow_id: str | None = None,
) -> float:
    """Seconds from start to result of one raw workflow over these calls."""
    workflow_id = workflow_id or new_id(f"raw-{mode}")
    spec = TOOL_SPECS[tool]
    calls = [
        ToolInput(goal_id=workflow_id, node_key=f"raw:{i}", tool=tool, workspace=str(workspace), args=a)
        for i, a in enumerate(args)
    ]
    started = time.perf_counter()
    result = await client.execute_workflow(
        RawToolsWorkflow.run,
        RawToolsInput(
            calls=calls,
            mode=mode,
            start_to_close_s=spec.start_to_close_s,
            heartbeat_s=spec.heartbeat_timeout_s,
            maximum_attempts=6 if spec.replay == "keyed" else 3,
        ),
        id=workflow_id,
        task_queue=task_queue,
    )
    elapsed = time.perf_counter() - started
    if result.ok != len(calls):
        raise RuntimeError(f"raw {mode} {tool}: {result.ok} of {len(calls)} calls succeeded")
    return elapsed


def tool_call_intervals(history) -> list[float]:
    """Seconds between consecutive tool calls (perdure.tool.run) in a history: activities
    from one scheduled to the next, else local activities from one's completion to the
    next's (the time each marker records: markers reach history only with their task)."""
    times = [
        event_seconds(e)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == Activities.RUN_TOOL
    ] or local_call_times(history)
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def local_call_times(history) -> list[float]:
    """When each local perdure.tool.run of a history completed, from its marker's data."""
    times = []
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        data = json.loads(event.marker_recorded_event_attributes.details["data"].payloads[0].data)
        if data.get("activity_type") == Activities.RUN_TOOL:
            done = data["complete_time"]
            times.append(int(done["seconds"]) + int(done.get("nanos", 0)) / 1e9)
    return times


def once_args(hook: WebhookReceiver, count: int, tag: str) -> list[dict]:
    return [{"url": f"{hook.base_url}/deploys", "payload": {"bench": tag, "n": i}} for i in range(count)]


async def run_perdure(client: Client, task_queue: str, workspace: Path, steps: list[dict], tools: list[str]):
    spec = goal_spec(workspace, steps, allowed_tools=tools)
    result, seconds, handle = await run_goal(client, task_queue, spec, "bench-goal")
    if result.outcome != "succeeded":
        raise RuntimeError(f"bench goal {handle.id}: {result.outcome}: {result.failure or result.unfinished[:3]}")
    return seconds, handle


async def measure(
    client: Client, workdir: Path, nodes: int = 50, small: int = 10, fanout: int = 100, repeats: int = 3
) -> Section:
    home = workdir / "overhead"
    workspace = make_workspace(home / "ws", {f"f{i:05d}.txt": "x\n" for i in range(max(nodes, fanout))})
    tq_goal, tq_raw = new_id("bench-overhead"), new_id("bench-raw")
    writes, small_writes = max(small + 1, nodes // 2), small
    times: dict[tuple[str, int], list[float]] = {}
    notes: list[str] = []

    write_histories: dict[str, list] = {kind: [] for kind in ("goal", "raw", "raw-local", "goal-once", "raw-once")}

    def record(kind: str, size: int, seconds: float) -> None:
        times.setdefault((kind, size), []).append(seconds)

    async def history(workflow_id: str):
        return await client.get_workflow_handle(workflow_id).fetch_history()

    async def once_and_local_writes(tag: str, size: int) -> None:
        """The same keyed calls from a raw workflow's local activities, and a chain of once
        writes from a goal and from a raw workflow's activities."""
        raw_id = new_id("raw-local-write")
        args = write_args(ledger, size, tag + "-raw-local")
        await run_raw(client, tq_raw, workspace, "http_request", args, "local", raw_id)
        write_histories["raw-local"].append(await history(raw_id))
        steps = chain_steps("notify_webhook", once_args(hook, size, tag))
        _, once_goal = await run_perdure(client, tq_goal, workspace, steps, ["notify_webhook"])
        write_histories["goal-once"].append((await run_chain(client, once_goal))[0])
        raw_id = new_id("raw-once")
        args = once_args(hook, size, tag + "-raw")
        await run_raw(client, tq_raw, workspace, "notify_webhook", args, "sequential", raw_id)
        write_histories["raw-once"].append(await history(raw_id))

    with LedgerAPI() as ledger, WebhookReceiver() as hook:
        async with perdure_worker(client, tq_goal, home), raw_worker(client, tq_raw, home):
            # Warm up both paths (sandbox imports, connections) before anything is timed.
            await run_perdure(client, tq_goal, workspace, chain_steps("read_file", read_args(3)), ["read_file"])
            for mode in ("sequential", "local", "concurrent"):
                await run_raw(client, tq_raw, workspace, "read_file", read_args(3), mode)

            last_chain = None
            for r in range(repeats):
                for size in (small, nodes):
                    seconds, last_chain = await run_perdure(
                        client, tq_goal, workspace, chain_steps("read_file", read_args(size)), ["read_file"]
                    )
                    record("goal-read", size, seconds)
                    for mode in ("sequential", "local"):
                        seconds = await run_raw(client, tq_raw, workspace, "read_file", read_args(size), mode)
                        record(f"raw-{mode}", size, seconds)
                for size in (small_writes, writes):
                    tag = new_id(f"w{r}-{size}")
                    seconds, write_goal = await run_perdure(
                        client,
                        tq_goal,
                        workspace,
                        chain_steps("http_request", write_args(ledger, size, tag)),
                        ["http_request"],
                    )
                    record("goal-write", size, seconds)
                    args = write_args(ledger, size, tag + "-raw")
                    raw_id = new_id("raw-write")
                    seconds = await run_raw(client, tq_raw, workspace, "http_request", args, "sequential", raw_id)
                    record("raw-write", size, seconds)
                    if size == writes:
                        write_histories["goal"].append((await run_chain(client, write_goal))[0])
                        write_histories["raw"].append(await client.get_workflow_handle(raw_id).fetch_history())
                        await once_and_local_writes(tag, size)

            fan_steps = [
                {"name": f"f{i:05d}", "kind": "tool", "tool": "read_file", "args": a}
                for i, a in enumerate(read_args(fanout))
            ]
            for _ in range(repeats):
                seconds, _ = await run_perdure(client, tq_goal, workspace, fan_steps, ["read_file"])
                record("goal-fanout", fanout, seconds)
                seconds = await run_raw(client, tq_raw, workspace, "read_file", read_args(fanout), "concurrent")
                record("raw-fanout", fanout, seconds)

        assert last_chain is not None
        history = (await run_chain(client, last_chain))[0]

    def per_step(kind: str, lo: int, hi: int) -> float:
        return slope_ms((lo, median(times[(kind, lo)])), (hi, median(times[(kind, hi)])))

    read_ms = per_step("goal-read", small, nodes)
    raw_ms = per_step("raw-sequential", small, nodes)
    local_ms = per_step("raw-local", small, nodes)
    # A write step is read off the histories: the median time from one write activity
    # scheduled to the next, over every step of the largest chains. The wall-time slope
    # (printed too) moves by tens of per cent between runs on a loaded machine.
    write_ms, raw_write_ms, raw_local_write_ms, once_ms, raw_once_ms = (
        median(i for h in write_histories[kind] for i in tool_call_intervals(h)) * 1000
        for kind in ("goal", "raw", "raw-local", "goal-once", "raw-once")
    )
    write_slope = per_step("goal-write", small_writes, writes)
    raw_write_slope = per_step("raw-write", small_writes, writes)
    goal_fan, raw_fan = median(times[("goal-fanout", fanout)]), median(times[("raw-fanout", fanout)])
    kinds = Counter(EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in history.events)

    def wall(kind: str, size: int) -> str:
        return f"{median(times[(kind, size)]):.2f} s"

    notes += [
        f"read chain (read_file of a 2-byte file; median of {repeats}; "
        f"per step = slope between {small} and {nodes} steps):",
        f"  goal           {small}: {wall('goal-read', small)}, {nodes}: {wall('goal-read', nodes)} "
        f"-> {read_ms:.1f} ms/step (end to end {median(times[('goal-read', nodes)]) / nodes * 1000:.1f} ms/step)",
        f"  raw activity   {small}: {wall('raw-sequential', small)}, {nodes}: {wall('raw-sequential', nodes)} "
        f"-> {raw_ms:.1f} ms/step",
        f"  raw local act. {small}: {wall('raw-local', small)}, {nodes}: {wall('raw-local', nodes)} "
        f"-> {local_ms:.1f} ms/step",
        f"  goal/raw activity = {read_ms / raw_ms:.2f}x, goal/raw local activity = {read_ms / local_ms:.2f}x",
        f"write chain (http_request POST with Idempotency-Key to the fake ledger; median step of {repeats} chains "
        f"of {writes} in their histories):",
        f"  goal {write_ms:.1f} ms/step (local activities), raw activity {raw_write_ms:.1f} ms/step -> "
        f"{write_ms / raw_write_ms:.2f}x, raw local activity {raw_local_write_ms:.1f} ms/step -> "
        f"{write_ms / raw_local_write_ms:.2f}x "
        f"(wall-time slope {small_writes} -> {writes}: {write_slope:.1f} and {raw_write_slope:.1f} ms/step)",
        f"once write chain (notify_webhook POST to a fake webhook; median step of {repeats} chains of {writes}):",
        f"  goal {once_ms:.1f} ms/step (activities), raw activity {raw_once_ms:.1f} ms/step -> "
        f"{once_ms / raw_once_ms:.3f}x",
        f"fan-out of {fanout} independent reads: goal {goal_fan:.2f} s, raw concurrent {raw_fan:.2f} s "
        f"-> raw/goal {raw_fan / goal_fan:.2f}",
        f"history of the {nodes}-step goal: {len(history.events)} events ({len(history.events) / nodes:.2f}/step), "
        f"largest payload {max_payload_bytes(history)} bytes",
        "  events by type: " + ", ".join(f"{k.lower()} {v}" for k, v in kinds.most_common()),
    ]
    figures = {
        "node_overhead_ratio": round(read_ms / raw_ms, 3),
        "events_per_node": round(len(history.events) / nodes, 2),
        "max_payload_bytes": max_payload_bytes(history),
        "read_step_ms": round(read_ms, 2),
        "raw_local_activity_ms": round(local_ms, 2),
        "raw_activity_ms": round(raw_ms, 2),
        "write_step_ms": round(write_ms, 2),
        # Kept beside write_step_ms: its target is a ratio to this run's raw write activity.
        "raw_write_activity_ms": round(raw_write_ms, 2),
        "raw_local_write_ms": round(raw_local_write_ms, 2),
        "once_write_step_ms": round(once_ms, 2),
        "raw_once_write_activity_ms": round(raw_once_ms, 2),
        "fanout_ratio": round(raw_fan / goal_fan, 3),
    }
    return Section(figures=figures, notes=notes)


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, nodes=50, small=10, fanout=100, repeats=3))


if __name__ == "__main__":
    main()
