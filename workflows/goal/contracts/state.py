"""The goal's one state object: what continue-as-new will carry.

Everything the goal knows lives here (plan versions, nodes, output cache,
ledger, phase), so a new run can resume from it. `schema_version` gates
loading: a state written by another version must be migrated explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_serializer, model_validator
from temporalio.contrib.workflow_streams import WorkflowStreamState

from perdure.workflows.devices.device_contracts import DevicePresence
from perdure.workflows.goal.contracts.decision_contracts import DecisionLog
from perdure.workflows.goal.contracts.goal_contracts import (
    AgentTurnResult,
    AheadApproval,
    Budget,
    ContextCompaction,
    GoalResult,
    GoalSpec,
    OwnCalls,
    SubgoalOutcome,
)
from perdure.workflows.goal.contracts.memory_contracts import GoalMemory, Recalled
from perdure.workflows.goal.contracts.messages import InboxEntry, Refusal
from perdure.workflows.goal.contracts.plan import NodeKind, Plan, StoredPlan
from perdure.workflows.goal.rules.evidence import EvidenceLog
from perdure.workflows.goal.rules.stall import StallAction, StallState
from perdure.workflows.goal.rules.timing import TimerRecord
from perdure.workflows.shared.contracts import ArtifactRef, Fingerprint, ToolResult
from perdure.workflows.shared.mcp_tools import McpCatalogue
from perdure.workflows.shared.statuses import NodeStatus, Phase
from perdure.workflows.shared.tool_specs import Compensation, ExpiryOutcome
from perdure.workflows.shared.user_tools import UserToolCatalogue

# "MAJOR.MINOR", restarted at perdure 1.0 (workflows/goal/contracts/migrations.py says why).
SCHEMA_VERSION = "1.0"


class AgentProgress(BaseModel):
    """Where an agent node's loop stands, kept in the node so the loop can stop while it
    waits for a person (an approval, an uncertain effect, a stall card, a park) and go
    on from here in a later task or run, without asking the model for the turn again."""

    turn: int = Field(default=0, description="The last turn whose model call returned.")
    transcript: ArtifactRef | None = None
    pending: AgentTurnResult | None = Field(
        default=None, description="That turn's answer while its tool calls and stall judgement are not done."
    )
    done: dict[int, ToolResult] = Field(
        default_factory=dict, description="Results of the pending turn's tool calls so far, by call index."
    )
    stall_action: StallAction | None = Field(
        default=None, description="The stall rung that asked a person about the pending turn."
    )
    stall_question: str | None = None
    tool_results: list[ToolResult] = Field(default_factory=list, description="For the next turn's prompt.")
    notes: list[str] = Field(default_factory=list, description="Runtime notes for the next turn's prompt.")


class Node(BaseModel):
    """One plan step as executed. `key` is set once the step is ready."""

    name: str
    kind: NodeKind
    needs: list[str] = Field(default_factory=list)
    status: NodeStatus = "pending"
    key: str | None = None
    output: ArtifactRef | None = None
    preview: str = ""
    error: str | None = None
    reused: bool = False
    runs: int = Field(default=0, description="Times dispatched; a result from an older run is ignored.")
    guidance_seen: int = Field(default=0, description="How much of the goal's guidance this node's model has seen.")
    degraded: bool = False
    stall: StallState = Field(default_factory=StallState)
    turns: int = 0
    compactions: list[ContextCompaction] = Field(
        default_factory=list, description="Agent turns whose prompt was compacted, oldest first."
    )
    tokens: int = 0
    cost_usd: float = 0.0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    child: str | None = Field(default=None, description="A subgoal: the id of the goal it started.")
    budget_granted: Budget | None = Field(default=None, description="A subgoal: the budget its child started with.")
    fingerprints: list[Fingerprint] = Field(
        default_factory=list,
        description="Workspace files its tool calls read or wrote, with their digests then (the latest per file).",
    )
    placements: dict[str, str] = Field(
        default_factory=dict, description="Tool -> where its calls ran and why (workflows/goal/rules/segments.py)."
    )
    waiting_on: str | None = Field(
        default=None,
        description="The question this node waits on with no task of its own: the wait is state, so it "
        "crosses continue-as-new, and the node runs again once the question is answered.",
    )
    agent: AgentProgress | None = Field(default=None, description="An agent node's loop, while it has not settled.")
    statements: list[str] | None = Field(
        default=None,
        description="An llm or agent node's statement lines, read from its whole output "
        "(workflows/goal/rules/evidence.py), "
        "until the evidence log takes them in; None: none were returned.",
    )
    memories: list[str] = Field(
        default_factory=list, description="The memory ids attached to its model input (workflows/goal/goal_memory.py)."
    )
    recalled: list[Recalled] = Field(
        default_factory=list, description="Those memories as its model input shows them, until it settles."
    )

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "status":
            # The goal keeps an index of statuses (workflows/goal/rules/node_index.py); a write it
            # did not see would leave it wrong, so there is one door.
            raise AttributeError("a node's status changes only through NodeIndex.set_status")
        super().__setattr__(name, value)


class PastLog(BaseModel):
    """The settled steps of a large goal that left its node table for the artifact store
    (workflows/goal/past.py): the refs of their chunks, how many of each status and kind,
    and which steps of the plan they are."""

    plan_version: int = Field(description="The plan version whose step positions `stored` marks.")
    chunks: list[ArtifactRef] = Field(
        default_factory=list, description="Each a JSON object whose `nodes` are stored steps, oldest first."
    )
    count: int = 0
    counts: dict[str, dict[str, int]] = Field(default_factory=dict, description="Status -> kind -> nodes.")
    stored: str = Field(
        default="",
        description="Which plan steps are stored, by position: a bitmap (bit i: step i), zlib-compressed, base64.",
    )
    not_succeeded: list[str] = Field(
        default_factory=list, description="'step: why' for the first stored steps that did not succeed (bounded)."
    )
    tokens: int = Field(default=0, description="The stored steps' tokens, in all.")
    cost_usd: float = Field(default=0.0, description="The stored steps' cost, in all.")


class RetiredNode(BaseModel):
    """Work a plan change left out after it had run, failed or been given up. Kept, never
    run again, so the report, the progress query and the outcome still count it."""

    node: Node
    plan_version: int = Field(description="The last plan version that had the step.")
    dropped_by: int = Field(description="The plan version that removed or changed it.")


class KindStats(BaseModel):
    runs: int = 0
    seconds: list[float] = Field(default_factory=list)
    costs_usd: list[float] = Field(default_factory=list)
    tokens: list[int] = Field(default_factory=list)


class Ledger(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    model_calls: int = 0
    tool_calls: int = 0
    active_seconds: float = Field(
        default=0.0, description="Active time up to `active_since` (or up to now, when not active)."
    )
    active_since: datetime | None = Field(default=None, description="When the current active stretch began.")
    failed_attempts: int = Field(default=0, description="Model attempts that failed or timed out, charged too.")
    estimated_cost_usd: float = Field(default=0.0, description="The part of cost_usd charged at an estimate.")
    tool_cost_usd: float = Field(
        default=0.0, description="The part of cost_usd that tool calls reported (a user's paid tools, `call.cost`)."
    )
    lost_attempts: int = Field(
        default=0, description="Attempts of its calls that died with their worker (workflows/goal/lost_workers.py)."
    )
    lost_by_step: dict[str, int] = Field(
        default_factory=dict, description="Those per step (calls outside steps under LOST_OUTSIDE_STEPS)."
    )
    by_kind: dict[str, KindStats] = Field(default_factory=dict)
    own_calls: dict[str, OwnCalls] = Field(
        default_factory=dict,
        description="The goal's own model calls by kind (contracts.OWN_CALL_KINDS), also in the totals above.",
    )

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class PlanDiff(BaseModel):
    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    invalidated: list[str] = Field(default_factory=list)
    kept: list[str] = Field(default_factory=list)
    to_confirm: list[str] = Field(default_factory=list)


class PlanVersion(BaseModel):
    version: int
    plan: Plan | None = Field(
        description="Never None once a run has loaded its plans. In the carried form, None means the same plan as "
        "the version before (a narrow or rewind keeps the plan): a 10,000-step plan travels once, not per version; "
        "or a plan stored by reference (`stored`)."
    )
    stored: StoredPlan | None = Field(
        default=None,
        exclude_if=lambda stored: stored is None,
        description="A large plan's steps in the artifact store: carried instead of the plan.",
    )
    reason: str
    source: Literal["planner", "plan-file", "narrow", "rewind", "queue", "drift", "verify", "evidence"]
    diff: PlanDiff = Field(default_factory=PlanDiff)


class QuestionOption(BaseModel):
    id: str
    label: str
    cost: str = Field(default="", description="What choosing it costs, in words (time, money, redone work).")


class Question(BaseModel):
    """A human checkpoint. Open questions are asked together, as one batch."""

    id: str
    topic: Literal[
        "park_expired",
        "narrow_confirm",
        "uncertain_effect",
        "confirm_effect",
        "stalled",
        "escalation",
        "confirm_device_call",
        "device_offline",
        "approvals_ahead",
    ]
    title: str
    done: str = Field(description="What the goal has done so far.")
    stuck: str = Field(description="Where it is stuck and why it needs a person.")
    options: list[QuestionOption]
    recommendation: str
    status: Literal["open", "answered", "closed", "expired"] = Field(
        default="open",
        description="closed: the goal ended (or the step went) first; expired: its deadline decided it "
        "(on_expiry), not a person.",
    )
    answer: str | None = None
    answer_text: str | None = None
    asked_at: datetime
    answered_at: datetime | None = None
    nodes: list[str] = Field(default_factory=list, description="Nodes this question decides about.")
    hold: list[str] = Field(default_factory=list, description="Pending nodes that wait for the answer.")
    effect_key: str | None = Field(default=None, description="The effect a confirmation or uncertain card is about.")
    tool: str | None = Field(default=None, description="The tool whose call a confirmation or uncertain card is about.")
    # Its deadline (workflows/goal/rules/question_deadline_rules.py): set once, from its asking,
    # by its step's, plan's or goal's rule.
    deadline_at: datetime | None = None
    remind_at: datetime | None = None
    on_expiry: ExpiryOutcome | None = None
    reminded_at: datetime | None = Field(default=None, description="When the reminder went out (once).")
    expired_at: datetime | None = Field(
        default=None, description="When its deadline passed unanswered (a park keeps it open, for a person)."
    )
    ahead: list[AheadApproval] = Field(default_factory=list, description="An approvals-ahead card's steps.")

    def about(self) -> list[str]:
        """The steps it is about: its nodes, or an approvals-ahead card's steps."""
        return self.nodes or [entry.step for entry in self.ahead]

    @property
    def decided(self) -> bool:
        """Answered by a person or decided by its deadline: a step waiting on it acts on `answer`."""
        return self.status in ("answered", "expired")


