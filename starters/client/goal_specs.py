"""A goal's spec as the front ends build it, before anything talks to Temporal: plan files
and the plan mappings clients send, what a plan adds to a start's options, the budget a
goal gets, goal ids, the digest a repeated start is compared by, and a start as data
(`StartRequest`: what `perdure ui`'s POST /api/goals and `perdure mcp`'s `start_goal` take,
by `perdure start`'s names, and what `perdure.Client.start`'s arguments make).

Pure: reads a plan file when asked, nothing else; starting is goal_starts.py's, and
checking a spec against the workers start_checks.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perdure.activities.tools.catalogue import DEFAULT_TOOLS, TOOL_SPECS
from perdure.starters.client.client_errors import BadPlanFile, InvalidRequest, StartRefused
from perdure.workflows.goal.contracts.deadline_contracts import DEFAULT_QUESTION_DEADLINE, QuestionDeadline
from perdure.workflows.goal.contracts.goal_contracts import DEFAULT_MAX_TOKENS, Budget, GoalSpec
from perdure.workflows.goal.contracts.messages import REQUEST_ID
from perdure.workflows.goal.contracts.plan import (
    AgentStep,
    Plan,
    SubgoalStep,
    ToolStep,
    describe_validation_error,
    parse_plan,
)
from perdure.workflows.shared.host_workspaces import host_workspace
from perdure.workflows.shared.mcp_tools import is_mcp_tool
from perdure.workflows.shared.user_tools import is_user_tool_name

SPEC_FIELDS_IN_PLAN = ("device_wait_s", "device_approval", "stall_after_s", "recovery_mode", "verify_after_s")
"""Goal settings a plan file may carry beside its steps (GoalSpec fields, validated there)."""


def load_plan_file(path: Path, allowed_tools: list[str] | None = None) -> tuple[Plan, dict]:
    """Read a YAML/JSON plan file: `steps:` plus optional `goal:`, `constraints:`, `premises:`,
    the device settings `device_wait_s:` and `device_approval:`, and `stall_after_s:`.
    Without `allowed_tools`, any known tool may appear (see `plan_tools`)."""
    return plan_from_mapping(read_plan_file(path), allowed_tools, str(path))


def read_plan_file(path: Path) -> object:
    """A plan file's content, parsed as YAML or JSON (by its suffix) but not yet validated."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise BadPlanFile(f"cannot read plan file {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise BadPlanFile(
            f"{path} is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}): "
            "save it as UTF-8 (a plan is YAML or JSON)"
        ) from None
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise BadPlanFile(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {err}") from None


def plan_from_mapping(data: object, allowed_tools: list[str] | None = None, where: str = "plan") -> tuple[Plan, dict]:
    """A plan file's content, already parsed (a file, or the JSON `perdure ui` is sent):
    the plan and its extras (`goal`, `constraints`, `premises`, the spec settings).
    BadPlanFile says what is wrong, prefixed by `where`."""
    if not isinstance(data, dict):
        raise BadPlanFile(f"{where}: expected a mapping with a 'steps' list at the top level")
    data = dict(data)
    extras = {k: data.pop(k) for k in ("goal", "constraints", "premises", *SPEC_FIELDS_IN_PLAN) if k in data}
    premises = extras.get("premises")
    if premises is not None and (
        not isinstance(premises, dict) or not all(isinstance(v, str) for v in premises.values())
    ):
        raise BadPlanFile(f"{where}: 'premises' must map each key to a string value, e.g. scope: all_modules")
    constraints = extras.get("constraints")
    if constraints is not None and (
        not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints)
    ):
        # A single string would be taken letter by letter as constraints.
        raise BadPlanFile(f"{where}: 'constraints' must be a list of strings, e.g. [\"touch only docs/\"]")
    # Without a list, a plan allows what it names: any built-in tool, and MCP tools and the
    # user's own, which only a worker knows (the start checks the workers' offers; the goal
    # checks them against its catalogues).
    plan, problem = parse_plan(data, allowed_tools or [*TOOL_SPECS, *worker_tools_named(data)])
    if plan is None:
        raise BadPlanFile(f"{where}: {problem}")
    return plan, extras


def worker_tools_named(data: dict) -> list[str]:
    """The tools only a worker knows (MCP tools, and names only a user's own tool can have)
    that a raw plan's steps name (before it is validated), subgoals' plans included."""
    steps = data.get("steps")
    named = []
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict):
            continue
        tools = step.get("tools")
        for tool in [step.get("tool"), *(tools if isinstance(tools, list) else [])]:
            if isinstance(tool, str) and (is_mcp_tool(tool) or is_user_tool_name(tool, TOOL_SPECS)):
                named.append(tool)
        if isinstance(step.get("plan"), dict):
            named += worker_tools_named(step["plan"])
    return named


