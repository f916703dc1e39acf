"""The orchestrator worker: goal workflows plus model, tool and report activities,
the watchdog (its workflow, its activities, and its schedule), what the worker
offers (workers/worker_capabilities.py, published while it runs by workers/offer_publisher.py
for `perdure profiles` and `perdure start`),
and the device registry with the workers' half of a device call (workers/device.py
is the device's own worker; workers/host.py runs one beside this worker in a host's process).

Stateless and replaceable: every durable fact lives in Temporal or in the
artifact store (PERDURE_ARTIFACT_STORE: a directory every worker shares, or an
S3-compatible object store), so any number of these can poll the `perdure` task queue.
`perdure worker` (starters/cli/worker_commands.py) runs one on a client from runtime/connect.py.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta
from pathlib import Path

import structlog
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError
from temporalio.worker import Worker

from perdure.activities.artifacts import ArtifactStore, artifact_store, checked_stores
from perdure.activities.devices.device_calls import DeviceCallActivities
from perdure.activities.goal.decision_chunks import DecisionActivities
from perdure.activities.goal.memory_activities import MemoryActivities
from perdure.activities.goal.past_chunk_store import PastActivities
from perdure.activities.goal.recheck import VerificationActivities, VerifyQuestionActivities
from perdure.activities.goal.report import ReportActivities
from perdure.activities.goal.timer_history import TimingActivities
from perdure.activities.mcp.launch import start_warnings
from perdure.activities.mcp.mcp_calls import McpServers
from perdure.activities.mcp.mcp_config import load_mcp_servers
from perdure.activities.models.model_activities import ModelActivities
from perdure.activities.models.profiles import ModelConfig, load_model_config
from perdure.activities.models.providers import import_profiles_sdk
from perdure.activities.router.router_activities import RouterIO
from perdure.activities.tools import sandbox
from perdure.activities.tools.run_tool import ToolActivities
from perdure.activities.tools.user.toolbox import Toolbox
from perdure.activities.watchdog.watchdog_model import WatchdogModelActivities
from perdure.activities.watchdog.watchdog_visibility import VisibilityActivities
from perdure.memory import store as memory_store
from perdure.runtime import settings
from perdure.runtime.codec import keyring_of
from perdure.workers import deployment, heap, watchdog_schedule
from perdure.workers.code_version import code_version
from perdure.workers.lost_worker import ReleaseAfterLostWorker
from perdure.workers.offer_publisher import offer_publisher
from perdure.workers.worker_capabilities import CapabilitiesActivities
from perdure.workers.workflow_types import ORCHESTRATOR_WORKFLOWS
from perdure.workflows.offers.worker_offers import VersionedWorkerOffersWorkflow, WorkerOffersWorkflow
from perdure.workflows.shared.contracts import TASK_QUEUE
from perdure.workflows.shared.retries import HEARTBEAT_THROTTLE

log = structlog.get_logger(__name__)

# A goal's workflow tasks go to the worker that has it cached (its sticky queue).
# If that worker dies, the server waits this long before handing the task to any
# worker, which then replays the history. The SDK default (10 s) is the largest
# part of recovering from a killed worker; a few seconds is still far longer than
# a healthy worker takes to pick up a task, so cached runs are not given up early.
STICKY_TIMEOUT = timedelta(seconds=3)


def build_worker(
    client: Client,
    *,
    task_queue: str = TASK_QUEUE,
    store: ArtifactStore | None = None,
    home: Path | None = None,
    model_config: ModelConfig | None = None,
    mcp_servers: McpServers | None = None,
    user_tools: Toolbox | None = None,
    **worker_options,
) -> Worker:
    """`store`: default, the one PERDURE_ARTIFACT_STORE names. `home`: where this machine keeps
    the watchdog's memory and rules (beside an object store's artifacts instead), the memory
    store's SQLite default and the MCP servers' scratch directories; default PERDURE_HOME, or the
    directory of a disk `store` handed in without one (tests keep both in one scratch directory)."""
    if store is None:
        store, home = artifact_store(), home or settings.perdure_home()
    elif home is None:
        home = store.local_dir.parent if store.local_dir is not None else settings.perdure_home()
    # The user's own tools (`perdure worker --tools`, entry points), loaded and checked before.
    user_tools = user_tools or Toolbox()
    # Watched: a profile added to config.toml is used without restarting the worker.
    model_config = model_config or load_model_config(watch=True)
    import_profiles_sdk(model_config.profiles.values())
    # Read once: a config.toml whose MCP servers cannot be used stops the worker here, in one line.
    servers = mcp_servers.servers if mcp_servers is not None else load_mcp_servers()
    mcp_servers = McpServers(servers, artifact_store=store.local_dir, home=home)
    models = ModelActivities(model_config, store)
    keyring = keyring_of(client.data_converter)
    offers = CapabilitiesActivities(
        model_config,
        mcp_servers=sorted(mcp_servers.servers),
        payload_keys=list(keyring.key_ids) if keyring else [],
        user_tools=user_tools.offers(),
    )
    tools = ToolActivities(
        store, quotas=lambda: model_config.quotas, mcp=mcp_servers, user_tools=user_tools.implementations()
    )
    verification = VerificationActivities(store)
    questions = VerifyQuestionActivities(model_config, store)
    report = ReportActivities(store)
    devices = DeviceCallActivities(store, client, tools)
    # The watchdog's memory and rules (beside an object store's artifacts), and the memory
    # store's SQLite default (PERDURE_MEMORY_URL names a shared one).
    watchdog = VisibilityActivities(client, home=home, store=store)
    memory = MemoryActivities(home=home)
    worker_options.setdefault("sticky_queue_schedule_to_start_timeout", STICKY_TIMEOUT)
    worker_options.setdefault("max_cached_workflows", settings.workflow_cache())
    # Heartbeats reach the server about every second whatever an activity's heartbeat
    # timeout, so a short timeout still leaves a live worker slack (workflows/shared/retries.py).
    worker_options.setdefault("max_heartbeat_throttle_interval", HEARTBEAT_THROTTLE)
    # A retry after a lost worker: the goal's next task is not held for the dead worker.
    worker_options["interceptors"] = [*worker_options.get("interceptors", ()), ReleaseAfterLostWorker()]
    if "deployment_config" not in worker_options:
        worker_options.setdefault("build_id", code_version())
    # What this worker offers is published while it runs, under the identity it polls with.
    identity = worker_options.get("identity") or client.identity
    publisher = offer_publisher(client, task_queue, identity, offers)
    worker_options["plugins"] = [*worker_options.get("plugins", ()), publisher]
    workflows = ORCHESTRATOR_WORKFLOWS
    if "deployment_config" in worker_options:
        workflows = [VersionedWorkerOffersWorkflow if w is WorkerOffersWorkflow else w for w in workflows]
    return Worker(
        client,
        task_queue=task_queue,
        workflows=workflows,
        activities=[
            *models.activities(),
            tools.run_tool,
            tools.run_tools,
            tools.prepare_effect,
            mcp_servers.catalogue,
            user_tools.catalogue,
            verification.verify_nodes,
            *TimingActivities(store).activities(),
            *DecisionActivities(store).activities(),
            *PastActivities(store).activities(),
            *questions.activities(),
            report.write_report,
            *watchdog.activities(),
            *WatchdogModelActivities(model_config).activities(),
            offers.capabilities,
            *devices.activities(),
            *RouterIO(client, model_config).activities(),
            *memory.activities(),
        ],
        **worker_options,
    )


def configure_logging(level: str = "INFO") -> None:
    """One console format for structlog and for stdlib records (the SDK's activity and
    workflow loggers): the event, then its structured fields (`extra=`) as key=value.
    A failed activity attempt is one line; any other exception is a plain traceback,
    never one with locals (they hold activity inputs and clients' settings)."""
    shared = [structlog.stdlib.add_log_level, structlog.processors.TimeStamper(fmt="iso")]
    renderer = structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
    handler = _CurrentStderr()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(), _failed_attempt_in_one_line, _drop_sdk_context],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # boto3 says at INFO where it found credentials, at every new client: noise, and a
    # worker's log is no place to talk about credentials at all.
    for chatty in ("boto3", "botocore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
    )


