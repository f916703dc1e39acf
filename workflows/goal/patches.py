"""The goal workflow's behaviour changes: one `workflow.patched` id per change that
would break the replay of histories recorded before it, and the baseline that stands
for all of them.

Most are decided once, as each run starts (GoalContext.decide_patches): asked later,
after a local activity in the same workflow task, replay meets the marker before the code
asks and fails as nondeterministic. A few are asked where they matter (the inbox, wait
steps, the tool runner) and only by runs without the baseline.

The baseline (BASELINE_PATCH): a run that starts on code with every change in BASELINED
records one marker for them all, not one each. Each `workflow.patched` call records a
marker and an upsert of the TemporalChangeVersion search attribute listing every patch so
far, so twenty-odd patches cost a goal's first workflow task about fifty events and
their memory in every cached run. A history recorded before the baseline has no marker for
it: its replay asks the SDK for each patch as it did when it ran. A change made after the
baseline gets its own id, outside BASELINED, until a new baseline takes it in.

Workflow code: imports nothing but the SDK and the state.
"""

from __future__ import annotations

from temporalio import workflow

from perdure.workflows.goal.contracts.state import GoalState

# Goals recorded before writes were prepared (effect_guard.py) run them the old way.
EFFECTS_FIRST_PATCH = "effects-first"
# Goals recorded before a tool node's wait for a person was state (and continue-as-new
# waited for the answer) keep waiting inside the node's task.
WAITS_PATCH = "waits-are-state"
# Goals recorded before an agent node's waits (approvals, uncertain effects, stall
# cards, a park) were state wait inside the node's task, as tool nodes did before
# `waits-are-state`.
AGENT_WAITS_PATCH = "agent-waits-are-state"
# Goals recorded before a rewind or narrow reached steps waiting for a person or parked
# (they went on with inputs the rewind had voided) leave them alone.
VOID_WAITS_PATCH = "void-reaches-waits"
# Goals recorded before the wall budget counted active time only (it counted parks and
# waits for a person), before a clock stopped the goal when a time budget ran out (only
# a charged model call could), and before wrap-up steps (which become ready when their
# needs end however they ended, so the loop looks for ready work again before it ends)
# keep the old accounting and the old end of the loop.
BUDGET_CLOCK_PATCH = "active-time-clock-wrap-up"
# Goals recorded before any error of a node's work settled the node (its task died and
# the node stayed running) replay the old way (scheduler.py).
NODE_ERRORS_SETTLE_PATCH = "node-errors-settle"
# Goals recorded before an interrupted run_command became a question (it was re-run,
# or its lost attempts failed the step) call it the old way (effect_guard.py).
COMMAND_REPLAY_PATCH = "commands-ask-after-loss"
# Goals recorded before devices existed plan without asking which devices there are.
DEVICES_PATCH = "devices-listed-for-plans"
# Goals recorded before a device wait's limit counted only nodes still offline set a
# timer for the wait of a node the device's return had just resumed.
DEVICE_WAIT_TIMER_PATCH = "device-wait-timers-of-offline-nodes"
# Finished steps are checked again after a long wait (workflows/goal/verification.py).
VERIFY_PATCH = "verify-after-long-waits"
# A step's `verify: {question}` is asked of a model after those checks (workflows/goal/verification.py).
VERIFY_QUESTION_PATCH = "verify-by-question"
# The plan is revised when settled steps' evidence calls for it: a contradicted
# conclusion, repeated results, declining new information (workflows/goal/rules/evidence.py).
REPLAN_ON_EVIDENCE_PATCH = "replan-on-evidence"
# Remote-write and irreversible steps go after the independent local work, and steps
# whose write sets overlap run one after the other (workflows/goal/rules/risk_order.py).
RISK_ORDER_PATCH = "risk-order"
# Goals recorded before a re-plan on evidence could let a step whose write is in flight
# finish and discard it (workflows/goal/rules/evidence.py) wait for every write in flight first.
REPLAN_DISCARDS_PATCH = "replan-discards-in-flight"
# Memories are recalled for llm and agent steps, written as steps settle, and offered for
# keeping across goals at the end (workflows/goal/goal_memory.py).
MEMORY_PATCH = "memory"
# The end-of-goal memory card goes to the owner's router and the goal ends at once (it
# asked and waited up to an hour before); episodic writes read the whole output's statements.
MEMORY_CARD_PATCH = "memory-card-to-router"
# A worker of code the goal has not run on checks its finished work first (verify_due.py).
VERIFY_ON_NEW_CODE_PATCH = "verify-on-new-code"
# A subgoal in flight holds its whole budget slice in the gates, not a kind estimate.
SUBGOAL_SLICES_PATCH = "subgoal-budget-slices"
# A command step's changes to files the goal read are looked at and kept as its own
# (workflows/goal/nodes/tool.py), so a later check does not take them for an edit from outside.
OWN_CHANGES_PATCH = "own-changes-around-commands"
# Reads made in one activation run as one local activity (workflows/goal/read_batch.py).
READ_BATCHES_PATCH = "read-batches"
# A batch also runs the read steps its reads make ready, in a chain (workflows/goal/read_batch.py).
READ_AHEAD_PATCH = "read-ahead"
# Reads past a workflow task's share of local activity results run as activities (read_batch.py).
READ_COMMITS_PATCH = "read-commits"
# A run also ends once it settled as many steps as its task timeout covers, or when its plan
# outgrew that timeout, so a worker taking the goal over replays it in time (run_boundary.py).
NODES_PER_RUN_PATCH = "nodes-per-run"
# A goal whose tools name MCP servers lists their tools first (planner.py); decided only
# for such goals, so every other goal's history has no marker for it.
MCP_TOOLS_PATCH = "mcp-tools"
# A write whose arguments are all in its call (no template, no model's JSON by reference) is
# prepared by the workflow itself, not by the prepare local activity (effect_guard.py); decided
# only for goals allowed a remote-write or irreversible tool.
WRITES_PREPARED_HERE_PATCH = "writes-prepared-in-workflow"