def plan_tools(plan: Plan) -> list[str]:
    """Every tool a plan names, in its subgoals' plans and `tools` too: writing it into a
    plan file is the user allowing it (a child may use only what its parent may)."""
    named: set[str] = set()
    for step in plan.steps:
        if isinstance(step, ToolStep):
            named.add(step.tool)
        elif isinstance(step, AgentStep):
            named.update(step.tools)
        elif isinstance(step, SubgoalStep):
            named.update(step.tools or [])
            named.update(plan_tools(step.plan) if step.plan is not None else [])
    return sorted(named)


def build_spec(**fields) -> GoalSpec:
    try:
        return GoalSpec(**fields)
    except ValidationError as err:
        raise InvalidRequest(describe_validation_error(err)) from None


# Goal ids go into URLs (the UI link, the codec and HTTP APIs) and shell commands we print.
GOAL_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
# Memo key of the digest of the spec a goal started with: a retried start compares it.
SPEC_DIGEST_MEMO = "perdure_spec_digest"


def check_goal_id(goal_id: str) -> None:
    if not GOAL_ID_PATTERN.match(goal_id):
        raise StartRefused(
            f"goal id {goal_id!r} is not allowed: use 1-200 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it goes into links and commands)"
        )


# Spec fields added after goals were already being started: left out of the digest while
# at their defaults, so a start retried across an upgrade still matches the goal it started.
LATER_SPEC_FIELDS = (
    *("forked_from", "reuse_outputs", "recovery_mode", "verify_after_s", "parent"),
    *("evidence_window", "min_new_information", "evidence_spacing_s", "continue_as_new_after_nodes"),
    "decisions_kept",
    "question_deadline",
    "local_keyed_writes",
    "stored_plan",
)


# Plan step fields added since, with their defaults: left out of a plan's steps at those.
LATER_STEP_FIELDS = {"verify": None, "writes": None, "defer": True, "question_deadline": None}
# A step's `verify` fields added after `verify` itself, likewise left out of it at their defaults.
LATER_VERIFY_FIELDS = {"question": None}


def spec_digest(spec: GoalSpec) -> str:
    fields = GoalSpec.model_fields
    unset = {n for n in LATER_SPEC_FIELDS if getattr(spec, n) == fields[n].get_default(call_default_factory=True)}
    if spec.question_deadline == DEFAULT_QUESTION_DEADLINE:
        unset.add("question_deadline")  # what every start gets: as good as unset for a start retried across an upgrade
    unset.add("local_keyed_writes")  # how writes run, not what the goal is: a retried start matches either way
    text = spec.model_dump_json(exclude=unset)
    if spec.plan is not None:
        data = json.loads(text)
        _drop_later_step_fields(data["plan"])
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _drop_later_step_fields(plan: dict) -> None:
    if "question_deadline" in plan and plan["question_deadline"] is None:
        del plan["question_deadline"]
    for step in plan.get("steps", []):
        for name, default in LATER_STEP_FIELDS.items():
            if name in step and step[name] == default:
                del step[name]
        if isinstance(step.get("verify"), dict):
            for name, default in LATER_VERIFY_FIELDS.items():
                if name in step["verify"] and step["verify"][name] == default:
                    del step["verify"][name]
        if isinstance(step.get("plan"), dict):
            _drop_later_step_fields(step["plan"])  # a subgoal's own plan


def static_details(spec: GoalSpec) -> str:
    """What the Temporal UI shows in the goal's header and list: the goal and its limits (markdown)."""
    plan = f"plan file ({len(spec.plan.steps)} steps)" if spec.plan is not None else "the planner"
    lines = [
        "**Goal:** " + _md_line(spec.goal),
        "**Constraints:** " + ("; ".join(_md_line(c) for c in spec.constraints) or "none"),
        "**Budget:** " + budget_text(spec.budget),
        f"**Plan:** {plan} · profile `{spec.model_profile}` · tools: {', '.join(spec.allowed_tools) or 'none'}",
    ]
    return "\n\n".join(lines)[:20_000]


def budget_text(budget: Budget) -> str:
    """A budget's limits in a line: '2,000,000 tokens, $2.5, 3600 s active', or 'none'."""
    limits = [
        f"{budget.max_tokens:,} tokens" if budget.max_tokens else "",
        f"${budget.max_cost_usd:g}" if budget.max_cost_usd else "",
        f"{budget.max_wall_seconds} s active" if budget.max_wall_seconds else "",
        f"deadline {budget.deadline.isoformat()}" if budget.deadline else "",
    ]
    return ", ".join(x for x in limits if x) or "none"


