"""Checkpoints at side-effect boundaries: short reads run as local activities whose results
reach history together, every remote write is its own activity, and a worker killed inside
a read segment costs only re-running the (free) reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from perdure.activities.goal.report import ReportActivities
from perdure.activities.tools.run_tool import ToolActivities
from perdure.activities.tools.workspace_versions import WorkspaceVersions
from perdure.testing.fakes import LedgerAPI
from perdure.workflows.goal import scheduler
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.messages import Abort
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.read_batch import BATCH_MAX_CALLS
from perdure.workflows.shared.contracts import ToolBatchInput, ToolBatchResult
from tests.builders import openai_profile, spec
from tests.helpers import (
    goal_result,
    local_activities,
    new_goal_id,
    run_goal,
    run_ids,
    running_worker,
    scheduled_activities,
    submit,
    tool_timeline,
)

WRITES_AFTER = (7, 14, 20)  # a remote write after the 7th, 14th and 20th read


def reads_and_writes(ledger_url: str) -> list[dict]:
    """20 reads in a chain, with a ledger entry written after reads 7, 14 and 20."""
    steps: list[dict] = []
    previous: list[str] = []
    for i in range(1, 21):
        name = f"read-{i:02d}"
        read = {"path": f"pages/{i:02d}.md"}
        steps.append({"name": name, "kind": "tool", "tool": "read_file", "args": read, "needs": previous})
        previous = [name]
        if i in WRITES_AFTER:
            write = f"write-{WRITES_AFTER.index(i) + 1}"
            body = {"ref": write, "pages": i}
            step = {"method": "POST", "url": f"{ledger_url}/entries", "body": body}
            steps.append({"name": write, "kind": "tool", "tool": "http_request", "args": step, "needs": previous})
            previous = [write]
    return steps


def write_pages(workspace: Path) -> None:
    (workspace / "pages").mkdir()
    for i in range(1, 21):
        (workspace / f"pages/{i:02d}.md").write_text(f"page {i}\n")


def segment_spec(workspace: Path, ledger_url: str):
    return spec(
        workspace,
        plan={"steps": reads_and_writes(ledger_url)},
        allowed_tools=["read_file", "http_request"],
        drift_every=0,
    )


def step_of(summary: str) -> str:
    return summary.split(" · ")[1]


@pytest.fixture
def ledger(fake_service) -> LedgerAPI:
    return fake_service(LedgerAPI)


@pytest.mark.slow
async def test_reads_are_grouped_between_writes_and_each_write_is_its_own_activity(
    env, task_queue, store, workspace, scripted, ledger
):
    write_pages(workspace)
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(env, task_queue, segment_spec(workspace, ledger.base_url))
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt

    history = await handle.fetch_history()
    timeline = [(where, step_of(summary)) for where, summary in tool_timeline(history)]
    expected = (
        [("local", f"read-{i:02d}") for i in range(1, 8)]
        + [("activity", "write-1")]
        + [("local", f"read-{i:02d}") for i in range(8, 15)]
        + [("activity", "write-2")]
        + [("local", f"read-{i:02d}") for i in range(15, 21)]
        + [("activity", "write-3")]
    )
    assert timeline == expected
    # Each segment's reads reached history in one workflow-task completion, the one that
    # also scheduled the write ending the segment.
    tasks = {step_of(s): task for _, _, s, task in local_activities(history)}
    writes = {step_of(s): eid for eid, _, s in scheduled_activities(history) if s.startswith("tool ")}
    for segment, (first, last) in enumerate([(1, 7), (8, 14), (15, 20)], start=1):
        segment_tasks = {tasks[f"read-{i:02d}"] for i in range(first, last + 1)}
        assert len(segment_tasks) == 1, f"segment {segment} spread over tasks {segment_tasks}"
        (task,) = segment_tasks
        assert task < writes[f"write-{segment}"]
    assert Counter(entry["body"]["ref"] for entry in ledger.ledger()) == {"write-1": 1, "write-2": 1, "write-3": 1}
    # Where each step ran, and why, is on the node.
    nodes = {n.name: n for n in snapshot.nodes}
    assert nodes["read-05"].placements["read_file"].startswith("local activity: read, safe to re-run")
    assert nodes["write-2"].placements["http_request"].startswith("activity: remote-write")


@pytest.mark.process
async def test_worker_killed_inside_a_read_segment_reruns_only_the_reads(tmp_path, fake_service, crash_rig):
    # A slow ledger keeps write-1 in flight long enough to start the standby worker.
    ledger = fake_service(LedgerAPI, respond_delay_s=1.0)
    rig = crash_rig()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    write_pages(workspace)
    # Reads 1-7 are the first segment; the 10th read is inside the second.
    first = rig.start_worker(fault="tool_done:read_file:10")
    handle = await rig.start_goal(segment_spec(workspace, ledger.base_url))
    await wait_for_running(handle, "write-1")
    standby = rig.start_worker()
    await standby.wait_polling()

    await rig.wait_killed(first)
    assert "perdure fault: SIGKILL at tool_done:read_file:10" in first.log_tail()
    result = await rig.result(handle)
    assert result.outcome == "succeeded", result.excerpt
    entries = ledger.ledger()

    assert Counter(entry["body"]["ref"] for entry in entries) == {"write-1": 1, "write-2": 1, "write-3": 1}
    history = await handle.fetch_history()
    timeline = [step_of(summary) for _, summary in tool_timeline(history)]
    assert [s for s in timeline if s.startswith("write")] == ["write-1", "write-2", "write-3"]
    assert sorted(s for s in timeline if s.startswith("read")) == [f"read-{i:02d}" for i in range(1, 21)]
    # Reads 8-10 had run on the killed worker, but their segment never reached history
    # from it: the standby re-ran them and committed the whole segment.
    identities = {e.event_id: e.workflow_task_completed_event_attributes.identity for e in history.events}
    reads = {step_of(s): task for _, _, s, task in local_activities(history)}
    assert all(not identities[reads[f"read-{i:02d}"]].startswith(f"{first.pid}@") for i in range(8, 15))
    assert all(identities[reads[f"read-{i:02d}"]].startswith(f"{first.pid}@") for i in range(1, 8))


async def wait_for_running(handle, step: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while step not in (await handle.query(GoalWorkflow.progress)).running:
        assert time.monotonic() < deadline, f"{step} never ran"
        await asyncio.sleep(0.05)


async def test_a_wide_read_segment_is_cut_into_workflow_tasks_of_bounded_size(
    env, task_queue, store, workspace, scripted
):
    (workspace / "pages").mkdir()
    steps = []
    for i in range(BATCH_MAX_CALLS + 50):
        (workspace / f"pages/{i}.md").write_text(f"page {i}\n")
        steps.append({"name": f"read-{i:03d}", "kind": "tool", "tool": "read_file", "args": {"path": f"pages/{i}.md"}})
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(
            env, task_queue, spec(workspace, plan={"steps": steps}, allowed_tools=["read_file"], drift_every=0)
        )
    assert result.outcome == "succeeded", result.excerpt
    history = await handle.fetch_history()
    per_batch = Counter(event for event, _, s, _ in local_activities(history) if s.startswith("tool "))
    # 150 reads ready together: two local activities of at most 100 calls, side by side. No
    # timer breaks the task (a server with the default timer shift fires a 1 ms one about a
    # second later): the SDK's
    # workflow task heartbeat bounds it by time (the next test).
    assert sorted(per_batch.values()) == [50, BATCH_MAX_CALLS], per_batch
    assert not [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]


@pytest.mark.slow
async def test_reads_whose_results_outgrow_a_task_completion_are_split_and_the_goal_lives(
    env, task_queue, store, workspace, scripted, monkeypatch
):
    """50 chains of 100 reads, each result ~1.1 kB (a long path in its fingerprint), so each
    local activity of 100 returns ~110 kB, under the size that goes to the payload store: over
    5 MB of results, read ahead faster than the SDK's task heartbeat (8 s here). All in one
    workflow task completion, the server refused it as too large and terminated the goal
    (GrpcMessageTooLarge). Now the reads past a task's share run as activities, whose results
    reach history on their own, and each completion stays small. (Chains, not 5,000 reads
    ready at once: dispatching that many in one activation can pass the SDK's 2 s deadlock
    limit on a loaded machine.) A task now starts at most STARTS_PER_TASK steps, whose
    results fit its share here; the bound is lifted so the share is what is tested."""
    monkeypatch.setattr(scheduler, "STARTS_PER_TASK", 100_000)
    deep = Path(*[d * 195 for d in "abc"])
    (workspace / deep).mkdir(parents=True)
    (workspace / deep / "page.md").write_text("a page\n")
    path = (deep / "page.md").as_posix()
    steps = [
        # Different calls (max_bytes), so no two are twins sharing one read.
        {"name": f"read-{i:04d}", "kind": "tool", "tool": "read_file", "args": {"path": path, "max_bytes": 1000 + i}}
        for i in range(5000)
    ]
    for before, step in zip(steps, steps[50:], strict=False):
        step["needs"] = [before["name"]]  # 50 chains: step i needs step i - 50
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(
            env, task_queue, spec(workspace, plan={"steps": steps}, allowed_tools=["read_file"], drift_every=0)
        )
    assert result.outcome == "succeeded", result.excerpt
    histories = [
        await env.client.get_workflow_handle(handle.id, run_id=r).fetch_history() for r in await run_ids(handle)
    ]
    carried, largest, reads_as_activities = 0, 0, 0
    for event in (e for history in histories for e in history.events):
        if event.event_type in (EventType.EVENT_TYPE_MARKER_RECORDED, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED):
            carried += event.ByteSize()  # what the task's completion carried
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            largest, carried = max(largest, carried), 0
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            reads_as_activities += (
                event.activity_task_scheduled_event_attributes.activity_type.name == Activities.RUN_TOOLS
            )
    assert largest < 2_000_000, largest  # half the server's limit on a task completion
    assert reads_as_activities > 0, "no read ran as an activity"


class SlowFifos:
    """FIFOs whose writer answers each read `delay_s` after it opens them, as often as they
    are read (a read run again after a timed-out task gets its answer too, so a failure
    shows as the assertion it is, not as a read blocked for good)."""

    def __init__(self, paths: list[Path], delay_s: float) -> None:
        self.paths, self.delay_s = paths, delay_s
        self.stopping = threading.Event()
        for path in paths:
            os.mkfifo(path)
        self.threads = [threading.Thread(target=self._serve, args=(p,), daemon=True) for p in paths]

    def __enter__(self) -> SlowFifos:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for path in self.paths:  # a writer waiting for a reader gets one, sees `stopping` and ends
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        for thread in self.threads:
            thread.join(timeout=5)

    def _serve(self, path: Path) -> None:
        while not self.stopping.is_set():
            try:
                with open(path, "w") as fifo:  # blocks until a read opens it
                    if self.stopping.is_set():
                        return
                    time.sleep(self.delay_s)
                    fifo.write(f"slow {path.name}\n")
            except BrokenPipeError:
                continue


@pytest.mark.slow
async def test_reads_running_longer_than_the_task_timeout_are_committed_by_the_task_heartbeat(
    env, task_queue, store, workspace
):
    """Three slow reads one after another (each a FIFO whose writer waits 1.4 s) in one read
    segment: longer than most of the goal's 2 s workflow task timeout, so the SDK ends the
    task with what has run and goes on in a new one, with no timer and no timeout."""
    steps, previous = [], []
    for i in range(1, 4):
        # A `verify` spec keeps a step out of read-ahead: one read, one local activity, in turn.
        step = {"name": f"slow-{i}", "kind": "tool", "tool": "read_file", "args": {"path": f"slow-{i}"}}
        steps.append({**step, "needs": previous, "verify": {"depth": "trust"}})
        previous = [f"slow-{i}"]
    goal = spec(workspace, plan={"steps": steps}, allowed_tools=["read_file"], drift_every=0)
    with SlowFifos([workspace / f"slow-{i}" for i in range(1, 4)], delay_s=1.4):
        async with running_worker(env, task_queue, store):
            handle, result = await run_goal(env, task_queue, goal, as_started=True)
    assert result.outcome == "succeeded", result.excerpt
    history = await handle.fetch_history()
    committed_in = {step_of(s): task for _, _, s, task in local_activities(history)}
    assert len(set(committed_in.values())) >= 2, committed_in  # the segment was committed in two tasks or more
    kinds = {e.event_type for e in history.events}
    assert EventType.EVENT_TYPE_TIMER_STARTED not in kinds
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT not in kinds


@pytest.mark.slow
async def test_a_read_ahead_batch_busy_for_several_task_timeouts_is_not_timed_out(env, task_queue, store, workspace):
    """A chain of reads run ahead in one local activity, three of them FIFOs whose writer
    waits 1.5 s each: the batch runs 4.5 s, over twice the goal's 2 s task timeout, on a
    worker that is busy but alive. The SDK heartbeats the task (at 80 % of the timeout),
    so the server never times it out and the reads run once."""
    steps, slow = [], []
    for i in range(9):
        name = f"r{i}"
        if i % 3 == 2:
            slow.append(workspace / name)
        else:
            (workspace / name).write_text(f"page {i}\n")
        steps.append({"name": name, "kind": "tool", "tool": "read_file", "args": {"path": name}})
        if i:
            steps[-1]["needs"] = [f"r{i - 1}"]
    goal = spec(workspace, plan={"steps": steps}, allowed_tools=["read_file"], drift_every=0)
    assert goal.task_timeout() == timedelta(seconds=2)
    with SlowFifos(slow, delay_s=1.5):
        async with running_worker(env, task_queue, store):
            handle, result = await run_goal(env, task_queue, goal, as_started=True)
    assert result.outcome == "succeeded", result.excerpt
    history = await handle.fetch_history()
    kinds = [e.event_type for e in history.events]
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT not in kinds
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in kinds
    batches = [s for _, kind, s, _ in local_activities(history, batches=True) if kind == "perdure.tool.run_batch"]
    assert len(batches) == 1, batches  # r0 and the 8 steps read ahead of it
    assert sorted(step_of(s) for _, _, s, _ in local_activities(history)) == [f"r{i}" for i in range(9)]


async def test_reads_ready_together_run_as_one_local_activity(env, task_queue, store, workspace, scripted):
    (workspace / "pages").mkdir()
    steps = []
    for i in range(12):
        (workspace / f"pages/{i}.md").write_text(f"page {i}\n")
        steps.append({"name": f"read-{i:02d}", "kind": "tool", "tool": "read_file", "args": {"path": f"pages/{i}.md"}})
    steps.append({"name": "last", "kind": "tool", "tool": "list_dir", "args": {"path": "pages"}, "needs": ["read-11"]})
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(
            env,
            task_queue,
            spec(workspace, plan={"steps": steps}, allowed_tools=["read_file", "list_dir"], drift_every=0),
        )
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt
    history = await handle.fetch_history()
    markers = local_activities(history, batches=True)
    batches = [m for m in markers if m[1] == "perdure.tool.run_batch"]
    # The step they make ready is read ahead in the same batch (a read, its arguments fixed).
    assert [s for _, _, s, _ in batches] == [
        "12 reads at once · read-00, read-01, read-02, read-03, read-04, read-05 +6 · 1 read ahead"
    ], markers
    assert [kind for _, kind, _, _ in markers if kind == "perdure.tool.run"] == []
    calls = {step_of(s): event for event, _, s, _ in local_activities(history)}
    assert set(calls) == {f"read-{i:02d}" for i in range(12)} | {"last"}
    for i in range(12):
        node = next(n for n in snapshot.nodes if n.name == f"read-{i:02d}")
        assert node.status == "succeeded" and f"page {i}" in node.preview, node
    # A plan step's one read fences nothing (its node never writes): no fence record was written.
    chain = history.events[0].workflow_execution_started_event_attributes.first_execution_run_id
    assert WorkspaceVersions(store).fence_of(handle.id, chain, "read-00") == {}


async def test_a_read_that_raises_in_a_batch_runs_again_alone_and_fails_as_it_would_without_one(
    env, task_queue, store, tmp_path, scripted
):
    gone = tmp_path / "no-such-workspace"  # every read raises WorkspaceMissing (non-retryable)
    steps = [{"name": f"read-{i}", "kind": "tool", "tool": "read_file", "args": {"path": f"{i}.md"}} for i in range(3)]
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(
            env, task_queue, spec(gone, plan={"steps": steps}, allowed_tools=["read_file"], drift_every=0)
        )
        snapshot = await handle.query(GoalWorkflow.progress)
    errors = {n.name: n.error for n in snapshot.nodes}
    assert all("WorkspaceMissing" in (errors[f"read-{i}"] or "") for i in range(3)), errors
    markers = local_activities(await handle.fetch_history(), batches=True)
    kinds = Counter(kind for _, kind, _, _ in markers)
    # The batch answered each call with its error; each then ran alone with its own policy.
    assert kinds["perdure.tool.run_batch"] == 1 and kinds["perdure.tool.run"] >= 3, markers
    assert result.outcome != "succeeded"


async def test_a_chain_of_reads_runs_ahead_in_one_batch_and_each_step_keeps_its_own_result(
    env, task_queue, store, workspace, scripted
):
    write_pages(workspace)
    chain = [
        {"name": f"read-{i:02d}", "kind": "tool", "tool": "read_file", "args": {"path": f"pages/{i:02d}.md"}}
        for i in range(1, 21)
    ]
    for before, step in zip(chain, chain[1:], strict=False):
        step["needs"] = [before["name"]]
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(
            env, task_queue, spec(workspace, plan={"steps": chain}, allowed_tools=["read_file"], drift_every=0)
        )
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt
    markers = local_activities(await handle.fetch_history(), batches=True)
    # The first read and the 19 it makes ready, one after another, in one local activity.
    assert [s for _, _, s, _ in markers] == ["read read-01 · 19 read ahead"], markers
    for i in range(1, 21):
        node = next(n for n in snapshot.nodes if n.name == f"read-{i:02d}")
        assert node.status == "succeeded" and node.preview.startswith(f"page {i}"), node


@pytest.mark.slow
async def test_an_abort_while_a_batch_of_reads_is_blocked_ends_the_goal_and_keeps_what_was_read(
    env, task_queue, store, workspace, scripted
):
    """A chain read ahead in one batch, one read of which blocks (a FIFO nobody writes yet):
    an abort ends the goal at once; the steps that never got their result are unfinished,
    none is reported succeeded without an output."""
    write_pages(workspace)
    os.mkfifo(workspace / "stuck")
    steps = [{"name": "first", "kind": "tool", "tool": "read_file", "args": {"path": "pages/01.md"}}]
    steps.append({"name": "stuck", "kind": "tool", "tool": "read_file", "args": {"path": "stuck"}, "needs": ["first"]})
    steps.append({"name": "after", "kind": "tool", "tool": "read_file", "args": {"path": "pages/02.md"}})
    steps[-1]["needs"] = ["stuck"]
    server = scripted({"replies": []})
    try:
        async with running_worker(env, task_queue, store, openai_profile(server)):
            goal = spec(workspace, plan={"steps": steps}, allowed_tools=["read_file"], drift_every=0)
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal), id=new_goal_id(), task_queue=task_queue
            )
            await wait_for_running(handle, "first")  # the batch (first + stuck, after read ahead) is blocked
            await asyncio.sleep(0.5)
            await submit(handle, Abort(request_id="ab-1", reason="taking too long"))
            result = await asyncio.wait_for(goal_result(handle), timeout=20)
    finally:
        with contextlib.suppress(OSError):  # let the blocked read end (ENXIO: nobody reads it any more)
            os.close(os.open(workspace / "stuck", os.O_WRONLY | os.O_NONBLOCK))
    assert result.outcome == "aborted", result.excerpt
    unfinished = {line.split(":")[0] for line in result.unfinished}
    assert {"first", "stuck", "after"} <= unfinished, result.unfinished
    assert not result.outputs, result.outputs  # nothing is reported as read


async def test_a_batch_that_fails_as_a_whole_runs_each_of_its_reads_alone(env, task_queue, store, workspace):
    """A local activity out of attempts raises its cause in the workflow (here an
    ApplicationError), not an ActivityError: the goal must still give each read its own
    call, not leave its steps running for good."""
    batches: list[int] = []

    # The batch activity is faked under its real name: one that fails however often it is tried.
    @activity.defn(name=Activities.RUN_TOOLS)
    async def run_batch(batch: ToolBatchInput) -> ToolBatchResult:
        batches.append(len(batch.calls))
        raise ApplicationError("the batch lost its disk", type="BatchBroken", non_retryable=True)

    write_pages(workspace)
    steps = [
        {"name": f"read-{i}", "kind": "tool", "tool": "read_file", "args": {"path": f"pages/0{i}.md"}} for i in (1, 2)
    ]
    activities = [run_batch, ToolActivities(store).run_tool, ReportActivities(store).write_report]
    goal = spec(workspace, plan={"steps": steps}, allowed_tools=["read_file"], drift_every=0)
    async with Worker(env.client, task_queue=task_queue, workflows=[GoalWorkflow], activities=activities):
        handle, result = await asyncio.wait_for(run_goal(env, task_queue, goal), 30)
        snapshot = await handle.query(GoalWorkflow.progress)
    assert batches == [2]
    assert result.outcome == "succeeded", result.excerpt
    assert {n.name: n.preview for n in snapshot.nodes} == {"read-1": "page 1", "read-2": "page 2"}
