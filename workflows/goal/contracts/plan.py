"""Plans: the structured output of the planner, or a declarative plan file.

Pure validation only. A plan is a list of named steps with dependencies; names
are stable within a plan version and used for edges, templates and display.
Tool steps may use `{{steps.NAME}}` inside string arguments to receive the text
output of a step they depend on; the tool activity resolves it from the
artifact store, so the workflow never holds the text.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from perdure.activities.tools.catalogue import DEVICE_TOOLS, TOOL_SPECS
from perdure.workflows.goal.contracts.deadline_contracts import QuestionDeadline, not_assumed, step_expiry_problems
from perdure.workflows.goal.rules.timing import DURATION_FORMAT, parse_duration
from perdure.workflows.shared.contracts import ArtifactRef
from perdure.workflows.shared.mcp_tools import is_mcp_tool, schema_problems
from perdure.workflows.shared.tool_specs import DEVICE_NAME, ToolSpec

STEP_NAME = r"^[a-z][a-z0-9_-]{0,63}$"
TEMPLATE = re.compile(r"\{\{\s*steps\.([a-z][a-z0-9_-]{0,63})\s*\}\}")
# A plan file (or a plan built by a program) may be large: goals run for days and
# thousands of nodes (a plan of thousands travels by reference: StoredPlan). A model's
# plan is held to far fewer steps (MAX_PLANNED_STEPS): longer model-written plans are
# rarely coherent, and a goal re-plans as it goes.
MAX_STEPS = 100_000
MAX_PLANNED_STEPS = 64


VerifyDepth = Literal["trust", "existence", "fingerprint", "semantic"]


class VerifySpec(BaseModel):
    """How a finished step is checked before a goal resumes after a long wait."""

    model_config = ConfigDict(extra="forbid")

    depth: VerifyDepth | None = Field(
        default=None,
        description="trust: not checked; existence: its artifacts and the files it wrote are still there; "
        "fingerprint: also the files it read are unchanged and the URLs it fetched (http_get) return the "
        "same body, digested as the tool returned it (the first max_bytes), re-fetched only when the goal "
        "allows the network; a fetch that fails (unreachable, an error status) keeps the step; a page that "
        "differs on every fetch (a timestamp, a nonce) voids its step at every check: give that step depth "
        "existence; semantic: also `command` still passes and a model still answers `question` with HOLDS. "
        "Default: the goal's recovery_mode (semantic when a command or a question is given).",
    )
    command: str | None = Field(
        default=None, min_length=1, max_length=4_000, description="A shell command that must still pass (sandboxed)."
    )
    expect_exit: int = Field(default=0, ge=0, le=255)
    timeout_s: float = Field(default=120, gt=0, le=600)
    question: str | None = Field(
        default=None,
        min_length=1,
        max_length=2_000,
        description="Asked of a model (one call, charged to the goal) over the goal, this step's output and "
        "what the goal learned since (newer conclusions, files it read that changed): an answer HOLDS keeps "
        "the step, VOID: <reason> voids it with its downstream; an answer in neither form keeps it.",
    )

    def depth_for(self, goal_default: VerifyDepth) -> VerifyDepth:
        return self.depth or ("semantic" if self.command or self.question else goal_default)


class _Step(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=STEP_NAME, description="Unique step name, lower-case identifier.")
    needs: list[str] = Field(default_factory=list, description="Names of steps this one depends on.")
    premises: dict[str, list[str] | None] = Field(
        default_factory=dict,
        description="Premise key -> the values this step's output holds for (null: depends on it, judge on change).",
    )
    wrap_up: bool = Field(
        default=False,
        description="Wrap-up work (list what is unfinished, notify the owner): runs past the hard budget gate.",
    )
    verify: VerifySpec | None = Field(
        default=None, description="How this step's result is checked after a long wait (the goal's recovery_mode)."
    )
    writes: list[Annotated[str, Field(min_length=1, max_length=1_000)]] | None = Field(
        default=None,
        max_length=100,
        description="What this step writes: workspace paths (a directory covers what is under it) or remote "
        "targets (anything with a scheme, e.g. mailto:ops@example.com, compared as written). Steps whose write "
        "sets overlap run one after the other, in plan order. Default: inferred from a write_file's path and a "
        "git commit's repository; [] declares none.",
    )
    defer: bool = Field(
        default=True,
        description="A remote-write or irreversible step waits until the independent read-only and local "
        "work is done; false pins it where the plan puts it (it runs once its needs are met).",
    )
    question_deadline: QuestionDeadline | None = Field(
        default=None, description="The deadline, reminder and outcome on expiry of the questions this step asks."
    )


class LlmStep(_Step):
    kind: Literal["llm"] = "llm"
    prompt: str = Field(min_length=1)


class _DeviceStep(_Step):
    device: str | None = Field(
        default=None,
        pattern=DEVICE_NAME,
        description="Run the step's tool calls on this device (`perdure devices`), not on a worker.",
    )
    device_wait_s: float | None = Field(
        default=None,
        gt=0,
        description="How long the step waits for its device to be online before a person is asked "
        "(wait longer, another device, skip); default: the goal's device_wait_s.",
    )


class AgentStep(_DeviceStep):
    kind: Literal["agent"] = "agent"
    prompt: str = Field(min_length=1)
    tools: list[str] = Field(default_factory=list, description="Tools the agent may call.")
    max_turns: int | None = Field(default=None, ge=1, le=50)


class ToolStep(_DeviceStep):
    kind: Literal["tool"] = "tool"
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    network: bool = Field(
        default=False, description="A shell command of this step may use the network (the goal may also allow it)."
    )
    replay: Literal["safe"] | None = Field(
        default=None,
        description="`safe`: the call may be re-run after an interruption (a test, a build); otherwise the "
        "tool's own replay policy decides.",
    )


class SubgoalStep(_Step):
    """A large independent part run as a goal of its own (a child workflow): its own plan
    or goal text, a share of this goal's budget, this goal's constraints verbatim."""

    kind: Literal["subgoal"] = "subgoal"
    goal: str | None = Field(default=None, min_length=1, max_length=20_000, description="The child's goal text.")
    plan: Plan | None = Field(default=None, description="The child's own plan (else its planner plans `goal`).")
    budget_share: float = Field(
        default=0.25, gt=0, le=1, description="The share of this goal's token and cost budget the child may use."
    )
    tools: list[str] | None = Field(default=None, description="The child's tools (default: this goal's).")
    join: Literal["all_settled", "fail_fast"] = Field(
        default="all_settled",
        description="fail_fast: when this child fails, the other fail_fast children still running are asked to stop "
        "(with rollback) and the goal decides once they have stopped.",
    )

    @model_validator(mode="after")
    def _has_something_to_do(self) -> SubgoalStep:
        if self.goal is None and self.plan is None:
            raise ValueError(f"subgoal step '{self.name}' needs a goal (text) or a plan")
        return self


class WaitStep(_Step):
    """Wait until a time (`until`) or for a while after the step becomes ready (`after`):
    a durable timer. Its output says when the goal acted and how late (workflows/goal/rules/timing.py)."""

    kind: Literal["wait"] = "wait"
    until: datetime | None = Field(
        default=None, description="Wait until this time, with its timezone (e.g. 2026-12-02T09:00:00Z)."
    )
    after: str | None = Field(
        default=None,
        max_length=40,
        description=f"Wait this long after the step becomes ready: {DURATION_FORMAT}.",
    )

    @field_validator("until")
    @classmethod
    def _until_has_a_timezone(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.utcoffset() is None:
            raise ValueError(f"'{value.isoformat()}' has no timezone: write it as e.g. 2026-12-02T09:00:00Z")
        return value

    @field_validator("after")
    @classmethod
    def _after_is_a_duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)  # its ValueError is the message
        return value

    @model_validator(mode="after")
    def _one_time(self) -> WaitStep:
        if (self.until is None) == (self.after is None):
            raise ValueError(f"wait step '{self.name}' needs exactly one of `until` (a time) or `after` (a duration)")
        return self

    def delay(self) -> timedelta | None:
        return parse_duration(self.after) if self.after is not None else None


# Every node kind is a step type: a new kind is a new class here and a runner in
# workflows/goal/nodes/ (the registry there checks each kind has one).
STEP_TYPES = (LlmStep, AgentStep, ToolStep, SubgoalStep, WaitStep)
PlanStep = Annotated[Union[STEP_TYPES], Field(discriminator="kind")]  # noqa: UP007 (a tuple of types)
NodeKind = Literal[tuple(t.model_fields["kind"].default for t in STEP_TYPES)]  # type: ignore[valid-type]


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: list[PlanStep] = Field(min_length=1, max_length=MAX_STEPS)
    question_deadline: QuestionDeadline | None = Field(
        default=None, description="The deadline, reminder and outcome on expiry of this plan's questions."
    )

    @model_validator(mode="after")
    def _graph_is_sound(self) -> Plan:
        # Pydantic runs this again whenever a model takes this plan as a field (a plan version,
        # the state): a plan whose steps were checked already is not walked again.
        checked = self.__dict__.get(_CHECKED)
        if checked is not None and checked[0] is self.steps and checked[1] == len(self.steps):
            return self
        for problem in graph_checks(self):
            if problem:
                raise ValueError(problem)
        mark_checked(self)
        return self

    def step(self, name: str) -> PlanStep:
        """The step called `name`, in constant time: the workflow looks a step up for every
        dispatch, which a linear scan made quadratic in the plan's size."""
        for rebuild in (False, True):
            positions = self.__dict__.get(_POSITIONS)
            if positions is None or rebuild:
                # Kept beside the fields (never dumped, ignored by ==); checked on every
                # use, since `steps` may have been replaced or edited since it was built.
                positions = {s.name: i for i, s in enumerate(self.steps)}
                self.__dict__[_POSITIONS] = positions
            i = positions.get(name)
            if i is not None and i < len(self.steps) and self.steps[i].name == name:
                return self.steps[i]
        raise KeyError(name)


