"""The goal's contracts: what starts a goal (GoalSpec, Budget), the names of its activities,
queries, signals and updates, the payloads of its model, report and drift activities, its result
and the progress snapshot the CLI, the page and the watchdog read."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from perdure.activities.tools.catalogue import DEFAULT_TOOLS
from perdure.workflows.goal.contracts.abort_contracts import AbortProgress
from perdure.workflows.goal.contracts.deadline_contracts import QuestionDeadline, not_assumed
from perdure.workflows.goal.contracts.decision_contracts import DEFAULT_KEPT, Decision, DecisionLog
from perdure.workflows.goal.contracts.messages import Refusal
from perdure.workflows.goal.contracts.plan import NodeKind, Plan, StoredPlan, VerifyDepth
from perdure.workflows.goal.rules.segments import DEFAULT_LOCAL_UP_TO_S
from perdure.workflows.shared.contracts import ArtifactRef, ToolResult
from perdure.workflows.shared.mcp_tools import McpTool
from perdure.workflows.shared.run_boundary import goal_task_timeout
from perdure.workflows.shared.statuses import NodeStatus
from perdure.workflows.shared.tool_specs import ApprovalRule
from perdure.workflows.shared.user_tools import UserTool

GOAL_WORKFLOW = "GoalWorkflow"
# Memo key of a goal's text (its start, up to GOAL_MEMO_CHARS): visibility listings carry the
# memo, so a list of goals shows what each is without asking each one.
GOAL_MEMO = "perdure_goal"
GOAL_MEMO_CHARS = 200


# The memo key that says which message format a goal's code reads (messages.MESSAGE_FORMAT);
# a goal started before it existed reads perdure 1.0's (message_delivery fits a message to it).
MESSAGE_FORMAT_MEMO = "perdure.message_format"


def goal_memo(goal: str) -> dict[str, str | int]:
    """The memo entries a goal starts with: its text, as far as a list shows it, and the
    message format its code reads."""
    from perdure.workflows.goal.contracts.messages import MESSAGE_FORMAT

    return {GOAL_MEMO: goal[:GOAL_MEMO_CHARS], MESSAGE_FORMAT_MEMO: MESSAGE_FORMAT}


class Activities:
    """Stable activity names: histories and replay depend on them."""

    PLAN = "perdure.model.plan"
    GENERATE = "perdure.model.generate"
    AGENT_TURN = "perdure.model.agent_turn"
    RUN_TOOL = "perdure.tool.run"
    # Reads ready together, as one local activity (workflows/goal/read_batch.py).
    RUN_TOOLS = "perdure.tool.run_batch"
    VERIFY_NODES = "perdure.verify.nodes"
    # A step's `verify: {question}`, asked of a model (workflows/goal/contracts/verify_contracts.py).
    VERIFY_QUESTION = "perdure.model.verify_question"
    PREPARE_EFFECT = "perdure.tool.prepare_effect"
    WRITE_REPORT = "perdure.report.write"
    DRIFT_CHECK = "perdure.model.drift_check"
    RESOLVE_DEVICE_CALL = "perdure.devices.resolve_call"
    STORE_DEVICE_OUTPUT = "perdure.devices.store_output"
    LIST_DEVICES = "perdure.devices.list"
    # The memory store (workflows/goal/contracts/memory_contracts.py, activities/goal/memory_activities.py).
    MEMORY_RECALL = "perdure.memory.recall"
    MEMORY_RECORD = "perdure.memory.record"
    MEMORY_REVOCATIONS = "perdure.memory.revocations"
    MEMORY_PROMOTE = "perdure.memory.promote"
    # A wait step's output, with how late it acted and why (activities/goal/timer_history.py).
    WAIT_OUTPUT = "perdure.timing.wait_output"
    # The tools of the MCP servers a goal names (activities/mcp/mcp_calls.py).
    MCP_CATALOGUE = "perdure.mcp.catalogue"
    # The user's own tools a goal names, as the worker loads them (activities/tools/user/tool_modules.py).
    USER_TOOLS_CATALOGUE = "perdure.user_tools.catalogue"
    # Older entries of a goal's decision log, stored as one chunk (workflows/goal/decision_log.py).
    WRITE_DECISIONS = "perdure.decisions.write_chunk"


class Queries:
    PROGRESS = "progress"
    INBOX = "inbox"


class Signals:
    MESSAGE = "message"
    SUBGOAL_SETTLED = "subgoal_settled"


class Updates:
    SUBMIT = "submit"


Outcome = Literal["succeeded", "partial", "failed", "aborted"]

# A goal whose spec leaves `drift_every` unset checks for drift this often, while its plan has model work.
DEFAULT_DRIFT_EVERY = 12

# Past this many characters an agent turn's prompt has its older finished turns compacted.
DEFAULT_COMPACT_AFTER_CHARS = 24_000


# The token budget a goal gets when it is started with no token or cost limit (`perdure start`
# without --max-tokens or --max-cost; the web UI, the MCP server and the router alike): enough
# for a long goal of ordinary work, a stop long before a runaway spends real money (about $6 of
# input on claude-sonnet-4-5). Tokens, not dollars: a cost budget also turns on the cost-density
# gate (workflows/goal/rules/density.py), whose fair share of a default would cut off ordinary work.
DEFAULT_MAX_TOKENS = 2_000_000


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(default=None, gt=0)
    max_cost_usd: float | None = Field(default=None, gt=0)
    max_wall_seconds: int | None = Field(
        default=None,
        gt=0,
        description="Active time: seconds with work in flight or ready to run; parked time and time "
        "waiting for a person are not counted.",
    )
    deadline: datetime | None = Field(
        default=None, description="A calendar deadline (timezone-aware): counts everything, parks included."
    )

    @field_validator("deadline")
    @classmethod
    def _deadline_has_a_timezone(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.utcoffset() is None:
            raise ValueError("a deadline needs a timezone, e.g. 2026-12-01T18:00:00+01:00 or 2026-12-01T17:00:00Z")
        return value

    def with_default_tokens(self) -> Budget:
        """This budget, with the default token limit when it sets neither a token nor a cost limit."""
        if self.max_tokens or self.max_cost_usd:
            return self
        return self.model_copy(update={"max_tokens": DEFAULT_MAX_TOKENS})


class ForkOrigin(BaseModel):
    """Where a forked goal came from (`perdure fork`)."""

    goal_id: str = Field(min_length=1, max_length=300)
    node: str = Field(min_length=1, max_length=200, description="The step from which the fork runs anew.")
    why: str = Field(min_length=1, max_length=2_000)
    changes: dict[str, str] = Field(
        default_factory=dict, description="What the fork changed: premise names and `profile`, to their new values."
    )


class ParentLink(BaseModel):
    """The goal and step a subgoal was started for."""

    goal_id: str = Field(min_length=1, max_length=300)
    node: str = Field(min_length=1, max_length=200)


class GoalSpec(BaseModel):
    """What the user asks for. Holds a model *profile name*, never a credential."""

    model_config = ConfigDict(extra="forbid")

    goal: str = Field(min_length=1, max_length=20_000)
    plan: Plan | None = Field(
        default=None,
        description="A declarative plan (plan file) instead of the planner. Once it is the goal's plan v1 "
        "the carried state keeps it there only: a continued run's spec has none.",
    )
    stored_plan: StoredPlan | None = Field(
        default=None,
        exclude_if=lambda stored: stored is None,
        description="A plan file of thousands of steps, stored in the artifact store by the client that started the "
        "goal (`perdure start`), instead of `plan`: the goal loads it chunk by chunk (workflows/goal/past.py).",
    )
    constraints: list[str] = Field(default_factory=list)
    budget: Budget = Field(default_factory=Budget)
    model_profile: str = "default"
    allowed_tools: list[str] = Field(default_factory=lambda: list(DEFAULT_TOOLS))
    workspace: str = Field(
        min_length=1,
        description="Absolute path of the workspace on the workers' machines, or HOST:NAME: a workspace a host "
        "holds, whose steps run there only (workflows/shared/host_workspaces.py).",
    )
    allow_network: bool = Field(
        default=False, description="Shell commands may use the network (they run in a sandbox without it otherwise)."
    )
    max_plan_repairs: int = Field(default=2, ge=0, le=5)
    max_agent_turns: int = Field(default=8, ge=1, le=50)
    premises: dict[str, str] = Field(
        default_factory=dict, description="Named assumptions steps may rest on, e.g. scope=all_modules."
    )
    soft_gate: float = Field(default=0.7, gt=0, le=1, description="Budget fraction from which nodes run degraded.")
    drift_every: int | None = Field(
        default=None,
        ge=0,
        description="Check for drift every N finished nodes; 0 = never; None (the default): every "
        "DEFAULT_DRIFT_EVERY while the plan has model work (an llm, agent or planned subgoal step), never otherwise.",
    )
    stall_threshold: int = Field(default=2, ge=1, le=20, description="Stale agent steps before each stall response.")
    stall_after_s: float = Field(
        default=1800, gt=0, description="The watchdog calls a goal stalled after this long without progress."
    )
    local_activities_up_to_s: float = Field(
        default=DEFAULT_LOCAL_UP_TO_S,
        ge=0,
        description="Short replay-safe tool calls expected to take at most this long run as local activities, "
        "checkpointed together at the next side effect; 0 = every call is a regular activity.",
    )
    local_keyed_writes: bool = Field(
        default=False,
        description="Writes whose re-run is harmless (replay `keyed`: the service deduplicates by the effect key; "
        "`check`: looked up before writing) run as local activities too, without an activity's round trip; "
        "`once` and irreversible calls keep their activity, scheduled (a durable intent) before the call. "
        "Every start sets it (starters/client/goal_specs.py); False, a 1.0 goal's, keeps every write an "
        "activity, so goals recorded before it replay.",
    )
    continue_as_new_after_events: int = Field(
        default=10_000, ge=50, description="Continue as new by this many history events, if the server has not said so."
    )
    continue_as_new_after_nodes: int | None = Field(
        default=None,
        ge=10,
        description="Continue as new once more steps than this have settled in a run; default: as many as the run's "
        "workflow task timeout is sized for (workflows/shared/run_boundary.py steps_per_run), which a worker "
        "taking the "
        "goal over must replay the run within.",
    )
    decisions_kept: int = Field(
        default=DEFAULT_KEPT,
        ge=4,
        le=10_000,
        description="Decision-log entries the goal's state keeps; older ones go to the artifact store in chunks "
        "of half as many (workflows/goal/contracts/decision_contracts.py).",
    )
    device_wait_s: float = Field(
        default=86_400,
        gt=0,
        description="A step waiting this long for its device to come online asks a person (wait longer, "
        "another device, skip); a plan step may set its own.",
    )
    device_approval: dict[str, ApprovalRule] = Field(
        default_factory=dict,
        description="Tool (or '*') -> when a call on a device needs a person's approval: always, never or "
        "risk>=local-write (the default). A device's own rule for the tool wins: it is its owner's machine.",
    )
    compact_context_after_chars: int | None = Field(
        default=DEFAULT_COMPACT_AFTER_CHARS,
        ge=1,
        description="An agent turn whose prompt is longer than this sends its older finished turns as one line "
        "each (failed attempts and the latest turns stay whole); None: never compact.",
    )
    recovery_mode: VerifyDepth = Field(
        default="fingerprint",
        description="How finished steps are checked before the goal goes on after a long wait (a plan step's "
        "`verify` sets its own): trust, existence, fingerprint or semantic.",
    )
    verify_after_s: float = Field(
        default=3_600,
        gt=0,
        description="A wait at least this long (parked, or no progress before a continue-as-new) is followed by "
        "checking the finished steps.",
    )
    evidence_window: int = Field(
        default=3,
        ge=0,
        le=20,
        description="Re-plan on evidence (a goal the planner planned; workflows/goal/rules/evidence.py) when this many "
        "consecutive settled steps end in the same class of error or name the same root cause, or this many "
        "finished steps add less than min_new_information, or a step contradicts another's conclusion; at least "
        "this many steps settle between two such re-plans. 0 = never re-plan on evidence.",
    )
    min_new_information: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Declining value: the share of new information (word 3-grams of an output's preview not "
        "seen in earlier outputs) the last evidence_window finished steps must add on average; 0 = not judged.",
    )
    evidence_spacing_s: float = Field(
        default=900,
        ge=0,
        description="At least this long between two re-plans on evidence, so plans do not oscillate.",
    )
    question_deadline: QuestionDeadline | None = Field(
        default=None,
        description="The deadline, reminder and outcome on expiry of the goal's questions (a plan and its steps "
        "may set their own). None: its questions wait without one, as a goal started before deadlines did; every "
        "front end (perdure start, the Client, the page, the MCP server, the router) and every subgoal starts "
        "with one (DEFAULT_QUESTION_DEADLINE: 48 h, a reminder 12 h before, the safe outcome per question).",
    )
    forked_from: ForkOrigin | None = None
    parent: ParentLink | None = Field(default=None, description="Set on a subgoal: the goal that started it.")
    reuse_outputs: dict[str, ArtifactRef] = Field(
        default_factory=dict,
        description="Finished work by node key, used as this goal's own when a step's key matches (a fork: the "
        "original's outputs before the fork node). Taken into the state at the start: a continued run's spec "
        "has none.",
    )

    @field_validator("question_deadline")
    @classmethod
    def _goal_assumes_nothing(cls, value: QuestionDeadline | None) -> QuestionDeadline | None:
        problem = not_assumed(value, "the goal's question deadline")
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_plan_file(self) -> GoalSpec:
        if self.plan is not None and self.stored_plan is not None:
            raise ValueError("a goal has a plan or a stored plan, not both")
        return self

    def task_timeout(self) -> timedelta:
        """The workflow task timeout a goal's first run is started with (workflows/shared/run_boundary.py)."""
        return goal_task_timeout(self.plan_steps())

    def plan_steps(self) -> int:
        """Steps of its plan file (0: the planner plans)."""
        if self.plan is not None:
            return len(self.plan.steps)
        return self.stored_plan.steps if self.stored_plan is not None else 0


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    estimated: bool = Field(
        default=False, description="Not reported by the provider: an attempt whose usage could not be known."
    )

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


