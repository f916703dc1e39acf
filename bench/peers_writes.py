"""perdure's write steps in `make bench-peers`, on the storage of the run (issue 39 item 3).

A peer's durable step is what a keyed write must be compared with: `write_step_ms` (a
keyed `http_request` to a fake ledger, run as a local activity: GoalSpec.local_keyed_writes)
is judged against LangGraph's step measured on the same storage in the same run, and
`once_write_step_ms` (a `notify_webhook`, which keeps its activity) against a raw Temporal
activity with the same call. Both are read off histories (bench/overhead.py
tool_call_intervals): the median time from one write to the next over chains of `count`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client

from bench.common import chain_steps, median, new_id, perdure_worker, raw_worker, run_chain
from bench.overhead import once_args, run_perdure, run_raw, tool_call_intervals, write_args
from perdure.testing.fakes import LedgerAPI, WebhookReceiver


@dataclass
class Writes:
    keyed_ms: float  # a goal's keyed write step (local activities)
    raw_local_keyed_ms: float  # a raw workflow's local activity with the same call
    once_ms: float  # a goal's once write step (activities)
    raw_once_ms: float  # a raw workflow's activity with the same call


async def writes_perdure(root: Path, client: Client, count: int, repeats: int) -> Writes:
    workspace = root / "ws"
    workspace.mkdir(parents=True)
    tq_goal, tq_raw = new_id("bench-peers-writes"), new_id("bench-peers-writes-raw")
    intervals: dict[str, list[float]] = {"keyed": [], "raw-keyed": [], "once": [], "raw-once": []}

    async def goal(tool: str, args: list[dict]) -> list[float]:
        _, handle = await run_perdure(client, tq_goal, workspace, chain_steps(tool, args), [tool])
        return tool_call_intervals((await run_chain(client, handle))[0])

    async def raw(tool: str, args: list[dict], mode: str) -> list[float]:
        workflow_id = new_id("raw-write")
        await run_raw(client, tq_raw, workspace, tool, args, mode, workflow_id)
        return tool_call_intervals(await client.get_workflow_handle(workflow_id).fetch_history())

    with LedgerAPI() as ledger, WebhookReceiver() as hook:
        async with perdure_worker(client, tq_goal, root), raw_worker(client, tq_raw, root):
            for repeat in range(repeats + 1):  # the first, untimed, warms every path up
                tag = new_id(f"w{repeat}")
                measured = {
                    "keyed": await goal("http_request", write_args(ledger, count, tag)),
                    "raw-keyed": await raw("http_request", write_args(ledger, count, tag + "-raw"), "local"),
                    "once": await goal("notify_webhook", once_args(hook, count, tag)),
                    "raw-once": await raw("notify_webhook", once_args(hook, count, tag + "-raw"), "sequential"),
                }
                if repeat:
                    for kind, seconds in measured.items():
                        intervals[kind] += seconds
    ms = {kind: median(seconds) * 1000 for kind, seconds in intervals.items()}
    return Writes(ms["keyed"], ms["raw-keyed"], ms["once"], ms["raw-once"])