_POSITIONS = "_step_positions"
_CHECKED = "_graph_checked"


def mark_checked(plan: Plan) -> None:
    """`plan`'s graph is sound as its steps are now (kept beside its fields, never dumped)."""
    plan.__dict__[_CHECKED] = (plan.steps, len(plan.steps))


class StoredPlan(BaseModel):
    """A large plan's steps in the artifact store, in chunks of consecutive steps (each a JSON
    object with `steps`), with its other fields: how a plan of thousands of steps travels, so no
    workflow task validates more than one chunk of it (workflows/goal/past.py loads them)."""

    chunks: list[ArtifactRef] = Field(min_length=1)
    steps: int = Field(ge=1, le=MAX_STEPS, description="How many steps the chunks hold, in all.")
    question_deadline: QuestionDeadline | None = None


SubgoalStep.model_rebuild()  # its `plan` is a Plan, defined after it


def graph_checks(plan: Plan) -> Iterator[str | None]:
    """What makes a plan's graph unsound, one check at a time: the first problem, or None
    after each check that passed (a goal loading a stored plan of 100,000 steps pauses
    between them: each takes a tenth of a second or more)."""
    names = [s.name for s in plan.steps]
    duplicates = sorted(n for n, count in Counter(names).items() if count > 1)
    if duplicates:
        yield f"step names must be unique; repeated: {', '.join(duplicates)}"
        return
    known = set(names)
    for step in plan.steps:
        missing = [d for d in step.needs if d not in known]
        if missing:
            yield f"step '{step.name}' needs unknown step(s): {', '.join(missing)}"
            return
        if step.name in step.needs:
            yield f"step '{step.name}' depends on itself"
            return
    yield None
    cycle = _find_cycle({s.name: s.needs for s in plan.steps})
    if cycle:
        yield "steps form a cycle: " + " -> ".join(cycle)