# The calls a goal makes on its own, beside its steps' (workflows/goal/spend.py books them),
# in the order they are shown.
OWN_CALL_KINDS = ("planning", "repair", "re-planning", "drift check", "verification")


class OwnCalls(BaseModel):
    """What one kind of the goal's own model calls (planning, drift checks, ...) cost so far."""

    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


class ModelContext(BaseModel):
    """What every model call of a goal is told. The goal and constraints are
    stable (sent first, for caching); premises, guidance and rejected paths
    change as the user steers (sent after them)."""

    profile: str
    goal: str
    constraints: list[str] = Field(default_factory=list)
    premises: dict[str, str] = Field(default_factory=dict)
    guidance: list[str] = Field(default_factory=list, description="The user's steering messages, oldest first.")
    rejected: list[str] = Field(default_factory=list, description="Rejected paths and why, never to be repeated.")
    degraded: bool = Field(default=False, description="Budget past the soft gate: compact context, core tools only.")
    quota_key: str | None = Field(
        default=None,
        description="A call back at its quota slot: the reservation's key (workflows/quota/quota_workflow.py).",
    )


# --- planning ---------------------------------------------------------------


class PlanRevision(BaseModel):
    """Asks the planner for a new version of a running plan."""

    reason: str
    current: Plan
    finished: dict[str, str] = Field(default_factory=dict, description="Finished step -> output preview.")
    requests: list[str] = Field(default_factory=list, description="Follow-up work the user queued.")


