"""A goal's start as data: what the web UI's POST /api/goals is sent and what the MCP
server's `start_goal` tool takes (`StartRequest`), and the spec and goal id `perdure start`
would build from the same options (`start_spec`).

Owns the translation and its refusals only; starting, checking against a worker and
answering a repeated start are starters/goals.py's and starters/start_checks.py's.
Client-side only; holds no state.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from perdure.activities.tools.catalogue import DEFAULT_TOOLS
from perdure.starters import goals, render
from perdure.workflows.goal.contracts.messages import REQUEST_ID
from perdure.workflows.shared.contracts import GoalSpec


class StartRequest(BaseModel):
    """What `perdure start` takes, by the same names where they fit."""

    model_config = ConfigDict(extra="forbid")

    goal: str | None = Field(
        default=None, min_length=1, max_length=20_000, description="What the goal should achieve, in words."
    )
    plan: dict[str, Any] | None = Field(default=None, description="A plan file's content: steps, goal, premises...")
    id: str | None = Field(default=None, description="The goal id (default: made from the request id, or the goal).")
    request_id: str | None = Field(
        default=None,
        pattern=REQUEST_ID,
        description="Without an id: the same request id names the same goal, so a repeated start is a retry.",
    )
    workspace: str = Field(default=".", min_length=1, max_length=4096, description="On the workers' machine.")
    profile: str = Field(default="default", min_length=1, max_length=200, description="The model profile's name.")
    tools: list[str] | None = Field(
        default=None, max_length=100, description="Allowed tools (default: the safe tools, plus those a plan names)."
    )
    constraints: list[str] = Field(
        default_factory=list, max_length=100, description="Rules every step must keep, in words the model reads."
    )
    premises: dict[str, str] = Field(
        default_factory=dict, max_length=100, description="Premise key -> value, e.g. scope: all_modules."
    )
    max_tokens: int | None = Field(default=None, gt=0, description="Token budget.")
    max_cost: float | None = Field(default=None, gt=0, description="Cost budget in USD.")
    max_wall: int | None = Field(default=None, gt=0, description="Wall-time budget in seconds of active time.")
    deadline: datetime | None = Field(default=None, description="ISO 8601; local time unless it has an offset.")
    no_budget: bool = Field(
        default=False,
        description="No token or cost limit (without max_tokens or max_cost a goal gets the default budget).",
    )
    allow_network: bool = Field(default=False, description="Let shell commands use the network.")
    replace: bool = Field(default=False, description="Reuse the id of a finished goal for a new one.")


def start_spec(body: StartRequest) -> tuple[GoalSpec, str]:
    """The spec and goal id `perdure start` would build from the same options; ValueError
    (BadPlanFile, StartRefused are ValueErrors too) says what is wrong."""
    allowed = body.tools or list(DEFAULT_TOOLS)
    goal, constraints, premises = body.goal, list(body.constraints), dict(body.premises)
    plan, settings_in_plan = None, {}
    if body.plan is not None:
        plan, extras = goals.plan_from_mapping(body.plan, body.tools, where="plan")
        if not body.tools:
            allowed = sorted(set(allowed) | set(goals.plan_tools(plan)))
        goal = goal or extras.get("goal")
        constraints = constraints or list(extras.get("constraints") or [])
        premises = {**(extras.get("premises") or {}), **premises}
        settings_in_plan = {k: extras[k] for k in goals.SPEC_FIELDS_IN_PLAN if k in extras}
    if not goal:
        raise ValueError("give the goal text (\"goal\"), or a plan with a 'goal' field")
    try:
        workspace = Path(body.workspace).expanduser().resolve()
    except RuntimeError as err:  # "~someone" this machine has no home for, a symlink loop
        raise ValueError(f"workspace {body.workspace!r}: {err}") from None
    deadline = body.deadline
    if deadline is not None:
        deadline = deadline if deadline.utcoffset() is not None else deadline.astimezone()
        if deadline <= datetime.now(UTC):
            raise ValueError(f"deadline {deadline.isoformat()} is in the past")
    limits = {"max_tokens": body.max_tokens, "max_cost_usd": body.max_cost, "max_wall_seconds": body.max_wall}
    spec = goals.build_spec(
        goal=goal,
        plan=plan,
        constraints=constraints,
        budget=goals.with_default_budget({**limits, "deadline": deadline}, body.no_budget),
        model_profile=body.profile,
        allowed_tools=allowed,
        workspace=str(workspace),
        premises=premises,
        allow_network=body.allow_network,
        **settings_in_plan,
    )
    if body.id is not None:
        goal_id = body.id
    elif body.request_id:
        # A retried request (a script, an agent) names the same goal: the start is then a
        # retry, and other content under the same request id meets that goal and is refused.
        goal_id = render.request_goal_id(body.request_id)
    else:
        goal_id = render.new_goal_id(goal)
    goals.check_goal_id(goal_id)
    return spec, goal_id
