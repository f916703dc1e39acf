"""Temporal Worker Deployments for the orchestrator's workers: which version a worker
is (the deployment from PERDURE_DEPLOYMENT, the build id from workers/code_version.py or
the caller), making a version current, and reading which goals run on which version.

Every workflow a versioned worker runs is pinned: its run stays on the version that
started it, so a new release never replays an old run on changed code. The long-lived
workflows move at continue-as-new (they ask for AUTO_UPGRADE there, and the goal starts
a new run soon after the current version changes): a goal that runs for weeks reaches
new code at its next run boundary. Old workers keep draining the runs pinned to them.

Owns the server calls; no printing (starters/cli/deploy_commands.py renders) and no workflow code.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field

from google.protobuf.field_mask_pb2 import FieldMask
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.deployment.v1 import WorkerDeploymentInfo
from temporalio.api.enums.v1 import WorkerDeploymentVersionStatus
from temporalio.api.workflow.v1 import WorkflowExecutionOptions
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
    UpdateWorkflowExecutionOptionsRequest,
)
from temporalio.client import Client, WorkflowExecutionDescription
from temporalio.common import (
    OneTimeVersioningOverride,
    SearchAttributeKey,
    VersioningBehavior,
    WorkerDeploymentVersion,
)
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from perdure.runtime import settings
from perdure.workers.code_version import code_version
from perdure.workflows.goal.contracts.goal_contracts import GOAL_WORKFLOW

# The system search attribute visibility keeps a run's version in, as `<deployment>:<build id>`.
VERSION_KEY = SearchAttributeKey.for_keyword("TemporalWorkerDeploymentVersion")
UNVERSIONED = "unversioned"
# A worker's version is known to the server once its pollers reach it (~0.4 s here).
VISIBLE_WITHIN_S = 30.0
# What the server answers a change to a deployment while another is under way.
_BUSY = (RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.FAILED_PRECONDITION, RPCStatusCode.ABORTED)


class DeploymentError(ValueError):
    """A deployment or version that cannot be used as asked; the message says why."""


def worker_version(build_id: str | None = None, deployment: str | None = None) -> WorkerDeploymentVersion:
    """This worker's version: `build_id`, else a digest of perdure's own code."""
    deployment = deployment or settings.deployment_name()
    build_id = code_version() if build_id is None else build_id
    # Temporal spells a version `<deployment>.<build id>`: a dot in the name would be ambiguous.
    if not deployment or "." in deployment:
        raise DeploymentError(f"deployment name {deployment!r} must be non-empty and have no '.'")
    if not build_id.strip() or len(build_id) > 255:
        raise DeploymentError(f"build id {build_id!r} must be 1 to 255 characters")
    return WorkerDeploymentVersion(deployment_name=deployment, build_id=build_id)


def deployment_config(version: WorkerDeploymentVersion) -> WorkerDeploymentConfig:
    """A worker of this version whose workflows stay on it (pinned) unless a run boundary
    asks to move (continue-as-new with AUTO_UPGRADE)."""
    return WorkerDeploymentConfig(
        version=version, use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.PINNED
    )


@dataclass
class VersionRow:
    build_id: str
    status: str  # current, ramping, draining, drained, inactive
    goals: list[str] = field(default_factory=list)


@dataclass
class DeploymentStatus:
    name: str
    current: str | None  # build id, None when no version is current (unversioned workers get the work)
    versions: list[VersionRow]
    unversioned_goals: list[str]


def _status_word(status: int) -> str:
    name = WorkerDeploymentVersionStatus.Name(status)
    return name.removeprefix("WORKER_DEPLOYMENT_VERSION_STATUS_").lower()


async def describe(client: Client, name: str) -> WorkerDeploymentInfo | None:
    """The deployment as the server holds it, None when no worker of it has polled yet."""
    info, _ = await _describe(client, name)
    return info


async def _describe(client: Client, name: str) -> tuple[WorkerDeploymentInfo | None, bytes]:
    try:
        response = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None, b""
        raise
    return response.worker_deployment_info, response.conflict_token


def _current_build(info: WorkerDeploymentInfo | None) -> str | None:
    if info is None or not info.routing_config.HasField("current_deployment_version"):
        return None
    return info.routing_config.current_deployment_version.build_id or None


def _version_status(info: WorkerDeploymentInfo | None, build_id: str) -> str | None:
    for summary in info.version_summaries if info else []:
        if summary.deployment_version.build_id == build_id:
            return _status_word(summary.status)
    return None


async def promote(
    client: Client, version: WorkerDeploymentVersion, *, only_if_new: bool = False, wait_s: float = VISIBLE_WITHIN_S
) -> str:
    """Make `version` the deployment's current version: new workflows and runs that continue
    as new go to its workers. With `only_if_new`, a version that was current before (an old
    worker restarted to drain its pinned runs) is left as it is. Waits up to `wait_s` for a
    worker of the version to have polled. Returns what happened, in a few words."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            outcome = await _promote_once(client, version, only_if_new)
        except RPCError as err:
            # Workers of one build starting together (compose replicas) all promote it: the
            # server takes one request to a deployment at a time and refuses the others as
            # too many or conflicting. Look again: it is then current, or this one retries.
            if err.status not in _BUSY or time.monotonic() > deadline:
                raise
            outcome = None
        if outcome is not None:
            return outcome
        if time.monotonic() > deadline:
            raise DeploymentError(
                f"no worker of build {version.build_id} has polled deployment {version.deployment_name!r}; "
                "start one (`perdure worker --build-id ...`) before making it current"
            )
        await asyncio.sleep(0.2)