class PlanInput(BaseModel):
    context: ModelContext
    allowed_tools: list[str]
    revision: PlanRevision | None = None
    attempt: int = 1
    rejected: ArtifactRef | None = Field(default=None, description="The previous reply, when repairing.")
    rejection: str | None = Field(default=None, description="Why the previous reply was invalid.")
    devices: dict[str, str] | None = Field(
        default=None,
        description="Device name -> what it offers (tools, online or not), for the planner; None: the registry "
        "could not be asked.",
    )
    device_tools: dict[str, list[str]] | None = Field(
        default=None, description="Device name -> the tools it offers: a plan naming another device is refused."
    )
    mcp_tools: list[McpTool] = Field(
        default_factory=list, description="The allowed tools from MCP servers, from the goal's catalogue."
    )
    user_tools: list[UserTool] = Field(
        default_factory=list, description="The allowed tools of the user's own, from the goal's catalogue."
    )


class PlanResult(BaseModel):
    plan: Plan | None = None
    error: str | None = None
    raw: ArtifactRef
    usage: Usage
    model: str
    rationale: str | None = Field(default=None, description="What the planner said of its plan, cut.")


# --- llm and agent nodes ----------------------------------------------------


class GenerateInput(BaseModel):
    context: ModelContext
    step: str
    prompt: str
    inputs: dict[str, ArtifactRef] = Field(default_factory=dict, description="Outputs of the steps it needs.")