class _CurrentStderr(logging.StreamHandler):
    """Writes to sys.stderr as it is at each record, not as it was when logging was set up:
    whoever swapped it since (a test runner capturing a command's output, then closing
    it) gets the records, and nothing writes to a closed stream."""

    @property
    def stream(self):  # noqa: ANN201 - logging.StreamHandler's attribute
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # noqa: ANN001 - StreamHandler.__init__ sets it
        pass


def _failed_attempt_in_one_line(_logger, _method: str, event: dict) -> dict:
    """The SDK logs each failed activity attempt ("Completing activity as failed") with its
    traceback; the activity's retry policy decides what happens next, so the log says which
    attempt of what failed and why, in one line."""
    if event.pop("__temporal_error_identifier", None) != "ActivityFailure":
        return event
    info = event.get("temporal_activity") or {}
    error = event.pop("exc_info", None)
    failure = error[1] if isinstance(error, tuple) else None
    return {
        **{k: v for k, v in event.items() if k != "event"},
        "event": "activity attempt failed",
        "activity": info.get("activity_type"),
        "attempt": info.get("attempt"),
        "workflow_id": info.get("workflow_id"),
        "error": _one_line(failure),
    }


def _one_line(failure: BaseException | None) -> str:
    if failure is None:
        return "unknown"
    kind = getattr(failure, "type", None) or type(failure).__name__
    text = " ".join((getattr(failure, "message", None) or str(failure)).split())
    return f"{kind}: {text[:300]}"