def _find_cycle(needs: dict[str, list[str]]) -> list[str] | None:
    """A dependency cycle as [a, b, ..., a], or None. Iterative: a plan may chain
    thousands of steps, deeper than Python's recursion limit."""
    state: dict[str, int] = {}  # 1 = on the path, 2 = done
    for root in needs:
        if root in state:
            continue
        path: list[str] = [root]
        pending = [iter(needs.get(root, []))]
        state[root] = 1
        while pending:
            dep = next(pending[-1], None)
            if dep is None:
                state[path.pop()] = 2
                pending.pop()
            elif state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            elif dep not in state:
                state[dep] = 1
                path.append(dep)
                pending.append(iter(needs.get(dep, [])))
    return None


# Tools whose replay policy (and network) a plan step may declare: a command can be
# anything, so only the plan knows it is repeatable or needs the network; every other
# tool's policy is a fact about its service, and its calls are the worker's own.
REPLAY_DECLARABLE = frozenset({"run_command"})


def check_plan(
    plan: Plan,
    allowed_tools: list[str],
    devices: dict[str, list[str]] | None = None,
    tools: Mapping[str, ToolSpec] | None = None,
) -> list[str]:
    """Problems that depend on the goal (tools allowed, tool arguments, templates) and,
    when `devices` (name -> tools offered) is given, on the devices the plan names.
    `tools`: the goal's tool table (its MCP catalogue's and user tools too); None: the
    built-in tools, and an MCP tool's name, or an allowed name that is not built in (a user
    tool), passes unchecked (only a worker can list them).

    Returns human-readable messages; empty when the plan can run.
    """
    problems: list[str] = [p for p in [not_assumed(plan.question_deadline, "question_deadline")] if p]
    allowed = set(allowed_tools)
    for step in plan.steps:
        called = [step.tool] if isinstance(step, ToolStep) else step.tools if isinstance(step, AgentStep) else []
        problems += step_expiry_problems(step.name, called, step.question_deadline, tools or TOOL_SPECS)
        if isinstance(step, ToolStep):
            problems += _check_tool_step(step, allowed, tools)
        elif isinstance(step, AgentStep):
            for tool in step.tools:
                if tool not in allowed:
                    problems.append(
                        f"step '{step.name}': tool '{tool}' is not allowed "
                        f"(allowed: {', '.join(sorted(allowed)) or 'none'})"
                    )
        elif isinstance(step, SubgoalStep):
            problems += _check_subgoal_step(step, allowed, tools)
        if isinstance(step, ToolStep | AgentStep) and step.device is not None:
            problems += _check_device_step(step, devices, tools)
    return problems