class ParkCondition(BaseModel):
    """What ends a park by itself (workflows/goal/park_conditions.py): a workspace file that
    exists, a command that exits 0 (both checked by an activity, polled with backoff), or a
    named signal."""

    kind: Literal["file", "command", "signal"]
    target: str
    interval_s: float = 2
    max_interval_s: float = 300
    next_check_at: datetime | None = None
    checks: int = 0
    last_result: str | None = None

    def describe(self) -> str:
        """What the park waits for, as status says it."""
        if self.kind == "signal":
            return f"until signal {self.target}"
        what = f"until file {self.target} exists" if self.kind == "file" else f"until command `{self.target}` exits 0"
        # What the last check said: a command that cannot run at all (no network, not
        # installed) shows here, not only at the park's expiry.
        last = f"; last check: {self.last_result[:120]}" if self.last_result else ""
        return f"{what}; checked {self.checks} times{last}"

    def held_text(self) -> str:
        """Why the park ended, for the gate log and the event stream."""
        if self.kind == "signal":
            return f"signal {self.target} received"
        return f"file {self.target} exists" if self.kind == "file" else f"command `{self.target}` exited 0"


class PauseState(BaseModel):
    mode: Literal["running", "parked", "aborting"] = "running"
    reason: str | None = None
    parked_at: datetime | None = None
    parked_since: datetime | None = Field(default=None, description="When this park began (an extension keeps it).")
    wake_at: datetime | None = None
    expires_at: datetime | None = None
    expiry_asked: bool = False
    rollback: bool = False
    emergency: bool = Field(default=False, description="Aborting because a budget ran out while work ran.")
    condition: ParkCondition | None = Field(default=None, description="A park that ends when this holds.")
    # An abort's own times and who asked (workflows/goal/rules/abort_view.py). Left out of the
    # carried state while unset, so a goal that was never aborted carries what it did before.
    abort_requested_at: datetime | None = Field(default=None, exclude_if=lambda at: at is None)
    abort_by: str | None = Field(
        default=None, exclude_if=lambda by: by is None, description="A message (its request id), an answer, ..."
    )
    abort_achieved_at: datetime | None = Field(
        default=None, exclude_if=lambda at: at is None, description="Nothing runs and every undo has settled."
    )