def _drop_sdk_context(_logger, _method: str, event: dict) -> dict:
    # The SDK's loggers put the activity or workflow info in the message already and
    # again as a `temporal_*` dict in extra; print it once.
    for key in [k for k in event if k.startswith("temporal_")]:
        del event[key]
    return event


async def run_orchestrator(
    client: Client,
    task_queue: str | None = None,
    version: WorkerDeploymentVersion | None = None,
    promote: bool = True,
    mcp_servers: McpServers | None = None,
    user_tools: Toolbox | None = None,
    store: ArtifactStore | None = None,
) -> None:
    """Run the worker until it is stopped. With a `version`, it is a Worker Deployment
    version (workers/deployment.py) and, when `promote`, becomes current once it polls,
    unless it was current before (an old build restarted to drain its pinned goals).
    `mcp_servers`: config.toml's, read before connecting (else read here); `user_tools`: the
    user's own tools, loaded before connecting (none when not given); `store`: the artifact
    store, checked before connecting (else PERDURE_ARTIFACT_STORE's, checked here with the payload store)."""
    task_queue = task_queue or settings.task_queue()
    options = {} if version is None else {"deployment_config": deployment.deployment_config(version)}
    mcp_servers = mcp_servers if mcp_servers is not None else McpServers(load_mcp_servers())
    if store is None:
        store = await asyncio.to_thread(checked_stores)
    worker = build_worker(
        client,
        task_queue=task_queue,
        store=store,
        home=settings.perdure_home(),
        mcp_servers=mcp_servers,
        user_tools=user_tools,
        **options,
    )
    log.info("artifact store", where=store.where)
    if store.local_dir is None and not memory_store.shared():
        # Artifacts in an object store: the hosts may share no disk, and a memory this host's
        # goals remember in its SQLite file would never be recalled on another.
        log.warning(
            "the memory store is this host's own SQLite file: set PERDURE_MEMORY_URL (postgresql://...) "
            "on every worker, or goals on other hosts will not recall what goals here remember",
            where=memory_store.store_url(settings.perdure_home()),
        )
    await ensure_watchdog(client, task_queue)
    warn, sandboxing = await sandbox.describe_at_start()
    (log.warning if warn else log.info)(sandboxing)
    for unsandboxed_server in start_warnings(mcp_servers.servers.values()):
        log.warning(unsandboxed_server)
    versioned = {} if version is None else {"deployment": version.deployment_name, "build_id": version.build_id}
    heap.settle()
    if user_tools is not None and user_tools.declarations:
        log.info("user tools loaded", tools=sorted(user_tools.declarations), sources=user_tools.sources)
    log.info("worker polling", task_queue=task_queue, namespace=client.namespace, **versioned)
    # The server knows the version once the worker polls: promote beside the running worker.
    promoting = asyncio.create_task(_promote(client, version)) if version is not None and promote else None
    try:
        await worker.run()
    finally:
        if promoting is not None:
            promoting.cancel()


async def _promote(client: Client, version: WorkerDeploymentVersion) -> None:
    try:
        outcome = await deployment.promote(client, version, only_if_new=True)
    except (RPCError, deployment.DeploymentError) as err:
        log.warning("version not made current", build_id=version.build_id, error=str(err))
        return
    log.info("version " + outcome, deployment=version.deployment_name, build_id=version.build_id)


async def ensure_watchdog(client: Client, task_queue: str) -> None:
    """Create or update the watchdog's schedule (PERDURE_WATCHDOG_INTERVAL_S, 0 = off).
    A server refusing schedules leaves the worker running without a watchdog."""
    interval = watchdog_schedule.interval_from_env()
    if interval is None:
        log.info("watchdog schedule not managed", reason=f"{watchdog_schedule.INTERVAL_ENV} is off")
        return
    try:
        ensured = await watchdog_schedule.ensure_watchdog_schedule(client, interval, task_queue)
    except RPCError as err:
        log.warning("watchdog schedule not ensured", error=err.message)
        return
    log.info(
        "watchdog schedule " + ensured.outcome,
        schedule_id=ensured.schedule_id,
        every_s=interval.total_seconds(),
        changes=ensured.changes or None,
    )
