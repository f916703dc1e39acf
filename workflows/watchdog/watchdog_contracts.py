"""Typed payloads of the watchdog: its input, what a scan observes, what the rules
decide, the memory kept between runs, and each run's result.

Pure pydantic, shared by `WatchdogWorkflow`, its activities and the CLI. Nothing
here reads a clock or does I/O; the watchdog's rules live in `watchdog_rules`.
Payloads stay compact: a scan row carries what the rules need, never a goal's
whole progress snapshot.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

WATCHDOG_WORKFLOW = "WatchdogWorkflow"
# Schedule id and the prefix of every scheduled run's workflow id (Temporal appends the time).
WATCHDOG_ID = "perdure-watchdog"
WATCHDOG_STATE_QUERY = "state"
MEMORY_SCHEMA_VERSION = 1
RULES_SCHEMA_VERSION = 1


class WatchdogActivities:
    """Stable activity names: histories and replay depend on them."""

    RECALL = "perdure.watchdog.recall"
    SCAN = "perdure.watchdog.scan"
    INTERVENE = "perdure.watchdog.intervene"
    REMEMBER = "perdure.watchdog.remember"
    JUDGE = "perdure.watchdog.judge"


FindingKind = Literal[
    "healthy",
    "parked",
    "waiting_device",
    "parked_past_expiry",
    "stalled",
    "looping",
    "failing",
    "unreachable",
    "unresponsive",
    "over_budget",
    "needs_human",
    "step_failed",
    "spinning",
    "drifting",
    "stuck_on_person",
    "judged_healthy",
    "unjudged",
]
IncidentKind = Literal["failing", "unreachable", "unresponsive"]
INFRASTRUCTURE_KINDS = frozenset({"failing", "unreachable", "unresponsive"})
InterventionAction = Literal["nudge", "escalate"]


class WatchdogRules(BaseModel):
    """Thresholds of the classification. The goal's own `stall_after_s` decides
    when it is stalled; these decide the rest."""

    model_config = ConfigDict(extra="forbid")

    failing_attempts: int = Field(default=3, ge=2, description="A pending activity at this attempt is failing.")
    unreachable_after_s: float = Field(
        default=300, gt=0, description="An activity scheduled this long without a worker starting it."
    )
    unanswered_after_s: float = Field(
        default=6 * 3600, gt=0, description="An open question this old is reported as unanswered."
    )
    escalate_after: float = Field(
        default=0.5,
        ge=0,
        description="Escalate a stall this fraction of the goal's stall_after_s after its nudge, if it persists.",
    )
    looping_rung: int = Field(
        default=3, ge=1, le=4, description="A node still running past this stall-ladder rung is looping."
    )
    stall_after_s: float | None = Field(
        default=None, gt=0, description="Stalled after this long without progress; unset: the goal's own threshold."
    )
    judge_calls_per_day: int = Field(
        default=50, ge=0, le=100_000, description="Model calls the watchdog may make per UTC day; 0 = rules only."
    )
    judge_tokens_per_day: int = Field(
        default=200_000, ge=0, le=100_000_000, description="Model tokens the watchdog may spend per UTC day."
    )
    judge_profile: str | None = Field(
        default=None, description="The model profile that judges ambiguous goals; unset: the default profile."
    )


class WatchdogInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_queue: str = Field(description="Watch the goals on this task queue (the one its workers serve).")
    rules: WatchdogRules = Field(default_factory=WatchdogRules)
    query_timeout_s: float = Field(default=10, gt=0, description="A goal not answering `progress` in this long.")
    max_goals: int = Field(default=1000, ge=1)
    as_of: datetime | None = Field(
        default=None,
        description="Judge as of this time instead of the run's start: for post-mortems, and for tests whose "
        "goals run on a virtual clock.",
    )


# --- scan -------------------------------------------------------------------------


class ScanInput(BaseModel):
    task_queue: str
    query_timeout_s: float = 10
    max_goals: int = 1000


class PendingActivityView(BaseModel):
    activity_type: str
    state: str = Field(description="scheduled, started, cancel_requested, paused…")
    attempt: int
    task_queue: str | None = None
    scheduled_at: datetime | None = None
    last_failure: str | None = None


class GoalObservation(BaseModel):
    """One open goal as a scan saw it: the snapshot fields the rules use, plus the
    server's view of its pending activities. `query_error` is set (and the
    snapshot fields left empty) when the goal did not answer its query."""

    goal_id: str
    started_at: datetime | None = None
    query_error: str | None = None
    phase: str = ""
    parked: bool = False
    percent_done: int = 0
    running: list[str] = Field(default_factory=list)
    last_progress_at: datetime | None = None
    stall_after_s: float = 1800
    looping_nodes: dict[str, int] = Field(
        default_factory=dict, description="Running agent node -> stall-ladder rungs fired."
    )
    park_expires_at: datetime | None = None
    open_questions: list[str] = Field(default_factory=list, description="'q3: title' of each open question.")
    oldest_question_at: datetime | None = None
    budget: dict[str, float] = Field(default_factory=dict)
    failed_steps: list[str] = Field(
        default_factory=list, description="'step: error' of the first few failed steps, earlier plan versions included."
    )
    failed_count: int = Field(default=0, description="Failed steps in all, when more than failed_steps shows.")
    pending: list[PendingActivityView] = Field(default_factory=list)
    pending_known: bool = Field(default=True, description="False when the server could not describe the goal.")
    waiting_for_devices: dict[str, str] = Field(
        default_factory=dict, description="Node -> the offline device it waits for (a legitimate wait)."
    )
    waiting_on_timers: list[str] = Field(
        default_factory=list, description="Wait steps waiting for their planned time (a legitimate wait)."
    )
    waiting_for_quota: list[str] = Field(
        default_factory=list, description="Steps whose model call waits for a quota slot (a legitimate wait)."
    )
    goal_text: str = Field(default="", description="The goal (cut), for the model's judgement.")
    plan: list[str] = Field(default_factory=list, description="'step (kind): status' of the current plan.")
    conclusions: list[str] = Field(default_factory=list, description="Latest finished outputs, briefly.")
    new_information: list[float] = Field(
        default_factory=list, description="Share of new information of each finished step, in plan order."
    )
    informative_steps: int = Field(default=0, description="Finished steps that brought new information.")
    plan_version: int = 0


class ScanResult(BaseModel):
    goals: list[GoalObservation]
    seconds: float = Field(description="Wall time the scan took.")


# --- rules output ---------------------------------------------------------------


class Finding(BaseModel):
    goal_id: str
    kind: FindingKind
    detail: str
    episode: str | None = Field(default=None, description="What makes this occurrence distinct from a later one.")


class Intervention(BaseModel):
    """A message to a goal. `request_id` is derived from goal, finding, action and
    episode, so a repeated run sends the same id and the goal's inbox dedupes it."""

    goal_id: str
    action: InterventionAction
    finding: FindingKind
    episode: str
    request_id: str
    text: str