class CompensationRecord(BaseModel):
    """How to undo one effect, recorded before the effect is sent; run newest first on
    abort with rollback for every effect that happened or may have happened."""

    node: str
    effect_key: str
    compensation: Compensation
    # Whether the effect happened: in flight (recorded before it is sent), then happened,
    # maybe (the outcome is unknown) or not_happened.
    effect: Literal["in_flight", "happened", "maybe", "not_happened"] = "in_flight"
    status: Literal["registered", "done", "failed", "not_needed"] = "registered"
    note: str | None = None
    device: str | None = Field(default=None, description="The device the effect happened on; its undo runs there.")


class DeviceWait(BaseModel):
    """A node waiting for its device to be online: since when, and the card that asks a
    person once the wait is longer than the step's or goal's device_wait_s."""

    device: str
    since: datetime
    question: str | None = None


class EffectRecord(BaseModel):
    """A remote write that happened, by effect key: a later call with the same key (a
    voided node run again) reuses this outcome instead of sending the effect twice."""

    node: str
    tool: str
    output: ArtifactRef | None = None
    preview: str = ""


class Verification(BaseModel):
    """One check of the finished steps before the goal went on (workflows/goal/verification.py)."""

    at: datetime
    why: str
    kept: list[str] = Field(default_factory=list)
    void: dict[str, str] = Field(default_factory=dict, description="Step -> why it no longer holds.")
    downstream: list[str] = Field(default_factory=list, description="Void because they rest on those.")
    problem: str | None = Field(default=None, description="The check could not be made: nothing was voided.")
    unchecked: dict[str, str] = Field(
        default_factory=dict,
        description="Step -> what of it could not be checked, so it was kept: a URL not re-fetched, a "
        "question the model's answer did not settle.",
    )

    def summary(self) -> str:
        if self.problem:
            return f"re-verification failed ({self.problem}): kept everything"
        reasons = "; ".join(f"{name}: {why}" for name, why in list(self.void.items())[:3])
        void = len(self.void) + len(self.downstream)
        said = f"re-verified: {len(self.kept)} kept, {void} void" + (f" ({reasons})" if reasons else "")
        if self.unchecked:
            notes = "; ".join(f"{name}: {why}" for name, why in list(self.unchecked.items())[:3])
            more = f" (and {len(self.unchecked) - 3} more)" if len(self.unchecked) > 3 else ""
            said += f"; kept without a full check: {notes}{more}"
        return said


