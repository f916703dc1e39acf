"""Shared test helpers: dev servers and workers wired like production, starting goals and
waiting on them over the client, free ports, and reading facts out of real histories.

No fixtures (conftest.py has those) and no test data (builders.py); no test module is
imported from here, so any test module, the soak and the history recorder may use it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from google.protobuf.message import DecodeError, Message
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import History
from temporalio.client import WorkflowHandle, WorkflowHistory
from temporalio.converter import default as default_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker
from typer.testing import CliRunner

from perdure.activities.artifacts import ArtifactStore
from perdure.activities.mcp.mcp_calls import McpServers
from perdure.activities.models.profiles import ModelConfig, ModelProfile
from perdure.activities.tools.user.toolbox import Toolbox
from perdure.runtime.codec import EncryptionCodec, Keyring, is_encrypted, is_sealed, unseal
from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.starters.client import goal_events
from perdure.starters.client.goal_reads import ended
from perdure.testing.servers import BIN, dev_server_options, free_ports  # noqa: F401 (used from here by tests)
from perdure.workers.orchestrator import build_worker
from perdure.workflows.goal.contracts.events import TokenDelta, TokenRetry
from perdure.workflows.goal.contracts.goal_contracts import Activities, GoalResult, GoalSpec, ProgressSnapshot
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared.contracts import ToolBatchResult
from perdure.workflows.shared.statuses import ENDED_PHASES
from tests.builders import scripted_profile, spec

LOCAL_ACTIVITY_MARKER = "core_local_activity"
CHROMIUM = Path("/usr/bin/chromium")

# --- servers and workers -----------------------------------------------------------


@asynccontextmanager
async def running_worker(
    env: WorkflowEnvironment,
    task_queue: str,
    store: ArtifactStore,
    *profiles: ModelProfile,
    mcp: McpServers | None = None,
    user_tools: Toolbox | None = None,
    **worker_options,
) -> AsyncIterator[Worker]:
    """The production worker (every workflow and activity) on `task_queue`, with these model
    profiles, MCP servers and user tools (none unless given), and these options of the SDK's Worker."""
    config = ModelConfig(profiles={p.name: p for p in profiles})
    worker = build_worker(
        env.client,
        task_queue=task_queue,
        store=store,
        model_config=config,
        mcp_servers=mcp or McpServers({}),
        user_tools=user_tools,
        **worker_options,
    )
    async with worker:
        yield worker


def isolated_demo_env(tmp_path: Path) -> tuple[dict[str, str], int, int]:
    """A user's environment with no model keys or perdure settings of its own, pointed
    at a scratch dev directory and free ports (the `perdure ui` a demo starts included):
    (env, frontend port, Temporal UI port)."""
    port, ui_port, page_port = free_ports(3)
    model_keys = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY")
    env = {
        **{k: v for k, v in os.environ.items() if k not in model_keys and not k.startswith("PERDURE_")},
        "PERDURE_TEMPORAL": f"127.0.0.1:{port}",
        "PERDURE_UI": f"http://localhost:{ui_port}",
        "PERDURE_UI_PORT": str(page_port),
        "PERDURE_DEV_DIR": str(tmp_path / "temporal-dev"),
        "PERDURE_HOME": str(tmp_path / "home"),
        "NO_COLOR": "1",
        "COLUMNS": "160",
    }
    return env, port, ui_port


# --- the Temporal UI in headless Chromium ------------------------------------------