def _check_subgoal_step(step: SubgoalStep, allowed: set[str], table: Mapping[str, ToolSpec] | None) -> list[str]:
    """A child may use only tools this goal may; its own plan is checked as this goal's would be."""
    tools = set(step.tools) if step.tools is not None else allowed
    problems = [
        f"step '{step.name}': subgoal tool '{tool}' is not allowed (allowed: {', '.join(sorted(allowed)) or 'none'})"
        for tool in sorted(tools - allowed)
    ]
    if step.plan is not None:
        own = check_plan(step.plan, sorted(tools & allowed), tools=table)
        problems += [f"step '{step.name}' (subgoal): {p}" for p in own]
    return problems


def devices_named(plan: Plan) -> list[str]:
    """The devices a plan's steps run on, sorted; kept beside the plan's fields (a large plan
    may be shared by its goal's runs on one worker: workflows/goal/past.py)."""
    cached = plan.__dict__.get(_DEVICES)
    if cached is not None and cached[0] is plan.steps and cached[1] == len(plan.steps):
        return cached[2]
    named = sorted({s.device for s in plan.steps if isinstance(s, ToolStep | AgentStep) and s.device})
    plan.__dict__[_DEVICES] = (plan.steps, len(plan.steps), named)
    return named


_DEVICES = "_devices_named"


def device_capable(tools: Mapping[str, ToolSpec] | None) -> list[str]:
    """The tools a device may offer: the built-in device tools, and the user's own tools
    (of the goal's table) declared for devices."""
    own = sorted(name for name, spec in (tools or {}).items() if spec.on_devices and name not in DEVICE_TOOLS)
    return [*DEVICE_TOOLS, *own]


