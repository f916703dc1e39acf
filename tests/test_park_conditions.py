"""Parks that end when a condition holds (`perdure park --until-file/--until-command/
--until-signal`), on a real server: each check is an activity in history, polled with
backoff by a durable timer; the goal resumes by itself and says why. Bad conditions are
refused at the door in one line."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import NamedTuple

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from perdure.starters import cli
from perdure.workflows.goal.contracts.goal_contracts import GoalResult
from perdure.workflows.goal.contracts.messages import Park, Signal
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, llm, openai_profile, spec
from tests.helpers import calls_for, goal_result, running_worker, start, submit, wait_until

pytestmark = [pytest.mark.slow]

POLL_MAX_S = 1.5


class ParkCheck(NamedTuple):
    summary: str
    scheduled: datetime
    completed: datetime | None  # None: it never completed (failed, timed out, or still running)
    held: bool


def park_checks(history) -> list[ParkCheck]:
    """Every park check in history, in order: its summary, when it was scheduled and when it
    completed (UTC), and whether the condition held (the check's tool result said ok)."""
    checks: dict[int, ParkCheck] = {}
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            summary = event.user_metadata.summary.data.decode().strip('"') if event.HasField("user_metadata") else ""
            if summary.startswith("park check"):
                checks[event.event_id] = ParkCheck(summary, event.event_time.ToDatetime(UTC), None, False)
        if event.HasField("activity_task_completed_event_attributes"):
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id in checks:
                held = json.loads(done.result.payloads[0].data)["ok"]
                check = checks[done.scheduled_event_id]
                checks[done.scheduled_event_id] = check._replace(completed=event.event_time.ToDatetime(UTC), held=held)
    return [checks[i] for i in sorted(checks)]


# How much later than one longest poll a park may end after its file appeared: the check's
# sandboxed command and two workflow tasks, on a loaded 2-core machine.
RESUME_SLACK_S = 5.0


def assert_resumed_within_one_poll(checks: list[ParkCheck], result: GoalResult, appeared: datetime, poll_max_s: float):
    """The park ended on the first check that ran after the file appeared (one still running
    then may have missed it), and no later than one longest poll (plus slack) after."""
    assert checks and checks[-1].held, checks
    assert not any(c.held for c in checks[:-1]), checks
    missed_after = [c for c in checks[:-1] if c.completed is not None and c.completed >= appeared]
    assert len(missed_after) <= 1, checks  # only a check under way when the file appeared
    assert checks[-1].completed is not None and checks[-1].completed >= appeared, checks
    assert result.decisions is not None and not result.decisions.chunks  # a short log: all of it kept
    ended = [d for d in result.decisions.recent if d.kind == "park" and d.text.startswith("park ended")]
    assert len(ended) == 1, result.decisions.recent
    latency = (ended[0].at - appeared).total_seconds()
    assert 0 < latency <= poll_max_s + RESUME_SLACK_S, (latency, checks)


async def parked_goal(env, task_queue, workspace, **condition):
    handle = await start(env, task_queue, workspace, [llm("only")])
    park = Park(request_id="p1", reason="waiting for CI", poll_first_s=0.5, poll_max_s=POLL_MAX_S, **condition)
    await handle.signal(GoalWorkflow.message_signal, park.model_dump(mode="json"))
    return handle


async def test_park_until_a_file_resumes_within_one_poll_of_it_appearing(env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    handle = await parked_goal(env, task_queue, workspace, until_file="build/READY")
    async with running_worker(env, task_queue, store, openai_profile(server)):
        snapshot = await wait_until(handle, lambda s: s.parked and "checked 3 times" in (s.pause_reason or ""))
        assert "until file build/READY exists" in snapshot.pause_reason
        assert server.requests() == []  # nothing ran while parked
        (workspace / "build").mkdir()
        appeared = datetime.now(UTC)  # just before: the file is there by any check after this
        (workspace / "build" / "READY").touch()
        result = await goal_result(handle)
        history = await handle.fetch_history()
        snapshot = await handle.query(GoalWorkflow.progress)

    checks = park_checks(history)
    assert len(checks) >= 4, checks  # three missed before the file, then the one that saw it
    assert_resumed_within_one_poll(checks, result, appeared, POLL_MAX_S)
    assert all(c.summary == "park check · file build/READY" for c in checks)
    assert any("park ended: file build/READY exists" in entry for entry in snapshot.gate_log)
    assert len(calls_for(server, "only")) == 1


async def test_a_check_that_fails_is_not_yet_and_says_why_and_the_goal_goes_on(
    env, task_queue, store, workspace, scripted
):
    server = scripted(STEP_REPLY)
    handle = await parked_goal(env, task_queue, workspace, until_file="READY")
    async with running_worker(env, task_queue, store, openai_profile(server)):
        await wait_until(handle, lambda s: s.parked and "checked 1 times" in (s.pause_reason or ""))
        moved = workspace.rename(workspace.with_name("elsewhere"))  # the check itself cannot run now
        failing = await wait_until(handle, lambda s: s.parked and "last check: the check failed" in s.pause_reason)
        moved.rename(workspace)
        (workspace / "READY").touch()
        result = await handle.result()
    assert "READY" in failing.pause_reason, failing.pause_reason
    assert result.outcome == "succeeded"  # the failed check neither failed nor ended the goal


async def test_park_until_a_command_succeeds(env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    handle = await parked_goal(env, task_queue, workspace, until_command="test -f ci-passed")
    async with running_worker(env, task_queue, store, openai_profile(server)):
        await wait_until(handle, lambda s: s.parked and "checked 2 times" in (s.pause_reason or ""))
        assert server.requests() == []
        (workspace / "ci-passed").touch()
        await handle.result()
        snapshot = await handle.query(GoalWorkflow.progress)

    assert any("park ended: command `test -f ci-passed` exited 0" in entry for entry in snapshot.gate_log)
    assert len(calls_for(server, "only")) == 1


async def test_park_until_a_signal(env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    handle = await parked_goal(env, task_queue, workspace, until_signal="ci-done")
    async with running_worker(env, task_queue, store, openai_profile(server)):
        snapshot = await wait_until(handle, lambda s: s.parked)
        assert "until signal ci-done" in snapshot.pause_reason
        wrong = await submit(handle, Signal(request_id="s0", name="deploy-done"))
        assert wrong.status == "rejected" and "waits for signal ci-done" in wrong.note
        assert (await handle.query(GoalWorkflow.progress)).parked
        right = await submit(handle, Signal(request_id="s1", name="ci-done"))
        await handle.result()
        history = await handle.fetch_history()
        snapshot = await handle.query(GoalWorkflow.progress)

    assert right.status == "applied"
    assert park_checks(history) == []  # a signal is not polled
    assert any("park ended: signal ci-done received" in entry for entry in snapshot.gate_log)


@pytest.mark.parametrize(
    ("condition", "error"),
    [
        ({"until_file": "../outside"}, "a path inside the goal's workspace"),
        ({"until_file": "/etc/passwd"}, "a path inside the goal's workspace"),
        ({"until_command": "   "}, "an empty command"),
        ({"until_signal": "ci done"}, "letters, digits"),
        ({"until_file": "x", "until_signal": "y"}, "one condition"),
    ],
)
def test_bad_park_conditions_are_refused_in_one_line(condition, error):
    with pytest.raises(ValidationError) as refused:
        Park(request_id="p", reason="r", **condition)
    assert error in str(refused.value)
    with pytest.raises(ValidationError):
        Signal(request_id="s", name="two words")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["signal", "g1", "ci done"], "error: name: signal name 'ci done': a signal name is letters, digits"),
        (["park", "g1", "--reason", "r", "--until-file", "../x"], "error: until_file: until_file must be a path"),
    ],
)
def test_bad_conditions_from_the_cli_are_one_line_with_no_server_asked(args, line):
    # Refused before any connection: no server runs at this address.
    result = CliRunner().invoke(cli.app, args, env={"TEMPORAL_ADDRESS": "127.0.0.1:1"})
    assert result.exit_code == 2
    assert result.output.startswith(line), result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.process
async def test_park_until_a_file_survives_a_worker_sigkill(crash_rig, tmp_path):
    rig = crash_rig()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    step = {"name": "after", "kind": "tool", "tool": "run_command", "args": {"command": "echo went on"}}
    handle = await rig.start_goal(spec(workspace, plan={"steps": [step]}, allowed_tools=["run_command"]))
    park = Park(request_id="p1", reason="waiting for CI", until_file="READY", poll_first_s=0.5, poll_max_s=POLL_MAX_S)
    await handle.signal(GoalWorkflow.message_signal, park.model_dump(mode="json"))
    worker = rig.start_worker()
    await wait_until(handle, lambda s: "checked 2 times" in (s.pause_reason or ""), timeout_s=60)
    worker.kill()  # SIGKILL: the park is state, its next check a durable timer
    await rig.start_worker().wait_polling()
    await wait_until(handle, lambda s: "checked 3 times" in (s.pause_reason or ""), timeout_s=60)
    appeared = datetime.now(UTC)  # just before: the file is there by any check after this
    (workspace / "READY").touch()
    result = await rig.result(handle)
    history = await handle.fetch_history()

    assert result.outcome == "succeeded", result.excerpt
    checks = park_checks(history)
    assert len(checks) >= 4, checks  # three missed (one before the kill), then the one that saw it
    assert_resumed_within_one_poll(checks, result, appeared, POLL_MAX_S)
    assert rig.store.get_text(result.outputs["after"]).startswith("$ echo went on")


async def test_park_time_limit_reached_before_the_file_asks_as_parks_do(ts_env, task_queue, store, workspace, scripted):
    server = scripted(STEP_REPLY)
    handle = await start(ts_env, task_queue, workspace, [llm("only")])
    park = Park(request_id="p1", reason="waiting for CI", until_file="READY", expiry_hours=0.01, poll_max_s=10)
    await handle.signal(GoalWorkflow.message_signal, park.model_dump(mode="json"))
    async with running_worker(ts_env, task_queue, store, openai_profile(server)):
        snapshot = await wait_until(handle, lambda s: s.questions)
        assert snapshot.parked and [q.title for q in snapshot.questions] == ["Still parked: waiting for CI"]
        assert "until file READY exists" in snapshot.pause_reason
        assert server.requests() == []