class RejectedPath(BaseModel):
    node: str
    why: str
    output_preview: str = ""
    at: datetime

    def for_prompt(self) -> str:
        shown = f" (its output began: {self.output_preview})" if self.output_preview else ""
        return f"step '{self.node}' was rejected: {self.why}{shown}"


class GoalState(BaseModel):
    # Unknown fields are an error, not something to drop: see workflows/goal/contracts/migrations.py.
    model_config = ConfigDict(extra="forbid")

    schema_version: str = SCHEMA_VERSION
    spec: GoalSpec
    phase: Phase = "planning"
    plan_versions: list[PlanVersion] = Field(default_factory=list)
    nodes: dict[str, Node] = Field(default_factory=dict)
    retired_nodes: list[RetiredNode] = Field(
        default_factory=list, description="Work of earlier plan versions the current plan left out, oldest first."
    )
    outputs_by_key: dict[str, ArtifactRef] = Field(default_factory=dict)
    ledger: Ledger = Field(default_factory=Ledger)
    failure: str | None = None
    result: GoalResult | None = None
    premises: dict[str, str] = Field(default_factory=dict)
    guidance: list[str] = Field(default_factory=list)
    inbox: list[InboxEntry] = Field(default_factory=list)
    refused: list[Refusal] = Field(default_factory=list)
    questions: list[Question] = Field(default_factory=list)
    pause: PauseState = Field(default_factory=PauseState)
    rejected_paths: list[RejectedPath] = Field(default_factory=list)
    abort_reason: str | None = None
    started_at: datetime | None = None
    last_progress_at: datetime | None = None
    runs: int = Field(default=1, description="Runs in the continue-as-new chain so far, this one included.")
    compensations: list[CompensationRecord] = Field(default_factory=list)
    effects: dict[str, EffectRecord] = Field(default_factory=dict, description="Effect key -> a write that happened.")
    drift_checks: int = 0
    gate_log: list[str] = Field(default_factory=list)
    decisions: DecisionLog = Field(
        default_factory=DecisionLog,
        description="The decision log: its latest entries and the refs of the stored rest "
        "(workflows/goal/decision_log.py).",
    )
    devices: dict[str, DevicePresence] = Field(
        default_factory=dict,
        description="The devices the plan names, as the registry last said (workflows/goal/device_placement.py).",
    )
    device_waits: dict[str, DeviceWait] = Field(default_factory=dict, description="Node -> its wait for its device.")
    device_moves: dict[str, str] = Field(
        default_factory=dict, description="Node -> the device a person chose for it when its own stayed offline."
    )
    subgoal_outcomes: dict[str, SubgoalOutcome] = Field(
        default_factory=dict, description="Child goal id -> how it ended, until its step has taken it."
    )
    verify_due: str | None = Field(
        default=None, description="Why the finished steps are to be checked before new work starts."
    )
    verifications: list[Verification] = Field(default_factory=list, description="Checks of finished work so far.")
    code_versions: list[str] = Field(
        default_factory=list, description="Build ids of the workers that have run this goal, oldest first (bounded)."
    )
    evidence: EvidenceLog = Field(
        default_factory=EvidenceLog,
        description="Conclusions and outcomes of settled steps, for re-planning on evidence "
        "(workflows/goal/rules/evidence.py).",
    )
    memory: GoalMemory = Field(
        default_factory=GoalMemory,
        description="The memory ids its steps used, revocations it was told, what it wrote "
        "(workflows/goal/goal_memory.py).",
    )
    timers: list[TimerRecord] = Field(
        default_factory=list,
        description="The wait steps' and the park's timers it acted on: planned, acted, how late (timing.py).",
    )
    mcp: McpCatalogue | None = Field(
        default=None,
        description="The tools of the MCP servers the goal names, as listed when it started "
        "(workflows/shared/mcp_tools.py); "
        "None: it names none, or has not listed them yet.",
    )
    user_tools: UserToolCatalogue | None = Field(
        default=None,
        description="The user's own tools the goal names, as a worker declared them when it started "
        "(workflows/shared/user_tools.py); None: it names none, or has not listed them yet.",
    )
    stopped_untouched: str | None = Field(
        default=None,
        exclude_if=lambda why: why is None,
        description="Why every step of a large goal that had no node when an emergency stop came is abandoned "
        "(counted, never given a node: workflows/goal/rules/node_index.py); None: no such stop.",
    )
    past: PastLog | None = Field(
        default=None,
        exclude_if=lambda past: past is None,
        description="A large goal's settled steps its frontier no longer needs, moved to the artifact store "
        "(workflows/goal/past.py); their nodes are not in `nodes`.",
    )

    @field_serializer("plan_versions", mode="wrap")
    def _carry_each_plan_once(self, versions: list[PlanVersion], handler: SerializerFunctionWrapHandler) -> Any:
        carried = []
        for i, version in enumerate(versions):
            before = versions[i - 1].plan if i else None
            # A stored plan travels by reference; a plan like the version before's, as None.
            if version.plan is not None and (
                version.stored is not None or (i and (version.plan is before or version.plan == before))
            ):
                version = version.model_copy(update={"plan": None})  # never dumped, not even to be dropped
            carried.append(version)
        return handler(carried)

    @model_validator(mode="after")
    def _share_repeated_plans(self) -> GoalState:
        share_plans(self.plan_versions)
        if self.plan_versions and self.plan_versions[0].plan is None and self.plan_versions[0].stored is None:
            raise ValueError("plan v1 has no plan")
        return self

    def open_questions(self) -> list[Question]:
        return [q for q in self.questions if q.status == "open"]

    @property
    def plan(self) -> Plan | None:
        return self.plan_versions[-1].plan if self.plan_versions else None

    def plan_size(self) -> int:
        """Steps of the current plan (0: none yet), loaded or still by reference."""
        if not self.plan_versions:
            return 0
        version = self.plan_versions[-1]
        if version.plan is not None:
            return len(version.plan.steps)
        return version.stored.steps if version.stored is not None else 0