_STATEMENTS = (
    "statement lines (CONCLUSION, ROOT CAUSE) of the whole output, as workflows/goal/rules/evidence.py reads "
    "them (at most "
    "its MAX_STATEMENTS, of at most MAX_STATEMENT_CHARS). None: not read (the evidence log reads its preview)."
)


class GenerateResult(BaseModel):
    output: ArtifactRef
    preview: str
    usage: Usage
    model: str
    statements: list[str] | None = Field(default=None, description="The " + _STATEMENTS)


class ToolCall(BaseModel):
    call_id: str
    tool: str
    args: ArtifactRef = Field(description="The arguments as the model wrote them (JSON text).")
    preview: str = Field(default="", description="A short rendering of the arguments, for people and stall checks.")


class AgentTurnInput(BaseModel):
    context: ModelContext
    step: str
    prompt: str
    inputs: dict[str, ArtifactRef] = Field(default_factory=dict)
    tools: list[str]
    turn: int = Field(ge=1)
    max_turns: int = Field(ge=1)
    transcript: ArtifactRef | None = Field(default=None, description="Conversation so far; None on turn 1.")
    tool_results: list[ToolResult] = Field(default_factory=list, description="Results of the previous turn's calls.")
    new_guidance: list[str] = Field(default_factory=list, description="Steering that arrived since the last turn.")
    notes: list[str] = Field(default_factory=list, description="Runtime notes for this turn (e.g. stall reminders).")
    compact_after_chars: int | None = Field(
        default=DEFAULT_COMPACT_AFTER_CHARS, ge=1, description="The goal's compaction threshold; None: never compact."
    )
    mcp_tools: list[McpTool] = Field(
        default_factory=list, description="Those of `tools` that come from MCP servers, from the goal's catalogue."
    )
    user_tools: list[UserTool] = Field(
        default_factory=list, description="Those of `tools` that are the user's own, from the goal's catalogue."
    )