# Asked where they matter by runs without the baseline (patched_here).
# Runs that started before it judged every message at the door, against the state as it
# was when the message arrived (a resume right behind a park was refused); with it, only
# what holds in any order is judged there, the rest at the message's turn (inbox.py).
IN_ORDER_PATCH = "inbox-in-order"
# A late wait step reads from history whether the server or the worker was missing (nodes/wait.py).
LATE_CAUSE_PATCH = "timer-late-cause"
# Reads run as local activities in segments, capped per workflow task (tool_runner.py).
READ_SEGMENTS_PATCH = "read-segments"
SEGMENT_CAP_PATCH = "segment-cap"

# At most STARTS_PER_TASK nodes start in one workflow task, the rest in the next
# (scheduler.py). In the baseline from the start (the baseline had not been released).
DISPATCH_PASSES_PATCH = "dispatch-passes"

# Every change above, in one marker for runs that start on code with all of them.
BASELINE_PATCH = "baseline-2026-12"
BASELINED = frozenset(
    {
        EFFECTS_FIRST_PATCH,
        WAITS_PATCH,
        AGENT_WAITS_PATCH,
        VOID_WAITS_PATCH,
        BUDGET_CLOCK_PATCH,
        NODE_ERRORS_SETTLE_PATCH,
        COMMAND_REPLAY_PATCH,
        DEVICES_PATCH,
        DEVICE_WAIT_TIMER_PATCH,
        VERIFY_PATCH,
        VERIFY_QUESTION_PATCH,
        REPLAN_ON_EVIDENCE_PATCH,
        RISK_ORDER_PATCH,
        REPLAN_DISCARDS_PATCH,
        MEMORY_PATCH,
        MEMORY_CARD_PATCH,
        VERIFY_ON_NEW_CODE_PATCH,
        SUBGOAL_SLICES_PATCH,
        OWN_CHANGES_PATCH,
        READ_BATCHES_PATCH,
        READ_AHEAD_PATCH,
        READ_COMMITS_PATCH,
        NODES_PER_RUN_PATCH,
        MCP_TOOLS_PATCH,
        WRITES_PREPARED_HERE_PATCH,
        IN_ORDER_PATCH,
        LATE_CAUSE_PATCH,
        READ_SEGMENTS_PATCH,
        SEGMENT_CAP_PATCH,
        DISPATCH_PASSES_PATCH,
    }
)

# Changes since the baseline, each with its own marker (not in BASELINED).
# Issue 34: a drift check is shown a bounded outline of the plan, and is not sent when the
# budget cannot afford it (workflows/goal/rules/drift_outline.py, budget.own_call_gate).
OWN_CALLS_BOUNDED_PATCH = "own-calls-bounded"
# Issue 34: a parked goal gets no budget verdict (a charge or the clock past a budget while a
# step runs on); it is judged when it resumes (spend.py).
PARKS_HOLD_VERDICTS_PATCH = "parks-hold-budget-verdicts"
# Issue 34: a goal in which no step succeeded ends failed (it ended partial), and a failed or
# aborted goal's workflow fails with its result in the failure (it completed), so the Temporal
# UI's list shows it as not completed (closing.py, workflow.py).
UNSUCCESSFUL_GOALS_FAIL_PATCH = "unsuccessful-goals-fail"
# Issue 34, item 4: an activity whose attempts dead workers used up is scheduled again while
# the goal's budget allows; the model's or tool's own failures keep their limit
# (workflows/goal/lost_workers.py).
WORKER_LOSS_PATCH = "worker-loss-scheduled-again"


def patched_here(state: GoalState, patch: str) -> bool:
    """A change asked where it matters: on in a run with the baseline when the baseline
    stands for it (no marker of its own), else what `workflow.patched` says."""
    return (patch in BASELINED and BASELINE_PATCH in state.patches) or workflow.patched(patch)
