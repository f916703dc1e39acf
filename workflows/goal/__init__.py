"""The goal workflow: one goal's deterministic body, one room per concern.

`workflow.py` holds the Temporal surface only: init, run, the handlers (each one
line), the loop's skeleton and continue-as-new. Every concern behind it is a
plain class given one `GoalContext` (context.py: the state, the goal id, a wake-up
callable, and shared primitives) and the collaborators it calls, never the
workflow itself:

    inbox.py         admission of every message, receipts, refusals
    steering.py      what each admitted message does (the verbs) and what answers mean
    pause.py         parked / running / aborting, park deadlines
    scheduler.py     ready nodes -> dispatch -> settle; void, cancel, adopt a plan
    nodes/           one runner per node kind (tool, llm, agent)
    model_calls.py   every model activity: its context, options and charge
    planner.py       the first plan, drift checks, follow-up plans
    spend.py         budget and density gates, estimates, charges, emergency stop
    effect_guard.py  confirmations, uncertain outcomes, compensations, rollback
    tool_runner.py   how one tool call runs (read segments, retries, timeouts)
    lost_workers.py  whether a call whose attempts dead workers used up runs again
    publisher.py     progress query, UI details, search attributes
    closing.py       outcome, report, result

Where do I add ...
- a steering verb: its message type and what its turn must find (`turn_problem`)
  in workflows/goal/contracts/messages.py,
  a method returning `Applied` in steering.py and its entry in `Steering.verbs`;
  the CLI verb in starters/.
- a node kind: a step type in workflows/goal/contracts/plan.py (`STEP_TYPES`; `NodeKind` follows),
  a runner in nodes/ and its entry in `nodes.node_runners` (a kind without one
  fails at start-up); its cost before any history in workflows/goal/rules/estimates.py
  (`KIND_DEFAULTS`, else it is assumed as heavy as an agent).
- a budget rule: spend.py, in `Spend.admit` (before a node starts) or in
  `Spend.charge` (after a model call); the arithmetic itself in workflows/shared/budget.py.
- a model call of the goal's own (no step asked for it): `ModelCalls.run(..., own=KIND)`
  with a KIND of contracts.OWN_CALL_KINDS, so status, report and result show it on its
  line; what it is shown bounded however large the plan (workflows/goal/rules/drift_outline.py is
  the example); an optional one asks `Spend.own_call_refused` first.
- a tool (with a compensation): one module of activities/tools/catalogue/ (its arguments,
  risk class, replay policy, effect key, lookup, compensation and implementation,
  declared together) listed in that package's TOOL_MODULES; nothing here changes, the
  effect guard and the tool runner read the declaration.
- a model provider: activities/models/providers.py (a `ChatProvider`, chosen in
  `provider_for`) and its profile fields in activities/models/profiles.py; nothing
  here changes, a goal names a profile, never a provider.

Changing what a room decides (the policy since 1.0): a running goal stays pinned to
the worker deployment version that started it, so a change to workflow code ships as
a new deployment version, and goals started before it finish on the old one; the
golden histories in tests/histories/ are recorded again for the new version. There is
no baseline and no `workflow.patched` call in the 1.0 code. Add one only where a goal
must move to new code mid-run (a fix a running goal cannot wait for), and say in a
comment beside it when it will be retired (the version after which no goal that
started before the patch can still be running); retire it then.
"""