class ContextCompaction(BaseModel):
    """How one agent turn's prompt was compacted. Only the prompt: the full transcript stays in the store."""

    turn: int = Field(ge=1)
    compacted_turns: list[int] = Field(description="Earlier turns the model saw as one line each.")
    chars_before: int = Field(ge=0)
    chars_after: int = Field(ge=0)
    full_transcript: ArtifactRef = Field(description="The whole transcript, this turn's reply included.")
    sent_prompt: ArtifactRef = Field(description="The compacted messages the model was sent.")


class AgentTurnResult(BaseModel):
    transcript: ArtifactRef
    tool_calls: list[ToolCall] = Field(default_factory=list)
    final: ArtifactRef | None = Field(default=None, description="Set when the model answered without tool calls.")
    reason: str | None = Field(
        default=None, description="What the model said beside its tool calls (its stated reason), cut."
    )
    preview: str = ""
    usage: Usage
    model: str
    compaction: ContextCompaction | None = Field(default=None, description="Set when this turn's prompt was compacted.")
    statements: list[str] | None = Field(default=None, description="A final answer's " + _STATEMENTS)


# --- tools --------------------------------------------------------------------


EARLIER_WORK = (
    "Set on work of an earlier plan version that the current plan left out (it ran, failed or was "
    "given up before the plan changed): the last plan version that had the step."
)


class StepOutcome(BaseModel):
    name: str
    kind: NodeKind
    status: NodeStatus
    output: ArtifactRef | None = None
    error: str | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    plan_version: int | None = Field(default=None, description=EARLIER_WORK)
    reused: bool = Field(default=False, description="Its output is earlier work of the same key (a twin, a fork).")