def _check_device_step(
    step: ToolStep | AgentStep, devices: dict[str, list[str]] | None, table: Mapping[str, ToolSpec] | None = None
) -> list[str]:
    tools = [step.tool] if isinstance(step, ToolStep) else step.tools
    capable = device_capable(table)
    # Without the goal's table (a client's check) a user tool's declaration is not known here.
    unjudged = {t for t in tools if table is None and t not in TOOL_SPECS and not is_mcp_tool(t)}
    problems = [
        f"step '{step.name}': {tool} cannot run on a device (device tools: {', '.join(capable)}); "
        "run it in a step without `device`"
        for tool in tools
        if tool not in capable and tool not in unjudged
    ]
    if devices is None:
        return problems
    offered = devices.get(step.device or "")
    if offered is None:
        known = ", ".join(f"{name} ({', '.join(tools) or 'no tools'})" for name, tools in sorted(devices.items()))
        return [*problems, f"step '{step.name}': no device named '{step.device}' (devices: {known or 'none yet'})"]
    missing = [t for t in tools if (t in capable or t in unjudged) and t not in offered]
    if missing:
        problems.append(
            f"step '{step.name}': device '{step.device}' does not offer {', '.join(missing)} "
            f"(it offers: {', '.join(offered) or 'nothing'})"
        )
    return problems


def _check_tool_step(step: ToolStep, allowed: set[str], tools: Mapping[str, ToolSpec] | None) -> list[str]:
    # Without the goal's table (a client's check), only a worker knows an MCP tool or a user's
    # own (a name allowed that is not built in): the goal checks them against its catalogues.
    unchecked = tools is None and (is_mcp_tool(step.tool) or (step.tool in allowed and step.tool not in TOOL_SPECS))
    tools = TOOL_SPECS if tools is None else tools
    if step.tool not in tools and not unchecked:
        return [f"step '{step.name}': unknown tool '{step.tool}' (known: {', '.join(sorted(tools))})"]
    if step.tool not in allowed:
        return [
            f"step '{step.name}': tool '{step.tool}' is not allowed (allowed: {', '.join(sorted(allowed)) or 'none'})"
        ]
    problems: list[str] = []
    if step.network and step.tool not in REPLAY_DECLARABLE:
        problems.append(
            f"step '{step.name}': `network: true` is only for {', '.join(sorted(REPLAY_DECLARABLE))} (what a "
            f"sandboxed command may reach); {step.tool} is a call the worker makes itself"
        )
    if unchecked:
        return problems
    spec = tools[step.tool]
    if step.replay is not None and step.tool not in REPLAY_DECLARABLE:
        policy = spec.replay
        problems.append(
            f"step '{step.name}': `replay: {step.replay}` is only for {', '.join(sorted(REPLAY_DECLARABLE))} "
            f"(a command the plan knows is repeatable); {step.tool} keeps its own replay policy '{policy}'"
        )
    for ref in template_refs(step.args):
        if ref not in step.needs:
            problems.append(f"step '{step.name}': argument uses {{{{steps.{ref}}}}} but does not list '{ref}' in needs")
    try:
        spec.args_model.model_validate(step.args)
    except ValidationError as err:
        problems.append(f"step '{step.name}': bad arguments for {step.tool}: {describe_validation_error(err)}")
    if spec.input_schema is not None:
        problems += [
            f"step '{step.name}': bad arguments for {step.tool}: {p}"
            for p in schema_problems(spec.input_schema, step.args)
        ]
    return problems


def template_refs(value: Any) -> set[str]:
    """Step names referenced by `{{steps.NAME}}` anywhere inside value."""
    if isinstance(value, str):
        return set(TEMPLATE.findall(value))
    if isinstance(value, dict):
        return set().union(*(template_refs(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(template_refs(v) for v in value)) if value else set()
    return set()


def describe_validation_error(err: ValidationError, root: str = "(root)") -> str:
    """One line per problem: `location: message`, readable by a person or a model;
    `root` names the location of a problem with the value as a whole."""
    # pydantic prefixes a validator's own text with "Value error, ": the text says it already.
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or root}: {e['msg'].removeprefix('Value error, ')}"
        for e in err.errors(include_url=False)
    )


def parse_plan(
    data: Any,
    allowed_tools: list[str],
    devices: dict[str, list[str]] | None = None,
    tools: Mapping[str, ToolSpec] | None = None,
) -> tuple[Plan | None, str | None]:
    """Validate untrusted plan data. Returns (plan, None) or (None, reason)."""
    try:
        plan = Plan.model_validate(data)
    except ValidationError as err:
        return None, describe_validation_error(err)
    problems = check_plan(plan, allowed_tools, devices, tools)
    if problems:
        return None, "; ".join(problems)
    return plan, None
