"""Reads run together as one local activity, and a chain of reads ahead of its steps.

A read segment's calls (workflows/goal/rules/segments.py) are replay-safe, so where they run is
free to choose. Each local activity costs the worker a round trip between the SDK's
core and Python, a workflow activation and its payload conversions: a few
milliseconds, far more than reading a small file. So the calls that nodes make in one
workflow activation (steps ready together, an agent turn's reads) are collected and
sent as ONE local activity (`perdure.tool.run_batch`), which runs them and returns
every result; each caller then goes on with its own result as before.

The same batch also runs *ahead*: the pending read steps that its reads make ready
(a chain of dependent reads, step after step), up to the segment's room. Their
results wait in the goal until the step is dispatched by the scheduler as usual,
gates, keys and all, and are taken instead of a call of its own. A result read ahead
is used only in the workflow task that read it and only if no other kind of call
started meanwhile, so nothing a write could have changed is served. The seeds' rule
is unchanged: only replay-safe reads are batched or read ahead, and any side effect
still ends the segment with its own checkpoint.

When the activation's other work is done is known by a wait condition: the SDK
checks conditions only once every ready coroutine has run, so by then every node
started in this activation has made its call. A call that raised in the batch (not
a tool error, which is data) is run again alone by its caller, with the retry policy
it has without a batch: errors keep their meaning and their retries.

A batch's answers reach history only when its workflow task completes; a worker killed
before then loses them. Each batch carries its number in the run (counted as batches are
scheduled: the same on replay) and the number below which the run's batches are in
history, so the worker keeps its answers until then (activities/tools/batch_journal.py)
and a worker running the same batch again after a crash reads only what was running.

Workflow code.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import FailureError

from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.plan import Plan, ToolStep
from perdure.workflows.goal.contracts.state import GoalState, Node
from perdure.workflows.goal.rules import segments
from perdure.workflows.shared.canonical import canonical_json
from perdure.workflows.shared.contracts import ToolBatchInput, ToolBatchResult, ToolInput, ToolResult
from perdure.workflows.shared.host_workspaces import host_workspace
from perdure.workflows.shared.retries import HEARTBEAT_TIMEOUT, TOOL_RETRY

SUMMARY_NAMES = 6
# Calls in one local activity at most; more made together run as several side by side.
BATCH_MAX_CALLS = 100
# Local activity results go to history with the workflow task that ran them: all of a
# task's in its completion, which the server refuses over 4 MB (GrpcMessageTooLarge), and
# then it terminates the goal. A task's local activities return this much at most before
# its next reads run as activities (a regular activity also ends the task: a checkpoint);
# their results reach history one by one, each on its own.
LOCAL_BYTES_PER_TASK = 1_000_000
# Calls one activation may place in local activities, before knowing their results' size.
# Each local activity's result stays under the payload store's threshold (128 kB by
# default: a larger one goes to the store, history keeps its address), so one activation
# adds 384 kB at most past LOCAL_BYTES_PER_TASK.
LOCAL_CALLS_PER_FLUSH = 3 * BATCH_MAX_CALLS
# What a call run alone as a local activity is counted as (its result is not measured).
LONE_CALL_BYTES = 2_000


@dataclass
class _Call:
    tool_input: ToolInput
    summary: str
    timeout: timedelta
    node: str | None = None
    answer: asyncio.Future | None = field(default=None, repr=False)  # None: a step read ahead
    twins: list[str] = field(default_factory=list)  # steps read ahead with the same call and needs


class ReadBatcher:
    def __init__(self, state: GoalState) -> None:
        self._state = state
        self._open: list[_Call] | None = None
        self._flushes: set[asyncio.Task] = set()
        # Step -> (history length when read, call key, result) of reads made ahead of their step.
        self._ahead: dict[str, tuple[int, str, ToolResult]] = {}
        self._dependents: tuple[Plan, dict[str, list[ToolStep]]] | None = None
        # (history length when the workflow task started, bytes its local activities returned)
        self._spent = (0, 0)
        # This run's batches, counted as they are scheduled (the same count on replay), and
        # those not known to be in history yet: batch -> history length when it was
        # answered (None: still running). The worker keeps a batch's answers until then
        # (activities/tools/batch_journal.py), for a worker running it again after a crash.
        self._batches = 0
        self._unrecorded: dict[int, int | None] = {}

    def read_ahead(self, node: Node | None, tool_input: ToolInput) -> ToolResult | None:
        """The result a batch read ahead for this node's call, if it still stands."""
        if node is None or not self._ahead:
            return None
        kept = self._ahead.pop(node.name, None)
        if kept is None:
            return None
        at, key, result = kept
        if at != workflow.info().get_current_history_length() or key != _call_key(tool_input):
            return None
        return result

    def forget_ahead(self, tool: str | None = None) -> None:
        """Another kind of call than a read starts (a write, a command, a device's call):
        what was read ahead may no longer be what its step would read."""
        if tool is None or _risk(tool) != "read":
            self._ahead.clear()

    async def run(
        self, tool_input: ToolInput, summary: str, timeout: timedelta, node: Node | None
    ) -> ToolResult | None:
        """The call's result from this activation's batch; None when the caller should run
        it alone (it was the only call, or it raised in the batch)."""
        if self._open is None:
            self._open = []
            flush = asyncio.create_task(self._flush(self._open))
            self._flushes.add(flush)
            flush.add_done_callback(self._flushes.discard)
        answer = asyncio.get_running_loop().create_future()
        self._open.append(_Call(tool_input, summary, timeout, node.name if node else None, answer))
        return await answer

    async def _flush(self, calls: list[_Call]) -> None:
        # Resolved once every coroutine made ready in this activation has run: the nodes
        # started with this one have all made their calls by then.
        await workflow.wait_condition(lambda: True)
        self._open = None
        waiting = [c for c in calls if c.answer is not None and not c.answer.done()]  # a cancelled node's is dropped
        room = self._local_room()
        # Only a batch of reads reads ahead: a write beside them could change what is read.
        only_reads = all(_risk(c.tool_input.tool) == "read" for c in waiting)
        can_read_ahead = waiting and only_reads and room > len(waiting)
        ahead = self._reads_ahead(waiting, room - len(waiting)) if can_read_ahead else []
        if len(waiting) + len(ahead) < 2 and room > 0:
            for call in waiting:
                self._spend(LONE_CALL_BYTES)  # its caller runs it alone, as a local activity
                call.answer.set_result(None)
            return
        batch = waiting + ahead
        try:
            entries = await self._run_waves(batch, room)
        except Exception as err:
            # Not a failure of the batch (those are answered above): the callers raise it,
            # so it settles their nodes or fails the workflow task, never leaves them waiting.
            for call in waiting:
                if not call.answer.done():
                    call.answer.set_exception(err)
            return
        at = workflow.info().get_current_history_length()
        for index, call in enumerate(batch):
            entry = entries[index] if index < len(entries) else None
            result = entry.result if entry is not None else None
            if call.answer is None:
                if result is not None and result.ok and call.node is not None:
                    for name in (call.node, *call.twins):
                        self._ahead[name] = (at, _call_key(call.tool_input), result)
            elif not call.answer.done():
                call.answer.set_result(result)

    async def _run_waves(self, batch: list[_Call], room: int) -> list:
        """Every call's answer, in waves of at most LOCAL_CALLS_PER_FLUSH: local activities
        while the workflow task has room (the first wave holds what was read ahead, which
        counts on being answered in this task), else activities, whose scheduling ends the
        task and whose inputs are in its completion too."""
        entries: list = []
        while len(entries) < len(batch):
            wave = batch[len(entries) : len(entries) + (room or LOCAL_CALLS_PER_FLUSH)]
            chunks = [wave[i : i + BATCH_MAX_CALLS] for i in range(0, len(wave), BATCH_MAX_CALLS)]
            answers = await asyncio.gather(*(self._run_batch(chunk, local=room > 0) for chunk in chunks))
            entries += [entry for answer in answers for entry in answer]
            room = self._local_room()
        return entries

    async def _run_batch(self, chunk: list[_Call], local: bool) -> list:
        """One batch's answers, one per call; answers missing (the batch failed as a whole)
        mean each of its calls runs alone, with its own retries. `local`: in this workflow
        task, as a local activity; else as an activity, which ends the task."""
        number, recorded_below = self._number_batch()
        batch = ToolBatchInput(
            calls=[c.tool_input for c in chunk],
            summaries=[c.summary for c in chunk],
            batch=number,
            recorded_below=recorded_below,
        )
        # The activity runs the calls side by side: the slowest one's limit bounds it.
        options = dict(
            result_type=ToolBatchResult,
            start_to_close_timeout=max(c.timeout for c in chunk),
            retry_policy=TOOL_RETRY,
            summary=_summary(chunk),
        )
        try:
            if local:
                answered = await workflow.execute_local_activity(Activities.RUN_TOOLS, batch, **options)
                self._spend(answered.size_bytes or LONE_CALL_BYTES * len(chunk))
            else:
                # Each call beats while it runs (activities/heartbeat.py): a lost worker is seen in seconds.
                answered = await workflow.execute_activity(
                    Activities.RUN_TOOLS, batch, heartbeat_timeout=HEARTBEAT_TIMEOUT, **options
                )
        except FailureError:
            # A local activity out of attempts raises its cause (an ApplicationError, a
            # TimeoutError), an activity an ActivityError: any failure of the batch as a whole.
            return [None] * len(chunk)
        finally:
            self._unrecorded[number] = workflow.info().get_current_history_length()
        return [entry for entry in answered.entries]

    def _number_batch(self) -> tuple[int, int]:
        """The next batch's number, and the run's batches below which all are in history: a
        batch answered before the current workflow task started was recorded when the task
        that took its answer completed (a task heartbeat records the answers it has)."""
        now = workflow.info().get_current_history_length()
        for number, answered_at in list(self._unrecorded.items()):
            if answered_at is not None and answered_at < now:
                del self._unrecorded[number]
        number = self._batches
        self._batches += 1
        recorded_below = min(self._unrecorded, default=number)
        self._unrecorded[number] = None
        return number, recorded_below

    def _local_room(self) -> int:
        """Calls this activation may still place in local activities (LOCAL_BYTES_PER_TASK)."""
        started, spent = self._spent
        length = workflow.info().get_current_history_length()
        if length != started:
            self._spent = (length, 0)  # a new workflow task: its completion starts empty
            spent = 0
        return LOCAL_CALLS_PER_FLUSH if spent < LOCAL_BYTES_PER_TASK else 0

    def _spend(self, size: int) -> None:
        started, spent = self._spent
        self._spent = (started, spent + size)

    def _reads_ahead(self, waiting: list[_Call], most: int) -> list[_Call]:
        """The pending read steps this batch's calls make ready, breadth first, up to what
        fills its last local activity, `most` at most."""
        room = BATCH_MAX_CALLS - len(waiting) % BATCH_MAX_CALLS if len(waiting) % BATCH_MAX_CALLS else 0
        room = min(room, most)
        if room <= 0:
            return []
        state = self._state
        assert state.plan is not None
        dependents = self._dependents_of(state.plan)
        have = {c.node for c in waiting if c.node is not None}
        goal_id, workspace = waiting[0].tool_input.goal_id, state.spec.workspace
        if host_workspace(workspace) is not None:
            return []  # its reads run on the workspace's host, never ahead on a worker
        local_up_to_s = state.spec.local_activities_up_to_s
        ahead: list[_Call] = []
        # Steps with the same call and needs get the same node key: one read serves them all
        # (the scheduler runs such twins once, and so does reading ahead).
        by_work: dict[tuple[str, tuple[str, ...]], _Call] = {}
        frontier = list(have)
        while frontier and len(ahead) < room:
            name = frontier.pop(0)
            for step in dependents.get(name, ()):
                # A large goal's pending step may have no node yet (workflows/goal/rules/frontier.py).
                node = state.nodes.get(step.name)
                if len(ahead) >= room or step.name in have or (node is not None and node.status != "pending"):
                    continue
                if not all(n in have or _succeeded(state, n) for n in step.needs):
                    continue
                if not readable_ahead(step, local_up_to_s):
                    continue
                have.add(step.name)
                frontier.append(step.name)
                call = ToolInput(goal_id=goal_id, node_key="", tool=step.tool, workspace=workspace, args=step.args)
                work = (_call_key(call), tuple(sorted(step.needs)))
                if work in by_work:
                    by_work[work].twins.append(step.name)
                    continue
                spec = TOOL_SPECS[step.tool]
                summary = f"tool {step.tool} · {step.name} · read ahead"
                by_work[work] = _Call(call, summary, timedelta(seconds=spec.start_to_close_s), step.name)
                ahead.append(by_work[work])
        return ahead

    def _dependents_of(self, plan: Plan) -> dict[str, list[ToolStep]]:
        """Step -> the tool steps that need it, built once per plan object."""
        if self._dependents is None or self._dependents[0] is not plan:
            index: dict[str, list[ToolStep]] = {}
            for step in plan.steps:
                if isinstance(step, ToolStep):
                    for need in step.needs:
                        index.setdefault(need, []).append(step)
            self._dependents = (plan, index)
        return self._dependents[1]