class Incident(BaseModel):
    """An infrastructure fault seen on a goal, re-checked every run until it clears."""

    id: str = Field(description="goal/kind/subject: one incident per goal and failing thing.")
    goal_id: str
    kind: IncidentKind
    subject: str = Field(description="The activity type, or 'progress query'.")
    detail: str
    opened_at: datetime
    last_seen_at: datetime
    checks: int = 1
    resolved_at: datetime | None = None
    resolution: str | None = None


class Assessment(BaseModel):
    """What the rules decided for one run."""

    findings: list[Finding]
    interventions: list[Intervention]
    incidents: list[Incident] = Field(description="Open incidents after this run, then those resolved by it.")


# --- intervene --------------------------------------------------------------------


class InterveneInput(BaseModel):
    interventions: list[Intervention]


class InterventionOutcome(BaseModel):
    request_id: str
    sent: bool
    error: str | None = None


class InterveneResult(BaseModel):
    outcomes: list[InterventionOutcome]


# --- memory -----------------------------------------------------------------------


class SentIntervention(BaseModel):
    goal_id: str
    action: InterventionAction
    finding: FindingKind
    episode: str
    sent_at: datetime


class GoalMemory(BaseModel):
    """Per open goal: its latest findings, and when a legitimate wait ended."""

    findings: list[Finding] = Field(default_factory=list)
    seen_at: datetime
    waiting: bool = Field(default=False, description="Parked or waiting for a person at the last run.")
    wait_ended_at: datetime | None = Field(
        default=None, description="When a run first saw it no longer waiting: its stall clock restarts there."
    )