class ReportInput(BaseModel):
    goal_id: str
    goal: str
    outcome: Outcome
    failure: str | None = None
    steps: list[StepOutcome] = Field(default_factory=list)
    unfinished: list[str] = Field(default_factory=list, description="'step: why' for every step not finished.")
    notes: list[str] = Field(default_factory=list, description="Plan versions, steering, questions: what changed.")
    tokens: int = 0
    cost_usd: float = 0.0
    tool_cost_usd: float = Field(default=0.0, description="The part of cost_usd paid tools reported (`call.cost`).")
    own_calls: dict[str, OwnCalls] = Field(
        default_factory=dict, description="The goal's own model calls (planning, drift checks, ...) by kind."
    )
    decisions: list[Decision] = Field(default_factory=list, description="The latest entries of its decision log.")
    decision_count: int = Field(default=0, description="How many decisions its log holds in all.")
    past: list[ArtifactRef] = Field(
        default_factory=list,
        exclude_if=lambda past: not past,
        description="A large goal's settled steps stored out of its state, in chunks of nodes "
        "(workflows/goal/past.py): the report reads the latest back and counts the rest.",
    )
    past_counts: dict[str, int] = Field(
        default_factory=dict, exclude_if=lambda counts: not counts, description="Those steps: status -> how many."
    )
    past_tokens: int = Field(default=0, exclude_if=lambda n: not n, description="Those steps' tokens, in all.")
    past_cost_usd: float = Field(default=0.0, exclude_if=lambda n: not n, description="Those steps' cost, in all.")


class ReportResult(BaseModel):
    report: ArtifactRef
    excerpt: str


class GoalResult(BaseModel):
    outcome: Outcome
    failure: str | None = None
    report: ArtifactRef
    excerpt: str
    outputs: dict[str, ArtifactRef] = Field(
        default_factory=dict,
        description="Step -> its output; of a large goal, the steps not stored in `past` (their nodes have theirs).",
    )
    past: list[ArtifactRef] = Field(
        default_factory=list,
        exclude_if=lambda past: not past,
        description="A large goal's settled steps stored out of its state: chunks, each a JSON object whose "
        "`nodes` are the steps as they ended (workflows/goal/past.py).",
    )
    failed_steps: list[str] = Field(default_factory=list)
    unfinished: list[str] = Field(default_factory=list)
    tokens: int = 0
    cost_usd: float = 0.0
    tool_cost_usd: float = Field(default=0.0, description="The part of cost_usd paid tools reported (`call.cost`).")
    objects: list[str] = Field(default_factory=list, description="Files it wrote and artifacts it made.")
    own_calls: dict[str, OwnCalls] = Field(
        default_factory=dict, description="Its own model calls (planning, drift checks, ...) by kind: in the totals."
    )
    lost_attempts: int = Field(default=0, description="Attempts of its calls that died with their worker.")
    lost_by_step: dict[str, int] = Field(default_factory=dict, description="Those per step.")
    decisions: DecisionLog | None = Field(
        default=None, description="Its decision log as it ended (`perdure log` reads it with no worker)."
    )


# --- progress -----------------------------------------------------------------


class SubgoalOutcome(BaseModel):
    """How a subgoal ended, as its parent learns it: the child's result, or, for a child that
    ended without one (terminated, timed out), why."""

    child_id: str = Field(min_length=1, max_length=600)
    result: GoalResult | None = None
    failure: str | None = Field(default=None, max_length=2_000)


class NodeView(BaseModel):
    name: str
    kind: NodeKind
    status: NodeStatus
    key: str | None = None
    preview: str = ""
    error: str | None = None
    placements: dict[str, str] = Field(default_factory=dict, description="Tool -> where its calls ran and why.")
    compactions: int = Field(default=0, description="Agent turns whose prompt was compacted.")
    plan_version: int | None = Field(default=None, description=EARLIER_WORK)
    waiting_for_device: str | None = Field(default=None, description="Offline: the device this node waits for.")
    needs: list[str] = Field(default_factory=list, description="The steps it depends on (the graph's edges).")
    tokens: int = 0
    cost_usd: float = 0.0
    held_back: list[str] = Field(
        default_factory=list,
        description="Why the scheduler held this step back: deferred as a risky step, serialized with a step "
        "writing the same target (workflows/goal/rules/risk_order.py).",
    )
    child: str | None = Field(default=None, description="A subgoal: the id of the goal it runs as.")
    quota: str | None = Field(
        default=None,
        description="Its model call waits for its resource's quota slot ('waiting for quota openai (next slot "
        "12:01:05)'), or waited behind other goals' calls (workflows/quota/quota_workflow.py).",
    )
    read_at: datetime | None = Field(
        default=None, description="When it read the oldest of the files it read (its fingerprints): its staleness."
    )


