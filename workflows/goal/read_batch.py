"""Reads ready together run as one local activity.

A read segment's calls (workflows/segments.py) are replay-safe, so where they run is
free to choose. Each local activity costs the worker a round trip between the SDK's
core and Python, a workflow activation and its payload conversions: a few
milliseconds, far more than reading a small file. So the calls that nodes make in one
workflow activation (steps ready together, an agent turn's reads) are collected and
sent as ONE local activity (`perdure.tool.run_batch`), which runs them and returns
every result; each caller then goes on with its own result as before. The seeds'
rule is unchanged: only replay-safe calls are batched, and any side effect still ends
the segment with its own checkpoint.

When the activation's other work is done is known by a wait condition: the SDK
checks conditions only once every ready coroutine has run, so by then every node
started in this activation has made its call. A call that raised in the batch (not
a tool error, which is data) is run again alone by its caller, with the retry policy
it has without a batch: errors keep their meaning and their retries. Goals recorded
before this existed never batch (patch `read-batches`).

Workflow code.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.contracts import Activities, ToolBatchInput, ToolBatchResult, ToolInput, ToolResult
from workflows.goal.context import READ_BATCHES_PATCH
from workflows.retries import TOOL_RETRY
from workflows.state import GoalState

SUMMARY_NAMES = 6


@dataclass
class _Call:
    tool_input: ToolInput
    summary: str
    timeout: timedelta
    answer: asyncio.Future = field(repr=False)


class ReadBatcher:
    def __init__(self, state: GoalState) -> None:
        self._state = state
        self._open: list[_Call] | None = None
        self._flushes: set[asyncio.Task] = set()

    def enabled(self) -> bool:
        """Decided as each run starts (GoalContext.decide_patches, patch `read-batches`), never
        here: asked first after a local activity in the same workflow task, a patch's
        marker would be met by replay before the code asks for it."""
        return READ_BATCHES_PATCH in self._state.patches

    async def run(self, tool_input: ToolInput, summary: str, timeout: timedelta) -> ToolResult | None:
        """The call's result from this activation's batch; None when the caller should run
        it alone (it was the only call, or it raised in the batch)."""
        if self._open is None:
            self._open = []
            flush = asyncio.create_task(self._flush(self._open))
            self._flushes.add(flush)
            flush.add_done_callback(self._flushes.discard)
        call = _Call(tool_input, summary, timeout, asyncio.get_running_loop().create_future())
        self._open.append(call)
        return await call.answer

    async def _flush(self, calls: list[_Call]) -> None:
        # Resolved once every coroutine made ready in this activation has run: the nodes
        # started with this one have all made their calls by then.
        await workflow.wait_condition(lambda: True)
        self._open = None
        waiting = [c for c in calls if not c.answer.done()]  # a cancelled node's call is dropped
        if len(waiting) < 2:
            for call in waiting:
                call.answer.set_result(None)
            return
        try:
            batch = await workflow.execute_local_activity(
                Activities.RUN_TOOLS,
                ToolBatchInput(calls=[c.tool_input for c in waiting], summaries=[c.summary for c in waiting]),
                result_type=ToolBatchResult,
                # The activity runs the calls side by side: the slowest one's limit bounds it.
                start_to_close_timeout=max(c.timeout for c in waiting),
                retry_policy=TOOL_RETRY,
                summary=_summary(waiting),
            )
            entries = batch.entries
        except ActivityError:
            entries = []  # out of attempts as a whole: each call runs alone, with its own retries
        for index, call in enumerate(waiting):
            entry = entries[index] if index < len(entries) else None
            if not call.answer.done():
                call.answer.set_result(entry.result if entry is not None else None)


def _summary(calls: list[_Call]) -> str:
    # A call's summary is "tool TOOL · STEP · KEY": the steps name the batch.
    names = [(c.summary.split(" · ") + [""])[1] or c.summary for c in calls[:SUMMARY_NAMES]]
    more = f" +{len(calls) - SUMMARY_NAMES}" if len(calls) > SUMMARY_NAMES else ""
    return f"{len(calls)} reads at once · {', '.join(names)}{more}"[:200]