def chromium(url: str, profile: Path, *args: str) -> str:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        # A finished workflow's page settles; virtual time lets the UI's fetches (and the
        # codec server's answers) land before the DOM is read.
        "--virtual-time-budget=15000",
    ]
    ran = subprocess.run([str(CHROMIUM), *flags, *args, url], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ran.stdout


# --- goals -------------------------------------------------------------------------


def new_goal_id(prefix: str = "goal") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def start(env: WorkflowEnvironment, task_queue: str, workspace: Path, steps: list[dict], **overrides):
    """Start a goal running these plan steps (no planner call); `overrides` go to the spec."""
    goal_spec = spec(workspace, plan={"steps": steps}, **overrides)
    return await env.client.start_workflow(
        GoalWorkflow.run, GoalInput(spec=goal_spec), id=new_goal_id("steer"), task_queue=task_queue
    )


async def goal_result(handle: WorkflowHandle) -> GoalResult:
    """The goal's result however it ended, read as `perdure result` reads it: a goal that
    failed or was aborted fails its workflow with the result in the failure."""
    return await ended(handle)


async def run_goal(
    env: WorkflowEnvironment, task_queue: str, goal_spec: GoalSpec, goal_id: str | None = None, as_started: bool = False
) -> tuple[WorkflowHandle, GoalResult]:
    """Start the goal and wait for its result, however it ended; `as_started`: with the
    workflow task timeout `perdure start` gives it (else the server's default, 10 s)."""
    handle = await env.client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=goal_spec),
        id=goal_id or new_goal_id(),
        task_queue=task_queue,
        task_timeout=goal_spec.task_timeout() if as_started else None,
    )
    return handle, await goal_result(handle)


async def until(predicate: Callable[[], Any], timeout_s: float = 30) -> None:
    """Return once `predicate()` holds (polled every 0.05 s): a fake service's ledger, a file."""
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def wait_until(
    handle: WorkflowHandle, predicate: Callable[[ProgressSnapshot], Any], timeout_s: float = 30
) -> ProgressSnapshot:
    """The first progress snapshot for which `predicate` holds (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snapshot = await handle.query(GoalWorkflow.progress)
        if predicate(snapshot):
            return snapshot
        await asyncio.sleep(0.1)
    raise AssertionError(f"condition not reached in {timeout_s} s; last snapshot: {_gist(snapshot)}")


def _gist(snapshot: ProgressSnapshot) -> str:
    """What a failed wait needs to say, without a line per node of a 10,000-node goal."""
    unsettled = [
        f"{n.name}={n.status}{f' ({n.error})' if n.error else ''}" for n in snapshot.nodes if n.status != "succeeded"
    ]
    return (
        f"phase={snapshot.phase} runs={snapshot.runs} counts={snapshot.counts} "
        f"not succeeded: {', '.join(unsettled[:12])}{' …' if len(unsettled) > 12 else ''}; "
        f"questions: {[q.title for q in snapshot.questions]}; failure: {snapshot.failure}; "
        f"gate log: {snapshot.gate_log[-3:]}"
    )


def statuses(snapshot: ProgressSnapshot) -> dict[str, str]:
    return {n.name: n.status for n in snapshot.nodes}


async def run_cli(env: WorkflowEnvironment, home: Path, *args: str, code: int | None = 0):
    """Run `perdure ARGS` in a thread (the CLI runs its own event loop); returns the result,
    whose stdout and stderr are what the terminal showed. `code` None: any exit code."""
    variables = {
        "PERDURE_TEMPORAL": env.client.service_client.config.target_host,
        "PERDURE_HOME": str(home),
        "PERDURE_CONFIG": str(home / "config.toml"),
    }
    # Wide, so a line of the output is a line of the text (the consoles measured no terminal).
    with mock.patch.object(terminal.console, "_width", 300), mock.patch.object(terminal.err_console, "_width", 300):
        result = await asyncio.to_thread(CliRunner().invoke, cli.app, list(args), env=variables)
    said = result.stdout + result.stderr
    assert "Traceback" not in said and result.exception is None or isinstance(result.exception, SystemExit), (
        said + repr(result.exception)
    )
    if code is not None:
        assert result.exit_code == code, said
    return result


async def perdure_status(env: WorkflowEnvironment, goal_id: str, width: int = 400) -> str:
    """What `perdure status GOAL` prints, run in this process against the test's server.
    The CLI's console is made `width` columns wide: the one it made at import measured
    whatever terminal the test run had, and a narrow table wraps its cells."""
    address = {"PERDURE_TEMPORAL": env.client.service_client.config.target_host}
    with mock.patch.object(terminal.console, "_width", width):
        result = await asyncio.to_thread(CliRunner().invoke, cli.app, ["status", goal_id], env=address)
    assert result.exit_code == 0, result.output
    return result.output


async def perdure_result(env, goal_id: str, home: Path) -> str:
    """What `perdure result GOAL` prints, in this process (it reads the report from the store)."""
    variables = {"PERDURE_TEMPORAL": env.client.service_client.config.target_host, "PERDURE_HOME": str(home)}
    with mock.patch.object(terminal.console, "_width", 400):
        done = await asyncio.to_thread(CliRunner().invoke, cli.app, ["result", goal_id], env=variables)
    assert done.exit_code == 0, done.output
    return done.output


async def cards_until_the_end(handle: WorkflowHandle) -> set[str]:
    """Every card the goal shows from now until it ends (polled every 0.1 s, 30 s at most)."""
    seen: set[str] = set()
    for _ in range(300):
        snapshot = await handle.query(GoalWorkflow.progress)
        seen.update(q.id for q in snapshot.questions)
        if snapshot.phase in ENDED_PHASES:
            break
        await asyncio.sleep(0.1)
    return seen


async def submit(handle: WorkflowHandle, message):
    """Send a steering message (a `perdure.workflows.goal.contracts.messages` model) by update; returns its receipt."""
    return await handle.execute_update(GoalWorkflow.submit, message.model_dump(mode="json"))


def calls_for(server, step: str) -> list[dict]:
    """The scripted server's requests for one llm or agent step."""
    return [r for r in server.requests() if r["last_message"].startswith(f"step: {step}\n")]