AHEAD_INTRO = (
    "These steps wait for a person (they cannot be undone, or run where a person approves each call); "
    "approved now, each runs later without asking again if its call is still exactly this"
)
"""What an approvals-ahead card says before its list of steps."""


class AheadApproval(BaseModel):
    """One step on an approvals-ahead card (irreversible, or on a device whose rules ask), and
    what a person decided for it: an approval is bound to `digest` (of the arguments as they
    will run) and, on a device, to `on` and `root`; a step whose arguments wait on another
    step's output has no digest and is asked when they are known."""

    step: str
    tool: str
    arguments: str = Field(description="The arguments as they will run, or the template when not known yet.")
    digest: str | None = Field(default=None, description="None: the arguments are not known in advance.")
    on: str | None = Field(default=None, description="The device or host it runs on, whose rules ask; None: a worker.")
    root: str | None = Field(
        default=None, description="The device's root: as known when listed, else the one it first runs in."
    )
    approved_before: str = Field(default="", description="What an earlier approval of this step was bound to.")
    decision: Literal["ask", "approved", "refused"] = "ask"

    def line_of_call(self) -> str:
        """The call: its arguments and where it runs."""
        where = f" on {self.on}" + (f" in {self.root}" if self.root else "") if self.on else ""
        return f"{self.arguments}{where}"

    def line(self) -> str:
        """The step as a card lists it (the card's text, `perdure status`)."""
        call = self.line_of_call() if self.digest else f"{self.line_of_call()} (will ask when known)"
        was = f" (approved before as {self.approved_before})" if self.approved_before else ""
        return f"{self.step}: {self.tool} {call}{was}"


class QuestionView(BaseModel):
    id: str
    topic: str = ""
    asked_at: datetime | None = None
    title: str
    done: str = Field(description="What the goal has done so far, as of the snapshot, not of the asking.")
    stuck: str
    options: list[dict[str, str]]
    recommendation: str
    deadline_at: datetime | None = Field(default=None, description="When it expires unanswered; None: no deadline.")
    remind_at: datetime | None = None
    reminded_at: datetime | None = Field(default=None, description="When its reminder went out.")
    on_expiry: str | None = Field(default=None, description="What it decides at its deadline: deny, park, abort, ...")
    expired_at: datetime | None = Field(
        default=None, description="Its deadline passed and parked the goal: it stays open for a person."
    )
    ahead: list[AheadApproval] = Field(default_factory=list, description="An approvals-ahead card's steps.")


class DriftOutline(BaseModel):
    """What a drift check is shown of the plan: its size, and a bounded window of it (the
    steps still to run first, the latest finished with their previews), never the whole of
    it, so the call costs the same for a plan of 20 steps and one of 20,000."""

    steps: int
    finished: int
    failed: int = 0
    kinds: dict[str, int] = Field(default_factory=dict, description="Steps per kind.")
    upcoming: list[str] = Field(default_factory=list, description="'name (kind): what it does' of the next steps.")
    recent: dict[str, str] = Field(default_factory=dict, description="The latest finished steps -> output preview.")


class DriftInput(BaseModel):
    context: ModelContext
    outline: DriftOutline


class DriftResult(BaseModel):
    on_track: bool
    reason: str
    usage: Usage
    model: str