async def _promote_once(client: Client, version: WorkerDeploymentVersion, only_if_new: bool) -> str | None:
    """One look and, if due, one change; None when the server does not know the version yet."""
    info, token = await _describe(client, version.deployment_name)
    status = _version_status(info, version.build_id)
    if status is None:
        return None
    if status == "current":
        return "already current"
    if only_if_new and status != "inactive":
        return f"left as it is: it was current before ({_current_build(info) or UNVERSIONED} is current)"
    await client.workflow_service.set_worker_deployment_current_version(
        SetWorkerDeploymentCurrentVersionRequest(
            namespace=client.namespace,
            deployment_name=version.deployment_name,
            build_id=version.build_id,
            conflict_token=token,
            identity=client.identity,
        )
    )
    return "made current"


def pinned_build(desc: WorkflowExecutionDescription) -> str | None:
    """The build id a run is pinned to, None when it is not pinned (unversioned, or not yet started by a worker)."""
    versioning = desc.raw_description.workflow_execution_info.versioning_info
    if versioning.HasField("versioning_override") and versioning.versioning_override.HasField("pinned"):
        return versioning.versioning_override.pinned.version.build_id or None
    if versioning.behavior != VersioningBehavior.PINNED or not versioning.HasField("deployment_version"):
        return None
    return versioning.deployment_version.build_id or None


@dataclass
class Pinning:
    deployment: str
    build_id: str  # the version the run is pinned to
    current: str | None  # the deployment's current version


async def pinning(client: Client, desc: WorkflowExecutionDescription) -> Pinning | None:
    """Which version an open run is pinned to and which is current; None when it is not pinned."""
    build = pinned_build(desc)
    if build is None:
        return None
    name = desc.raw_description.workflow_execution_info.versioning_info.deployment_version.deployment_name
    name = name or settings.deployment_name()
    return Pinning(name, build, _current_build(await describe(client, name)))


async def move(client: Client, goal_id: str, build_id: str | None = None) -> str:
    """Move an open goal's current run to `build_id` (default: the current version) now,
    instead of at its next run boundary: the run's next workflow task goes to a worker of
    that build, which replays the run's history on its code, and the run is pinned there
    from then on. For runs whose old workers are gone. Returns what happened, in a few words."""
    desc = await client.get_workflow_handle(goal_id).describe()
    pinned = await pinning(client, desc)
    if pinned is None:
        raise DeploymentError(f"goal {goal_id} is not pinned to a version: it runs on any worker of its queue")
    target = build_id or pinned.current
    if target is None:
        raise DeploymentError(f"deployment {pinned.deployment!r} has no current version to move goal {goal_id} to")
    if _version_status(await describe(client, pinned.deployment), target) is None:
        raise DeploymentError(f"deployment {pinned.deployment!r} has no build {target!r} (see `perdure deploy status`)")
    if target == pinned.build_id:
        return f"already on build {target}"
    override = OneTimeVersioningOverride(WorkerDeploymentVersion(pinned.deployment, target))
    await client.workflow_service.update_workflow_execution_options(
        UpdateWorkflowExecutionOptionsRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=goal_id, run_id=desc.run_id),
            # One time: the first task on `target` ends the override, and the worker's own
            # behaviour (pinned) keeps the run there; a later version still takes it at CAN.
            workflow_execution_options=WorkflowExecutionOptions(versioning_override=override._to_proto()),
            update_mask=FieldMask(paths=["versioning_override"]),
            identity=client.identity,
        )
    )
    return f"goes to build {target} at its next workflow task"


async def status(client: Client, name: str | None = None, limit: int = 1000) -> DeploymentStatus:
    """The deployment's versions, each with the open goals whose current run is on it
    (visibility's system attribute; a run no worker has taken yet is listed as unversioned)."""
    name = name or settings.deployment_name()
    info = await describe(client, name)
    by_build: dict[str, list[str]] = defaultdict(list)
    query = f"WorkflowType = '{GOAL_WORKFLOW}' AND ExecutionStatus = 'Running'"
    async for wf in client.list_workflows(query, limit=limit):
        deployment, _, build = (wf.typed_search_attributes.get(VERSION_KEY) or "").partition(":")
        by_build[build if deployment == name else UNVERSIONED].append(wf.id)
    rows = [
        VersionRow(
            s.deployment_version.build_id,
            _status_word(s.status),
            sorted(by_build.pop(s.deployment_version.build_id, [])),
        )
        for s in (info.version_summaries if info else [])
    ]
    rows += [VersionRow(build, "unknown", sorted(ids)) for build, ids in by_build.items() if build != UNVERSIONED]
    return DeploymentStatus(name, _current_build(info), rows, sorted(by_build.get(UNVERSIONED, [])))