class RunSummary(BaseModel):
    run_id: str
    at: datetime
    goals: int
    counts: dict[str, int] = Field(default_factory=dict, description="Finding kind -> goals.")
    interventions: list[str] = Field(default_factory=list, description="Request ids sent by this run.")
    scan_seconds: float = 0


class WatchdogMemory(BaseModel):
    """What the watchdog remembers between runs. Small, and derived: losing it costs
    at most a re-sent intervention, which the goal's inbox dedupes by request id."""

    schema_version: int = MEMORY_SCHEMA_VERSION
    sent: dict[str, SentIntervention] = Field(default_factory=dict, description="Request id -> what was sent.")
    incidents: list[Incident] = Field(default_factory=list, description="Open first, then recently resolved.")
    goals: dict[str, GoalMemory] = Field(default_factory=dict)
    last_run: RunSummary | None = None
    verdicts: dict[str, Verdict] = Field(default_factory=dict, description="goal/episode -> the model's verdict.")
    judge_usage: dict[str, list[int]] = Field(
        default_factory=dict, description="UTC day -> [model calls, tokens] the watchdog spent judging."
    )
    judge_note: str | None = Field(default=None, description="Why the last run judged by rules only.")

    def open_incidents(self) -> list[Incident]:
        return [i for i in self.incidents if i.resolved_at is None]


class Verdict(BaseModel):
    """The model's structured judgement of one goal in one episode, or why there is none."""

    goal_id: str
    episode: str
    at: datetime
    verdict: Literal["healthy", "spinning", "drifting", "stuck_on_person"] | None = None
    reason: str = ""
    confidence: float = 0.0
    malformed: str | None = Field(default=None, description="Why the reply was not a verdict: no action taken.")
    tokens: int = 0


class JudgeInput(BaseModel):
    goal_id: str
    profile: str | None = None
    prompt: str


class JudgeResult(BaseModel):
    raw: str
    tokens: int = 0


class RecallInput(BaseModel):
    scope: str = Field(description="Whose memory: the task queue the watchdog watches.")


class RuleChange(BaseModel):
    """One change to the rule book: who set which rule for whom, from what to what."""

    version: int
    at: datetime
    user: str
    scope: str = Field(description="'all', 'tag=NAME' or 'goal=ID'.")
    rule: str
    old: float | int | str | None = None
    new: float | int | str | None = None


class RuleBook(BaseModel):
    """The maintainers' rules: durable state of the watchdog, never rewritten by a worker
    start. `scopes` maps 'all', 'tag=NAME' (goal ids starting with NAME) and 'goal=ID' to
    the rules set there; a goal's rules are the schedule's defaults overlaid by all, then
    its tags, then its own. `history` keeps every change, numbered by `version`."""

    schema_version: int = RULES_SCHEMA_VERSION
    version: int = 0
    scopes: dict[str, dict[str, float | int | str | None]] = Field(default_factory=dict)
    history: list[RuleChange] = Field(default_factory=list)


class RecallResult(BaseModel):
    memory: WatchdogMemory
    note: str | None = Field(default=None, description="Why a fresh memory was used (missing, unreadable).")
    rules: RuleBook = Field(default_factory=RuleBook, description="The rule book (empty: none set, or unreadable).")
    rules_note: str | None = Field(default=None, description="Why the rule book could not be read.")


class RememberInput(BaseModel):
    scope: str
    memory: WatchdogMemory


class RememberResult(BaseModel):
    path: str


# --- result -------------------------------------------------------------------------


class WatchdogResult(BaseModel):
    as_of: datetime
    goals: int
    findings: list[Finding] = Field(description="Every finding but 'healthy'.")
    counts: dict[str, int]
    sent: list[str] = Field(default_factory=list, description="Request ids of interventions sent.")
    failed: list[str] = Field(default_factory=list, description="'request id: why' for those that could not be.")
    open_incidents: list[Incident] = Field(default_factory=list)
    resolved_incidents: list[Incident] = Field(default_factory=list, description="Resolved by this run.")
    scan_seconds: float = 0


class WatchdogRunState(BaseModel):
    """Everything one run knows, as it goes; what the `state` query returns. Not
    carried anywhere: each run starts afresh and reads its memory."""

    phase: Literal["recalling", "scanning", "intervening", "remembering", "done"] = "recalling"
    goals: int = 0
    findings: list[Finding] = Field(default_factory=list)
    sent: list[str] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list)
    open_incidents: int = 0
