"""The watchdog on a real server: runs started directly (as the schedule would)
over real goals, judged as of chosen times so no test waits out a threshold.
What the goals received is read back from their own inbox and questions.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timedelta

import pytest
from temporalio import activity
from temporalio.client import ScheduleOverlapPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker
from typer.testing import CliRunner

from perdure.activities.goal.report import ReportActivities
from perdure.activities.tools.run_tool import ToolActivities
from perdure.activities.watchdog.watchdog_memory import memory_path
from perdure.activities.watchdog.watchdog_visibility import VisibilityActivities
from perdure.starters.cli import app
from perdure.workers import orchestrator, watchdog_schedule
from perdure.workflows.goal.contracts.goal_contracts import Activities, GenerateInput, GenerateResult, Usage
from perdure.workflows.goal.contracts.messages import Answer, Park
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared.contracts import ToolInput, ToolResult
from perdure.workflows.watchdog.watchdog_contracts import ScanInput, WatchdogInput, WatchdogResult
from perdure.workflows.watchdog.watchdog_workflow import WatchdogWorkflow
from tests.builders import STEP_REPLY, gate, llm, openai_profile
from tests.helpers import goal_result, local_activities, running_worker, start, statuses, submit, wait_until

# Waits on purpose (retried activities reaching an attempt, query timeouts, schedules): not in test-fast.
pytestmark = pytest.mark.slow


async def watchdog_run(env, task_queue: str, as_of: datetime | None = None) -> WatchdogResult:
    return await env.client.execute_workflow(
        WatchdogWorkflow.run,
        WatchdogInput(task_queue=task_queue, as_of=as_of),
        id=f"wd-test-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
    )


def watchdog_entries(inbox) -> list[tuple[str, str]]:
    return [(e.request_id, e.kind) for e in inbox.entries if e.request_id.startswith("wd-")]


def kinds(result: WatchdogResult, goal_id: str) -> set[str]:
    return {f.kind for f in result.findings if f.goal_id == goal_id}


async def test_a_stalled_goal_is_nudged_then_escalated_once_each(env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [gate()], stall_after_s=60)
        snapshot = await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
        t0 = snapshot.last_progress_at

        def at(seconds: float) -> datetime:
            return t0 + timedelta(seconds=seconds)

        fresh = await watchdog_run(env, task_queue, at(5))
        assert fresh.sent == [] and fresh.counts == {"healthy": 1}

        first = await watchdog_run(env, task_queue, at(61))
        assert kinds(first, handle.id) == {"stalled"}
        [nudge] = first.sent
        assert nudge.startswith(f"wd-{handle.id}-stalled-nudge-")
        # The same run again, and a later one before the nudge had time to work: nothing more.
        assert (await watchdog_run(env, task_queue, at(61))).sent == []
        assert (await watchdog_run(env, task_queue, at(80))).sent == []
        # Memory lost: the nudge is re-sent under the same id and the inbox takes it once.
        memory_path(store.root.parent, task_queue).unlink()
        assert (await watchdog_run(env, task_queue, at(85))).sent == [nudge]

        escalated = await watchdog_run(env, task_queue, at(120))
        [escalation] = escalated.sent
        assert escalation == nudge.replace("-nudge-", "-escalate-")
        snapshot = await wait_until(handle, lambda s: s.questions)
        assert [q.title for q in snapshot.questions] == ["The watchdog found this goal stalled"]
        assert "a nudge to the model has not helped" in snapshot.questions[0].stuck

        # Waiting for a person is not a stall: days later, nothing more is sent.
        waiting = await watchdog_run(env, task_queue, at(3 * 86400))
        assert waiting.sent == [] and kinds(waiting, handle.id) == {"needs_human"}
        inbox = await handle.query(GoalWorkflow.inbox)
        assert watchdog_entries(inbox) == [(nudge, "steer"), (escalation, "escalate")]
        assert inbox.refused == []

        # Answered: the stall clock restarts where the wait ended, as a new episode.
        question = snapshot.questions[0].id
        await submit(handle, Answer(request_id="a1", question_id=question, choice="continue"))
        await wait_until(handle, lambda s: not s.questions)
        assert (await watchdog_run(env, task_queue, at(3 * 86400 + 10))).sent == []
        again = await watchdog_run(env, task_queue, at(3 * 86400 + 80))
        [second_nudge] = again.sent
        assert "-stalled-nudge-" in second_nudge and second_nudge != nudge

        (workspace / "GO").touch()
        assert (await handle.result()).outcome == "succeeded"


async def test_a_parked_goal_is_never_nudged_and_its_expiry_is_asked_once(
    ts_env, task_queue, store, workspace, scripted
):
    server = scripted(STEP_REPLY)
    handle = await start(ts_env, task_queue, workspace, [llm("only")], stall_after_s=60)
    park = Park(request_id="p1", reason="waiting for the CI run")
    await handle.signal(GoalWorkflow.message_signal, park.model_dump(mode="json"))
    async with running_worker(ts_env, task_queue, store, openai_profile(server)):
        snapshot = await wait_until(handle, lambda s: s.parked)
        expires = snapshot.park_expires_at
        before = [expires - timedelta(hours=47), expires - timedelta(minutes=1)]
        for moment in before:
            result = await watchdog_run(ts_env, task_queue, moment)
            assert result.sent == [] and kinds(result, handle.id) == {"parked"}

        # The goal's own clock runs days ahead (time skipping); its timer asks once.
        await ts_env.fast_forward(handle, timedelta(days=3))
        snapshot = await wait_until(handle, lambda s: s.questions)
        goal_now = await ts_env.get_current_time(handle)
        assert goal_now > expires + timedelta(days=2)
        for moment in [expires + timedelta(minutes=1), goal_now, goal_now + timedelta(hours=7)]:
            result = await watchdog_run(ts_env, task_queue, moment)
            assert result.sent == []
            assert "parked_past_expiry" in kinds(result, handle.id) and "stalled" not in kinds(result, handle.id)
        assert kinds(result, handle.id) == {"parked_past_expiry", "needs_human"}  # unanswered for hours

        snapshot = await handle.query(GoalWorkflow.progress)
        assert [q.title for q in snapshot.questions] == ["Still parked: waiting for the CI run"]
        inbox = await handle.query(GoalWorkflow.inbox)
        assert [(e.request_id, e.kind) for e in inbox.entries] == [("p1", "park")]
        assert server.requests() == []  # nothing ran, nothing was woken
        await submit(handle, Answer(request_id="p2", question_id=snapshot.questions[0].id, choice="abort"))
        assert (await goal_result(handle)).outcome == "aborted"


async def test_a_failing_activity_opens_one_incident_resolved_when_it_succeeds(env, task_queue, store, workspace):
    # The model activity is faked under its real name: what matters is that it fails for a
    # while and then succeeds, which a function says more plainly than a model script.
    upstream = {"down": True}

    @activity.defn(name=Activities.GENERATE)
    async def generate(step: GenerateInput) -> GenerateResult:
        if upstream["down"]:
            raise ApplicationError("HTTP 500: upstream down", type="ModelRetryable")
        return GenerateResult(
            output=await store.aput_text("step done"), preview="step done", usage=Usage(), model="fake"
        )

    real = [
        ToolActivities(store).run_tool,
        ReportActivities(store).write_report,
        *VisibilityActivities(env.client, home=store.root.parent).activities(),
    ]
    worker = Worker(
        env.client, task_queue=task_queue, workflows=[GoalWorkflow, WatchdogWorkflow], activities=[generate, *real]
    )
    async with worker:
        handle = await start(env, task_queue, workspace, [llm("flaky"), gate(["flaky"])])
        await wait_for_attempt(handle, 3)

        first = await watchdog_run(env, task_queue)
        [incident] = first.open_incidents
        assert incident.id == f"{handle.id}/failing/perdure.model.generate"
        assert "upstream down" in incident.detail and incident.kind == "failing"
        second = await watchdog_run(env, task_queue)
        assert [(i.id, i.checks) for i in second.open_incidents] == [(incident.id, 2)]
        assert first.sent == second.sent == []  # an API fault is not the model's to fix

        upstream["down"] = False  # the next attempt succeeds
        await wait_until(handle, lambda s: statuses(s)["flaky"] == "succeeded")
        cleared = await watchdog_run(env, task_queue)
        assert cleared.open_incidents == []
        [resolved] = cleared.resolved_incidents
        assert resolved.id == incident.id and resolved.resolution == "cleared: no longer seen"
        assert (await watchdog_run(env, task_queue)).resolved_incidents == []  # resolved once

        (workspace / "GO").touch()
        await handle.result()


async def test_a_step_whose_local_read_failed_for_good_is_a_finding_not_healthy(env, task_queue, store, workspace):
    tools = ToolActivities(store)

    # Reads fail for good (as in a workspace the worker lacks); the gate runs for real.
    @activity.defn(name=Activities.RUN_TOOL)
    async def run_tool(tool_input: ToolInput) -> ToolResult:
        if tool_input.tool == "read_file":
            raise ApplicationError("the disk is gone", type="DiskGone", non_retryable=True)
        return await tools.run_tool(tool_input)

    real = [
        ReportActivities(store).write_report,
        *VisibilityActivities(env.client, home=store.root.parent).activities(),
    ]
    worker = Worker(
        env.client, task_queue=task_queue, workflows=[GoalWorkflow, WatchdogWorkflow], activities=[run_tool, *real]
    )
    read = {"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md"}}
    async with worker:
        handle = await start(env, task_queue, workspace, [read, gate()])
        await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
        while not local_activities(await handle.fetch_history()):
            await asyncio.sleep(0.1)  # the read's failure has reached the goal
        result = await watchdog_run(env, task_queue)
        assert result.counts == {"step_failed": 1}  # not "healthy"
        [finding] = [f for f in result.findings if f.goal_id == handle.id]
        assert finding.kind == "step_failed" and finding.detail == "1 step(s) failed: read: the disk is gone (DiskGone)"
        assert result.sent == []
        (workspace / "GO").touch()
        assert (await asyncio.wait_for(handle.result(), 30)).outcome == "partial"


async def wait_for_attempt(handle, attempt: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pending = (await handle.describe()).raw_description.pending_activities
        if any(p.attempt >= attempt for p in pending):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no pending activity reached attempt {attempt}")


async def test_a_goal_no_worker_answers_for_is_an_incident(env, task_queue, store, workspace):
    handle = await start(env, task_queue, workspace, [llm("only")])
    activities = VisibilityActivities(env.client, home=store.root.parent)
    # Visibility is eventually consistent: a goal just started may take a moment to be listed.
    for _ in range(50):
        scan = await ActivityEnvironment().run(activities.scan, ScanInput(task_queue=task_queue, query_timeout_s=1))
        if scan.goals:
            break
        await asyncio.sleep(0.1)
    [row] = scan.goals
    assert row.goal_id == handle.id and row.query_error == "no worker answered within 1 s"
    await handle.terminate("test over")


async def test_two_workers_make_one_schedule_and_restarts_keep_it(env, task_queue, tmp_path, monkeypatch):
    monkeypatch.setenv("PERDURE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PERDURE_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("PERDURE_WATCHDOG_INTERVAL_S", "3600")
    sid = watchdog_schedule.schedule_id(task_queue)
    schedule = env.client.get_schedule_handle(sid)
    try:
        workers = [asyncio.create_task(orchestrator.run_orchestrator(env.client, task_queue)) for _ in range(2)]
        created = await eventually(schedule.describe)
        assert await listed_schedules(env, sid) == [sid]
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

        restarted = asyncio.create_task(orchestrator.run_orchestrator(env.client, task_queue))
        await asyncio.sleep(1)
        restarted.cancel()
        await asyncio.gather(restarted, return_exceptions=True)
        kept = await schedule.describe()
        assert kept.info.created_at == created.info.created_at and kept.info.last_updated_at is None
        assert [i.every for i in kept.schedule.spec.intervals] == [timedelta(hours=1)]
        assert kept.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP

        # A new interval updates the same schedule; a pause made by a person survives it.
        await schedule.pause(note="maintenance")
        ensured = await watchdog_schedule.ensure_watchdog_schedule(env.client, timedelta(seconds=90), task_queue)
        assert ensured.outcome == "updated"
        updated = await schedule.describe()
        assert [i.every for i in updated.schedule.spec.intervals] == [timedelta(seconds=90)]
        assert updated.schedule.state.paused and updated.schedule.state.note == "maintenance"
        assert await listed_schedules(env, sid) == [sid]
    finally:
        await schedule.delete()


async def eventually(probe, timeout_s: float = 15):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await probe()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def listed_schedules(env, sid: str) -> list[str]:
    """Schedules whose id starts with `sid`, once visibility lists it."""
    deadline = time.monotonic() + 10
    while True:
        ids = [s.id async for s in await env.client.list_schedules() if s.id.startswith(sid)]
        if ids or time.monotonic() > deadline:
            return ids
        await asyncio.sleep(0.2)


async def test_watchdog_cli_status_pause_run_now_and_report(env, task_queue, store, workspace, scripted, monkeypatch):
    home = store.root.parent
    monkeypatch.setenv("PERDURE_TEMPORAL", env.client.service_client.config.target_host)
    monkeypatch.setenv("PERDURE_TASK_QUEUE", task_queue)
    monkeypatch.setenv("PERDURE_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()

    async def perdure(*args: str) -> str:
        result = await asyncio.to_thread(runner.invoke, app, ["watchdog", *args])
        return result.output

    assert "no watchdog schedule" in await perdure("status")
    server = scripted(STEP_REPLY)
    sid = watchdog_schedule.schedule_id(task_queue)
    try:
        await watchdog_schedule.ensure_watchdog_schedule(env.client, timedelta(hours=1), task_queue)
        async with running_worker(env, task_queue, store, openai_profile(server)):
            handle = await start(env, task_queue, workspace, [gate()])
            await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
            assert "active · every 60 min" in await perdure("status")
            assert "watchdog paused" in await perdure("pause", "--note", "quiet please")
            assert "paused" in (status := await perdure("status")) and "quiet please" in status
            await perdure("resume")
            ran = await perdure("run-now")
            assert f"watchdog run {sid}-" in ran and "1 goal(s)" in ran and "1 healthy" in ran
            assert "every goal is healthy" in ran
            report = await perdure("report", "--all")
            assert "no open incidents" in report and handle.id in report and "healthy" in report
            # Without the memory file here, the report falls back to the last run's result.
            memory_path(home, task_queue).unlink()
            assert "showing the schedule's last finished run" in await perdure("report")
            (workspace / "GO").touch()
            await handle.result()
    finally:
        await env.client.get_schedule_handle(sid).delete()


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.delenv("PERDURE_WATCHDOG_INTERVAL_S", raising=False)
    assert watchdog_schedule.interval_from_env() == timedelta(seconds=60)
    monkeypatch.setenv("PERDURE_WATCHDOG_INTERVAL_S", "off")
    assert watchdog_schedule.interval_from_env() is None
    monkeypatch.setenv("PERDURE_WATCHDOG_INTERVAL_S", "soon")
    with pytest.raises(ValueError, match="PERDURE_WATCHDOG_INTERVAL_S must be a number"):
        watchdog_schedule.interval_from_env()
