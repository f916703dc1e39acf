"""The goal's memory (issue 21, section 2): recall before an llm or agent step runs,
episodic writes as steps settle, revocations told at the next model turn, and the
end-of-goal card that offers the verified conclusions for keeping across goals.

Workflow code. Every read and write is a `perdure.memory.*` local activity (the store is
on the worker: activities/goal/memory_activities.py), so the history records which memory
ids each step was given; the ids stay on the node (`node.memories`) and in
`state.memory.used`. The rules (what is worth keeping, how a memory reads in a prompt,
the card) are pure, in workflows/goal/rules/memory_rules.py. Memory is advice: a memory call that
fails is noted in the gate log and the step goes on without it.

How a goal learns of a forget: it asks. Each recall and each model turn of a goal that
has used memories asks which of the used ids are revoked (at most once per workflow
task). Chosen over a signal from `perdure forget`: the forget then needs no Temporal
connection and no list of goals that used a memory, a goal that is parked or continuing
as new misses nothing, and no goal's history grows for a forget that does not concern
it. The cost is one local activity per model turn, and only in goals that used memories.

Where the end-of-goal card goes. A goal whose work is done does not stay open for a
person (`perdure watch`, `perdure result`, scripts and parent goals wait for its end): it
sends the card to its owner's router (`router-OWNER`, the
owner its PerdureOwner search attribute), which keeps it in the user's one inbox that
outlives goals, and ends. The signal is awaited, a server round trip and not the router's
handling: a signal still unsent when the workflow completes is never sent. A router that
does not exist yet (a user who never ran `perdure say`) makes the signal fail; the goal then
starts it as a child with parent-close policy ABANDON (it outlives the goal; a router that
started meanwhile makes the start fail harmlessly, one that ended is replaced) and signals
again. Chosen over starting the router first every time: a goal then records a child start
only when the user has no router, and the common case is one signal. Whatever fails, the
goal ends as it would have and its report says where the candidates are.

Constructed by each room that needs it (scheduler, llm and agent runners, closing): all
it knows is in the state.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.memory_contracts import (
    MemoryOffer,
    MemoryOffered,
    RecallInput,
    RecallResult,
    RecordInput,
    RecordResult,
    Revocation,
    RevocationsInput,
    RevocationsResult,
)
from perdure.workflows.goal.contracts.plan import PlanStep
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.rules import memory_rules
from perdure.workflows.router.router_contracts import ROUTER_WORKFLOW, RouterHandlers, RouterInput, router_id
from perdure.workflows.shared.search_attributes import OWNER

MEMORY_TIMEOUT = timedelta(seconds=20)
MEMORY_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.5), maximum_attempts=3)
MODEL_KINDS = ("llm", "agent")


class GoalMemoryRoom:
    def __init__(self, ctx: GoalContext) -> None:
        self._ctx = ctx

    # --- recall -------------------------------------------------------------------------

    def wants_recall(self, step: PlanStep, node: Node) -> bool:
        """An llm step, or an agent step before its first turn: a resumed agent's
        memories are in its transcript already."""
        if step.kind not in MODEL_KINDS:
            return False
        return node.agent is None or (node.agent.turn == 0 and node.agent.pending is None)

    async def recall(self, step: PlanStep, node: Node) -> None:
        """Attach the few memories relevant to the step (its kind, prompt, inputs and
        premises; this goal's, this workspace's and global ones) to the node."""
        state = self._ctx.state
        query = memory_rules.recall_query(step.kind, step.name, step.prompt, step.needs, state.premises)
        payload = RecallInput(
            goal_id=self._ctx.goal_id,
            node=node.name,
            node_key=node.key,
            workspace=state.spec.workspace,
            query=query,
            at=workflow.now(),
            check=self._unchecked(),
            record=self._outgoing(),
        )
        result = await self._call(Activities.MEMORY_RECALL, payload, RecallResult, f"memory recall for {step.name}")
        if result is None:
            return
        self._delivered(payload.record, result.recorded)
        self._take_revocations(result.revoked)
        node.recalled = result.memories
        node.memories = [m.id for m in result.memories]
        used = state.memory.used
        for memory_id in node.memories:
            used.setdefault(memory_id, node.name)
        if len(used) > memory_rules.MAX_USED_KEPT:
            state.memory.used = dict(list(used.items())[-memory_rules.MAX_USED_KEPT :])

    async def untold_revocations(self, node: Node) -> list[Revocation]:
        """The revocations of memories this goal used that no model turn was told yet;
        from now on they count as told (this turn tells them)."""
        memory = self._ctx.state.memory
        ids = self._unchecked()
        if ids and memory.checked_at != workflow.now():
            summary = f"memory revocations for {node.name}"
            payload = RevocationsInput(ids=ids, record=self._outgoing())
            result = await self._call(Activities.MEMORY_REVOCATIONS, payload, RevocationsResult, summary)
            if result is not None:
                self._delivered(payload.record, result.recorded)
                self._take_revocations(result.revoked)
        untold = memory.revoked[memory.told :]
        memory.told = len(memory.revoked)
        if untold:
            names = ", ".join(r.id for r in untold)
            self._ctx.log_gate(f"{node.name}: told that memories it used were revoked: {names}")
        return untold

    def prompt_for(self, prompt: str, node: Node, untold: list[Revocation]) -> str:
        """The step's prompt with its attached memories and any revocations after it."""
        now = workflow.now()
        state = self._ctx.state
        parts = [
            prompt,
            memory_rules.attached_block(node.recalled, self._ctx.goal_id, state.spec.workspace, now),
            memory_rules.revocations_block(untold, now),
        ]
        return "\n\n".join(part for part in parts if part)

    def revocation_note(self, untold: list[Revocation]) -> list[str]:
        """A later agent turn hears of revocations as a runtime note."""
        block = memory_rules.revocations_block(untold, workflow.now())
        return [block] if block else []

    def _unchecked(self) -> list[str]:
        memory = self._ctx.state.memory
        known = {r.id for r in memory.revoked}
        return [i for i in memory.used if i not in known]

    def _take_revocations(self, revoked: list[Revocation]) -> None:
        memory = self._ctx.state.memory
        memory.checked_at = workflow.now()
        known = {r.id for r in memory.revoked}
        memory.revoked += [r for r in revoked if r.id not in known]

    # --- episodic writes ----------------------------------------------------------------

    def settled(self, node: Node) -> None:
        """A step settled: its reusable conclusions (or its failure) and the rejected paths
        recorded since go to the outbox, and its working memories are to go. The outbox
        is written by the goal's next memory call (the next step's recall writes first,
        so that step may already recall them) and at the end: no write holds a step's
        task, and the outbox crosses continue-as-new in the state."""
        memory = self._ctx.state.memory
        if not node.reused and node.status in ("succeeded", "failed"):
            memory.outbox += memory_rules.settled_memories(
                self._ctx.goal_id,
                node.name,
                node.kind,
                node.key,
                node.status,
                node.preview,
                node.error,
                workflow.now(),
                node.statements,
            )
        if node.memories and node.name not in memory.drop_pending:
            memory.drop_pending.append(node.name)
        node.recalled = []
        self._queue_rejected()
        # Failures are kept first when a goal that never recalls piles up its outbox.
        if len(memory.outbox) > memory_rules.MAX_OUTBOX:
            failures = [m for m in memory.outbox if m.kind == "failure"]
            others = [m for m in memory.outbox if m.kind != "failure"]
            memory.outbox = (others + failures)[-memory_rules.MAX_OUTBOX :]

    def compacted(self, node: Node) -> None:
        """An agent's prompt was compacted: what its working memory held is gone from it."""
        memory = self._ctx.state.memory
        if node.memories and node.name not in memory.drop_pending:
            memory.drop_pending.append(node.name)

    def _queue_rejected(self) -> None:
        state, memory = self._ctx.state, self._ctx.state.memory
        for path in state.rejected_paths[memory.rejected_recorded :]:
            found = memory_rules.rejected_memory(self._ctx.goal_id, path, workflow.now())
            if found is not None:
                memory.outbox.append(found)
        memory.rejected_recorded = len(state.rejected_paths)

    def _outgoing(self) -> RecordInput | None:
        memory = self._ctx.state.memory
        if not memory.outbox and not memory.drop_pending:
            return None
        return RecordInput(
            goal_id=self._ctx.goal_id, memories=list(memory.outbox), drop_working_of=list(memory.drop_pending)
        )

    def _delivered(self, sent: RecordInput | None, result: RecordResult | None) -> None:
        """The outbox as it was sent is written: off it, and what was kept is known."""
        if sent is None or result is None:
            return
        memory = self._ctx.state.memory
        # By identity: a step settling meanwhile added to it, and two recalls in flight may
        # send the same entries (written once: ids are content-derived).
        sent_ids = {id(m) for m in sent.memories}
        memory.outbox = [m for m in memory.outbox if id(m) not in sent_ids]
        memory.drop_pending = [n for n in memory.drop_pending if n not in sent.drop_working_of]
        known = {w.id for w in memory.written}
        for new, memory_id in zip(sent.memories, result.ids, strict=False):
            if memory_id not in known and memory_id not in result.refused:
                known.add(memory_id)
                memory.written.append(memory_rules.written(new, memory_id))
        del memory.written[: -memory_rules.MAX_WRITTEN_KEPT]

    async def flush(self, summary: str = "memory record") -> None:
        """Write what the outbox holds (at the end of the goal)."""
        self._queue_rejected()
        sent = self._outgoing()
        if sent is None:
            return
        result = await self._call(Activities.MEMORY_RECORD, sent, RecordResult, summary)
        self._delivered(sent, result)

    # --- the end-of-goal card -----------------------------------------------------------

    async def at_close(self) -> None:
        """As the goal ends: write the rejected paths not written yet, and offer the verified
        conclusions for keeping across goals to the owner's router."""
        await self.flush()
        await self._offer()

    async def _offer(self) -> None:
        """Send the card to the owner's router, once; a subgoal sends none (its parent
        ends later), nor does an aborted goal (nothing was asked of it then before either)."""
        state = self._ctx.state
        if state.spec.parent is not None or state.pause.mode == "aborting" or state.memory.offered is not None:
            return
        offer = memory_rules.memory_offer(state, self._ctx.goal_id, workflow.now(), memory_rules.candidates(state))
        if offer is None:
            return
        offered = state.memory.offered = MemoryOffered(candidates=len(offer.candidates))
        owner = workflow.info().typed_search_attributes.get(OWNER)
        if not owner:
            offered.problem = "the goal has no owner (PerdureOwner) whose router could hold them"
        else:
            offered.router, offered.problem = router_id(owner), await self._send(owner, offer)
            if offered.problem is not None:
                offered.router = None
        where = f"sent to {offered.router}" if offered.router else f"not sent: {offered.problem}"
        self._ctx.log_gate(f"memory: {offered.candidates} candidate(s) to keep across goals {where}")

    async def _send(self, owner: str, offer: MemoryOffer) -> str | None:
        """The card to `router-OWNER`, starting that router if there is none; None when it
        holds it now, else why not."""
        payload = offer.model_dump(mode="json")
        handle = workflow.get_external_workflow_handle(router_id(owner))
        try:
            await handle.signal(RouterHandlers.MEMORY_CARD, payload)
            return None
        except ApplicationError:
            pass  # no such router (or it has ended): start one
        try:
            await workflow.start_child_workflow(
                ROUTER_WORKFLOW,
                RouterInput(user=owner, profile=self._ctx.state.spec.model_profile),
                id=router_id(owner),
                task_queue=workflow.info().task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                static_summary=f"router of {owner}",
            )
        except WorkflowAlreadyStartedError:
            pass  # started meanwhile (`perdure say`, another goal): it takes the card
        except Exception as err:  # noqa: BLE001 - e.g. an owner no router input takes: the goal ends all the same
            return f"the router {router_id(owner)} could not be started ({str(err)[:200]})"
        try:
            await handle.signal(RouterHandlers.MEMORY_CARD, payload)
        except ApplicationError as err:
            return f"the router {router_id(owner)} did not take them ({str(err)[:200]})"
        return None

    def notes(self) -> list[str]:
        """What the report says of the goal's memory."""
        memory = self._ctx.state.memory
        notes = []
        if memory.used:
            notes.append(f"memory: steps were given {len(memory.used)} memories")
        if memory.revoked:
            notes.append("memory: revoked since used: " + ", ".join(r.id for r in memory.revoked))
        offered = memory.offered
        if offered is not None and offered.router is not None:
            notes.append(f"memory: {offered.candidates} conclusions offered for keeping: see perdure inbox --router")
        elif offered is not None:
            notes.append(
                f"memory: {offered.candidates} verified conclusions were not offered for keeping ({offered.problem}); "
                f"they stay this goal's episodic memories: perdure memory list --goal {self._ctx.goal_id}"
            )
        if memory.problems:
            notes.append(f"memory: {memory.problems} memory call(s) failed; the goal went on without them")
        return notes

    # --- calls --------------------------------------------------------------------------

    async def _call(self, activity: str, payload: BaseModel, result_type: type, summary: str):
        """One memory activity, local (a read or an idempotent write: a re-run after a
        crash does no harm); None when it failed, said in the gate log."""
        try:
            return await workflow.execute_local_activity(
                activity,
                payload,
                result_type=result_type,
                start_to_close_timeout=MEMORY_TIMEOUT,
                retry_policy=MEMORY_RETRY,
                summary=summary,
            )
        except ValueError as err:
            # Raised as the call is made by a worker without the memory activities (tests'
            # hand-built workers): the goal runs without memory there.
            if "is not registered" not in str(err):
                raise
            self._ctx.log_gate(f"{summary}: this worker has no memory activities; going on without memory")
            return None
        except (ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) and err.cause is not None else err
            self._ctx.state.memory.problems += 1
            self._ctx.log_gate(f"{summary} failed ({str(cause)[:200]}); going on without it")
            return None