def share_plans(versions: list[PlanVersion]) -> None:
    """A version carried without its plan has its predecessor's (a stored plan, whose
    steps are not loaded yet, leaves its own and its followers' to the loader)."""
    for i, version in enumerate(versions):
        if version.plan is None and version.stored is None and i:
            version.plan = versions[i - 1].plan


@dataclass(frozen=True)
class UndecryptedInput:
    """What a worker with no payload keys is given for a goal's input that a client encrypted
    (runtime/converter.py), in place of the GoalInput it cannot read: the goal then ends
    saying why, instead of failing every workflow task on the input (a stuck goal)."""

    key_id: str

    def problem(self, fresh: bool) -> str:
        """`fresh`: the goal has done nothing yet, and ends."""
        what = (
            f"this worker cannot read the goal: its input is encrypted with payload key '{self.key_id}' and the "
            "worker has no payload keys"
        )
        if not fresh:
            return what + "; a worker with the key carries it on"
        return (
            what + ". Nothing was done. Give every worker the keys the CLI has (PERDURE_PAYLOAD_KEYS or "
            "PERDURE_PAYLOAD_KEY_FILE), then start the goal again with --replace"
        )


class GoalInput(BaseModel):
    """Workflow input: the spec, plus the carried state when continuing as new.

    The state travels as JSON text, so an old or damaged one reaches the workflow's
    own loader (and a clear refusal) instead of failing in the decoder. Text, because
    a goal of thousands of nodes must load within its first workflow task: validated
    from text in one pass it loads about twice as fast as through a mapping
    (workflows/goal/contracts/migrations.py).
    """

    spec: GoalSpec
    state: str | None = None
    stream: WorkflowStreamState | None = Field(
        default=None, description="The event stream's log and publishers, carried across continue-as-new."
    )