# --- reading histories -------------------------------------------------------------


def _all_text(message: Message) -> str:
    """Every string and bytes field of a protobuf message, recursively: a history's payloads
    (their JSON data, as stored: decode an encrypted history first), failures, summaries and headers."""
    parts: list[str] = []
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            items = [x for key in value for x in (key, value[key])]
        elif field.is_repeated:
            items = list(value)
        else:
            items = [value]
        for item in items:
            if isinstance(item, Message):
                parts.append(_all_text(item))
            elif isinstance(item, bytes):
                parts.append(item.decode("utf-8", errors="replace"))
            elif isinstance(item, str):
                parts.append(item)
    return "\n".join(parts)


def history_text(history: WorkflowHistory | History) -> str:
    return "\n".join(_all_text(event) for event in history.events)


def files_text(root: Path, skip: set[Path], keyring: Keyring | None = None) -> str:
    """Every file under `root` but `skip`, as text; with the keys, sealed files (artifacts) and
    encrypted offloaded payloads are decrypted first, so a search sees what they hold."""
    return "\n".join(
        _plaintext(p.read_bytes(), keyring, str(p)).decode("utf-8", errors="replace")
        for p in sorted(root.rglob("*"))
        if p.is_file() and p not in skip
    )


def _plaintext(raw: bytes, keyring: Keyring | None, what: str) -> bytes:
    if keyring is None:
        return raw
    if is_sealed(raw):
        return unseal(keyring, raw, what)
    try:
        payload = Payload.FromString(raw)
    except DecodeError:
        return raw
    return EncryptionCodec(keyring).decrypt(payload).data if is_encrypted(payload) else raw


def _summary(event) -> str:
    if not event.HasField("user_metadata") or not event.user_metadata.HasField("summary"):
        return ""
    return default_converter().payload_converter.from_payloads([event.user_metadata.summary])[0]


def scheduled_activities(history: WorkflowHistory) -> list[tuple[int, str, str]]:
    """(event id, activity type, summary) for every scheduled activity, in order."""
    found = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            found.append((event.event_id, attrs.activity_type.name, _summary(event)))
    return found


def started_attempts(history: WorkflowHistory) -> dict[int, int]:
    """Scheduled event id -> attempt number recorded when the activity last started."""
    return {
        e.activity_task_started_event_attributes.scheduled_event_id: e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    }


def completions(history: WorkflowHistory) -> list[tuple[int, int]]:
    """(completion event id, scheduled event id) for every activity that completed or failed, in order."""
    found = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            found.append((e.event_id, e.activity_task_completed_event_attributes.scheduled_event_id))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            found.append((e.event_id, e.activity_task_failed_event_attributes.scheduled_event_id))
    return found


