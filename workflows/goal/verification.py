"""Verify before going on: after a long wait, the goal's finished steps are checked before
new work starts, and what no longer holds is voided as a rewind would void it.

When: a park at least `verify_after_s` long ends (a resume, or its wake time), or a run
continued as new starts after that long without progress (workflows/goal/verify_due.py). What: every
succeeded step of the current plan, as deep as its `verify` (or the goal's
recovery_mode) says, in one activity (activities/goal/recheck.py): existence (its output
artifact, the files it wrote), fingerprint (the files it read are as the goal last knew
them, the URLs it fetched return the same body: re-fetched when the goal may call
http_get, as the tool itself may whatever `allow_network` says), semantic (its `verify`
command still passes). Steps on a device, and every step of a goal whose workspace is
on a host, are checked only for their artifacts: their files are on that machine. A
check that cannot be made keeps everything and says so; the goal never stops on it.

What a read is checked against (`as_the_goal_knows`): not the digest the step read, but
what that became through the goal's own later changes, so a step that read a.md is not
voided because a later step of the same goal wrote a.md (that would run the writer, and
any remote write after it, again). Every fingerprint of the same file across the goal's
nodes, in time order after the read: a write (or what one of the goal's command steps
`changed` it to) moves the expected digest on; a read or a look `seen` that differs from
it means the file changed from outside while the goal ran, and then the step's own
digest is the one checked, as if the goal had not written it (what differs from what
the step read voids it). A change from outside is therefore "now != what the goal's
own writes made of what the step read".

Then, at depth semantic, each step whose `verify` asks a `question` and that still holds
(neither void nor downstream of a void step: those run again anyway) is asked about in
one model call through ModelCalls (charged to the goal, failed attempts included; the
step's profile, else the goal's), in plan order. One call per step rather than one for
all: each answer is one strict verdict about one conclusion, so a malformed or cut-off
answer leaves only its own step unjudged, a long conclusion does not crowd out the
others, and a step voided by its answer spares the questions downstream of it. Such
steps are declared by hand and few, so the calls are few. The model is shown the goal,
the question, the step's output (read in full by the activity), the conclusions the goal
recorded since the step finished (state.evidence; those of steps still standing) and
what the checked steps read that changed since. HOLDS keeps the step; VOID voids it with
the others; an answer in neither form, or a call that fails, keeps it and the record
says so. Goals recorded before questions existed (patch `verify-by-question`) ask none.

Workflow code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from perdure.workflows.goal.context import GoalContext
from perdure.workflows.goal.contracts.goal_contracts import Activities, ModelContext
from perdure.workflows.goal.contracts.plan import PlanStep
from perdure.workflows.goal.contracts.state import Node, PlanDiff, Verification
from perdure.workflows.goal.contracts.verify_contracts import (
    REFETCH_TIMEOUT_S,
    NodeCheck,
    QuestionInput,
    QuestionResult,
    VerifyInput,
    VerifyResult,
    source_key,
)
from perdure.workflows.goal.model_calls import ModelCalls
from perdure.workflows.goal.rules.invalidation import invalidate_nodes
from perdure.workflows.goal.scheduler import Scheduler
from perdure.workflows.goal.tool_runner import failure_message
from perdure.workflows.shared.contracts import Fingerprint
from perdure.workflows.shared.host_workspaces import host_workspace

VERIFY_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=1))
VERIFY_HEARTBEAT = timedelta(seconds=60)
# Checks of finished work kept in the state (the newest; each is also a plan version).
VERIFICATIONS_KEPT = 20
# What a question is shown of the goal's newer conclusions and changed reads (the newest).
QUESTION_EVIDENCE_LINES = 20
# The tool whose rule a URL's re-fetch follows: the goal may call it.
REFETCH_TOOL = "http_get"
# The goal's own changes to a file, and what only looks at it (Fingerprint.kind).
OWN_CHANGES = ("wrote", "changed")
CHECKED_KINDS = ("read", "wrote")


class Verifier:
    def __init__(self, ctx: GoalContext, scheduler: Scheduler, calls: ModelCalls) -> None:
        self._ctx = ctx
        self._scheduler = scheduler
        self._calls = calls

    def pending(self) -> bool:
        return bool(self._ctx.state.verify_due) and self._ctx.state.pause.mode == "running"

    async def run(self) -> None:
        state = self._ctx.state
        why, state.verify_due = state.verify_due or "", None
        if not await self._ctx.restore_past():  # a large goal's stored steps are checked too (past.py)
            state.verify_due = why  # parked, saying why: checked once resumed
            return
        known = timeline(state.nodes.values())
        checks = [c for c in (self._check(s, known) for s in self._ctx.plan().steps) if c is not None]
        if not checks:
            return
        record = Verification(at=workflow.now(), why=why)
        refetch = REFETCH_TOOL in state.spec.allowed_tools
        urls = sum(1 for c in checks for p in c.fingerprints if p.source.startswith("url:")) if refetch else 0
        try:
            result = await workflow.execute_activity(
                Activities.VERIFY_NODES,
                VerifyInput(
                    workspace=state.spec.workspace, network=state.spec.allow_network, refetch=refetch, checks=checks
                ),
                result_type=VerifyResult,
                start_to_close_timeout=timedelta(
                    seconds=60 + sum(c.timeout_s for c in checks if c.command) + REFETCH_TIMEOUT_S * urls
                ),
                heartbeat_timeout=VERIFY_HEARTBEAT,
                retry_policy=VERIFY_RETRY,
                summary=f"verify {len(checks)} finished steps ({why})"[:200],
            )
        except ActivityError as err:
            record.problem = failure_message(err)[:300]
            record.kept = [c.node for c in checks]
        else:
            void, unchecked = dict(result.void), dict(result.unchecked)
            await self._ask_questions(void, unchecked, result.changed)
            record.void, record.unchecked = void, unchecked
            invalidation = invalidate_nodes(self._ctx.plan(), self._statuses(), list(void))
            record.kept = invalidation.kept
            record.downstream = [name for name in invalidation.void if name not in void]
            if invalidation.void:
                self._scheduler.void(invalidation.void)
                self._scheduler.record_plan_version(
                    "verify",
                    f"{why}: {record.summary()}",
                    PlanDiff(invalidated=invalidation.void, kept=invalidation.kept),
                )
        state.verifications = [*state.verifications, record][-VERIFICATIONS_KEPT:]
        self._ctx.log_gate(f"{why}: {record.summary()}", kind="verify", about=[*record.void, *record.downstream])

    def _check(self, step: PlanStep, known: Mapping[str, list[Fingerprint]]) -> NodeCheck | None:
        node = self._ctx.state.nodes.get(step.name)  # a large goal's pending step may have none yet
        if node is None or node.status != "succeeded":
            return None
        spec = step.verify
        depth = spec.depth_for(self._ctx.state.spec.recovery_mode) if spec else self._ctx.state.spec.recovery_mode
        if depth == "trust":
            return None
        # A goal whose workspace is on a host: its files are there, not on this worker.
        on_host = host_workspace(self._ctx.state.spec.workspace) is not None
        on_device = on_host or getattr(step, "device", None) is not None
        return NodeCheck(
            node=step.name,
            depth="existence" if on_device else depth,
            artifacts=[node.output] if node.output else [],
            fingerprints=[] if on_device else as_the_goal_knows(node, known),
            command=None if on_device or spec is None else spec.command,
            expect_exit=spec.expect_exit if spec else 0,
            timeout_s=spec.timeout_s if spec else 120,
        )

    # --- the model question ------------------------------------------------------

    async def _ask_questions(self, void: dict[str, str], unchecked: dict[str, str], changed: list[str]) -> None:
        """Ask each still-holding question step, in plan order; a VOID answer joins `void`."""
        plan, recovery_mode = self._ctx.plan(), self._ctx.state.spec.recovery_mode
        voided = set(invalidate_nodes(plan, self._statuses(), list(void)).void)
        for step in plan.steps:
            spec = step.verify
            node = self._ctx.state.nodes.get(step.name)
            if spec is None or spec.question is None or node is None or node.status != "succeeded":
                continue
            if step.name in voided:
                continue
            if spec.depth_for(recovery_mode) != "semantic":
                continue
            try:
                answer = await self._ask(step, spec.question, node, voided, changed)
            except ActivityError as err:
                note = f"its question could not be asked ({failure_message(err)[:200]})"
                unchecked[step.name] = _joined(unchecked.get(step.name), note)
                continue
            if answer.verdict == "void":
                void[step.name] = f"the model judged its conclusion no longer holds: {answer.reason}"
                voided.update(invalidate_nodes(plan, self._statuses(), [step.name]).void)
            elif answer.verdict == "unjudged":
                note = f"its question could not be judged ({answer.reason})"
                unchecked[step.name] = _joined(unchecked.get(step.name), note)

    async def _ask(
        self, step: PlanStep, question: str, node: Node, voided: set[str], changed: list[str]
    ) -> QuestionResult:
        summary = f"verify question · {step.name}"
        payload = QuestionInput(
            context=self._context(step, summary),
            step=step.name,
            question=question,
            output=node.output,
            preview=node.preview,
            finished_at=node.finished_at,
            conclusions=self._conclusions_since(node, voided),
            changed=changed[-QUESTION_EVIDENCE_LINES:],
        )
        return await self._calls.run(Activities.VERIFY_QUESTION, payload, QuestionResult, summary, own="verification")

    def _context(self, step: PlanStep, summary: str) -> ModelContext:
        context = self._calls.context(summary)
        profile = getattr(step, "profile", None)
        return context.model_copy(update={"profile": profile}) if isinstance(profile, str) and profile else context

    def _conclusions_since(self, node: Node, voided: set[str]) -> list[str]:
        """The conclusions recorded after `node` finished by other steps whose output still
        stands (a step voided now drew its conclusion from what no longer holds)."""
        nodes = self._ctx.state.nodes
        lines = []
        for c in self._ctx.state.evidence.conclusions:
            if c.node == node.name or c.node in voided or (node.finished_at and c.at <= node.finished_at):
                continue
            source = nodes.get(c.node)
            if source is not None and (source.status != "succeeded" or source.key != c.node_key):
                continue
            disputed = f", disputed by step '{c.contradicted_by}'" if c.contradicted_by else ""
            lines.append(f"{c.claim}: {'holds' if c.holds else 'does not hold'} (step '{c.node}'{disputed})")
        return lines[-QUESTION_EVIDENCE_LINES:]

    def _statuses(self) -> dict[str, str]:
        return {name: node.status for name, node in self._ctx.state.nodes.items()}


def _joined(earlier: str | None, note: str) -> str:
    return f"{earlier}; {note}" if earlier else note


# --- what the goal knows of the files it read ---------------------------------------


def timeline(nodes: Iterable[Node]) -> dict[str, list[Fingerprint]]:
    """Every file and directory fingerprint of the goal's nodes, by source, oldest first."""
    by_source: dict[str, list[Fingerprint]] = {}
    for node in nodes:
        for print_ in node.fingerprints:
            if print_.source.startswith(("file:", "dir:")):
                by_source.setdefault(source_key(print_.source), []).append(print_)
    for prints in by_source.values():
        prints.sort(key=lambda p: p.at)
    return by_source


def expected_digest(read: Fingerprint, known: Mapping[str, list[Fingerprint]]) -> str | None:
    """What `read`'s source should digest to now if nobody but the goal changed it since."""
    expected = read.digest
    for later in known.get(source_key(read.source), []):
        if later.at <= read.at:
            continue
        if later.kind in OWN_CHANGES:
            expected = later.digest
        elif later.digest != expected:
            return read.digest  # seen changed from outside: only what the step read still holds
    return expected


def as_the_goal_knows(node: Node, known: Mapping[str, list[Fingerprint]]) -> list[Fingerprint]:
    """`node`'s fingerprints to check, each file read expected as the goal's own later
    changes left it; the goal's looks around its commands are not checked."""
    prints = []
    for print_ in node.fingerprints:
        if print_.kind not in CHECKED_KINDS:
            continue
        if print_.kind == "read" and print_.source.startswith(("file:", "dir:")):
            print_ = print_.model_copy(update={"digest": expected_digest(print_, known)})
        prints.append(print_)
    return prints