def with_default_budget(limits: dict, no_budget: bool = False) -> dict:
    """The budget fields a start asks for (`max_tokens`, `max_cost_usd`, `max_wall_seconds`,
    `deadline`), with the default token limit (contracts.DEFAULT_MAX_TOKENS) when it names
    neither a token nor a cost limit, unless `no_budget`, which asks for no limit at all
    (ValueError when a limit is given beside it)."""
    if no_budget:
        if any(value is not None for value in limits.values()):
            raise InvalidRequest("no budget means no limit at all: give no token, cost, time or deadline limit with it")
        return limits
    if limits.get("max_tokens") is None and limits.get("max_cost_usd") is None:
        return {**limits, "max_tokens": DEFAULT_MAX_TOKENS}
    return limits


def budget_line(budget: Budget, defaulted: bool) -> str:
    """What `perdure start` says of the goal's budget."""
    if defaulted:
        return f"budget: {budget_text(budget)} (the default; --max-tokens or --max-cost set your own, --no-budget none)"
    return f"budget: {budget_text(budget)}"


def _md_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class StartOptions:
    """A start's options once a plan's extras are in: what `perdure start` and `start_spec` build the spec from."""

    goal: str | None
    allowed_tools: list[str]
    constraints: list[str]
    premises: dict[str, str]
    plan: Plan | None = None
    settings_in_plan: dict[str, Any] = field(default_factory=dict)


def with_plan(
    plan: Plan | None,
    extras: dict,
    *,
    goal: str | None,
    tools: list[str] | None,
    constraints: list[str],
    premises: dict[str, str],
) -> StartOptions:
    """The options with what a plan file adds: without `tools`, the safe tools and the
    tools the plan names (writing them there is the user allowing them); its goal and
    constraints where the options have none; its premises under the options' own; and
    the goal settings it carries (SPEC_FIELDS_IN_PLAN)."""
    allowed = tools or list(DEFAULT_TOOLS)
    if plan is None:
        return StartOptions(goal, allowed, list(constraints), dict(premises))
    if not tools:
        allowed = sorted(set(allowed) | set(plan_tools(plan)))
    return StartOptions(
        goal=goal or extras.get("goal"),
        allowed_tools=allowed,
        constraints=list(constraints) or list(extras.get("constraints") or []),
        premises={**(extras.get("premises") or {}), **premises},
        plan=plan,
        settings_in_plan={k: extras[k] for k in SPEC_FIELDS_IN_PLAN if k in extras},
    )


def spec_of(
    options: StartOptions,
    limits: dict,
    *,
    no_budget: bool,
    profile: str,
    workspace: str,
    allow_network: bool,
    question_deadline: QuestionDeadline | None = None,
) -> tuple[GoalSpec, bool]:
    """The spec, and whether its budget is the default one (the limits named none);
    ValueError says what is wrong. `options.goal` is set (the caller says how it is missing)."""
    budget = with_default_budget(limits, no_budget)
    spec = build_spec(
        question_deadline=question_deadline or DEFAULT_QUESTION_DEADLINE,
        local_keyed_writes=True,
        goal=options.goal,
        plan=options.plan,
        constraints=options.constraints,
        budget=budget,
        model_profile=profile,
        allowed_tools=options.allowed_tools,
        workspace=workspace,
        premises=options.premises,
        allow_network=allow_network,
        **options.settings_in_plan,
    )
    return spec, budget != limits


def question_deadline_of(after: str | None, remind_before: str | None, on_expiry: str | None) -> QuestionDeadline:
    """The goal's question deadline a start asks for: the default (DEFAULT_QUESTION_DEADLINE) with
    what it names; InvalidRequest says what is wrong."""
    named = {"after": after, "remind_before": remind_before, "on_expiry": on_expiry}
    fields = {**DEFAULT_QUESTION_DEADLINE.model_dump(exclude_none=True), **{k: v for k, v in named.items() if v}}
    try:
        return QuestionDeadline(**fields)
    except ValidationError as err:
        raise InvalidRequest(describe_validation_error(err, root="question deadline")) from None


def with_start_defaults(spec: GoalSpec) -> GoalSpec:
    """A spec a program built gets what every start gets where it says nothing: the default
    question deadline, and keyed writes as local activities."""
    update: dict = {}
    if spec.question_deadline is None:
        update["question_deadline"] = DEFAULT_QUESTION_DEADLINE
    if "local_keyed_writes" not in spec.model_fields_set:
        update["local_keyed_writes"] = True
    return spec.model_copy(update=update) if update else spec


def new_goal_id(goal: str) -> str:
    return f"goal-{_slug(goal)}-{uuid.uuid4().hex[:6]}"


def request_goal_id(request_id: str) -> str:
    """The goal id a start with this request id names, whatever else it carries: a retry
    finds its goal, and other content under the same request id finds it too (and is refused)."""
    return f"goal-{_slug(request_id)}-{hashlib.sha256(request_id.encode()).hexdigest()[:6]}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:32].rstrip("-") or "goal"