def readable_ahead(step: ToolStep, local_up_to_s: float) -> bool:
    """A step whose one call may run before the scheduler dispatches it: a read on the
    workers (no device), placed in a read segment, with fixed arguments (no template on
    the outputs it needs) and nothing around it (no checks, no network, no replay rule)."""
    spec = TOOL_SPECS.get(step.tool)
    if spec is None or spec.risk != "read" or step.device is not None or step.verify is not None:
        return False
    if step.network or step.replay is not None or step.wrap_up:
        return False
    if not segments.place_tool(step.tool, local_up_to_s).local:
        return False
    return "{{" not in canonical_json(step.args)


def _succeeded(state: GoalState, name: str) -> bool:
    node = state.nodes.get(name)
    return node is not None and node.status == "succeeded"


def _risk(tool: str) -> str | None:
    spec = TOOL_SPECS.get(tool)
    return spec.risk if spec is not None else None


def _call_key(tool_input: ToolInput) -> str:
    return f"{tool_input.tool}\0{canonical_json(tool_input.args or {})}"


def _summary(chunk: list[_Call]) -> str:
    """`read STEP`, or `N reads at once · STEP, STEP…`, and how many steps were read ahead."""
    calls = [c for c in chunk if c.answer is not None] or chunk[:1]
    ahead = sum(c.answer is None for c in chunk) - (0 if calls[0].answer is not None else 1)
    # A call's summary is "tool TOOL · STEP · KEY": the steps name the batch.
    names = [(c.summary.split(" · ") + [""])[1] or c.summary for c in calls[:SUMMARY_NAMES]]
    more = f" +{len(calls) - SUMMARY_NAMES}" if len(calls) > SUMMARY_NAMES else ""
    also = f" · {ahead} read ahead" if ahead else ""
    head = f"read {names[0]}" if len(calls) == 1 else f"{len(calls)} reads at once · {', '.join(names)}{more}"
    return f"{head}{also}"[:200]