def first_event(history: WorkflowHistory, step: str) -> int:
    """The event id of the first activity scheduled for `step` (a write's prepare included)."""
    return min(event_id for event_id, _, summary in scheduled_activities(history) if f" · {step} · " in summary)


def completed_at(history: WorkflowHistory, step: str) -> int:
    """The event id at which `step`'s last activity completed."""
    ours = {event_id for event_id, _, summary in scheduled_activities(history) if f" · {step} · " in summary}
    return max(done for done, scheduled in completions(history) if scheduled in ours)


def workflow_task_failures(history: WorkflowHistory, *, burst: bool = False) -> list[str]:
    """The failure message of every workflow task that failed, but those the server failed
    itself because a signal or an update came in while the workflow was completing
    (UnhandledCommand: retried at once with the new events; none of the workflow's code failed).
    `burst`: also those it failed because more events arrived while the task ran than it
    buffers (ForceCloseCommand: hundreds of activities finishing at once), retried likewise."""
    ignored = _FAILED_IN_A_BURST if burst else _FAILED_BY_A_MESSAGE
    return [
        e.workflow_task_failed_event_attributes.failure.message
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        and e.workflow_task_failed_event_attributes.cause not in ignored
    ]


_FAILED_BY_A_MESSAGE = (WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,)
_FAILED_IN_A_BURST = (
    *_FAILED_BY_A_MESSAGE,
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FORCE_CLOSE_COMMAND,
)


def largest_event_bytes(history: WorkflowHistory) -> int:
    return max(e.ByteSize() for e in history.events)


def local_activities(history: WorkflowHistory, batches: bool = False) -> list[tuple[int, str, str, int]]:
    """(event id, activity type, summary, completing workflow task's event id) for every
    local activity, which history records as a marker when its workflow task completes.
    Reads run together in one batch (workflows/goal/read_batch.py) are listed one row per
    call, each with its own summary and the batch's marker, as perdure.tool.run would be;
    `batches=True` lists each batch as the one local activity it is."""
    found = []
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        attrs = event.marker_recorded_event_attributes
        if attrs.marker_name != LOCAL_ACTIVITY_MARKER:
            continue
        data = json.loads(attrs.details["data"].payloads[0].data)
        task = attrs.workflow_task_completed_event_id
        if data["activity_type"] == Activities.RUN_TOOLS and not batches:
            for call in _batch_calls(attrs):
                found.append((event.event_id, Activities.RUN_TOOL, call, task))
            continue
        found.append((event.event_id, data["activity_type"], _summary(event), task))
    return found


def _batch_calls(marker_attrs) -> list[str]:
    """The summaries of the calls a batch's marker answered (its result echoes them)."""
    if "result" not in marker_attrs.details:
        return []  # the batch failed as a whole: each call ran again alone
    result = default_converter().payload_converter.from_payloads(
        list(marker_attrs.details["result"].payloads), [ToolBatchResult]
    )[0]
    return [entry.call for entry in result.entries if entry.result is not None]


def tool_timeline(history: WorkflowHistory) -> list[tuple[str, str]]:
    """("local" | "activity", summary) for every tool call, in history order."""
    timeline = []
    local: dict[int, list[str]] = {}
    for event_id, _, summary, _ in local_activities(history):
        local.setdefault(event_id, []).append(summary)  # a batch's calls share its marker
    scheduled = {event_id: summary for event_id, _, summary in scheduled_activities(history)}
    for event in history.events:
        if event.event_id in local:
            timeline.extend(("local", summary) for summary in local[event.event_id] if summary.startswith("tool "))
        elif event.event_id in scheduled and scheduled[event.event_id].startswith("tool "):
            timeline.append(("activity", scheduled[event.event_id]))
    return timeline


def activity_outcomes(history: WorkflowHistory, activity_type: str) -> tuple[int, int, list[int]]:
    """(scheduled, completed, attempts of the completed) for one activity type."""
    scheduled: set[int] = set()
    attempts: dict[int, int] = {}
    completed: list[int] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == activity_type:
                scheduled.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            attempts[attrs.scheduled_event_id] = attrs.attempt
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = event.activity_task_completed_event_attributes.scheduled_event_id
            if sid in scheduled:
                completed.append(sid)
    return len(scheduled), len(completed), [attempts.get(sid, 0) for sid in completed]