class ProgressSnapshot(BaseModel):
    goal_id: str
    phase: str
    plan_version: int
    counts: dict[str, int]
    unlisted: int = Field(
        default=0,
        description="Steps `nodes` leaves out: a goal of thousands of steps lists its frontier (in flight, next, "
        "latest settled); `counts` has them all.",
    )
    running: list[str]
    percent_done: int
    tokens: int
    cost_usd: float
    tool_cost_usd: float = Field(default=0.0, description="The part of cost_usd paid tools reported (`call.cost`).")
    model_calls: int
    tool_calls: int
    nodes: list[NodeView]
    earlier: list[NodeView] = Field(
        default_factory=list, description="Work of earlier plan versions that the current plan left out, oldest first."
    )
    results: dict[str, str] = Field(default_factory=dict, description="Step name -> output digest.")
    report: ArtifactRef | None = None
    failure: str | None = None
    parked: bool = False
    pause_reason: str | None = None
    premises: dict[str, str] = Field(default_factory=dict)
    questions: list[QuestionView] = Field(default_factory=list, description="Open human checkpoints, one batch.")
    pending_messages: int = 0
    budget: dict[str, float] = Field(default_factory=dict, description="Fraction used per budgeted dimension.")
    active_seconds: float = Field(default=0.0, description="Active time so far (what max_wall_seconds counts).")
    failed_attempts: int = Field(default=0, description="Model attempts that failed or timed out; charged too.")
    lost_attempts: int = Field(default=0, description="Attempts that died with their worker, scheduled again.")
    estimated_cost_usd: float = Field(
        default=0.0, description="The part of cost_usd charged at an estimate (attempts whose usage is unknown)."
    )
    deadline: datetime | None = Field(default=None, description="The goal's calendar deadline, if it has one.")
    degraded: bool = False
    eta: str | None = Field(default=None, description="A coarse range with its confidence, never a precise number.")
    eta_confidence: str | None = None
    conclusions: list[str] = Field(default_factory=list, description="Latest finished outputs, briefly.")
    gate_log: list[str] = Field(default_factory=list, description="Budget, density and stall decisions, latest last.")
    started_at: datetime | None = None
    runs: int = Field(default=1, description="Runs in the goal's continue-as-new chain so far.")
    last_progress_at: datetime | None = Field(default=None, description="When a node last settled (new information).")
    stall_after_s: float = Field(default=1800, description="The goal's threshold for 'no progress' when not parked.")
    stall_rungs: dict[str, int] = Field(default_factory=dict, description="Agent node -> stall-ladder rungs fired.")
    park_expires_at: datetime | None = None
    oldest_question_at: datetime | None = Field(default=None, description="When the oldest open question was asked.")
    expired_questions: list[str] = Field(
        default_factory=list, description="Questions their deadline decided (nobody answered), latest last (bounded)."
    )
    devices: dict[str, str] = Field(default_factory=dict, description="Device -> online or offline, as last heard.")
    waiting_for_devices: dict[str, str] = Field(
        default_factory=dict, description="Node -> the device it waits for (it runs when the device is back)."
    )
    hosts: list[str] = Field(
        default_factory=list,
        exclude_if=lambda hosts: not hosts,
        description="Which of `devices` are hosts holding the goal's workspace (shown as hosts, not devices).",
    )
    forked_from: ForkOrigin | None = Field(default=None, description="Where the goal was forked from (`perdure fork`).")
    own_calls: dict[str, OwnCalls] = Field(
        default_factory=dict, description="Its own model calls (planning, drift checks, ...) by kind: in the totals."
    )
    goal: str = Field(default="", description="The goal text (cut), for whoever routes messages to it.")
    workspace: str = ""
    objects: list[str] = Field(
        default_factory=list,
        description="Files it writes or wrote and artifacts it made (workflows/goal/rules/progress_view.py).",
    )
    abort: AbortProgress | None = Field(
        default=None,
        exclude_if=lambda abort: abort is None,
        description="An abort: requested (what still runs, what is still to undo), then achieved "
        "(what was undone and what could not be); None: not aborted (workflows/goal/rules/abort_view.py).",
    )
    refused: list[Refusal] = Field(
        default_factory=list,
        description="The latest messages refused at the door (rules/progress_view.py REFUSALS_SHOWN), for "
        "`perdure status` without a second query; `perdure inbox` has them all.",
    )
    refused_count: int = Field(default=0, description="Messages refused at the door, all told.")
