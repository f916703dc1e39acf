"""Client-side goal operations: build a spec, start, read progress and results.

Used by the CLI and the demo; talks to Temporal only through the client and
reads the local artifact store for full reports. Holds no goal state.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import yaml
from pydantic import ValidationError
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, WorkflowExecutionStatus, WorkflowTaskFailedCause
from temporalio.api.failure.v1 import Failure
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowFailureError, WorkflowHandle
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.artifacts import ArtifactMissing, default_store
from runtime import settings
from workflows.contracts import GOAL_WORKFLOW, GoalResult, GoalSpec, ProgressSnapshot
from workflows.goal import GoalWorkflow
from workflows.plan import AgentStep, Plan, ToolStep, describe_validation_error, parse_plan
from workflows.state import GoalInput
from workflows.tool_specs import TOOL_SPECS


class GoalNotFound(LookupError):
    pass


class BadPlanFile(ValueError):
    pass


def load_plan_file(path: Path, allowed_tools: list[str] | None = None) -> tuple[Plan, dict]:
    """Read a YAML/JSON plan file: `steps:` plus optional `goal:`, `constraints:` and `premises:`.
    Without `allowed_tools`, any known tool may appear (see `plan_tools`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise BadPlanFile(f"cannot read plan file {path}: {err.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise BadPlanFile(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {err}") from None
    if not isinstance(data, dict):
        raise BadPlanFile(f"{path}: expected a mapping with a 'steps' list at the top level")
    extras = {k: data.pop(k) for k in ("goal", "constraints", "premises") if k in data}
    premises = extras.get("premises")
    if premises is not None and (
        not isinstance(premises, dict) or not all(isinstance(v, str) for v in premises.values())
    ):
        raise BadPlanFile(f"{path}: 'premises' must map each key to a string value, e.g. scope: all_modules")
    plan, problem = parse_plan(data, allowed_tools or list(TOOL_SPECS))
    if plan is None:
        raise BadPlanFile(f"{path}: {problem}")
    return plan, extras


def plan_tools(plan: Plan) -> list[str]:
    """Every tool a plan names: writing it into a plan file is the user allowing it."""
    named: set[str] = set()
    for step in plan.steps:
        if isinstance(step, ToolStep):
            named.add(step.tool)
        elif isinstance(step, AgentStep):
            named.update(step.tools)
    return sorted(named)


def build_spec(**fields) -> GoalSpec:
    try:
        return GoalSpec(**fields)
    except ValidationError as err:
        raise ValueError(describe_validation_error(err)) from None


# How long a workflow task may run before the server gives it to another worker.
# It is also how long a goal waits after its worker dies in the middle of a task
# (a read segment of local activities runs inside one), so it bounds recovery.
# The server's default is 10 s; perdure's workflow tasks take milliseconds, and a
# segment's local activities keep a long task alive by heartbeating it.
GOAL_TASK_TIMEOUT = timedelta(seconds=4)


async def start_goal(client: Client, spec: GoalSpec, goal_id: str) -> WorkflowHandle:
    return await client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=spec),
        id=goal_id,
        task_queue=settings.task_queue(),
        static_summary=spec.goal[:200],
        task_timeout=GOAL_TASK_TIMEOUT,
    )


async def describe(client: Client, goal_id: str) -> WorkflowExecutionDescription:
    try:
        return await client.get_workflow_handle(goal_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise GoalNotFound(f"no goal with id '{goal_id}' (list goals with `perdure ls`)") from None
        raise


def is_open(desc: WorkflowExecutionDescription) -> bool:
    return desc.status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING


# How far back from a goal's last event to look for the failure of its workflow task:
# after a failure the server records nothing of the retries, only signals and updates.
STUCK_LOOKBACK_EVENTS = 200


async def workflow_task_failure(client: Client, desc: WorkflowExecutionDescription) -> str | None:
    """Why a goal is stuck, when it is: its workflow task is being retried after a failure
    (the server records the first failure only, then retries, so the goal decides nothing,
    answers no query and takes no update meanwhile). The failure message of the last
    WorkflowTaskFailed event since the last completed task; None when the goal is not stuck."""
    raw = desc.raw_description
    if not is_open(desc) or not raw.HasField("pending_workflow_task") or raw.pending_workflow_task.attempt < 2:
        return None
    request = GetWorkflowExecutionHistoryReverseRequest(
        namespace=client.namespace,
        execution=WorkflowExecution(workflow_id=desc.id, run_id=desc.run_id),
        maximum_page_size=STUCK_LOOKBACK_EVENTS,
    )
    events = (await client.workflow_service.get_workflow_execution_history_reverse(request)).history.events
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            return None
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            attributes = event.workflow_task_failed_event_attributes
            return await failure_message(client.data_converter, attributes.failure) or WorkflowTaskFailedCause.Name(
                attributes.cause
            )
    return None


async def failure_message(converter: DataConverter, failure: Failure) -> str:
    """A failure's message as its sender wrote it: with payload encryption on, history holds
    "Encoded failure" and the real message in the encrypted attributes."""
    if not failure.HasField("encoded_attributes"):
        return failure.message
    decoded = Failure()
    decoded.CopyFrom(failure)  # decoding works in place; the event stays as history has it
    try:
        return str(await converter.decode_failure(decoded)) or failure.message
    except Exception:  # no keys here, or not the right ones: say what history says
        return failure.message


async def progress(client: Client, goal_id: str, timeout_s: float = 5) -> ProgressSnapshot:
    """Query the goal. Raises RPCError when no worker answers in time."""
    handle = client.get_workflow_handle(goal_id)
    return await handle.query(GoalWorkflow.progress, rpc_timeout=timedelta(seconds=timeout_s))


async def result(client: Client, goal_id: str) -> GoalResult:
    """Wait for the goal to end. A goal that failed still carries its report."""
    handle = client.get_workflow_handle(goal_id, result_type=GoalResult)
    try:
        return await handle.result()
    except WorkflowFailureError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type == "GoalFailed" and cause.details:
            return GoalResult.model_validate(cause.details[0])
        raise


def read_report(goal_result: GoalResult) -> str:
    """The full report from the local artifact store, or the excerpt the goal carries."""
    try:
        return default_store().get_text(goal_result.report)
    except ArtifactMissing:
        return goal_result.excerpt + "\n\n(full report not in this machine's artifact store)"


async def list_goals(client: Client, query: str | None = None, limit: int = 50) -> list:
    full = f"WorkflowType = '{GOAL_WORKFLOW}'" + (f" AND ({query})" if query else "")
    goals = []
    async for wf in client.list_workflows(full, limit=limit):
        goals.append(wf)
    return goals