# --- a start as data: what the web UI and the MCP server are sent ------------------------


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
    workspace: str = Field(
        default=".",
        min_length=1,
        max_length=4096,
        description="A directory on the workers' machines, or HOST:NAME: a workspace a host holds (`perdure worker "
        "--host`).",
    )
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
    question_deadline: str | None = Field(
        default=None, max_length=40, description="How long each question waits for an answer (default 48h)."
    )
    remind_before: str | None = Field(
        default=None, max_length=40, description="The reminder comes this long before a question's deadline."
    )
    on_expiry: Literal["deny", "park", "abort"] | None = Field(
        default=None, description="What an unanswered question decides (default: deny a write, park otherwise)."
    )
    replace: bool = Field(default=False, description="Reuse the id of a finished goal for a new one.")


def goal_workspace(text: str) -> str:
    """A goal's workspace as its spec holds it: `HOST:NAME` as given (a workspace a host holds:
    workflows/shared/host_workspaces.py), else the absolute path of a directory on the workers'
    machines; InvalidRequest when that path cannot be made absolute."""
    if host_workspace(text) is not None:
        return text.strip()
    try:
        return str(Path(text).expanduser().resolve())
    except RuntimeError as err:  # "~someone" this machine has no home for, a symlink loop
        raise InvalidRequest(f"workspace {text!r}: {err}") from None


def start_spec(body: StartRequest, where: str = "plan") -> tuple[GoalSpec, str]:
    """The spec and goal id `perdure start` would build from the same options; InvalidRequest
    or StartRefused (ValueErrors both) says what is wrong, `where` naming the plan's source."""
    plan, extras = plan_from_mapping(body.plan, body.tools, where=where) if body.plan is not None else (None, {})
    options = with_plan(
        plan, extras, goal=body.goal, tools=body.tools, constraints=body.constraints, premises=body.premises
    )
    if not (options.goal or "").strip():
        raise InvalidRequest("give the goal text (\"goal\"), or a plan with a 'goal' field")
    workspace = goal_workspace(body.workspace)
    deadline = body.deadline
    if deadline is not None:
        deadline = deadline if deadline.utcoffset() is not None else deadline.astimezone()
        if deadline <= datetime.now(UTC):
            raise InvalidRequest(f"deadline {deadline.isoformat()} is in the past")
    limits = {"max_tokens": body.max_tokens, "max_cost_usd": body.max_cost, "max_wall_seconds": body.max_wall}
    spec, _ = spec_of(
        options,
        {**limits, "deadline": deadline},
        no_budget=body.no_budget,
        profile=body.profile,
        workspace=workspace,
        allow_network=body.allow_network,
        question_deadline=question_deadline_of(body.question_deadline, body.remind_before, body.on_expiry),
    )
    if body.id is not None:
        goal_id = body.id
    elif body.request_id:
        # A retried request (a script, an agent) names the same goal: the start is then a
        # retry, and other content under the same request id meets that goal and is refused.
        goal_id = request_goal_id(body.request_id)
    else:
        goal_id = new_goal_id(options.goal)
    check_goal_id(goal_id)
    return spec, goal_id


# --- a start as a Python program makes it (perdure.Client.start) ---------------------------

PlanSource = Plan | Mapping[str, Any] | str | os.PathLike
"""What `Client.start` takes as a plan: a Plan, a plan file's content, or its path."""


def start_request(plan: PlanSource | None = None, **options: Any) -> tuple[StartRequest, str]:
    """The StartRequest a program's options make, as the web UI and MCP server are sent one,
    and where its plan came from (to name it in errors); InvalidRequest (BadPlanFile for the
    plan) says what is wrong, before anything is sent."""
    data, where = (None, "plan") if plan is None else plan_content(plan)
    try:
        return StartRequest(plan=data, **options), where
    except ValidationError as err:
        raise InvalidRequest(describe_validation_error(err, root="(start)")) from None


def plan_content(plan: PlanSource) -> tuple[dict[str, Any], str]:
    """A plan as a mapping (a Plan's fields, a mapping as it is, a file's content) and its source."""
    if isinstance(plan, Plan):
        return plan.model_dump(mode="json"), "plan"
    if isinstance(plan, str | os.PathLike):
        path = Path(plan).expanduser()
        data, where = read_plan_file(path), str(path)
    elif isinstance(plan, Mapping):
        data, where = plan, "plan"
    else:
        raise BadPlanFile(f"plan: expected a perdure.Plan, a mapping or a plan file's path, not {type(plan).__name__}")
    if not isinstance(data, Mapping):
        raise BadPlanFile(f"{where}: expected a mapping with a 'steps' list at the top level")
    return dict(data), where