# Events a workflow's own commands produce (what replay checks), as opposed to what
# arrives from outside (signals, updates, activity results) or the server's bookkeeping.
COMMAND_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
        EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED,
        EventType.EVENT_TYPE_TIMER_STARTED,
        EventType.EVENT_TYPE_TIMER_CANCELED,
        EventType.EVENT_TYPE_MARKER_RECORDED,
        EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
        EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
    }
)


def command_batches(history: WorkflowHistory) -> list[tuple[tuple[str, str, str], ...]]:
    """What each workflow task committed: its commands as (event type, activity type or
    marker or upserted keys, summary), sorted within the task. Sorted, because concurrent
    local activities complete (and the upserts they trigger interleave) in timing order;
    the batch as a whole is what the code decides. Two recordings of one scenario by
    equivalent code have equal batches."""
    batches: list[tuple[tuple[str, str, str], ...]] = []
    batch: list[tuple[str, str, str]] = []
    for event in history.events:
        name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
        if name.startswith("WORKFLOW_TASK_"):
            if batch:
                batches.append(tuple(sorted(batch)))
            batch = []
        elif event.event_type in COMMAND_EVENTS:
            batch.append((name, _command_subject(event), _summary(event)))
    return batches + ([tuple(sorted(batch))] if batch else [])


def _command_subject(event) -> str:
    if event.HasField("activity_task_scheduled_event_attributes"):
        return event.activity_task_scheduled_event_attributes.activity_type.name
    if event.HasField("marker_recorded_event_attributes"):
        attrs = event.marker_recorded_event_attributes
        if attrs.marker_name == LOCAL_ACTIVITY_MARKER:
            return json.loads(attrs.details["data"].payloads[0].data)["activity_type"]
        return attrs.marker_name
    if event.HasField("upsert_workflow_search_attributes_event_attributes"):
        return ",".join(
            sorted(event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields)
        )
    return ""


# --- the event stream -------------------------------------------------------------


def live_goal_profile(server, every_s: float = 0.3) -> ModelProfile:
    """A scripted profile whose streamed replies are shown every `every_s`."""
    return scripted_profile(server).model_copy(update={"live_every_s": every_s})


TOKEN_EVENT_TYPES = {TokenDelta.model_fields["type"].default, TokenRetry.model_fields["type"].default}


async def stream_events(env, goal_id: str, from_offset: int = 0, tokens: bool = True):
    """(offset, event) of a goal's stream from `from_offset` as perdure reads it (the poll
    query, starters/client/goal_events.py) until its end event; live text only if `tokens`."""
    async for item in goal_events.events(env.client, goal_id, from_offset):
        event = item.event
        if event is None or (not tokens and event.type in TOKEN_EVENT_TYPES):
            continue
        yield item.offset, event


async def events_until_end(env, goal_id: str) -> list:
    """Every event and live text of a goal, from offset 0 until its end event."""
    return [event async for _, event in stream_events(env, goal_id)]


async def run_ids(handle) -> list[str]:
    """Every run of the goal's continue-as-new chain, first to last."""
    ids = [handle.first_execution_run_id or handle.result_run_id]
    while True:
        history = await handle._client.get_workflow_handle(handle.id, run_id=ids[-1]).fetch_history()
        last = history.events[-1]
        if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            return ids
        ids.append(last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id)


def plant_canaries(planted: str, worker_home: Path, perdure_home: Path, payload_store: Path) -> list[Path]:
    """Files holding `planted` where a process perdure starts must not look: the worker's
    home, the perdure home and its artifact store, the payload store. Returns their paths."""
    paths = [
        worker_home / ".perdure" / "planted",
        perdure_home / "planted",
        perdure_home / "artifacts" / "planted",
        payload_store / f"planted-{uuid.uuid4().hex[:8]}",
    ]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(planted)
    return paths
