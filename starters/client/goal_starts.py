"""Starting a goal: the workflow start itself (the id's conflict and reuse policies decide
a race), and the answer to a start that was already made: a retry with the same spec
names the goal already there, other content under a live id is refused.

What the workers offer is checked before (start_checks.py); the spec is built before
(goal_specs.py). Client-side only; holds no state.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.client import Client, WorkflowExecutionDescription, WorkflowHandle
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError

from perdure.activities.artifacts import ObjectStoreUnavailable, artifact_store
from perdure.runtime import settings
from perdure.runtime.converter import STORE_ENV, payload_location
from perdure.starters.client.client_errors import GoalNotFound, StartRefused
from perdure.starters.client.goal_reads import describe, finished_text, is_open
from perdure.starters.client.goal_specs import SPEC_DIGEST_MEMO, check_goal_id, spec_digest, static_details
from perdure.starters.client.plan_upload import with_stored_plan
from perdure.workflows.goal.contracts.goal_contracts import GoalSpec, goal_memo
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.rules import frontier
from perdure.workflows.shared import search_attributes as sa


async def start_goal(client: Client, spec: GoalSpec, goal_id: str, replace: bool = False) -> WorkflowHandle:
    """Start the goal under `goal_id`. The server refuses an id another run holds (conflict
    FAIL) and, unless `replace`, an id a finished run had (reuse REJECT_DUPLICATE), so two
    starts racing cannot both win; `start` in the CLI decides before it gets here."""
    check_goal_id(goal_id)
    steps = spec.plan_steps()
    if frontier.is_large(steps) and payload_location() is None:
        # Such a goal's carried state, or its plan when the artifact store fails to take it, may
        # pass Temporal's 2 MB payload limit: only the payload store keeps that out of history.
        raise StartRefused(
            f"a plan of {steps} steps needs the payload store, and {STORE_ENV} is off: set it (or unset it, "
            "to keep payloads beside the artifacts) for the CLI and the workers; nothing started"
        )
    try:
        started = await with_stored_plan(spec, artifact_store())
    except (OSError, ObjectStoreUnavailable) as err:
        what = f"the plan's {spec.plan_steps()} steps could not be stored in the artifact store"
        raise StartRefused(f"{what}: {err}; nothing started") from None
    return await client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=started),
        id=goal_id,
        task_queue=settings.task_queue(),
        static_summary=spec.goal[:200],
        static_details=static_details(spec),
        memo={SPEC_DIGEST_MEMO: spec_digest(spec), **goal_memo(spec.goal)},
        search_attributes=TypedSearchAttributes([SearchAttributePair(sa.OWNER, settings.user())]),
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE if replace else WorkflowIDReusePolicy.REJECT_DUPLICATE,
        task_timeout=spec.task_timeout(),
    )


@dataclass(frozen=True)
class StartAnswer:
    """What a start did: `started` a new goal, or found this very start already done; and
    what could not be checked before it (the workers' offer unread, the devices unknown)."""

    goal_id: str
    started: bool
    text: str
    warnings: tuple[str, ...] = ()


async def start_or_existing(client: Client, spec: GoalSpec, goal_id: str, replace: bool = False) -> StartAnswer:
    """Start the goal, or answer with the one already under `goal_id` when this start is a
    retry of it (same spec); StartRefused for a different spec under a live id, and for a
    finished goal's id without `replace`. The decision `perdure start` prints and the web
    UI's POST /api/goals returns."""
    existing = await existing_goal(client, goal_id)
    if existing is not None:
        same = await started_digest(existing) == spec_digest(spec)
        if is_open(existing):
            if not same:
                raise StartRefused(
                    f"goal {goal_id} is already running with a different spec; nothing started. Pick another "
                    f"--id, or end that goal first (`perdure abort {goal_id}`)"
                )
            started = f"{existing.start_time:%Y-%m-%d %H:%M:%S}" if existing.start_time else "earlier"
            text = f"goal {goal_id} already running with this spec (started {started}); nothing new started"
            return StartAnswer(goal_id, False, text)
        if same and not replace:
            text = f"{await finished_text(client, existing)} (same spec; nothing new started)"
            return StartAnswer(goal_id, False, text)
        if not replace:
            raise StartRefused(
                f"{await finished_text(client, existing)}. To start a new goal under this id, add --replace: "
                "the old run stays in the server's history until its retention ends, but perdure shows only "
                "the new one from then on"
            )
    try:
        await start_goal(client, spec, goal_id, replace=replace)
    except WorkflowAlreadyStartedError:
        # Another start won the race between our look and this one.
        raise StartRefused(
            f"goal {goal_id} was started meanwhile by someone else; see `perdure status {goal_id}`"
        ) from None
    replaced = " (replacing the finished goal of that id)" if existing is not None else ""
    return StartAnswer(goal_id, True, f"goal {goal_id} started{replaced}")


async def started_digest(desc: WorkflowExecutionDescription) -> str | None:
    """The digest of the spec the goal started with (None for a goal started without one)."""
    try:
        return (await desc.memo()).get(SPEC_DIGEST_MEMO)
    except Exception:  # a memo this client cannot decode (other keys): treat as unknown
        return None


async def existing_goal(client: Client, goal_id: str) -> WorkflowExecutionDescription | None:
    try:
        return await describe(client, goal_id)
    except GoalNotFound:
        return None
