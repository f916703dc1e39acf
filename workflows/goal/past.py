"""A large goal's past: its settled steps stored out of the node table, and its plan
stored by reference, so what each run carries and loads grows with its frontier
(workflows/goal/rules/frontier.py has the rules and the sizes).

Workflow code, by local activities (activities/goal/past_chunk_store.py), like the decision log's
chunks: a chunk of settled nodes is written in a task of its own once enough of them are no
longer needed by any step not settled yet, and the nodes leave the table when its ref is
back; before a run continues as new the rest of them go too, and a plan not stored yet is
stored. A store that fails leaves the nodes (or the plan) in the carried state: a later pass
tries again. A new run loads its stored plans first, chunk by chunk; the worker keeps them
validated (plan_cache.py).

What judges settled work (a rewind, a narrow, a re-plan, a check after a long wait) first
brings the stored nodes back (`restore`), chunk by chunk too; they are stored again later.

A chunk that cannot be read is read again after a durable wait, a few times (READ_BACKOFF);
then the goal parks saying which chunk and what to do (`on_unreadable`), and what needed the
chunk does not happen: a resume tries again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

from perdure.workflows.goal import plan_cache
from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts import past_chunks as chunks
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.goal.contracts.state import Node, PastLog, PlanVersion, StoredPlan, share_plans
from perdure.workflows.goal.rules import frontier, risk_order
from perdure.workflows.goal.rules.node_index import plan_graph
from perdure.workflows.goal.tool_runner import failure_message
from perdure.workflows.shared.contracts import ArtifactRef

T = TypeVar("T")
R = TypeVar("R")

STORE_TIMEOUT = timedelta(seconds=60)
STORE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.5), maximum_attempts=5)
# Between two steps of work that each take a workflow task of their own (a stored plan's
# graph and risk facts; the chunks a restore or a store pass reads or writes in a row): a
# timer ends the task, so no task decodes or builds more than one part.
CHUNK_PAUSE = timedelta(milliseconds=1)
# Chunks of a stored plan read in one workflow task (2,000 steps each: frontier.PLAN_CHUNK_STEPS).
PLAN_CHUNKS_PER_TASK = 8
# A chunk read that failed is tried again after each of these waits (durable timers: a
# worker restart in between loses nothing); after the last, the goal parks saying why.
READ_BACKOFF = (timedelta(seconds=10), timedelta(minutes=1), timedelta(minutes=5))
# How many stored steps that did not succeed the past names (the report's and result's lists).
NAMED_KEPT = 100


class PastUnreadable(Exception):
    """A stored chunk could not be read, after every wait of READ_BACKOFF: why, for a person."""


class Past:
    def __init__(self, ctx: GoalContext) -> None:
        self._ctx = ctx
        # Settled nodes not stored yet, oldest first: what a store pass looks through.
        self._candidates: dict[str, None] = {}
        self._since_look = 0
        self._writing: asyncio.Task | None = None
        self._restoring = False
        self._closed = False  # the report is being written: nothing more leaves the table
        self._bits: bytearray | None = None  # PastLog.stored, decoded
        # (plan, the write steps not settled) -> the steps they build on (frontier.upstream_of_unsettled_writes).
        self._pinned: tuple[object, tuple[str, ...], set[str]] | None = None
        # How the goal parks when a chunk cannot be read (set by the workflow): a reason a person can act on.
        self.on_unreadable: Callable[[str], None] = lambda _why: None

    # --- as a run starts ----------------------------------------------------------------

    async def load(self) -> bool:
        """The plans stored by reference (each loaded once however many versions share it),
        then which steps are stored in the past. False: a chunk could not be read, the goal
        is parked saying so (`on_unreadable`), and this is to be called again once resumed."""
        state = self._ctx.state
        spec = state.spec
        loaded: dict[tuple[str, ...], Plan] = {}
        try:
            if not state.plan_versions and spec.plan is None and spec.stored_plan is not None:
                # A plan file the client stored: the planner adopts it as it would one in the spec.
                spec.plan = await self._read_plan(spec.stored_plan)
            for version in state.plan_versions:
                key = tuple(ref.digest for ref in version.stored.chunks) if version.stored is not None else ()
                if version.plan is None and key and key not in loaded:
                    loaded[key] = await self._read_plan(version.stored)
        except PastUnreadable as err:
            self.on_unreadable(str(err))
            return False
        if state.past is not None and state.plan_size() > frontier.PLAN_CHUNK_STEPS:
            await workflow.sleep(CHUNK_PAUSE)  # not in the task that validated the plan's last chunk
        # The plans and which of their steps are stored, in one activation: a query in between
        # would count the stored steps twice (as stored, and as pending steps with no node).
        for version in state.plan_versions:
            if version.plan is None and version.stored is not None:
                version.plan = loaded[tuple(ref.digest for ref in version.stored.chunks)]
        share_plans(state.plan_versions)
        self._decode_stored()
        for name, node in state.nodes.items():
            if node.status in frontier.STORABLE:
                self._candidates[name] = None
        return True

    def _decode_stored(self) -> None:
        state, ctx = self._ctx.state, self._ctx
        ctx.stored.clear()
        self._bits = None
        if state.past is not None and state.plan is not None:
            steps = state.plan.steps
            self._bits = frontier.decode_bits(state.past.stored, len(steps))
            ctx.stored.update(frontier.marked(self._bits, [s.name for s in steps]))
        ctx.forget_index()

    async def _read_plan(self, stored: StoredPlan) -> Plan:
        # PLAN_CHUNKS_PER_TASK chunks to a workflow task: the activity that reads one validates
        # it for the goal (plan_cache.py), and a run replayed on another worker validates each
        # here as its local activity's result comes (one activation each). All 50 chunks of a
        # 100,000-step plan in one task held it 1.3-1.6 s, and a query (`perdure status`) with it.
        steps = await self._read(
            stored.chunks,
            chunks.READ_PLAN,
            chunks.ReadPlanResult,
            "the goal's plan",
            lambda ref, read: plan_cache.validated(ref, read.text),
            per_task=PLAN_CHUNKS_PER_TASK,
        )
        owner = (self._ctx.goal_id, workflow.info().first_execution_run_id)
        return plan_cache.plan_of(owner, stored, steps)

    async def prepare(self) -> None:
        """Before the first dispatch of a plan of more than one chunk: what the node index and
        the risk order derive from it (its graph, its risk facts), each in a workflow task of
        its own (a smaller plan's take a few tens of milliseconds)."""
        plan = self._ctx.state.plan
        if plan is None or len(plan.steps) <= frontier.PLAN_CHUNK_STEPS:
            return
        await workflow.sleep(CHUNK_PAUSE)
        plan_graph(plan)
        await workflow.sleep(CHUNK_PAUSE)
        risk_order.risk_facts(plan, self._ctx.tools())
        await workflow.sleep(CHUNK_PAUSE)

    # --- storing settled nodes ------------------------------------------------------------

    def large(self) -> bool:
        return frontier.is_large(self._ctx.state.plan_size())

    def ends_in_a_run_of_its_own(self) -> bool:
        """A large goal whose work is done, in a run that settled many steps: it reports in a
        new run. A query on a finished goal (`perdure status`) replays the goal's last run on a
        worker; that run then holds the report only, not thousands of steps."""
        return self.large() and self._ctx.settled_this_run >= frontier.LAST_RUN_AFTER

    def settled(self, node: Node) -> None:
        """A node settled: it may be stored once no step not settled yet needs it."""
        if not self.large():
            return
        self._candidates[node.name] = None
        self._since_look += 1
        if self._since_look >= frontier.PAST_CHUNK_NODES and not self._busy():
            self._since_look = 0
            storable = self._storable()
            if len(storable) >= frontier.PAST_CHUNK_NODES:
                self._writing = asyncio.create_task(self._store(storable[: frontier.PAST_CHUNK_NODES]))

    def _busy(self) -> bool:
        return self._closed or self._restoring or (self._writing is not None and not self._writing.done())

    def _storable(self) -> list[Node]:
        ctx, nodes = self._ctx, self._ctx.state.nodes
        index, held = ctx.index(), frontier.held_names(ctx.state)
        pinned: set[str] | None = None  # built only if a candidate saw a file
        found = []
        for name in list(self._candidates):
            node = nodes.get(name)
            if node is None or node.status not in frontier.STORABLE:
                del self._candidates[name]  # stored, voided or left out meanwhile
                continue
            if node.statements is not None:
                continue  # the evidence log has not taken them in
            if not frontier.storable(node, index.dependants(name), index.status_of, held):
                continue
            if frontier.saw_files(node):
                pinned = self._upstream_of_writes() if pinned is None else pinned
                if name in pinned:
                    continue  # a write not settled yet is checked against what it saw
            found.append(node)
        return found

    def _upstream_of_writes(self) -> set[str]:
        plan, index = self._ctx.plan(), self._ctx.index()
        unsettled = tuple(w for w in frontier.write_steps(plan) if index.status_of(w) not in frontier.SETTLED_OR_STORED)
        if self._pinned is None or self._pinned[0] is not plan or self._pinned[1] != unsettled:
            self._pinned = (plan, unsettled, frontier.upstream_of_unsettled_writes(plan, index.status_of))
        return self._pinned[2]

    async def settle(self) -> None:
        """Before the run continues as new: the chunk being written, then every settled node
        no step not settled yet needs, and each large plan not stored yet. What fails to be
        stored is carried as it is."""
        await self._wait_for_writing()
        if not self.large():
            return
        storable = self._storable()
        for i in range(0, len(storable), frontier.PAST_CHUNK_NODES):
            if i:
                await workflow.sleep(CHUNK_PAUSE)
            if not await self._store(storable[i : i + frontier.PAST_CHUNK_NODES]):
                break  # the store is failing: the rest is carried too, and tried in the next run
        for version in self._ctx.state.plan_versions:
            if version.stored is None and version.plan is not None and frontier.is_large(len(version.plan.steps)):
                await self._store_plan(version)

    async def close(self) -> None:
        """Before the report: the store pass in flight finishes, and no other starts (the
        report lists the node table and counts the past: a step in both would be told twice)."""
        self._closed = True
        await self._wait_for_writing()

    async def _wait_for_writing(self) -> None:
        while self._writing is not None and not self._writing.done():
            await asyncio.wait([self._writing])

    async def _store(self, nodes: list[Node]) -> bool:
        """One chunk of settled nodes to the store, and out of the table. False: the store
        failed, and the nodes stay (a later pass, or the next run, tries again)."""
        ctx, state = self._ctx, self._ctx.state
        version = len(state.plan_versions)
        try:
            ref = await _chunk_activity(
                chunks.WRITE_PAST, chunks.WritePastInput(nodes=nodes), ArtifactRef, f"store {len(nodes)} settled steps"
            )
        except FailureError as err:
            ctx.log_gate(f"{len(nodes)} settled steps stay in the goal's state: {_why(err)}")
            return False
        # Stored as they were when the chunk was written: one changed meanwhile (a plan
        # change, a restore) keeps the whole chunk out, and its nodes stay in the table.
        if len(state.plan_versions) != version or self._restoring:
            return True
        if any(state.nodes.get(n.name) is not n or n.status not in frontier.STORABLE for n in nodes):
            return True
        past = state.past or PastLog(plan_version=version)
        index = ctx.index()
        bits = self._bits if self._bits is not None else frontier.decode_bits(past.stored, index.total)
        for node in nodes:
            frontier.set_bit(bits, index.position(node.name))
            kinds = past.counts.setdefault(node.status, {})
            kinds[node.kind] = kinds.get(node.kind, 0) + 1
            if node.status != "succeeded" and len(past.not_succeeded) < NAMED_KEPT:
                past.not_succeeded.append(f"{node.name}: {node.error or node.status}")
            past.tokens, past.cost_usd = past.tokens + node.tokens, past.cost_usd + node.cost_usd
        self._bits = bits
        past.stored, past.count = frontier.encode_bits(bits), past.count + len(nodes)
        past.chunks.append(ref)
        state.past = past
        index.stored(nodes)  # before the table shrinks, so the index still fits it
        for node in nodes:
            del state.nodes[node.name]
            self._candidates.pop(node.name, None)
            ctx.stored.add(node.name)
            if node.key is not None and node.output is not None and state.outputs_by_key.get(node.key) == node.output:
                # Reuse by key looks among the frontier; a restore brings these back.
                del state.outputs_by_key[node.key]
        return True

    # --- storing a plan ---------------------------------------------------------------------

    async def _store_plan(self, version: PlanVersion) -> None:
        """A large plan's steps to the store, in chunks; if the store fails, the plan is
        carried whole (the next run tries again)."""
        plan = version.plan
        assert plan is not None
        refs, size = [], frontier.PLAN_CHUNK_STEPS
        for i in range(0, len(plan.steps), size):
            if i:
                await workflow.sleep(CHUNK_PAUSE)
            steps = plan.steps[i : i + size]
            try:
                summary = f"store plan v{version.version}, steps {i + 1}-{i + len(steps)}"
                refs.append(
                    await _chunk_activity(chunks.WRITE_PLAN, chunks.WritePlanInput(steps=steps), ArtifactRef, summary)
                )
            except FailureError as err:
                self._ctx.log_gate(f"plan v{version.version} is carried whole: {_why(err)}")
                return
        version.stored = StoredPlan(chunks=refs, steps=len(plan.steps), question_deadline=plan.question_deadline)

    # --- bringing the past back -------------------------------------------------------------

    async def restore(self) -> bool:
        """Every stored node back in the node table, before settled work is judged (a rewind,
        a narrow, a re-plan, a check of finished work). False: a chunk could not be read, the
        goal is parked saying so, and what wanted the nodes must not go on."""
        await self._wait_for_writing()
        state = self._ctx.state
        past = state.past
        if past is None:
            return True
        self._restoring = True
        try:
            loaded = await self._read(
                past.chunks, chunks.READ_PAST, chunks.PastChunk, "the goal's stored steps", None, per_task=1
            )
        except PastUnreadable as err:
            self.on_unreadable(str(err))
            return False
        finally:
            self._restoring = False
        restored = [node for chunk in loaded for node in chunk.nodes]
        for node in restored:
            state.nodes[node.name] = node
            self._candidates[node.name] = None
            if node.status == "succeeded" and node.key is not None and node.output is not None:
                state.outputs_by_key.setdefault(node.key, node.output)
        state.past = None
        self._decode_stored()
        return True

    async def _read(
        self,
        refs: list[ArtifactRef],
        activity: str,
        result_type: type[T],
        what: str,
        validate: Callable[[ArtifactRef, T], R] | None,
        per_task: int,
    ) -> list:
        """Each chunk by a local activity, and `validate`d (what that returns is kept, else the
        chunk); `per_task` of them to a workflow task. A chunk that fails is read again after
        each READ_BACKOFF wait; PastUnreadable after the last."""
        found = []
        for i, ref in enumerate(refs):
            if i and i % per_task == 0:
                await workflow.sleep(CHUNK_PAUSE)
            for wait in (*READ_BACKOFF, None):
                try:
                    summary = f"load {what}, chunk {i + 1} of {len(refs)}"
                    chunk = await _chunk_activity(activity, chunks.ReadChunkInput(ref=ref), result_type, summary)
                    break
                except FailureError as err:
                    why = _why(err)
                    if wait is None:
                        raise PastUnreadable(_unreadable(what, i, len(refs), why)) from None
                    self._ctx.log_gate(f"{what}: chunk {i + 1} of {len(refs)} not read ({why}); again in {wait}")
                    await workflow.sleep(wait, summary=f"read {what} again")
            found.append(validate(ref, chunk) if validate is not None else chunk)
        return found


async def _chunk_activity(activity: str, input: object, result_type: type[T], summary: str) -> T:
    return await workflow.execute_local_activity(
        activity,
        input,
        result_type=result_type,
        start_to_close_timeout=STORE_TIMEOUT,
        retry_policy=STORE_RETRY,
        summary=summary,
    )


def _why(err: FailureError) -> str:
    """A chunk activity's failure as said to a person: a local activity's comes as the
    activity's own ApplicationError (its type says which: activities/goal/past_chunk_store.py)."""
    if isinstance(err, ApplicationError):
        return f"{err.message} ({err.type})" if err.type else err.message
    return failure_message(err) if isinstance(err, ActivityError) else str(err)


def _unreadable(what: str, i: int, count: int, why: str) -> str:
    return (
        f"{what} could not be read: chunk {i + 1} of {count}: {why}. Put the chunk back in the artifact store "
        "(PERDURE_ARTIFACT_STORE, as the goal's workers see it), then resume the goal (`perdure resume`); "
        "or abort it"
    )
