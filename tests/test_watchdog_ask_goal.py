"""`perdure watchdog ask` about a real goal on the session's dev server: the scripted model
reads the goal's progress and its pending activities with the CLI's tools (the results it
is sent are the goal's real phase, running steps and pending activities), then proposes a
nudge, which reaches the goal's inbox as a steer only when the maintainer confirms (--yes),
never with --no. Through the CLI, against the production worker; requests logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from types import SimpleNamespace

import pytest
from temporalio.api.enums.v1 import EventType
from typer.testing import CliRunner

from perdure.starters.cli import app
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, gate, llm, openai_profile
from tests.helpers import running_worker, start, statuses, wait_until

pytestmark = pytest.mark.slow

NUDGE_TEXT = "[watchdog] the gate waits for a file nobody creates; ask the maintainer for GO"


def ask_script(goal_id: str) -> dict:
    """progress of the goal, then its pending activities, then an answer proposing a nudge."""
    answer = {
        "answer": f"{goal_id} is waiting at its gate step, whose command is still running",
        "propose": {"nudge": goal_id, "text": NUDGE_TEXT},
    }
    return {
        "replies": [
            {"when_last": "TOOL RESULT pending", "content": json.dumps(answer)},
            {"when_last": "TOOL RESULT progress", "content": json.dumps({"tool": "pending", "goal": goal_id})},
            {"when": "PERDURE-WATCHDOG-ASK", "content": json.dumps({"tool": "progress", "goal": goal_id})},
        ]
    }


async def ask(env, tmp_path, task_queue: str, server, goal_id: str, *flags: str):
    """`perdure watchdog ask` in a thread (it runs its own event loop), against this test's server."""
    config = tmp_path / "ask-config.toml"
    config.write_text(
        f'[profiles.wd]\nprovider = "openai"\nmodel = "scripted"\nbase_url = "{server.openai_base_url}"\n',
        encoding="utf-8",
    )
    cli_env = {
        "PERDURE_TEMPORAL": env.client.service_client.config.target_host,
        "PERDURE_HOME": str(tmp_path / "home"),
        "PERDURE_CONFIG": str(config),
        "PERDURE_TASK_QUEUE": task_queue,
        "PERDURE_USER": "maintainer",
        "COLUMNS": "250",
    }
    args = ["watchdog", "ask", f"why is {goal_id} not finishing?", "--profile", "wd", *flags]
    result = await asyncio.to_thread(CliRunner().invoke, app, args, env=cli_env)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output, result.output
    # Rich wraps to the console's width, which an earlier test's console may have fixed.
    return SimpleNamespace(output=" ".join(result.output.split()))


def tool_result(request: dict, tool: str):
    prefix = f"TOOL RESULT {tool}: "
    assert request["last_message"].startswith(prefix), request["last_message"]
    return json.loads(request["last_message"].removeprefix(prefix))


async def ask_entries(handle) -> list[tuple[str, str]]:
    inbox = await handle.query(GoalWorkflow.inbox)
    return [(e.request_id, e.kind) for e in inbox.entries if e.request_id.startswith("wd-ask-")]


async def messages_admitted(handle) -> int:
    """Messages the server took for the goal, by signal or by update (a steer goes either way)."""
    history = await handle.fetch_history()
    kinds = (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)
    return sum(e.event_type in kinds for e in history.events)


async def test_ask_reads_a_goals_progress_and_pending_activities_and_nudges_it_only_when_confirmed(
    env, task_queue, store, workspace, scripted, tmp_path
):
    goal_model = scripted(STEP_REPLY)
    async with running_worker(env, task_queue, store, openai_profile(goal_model)):
        handle = await start(env, task_queue, workspace, [llm("read"), gate(["read"])])
        at_gate = await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
        model = scripted(ask_script(handle.id))

        refused = await ask(env, tmp_path, task_queue, model, handle.id, "--no")
        out = refused.output
        assert f"watchdog reads progress of {handle.id}" in out and f"watchdog reads pending of {handle.id}" in out
        assert f"proposed: nudge {handle.id}: {NUDGE_TEXT}" in out and "not applied" in out
        assert "applied: nudge" not in out

        # The model was sent the goal's real state, read over the server.
        first, after_progress, after_pending = model.requests()
        assert first["last_message"] == f"why is {handle.id} not finishing?"
        progress = tool_result(after_progress, "progress")
        assert progress["phase"] == at_gate.phase == "running"
        assert progress["running"] == at_gate.running == ["gate"]
        assert set(progress) == {"phase", "running", "percent_done", "last_progress_at", "conclusions", "gate_log"}
        assert progress["percent_done"] == at_gate.percent_done
        pending = tool_result(after_pending, "pending")
        assert isinstance(pending, list)
        described = await handle.describe()
        live = [p.activity_type.name for p in described.raw_description.pending_activities]
        assert [p["activity_type"] for p in pending] == live and live, "the gate's command is a pending activity"
        assert all(p["state"] == "started" and p["attempt"] == 1 for p in pending), pending

        # --no sent nothing: no message in the goal's history, nothing from ask in its inbox.
        assert await messages_admitted(handle) == 0
        assert await ask_entries(handle) == []

        applied = await ask(env, tmp_path, task_queue, model, handle.id, "--yes")
        rid = "wd-ask-" + hashlib.sha256(f"{handle.id}\n{NUDGE_TEXT}".encode()).hexdigest()[:16]
        assert f"applied: nudge {handle.id} ({rid})" in applied.output, applied.output
        assert "not applied" not in applied.output
        assert len(model.requests()) == 6  # the same three turns again

        deadline = time.monotonic() + 10
        while not (entries := await ask_entries(handle)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert entries == [(rid, "steer")]
        assert await messages_admitted(handle) == 1
        assert (await handle.query(GoalWorkflow.progress)).phase == "running"  # nudged, not ended
        # Asked again, the same nudge is not sent twice, and the CLI says so.
        again = await ask(env, tmp_path, task_queue, model, handle.id, "--yes")
        assert f"already delivered: nudge {handle.id} ({rid}); nothing sent again" in again.output, again.output
        assert await messages_admitted(handle) == 1
        print(refused.output, applied.output, sep="\n")
        await handle.terminate("test over")


async def test_ask_about_a_goal_the_server_does_not_know_tells_the_model_the_error_and_applies_nothing(
    env, task_queue, scripted, tmp_path
):
    missing = "goal-that-never-ran"
    model = scripted(
        {
            "replies": [
                {"when_last": "TOOL RESULT progress", "content": json.dumps({"answer": "no such goal"})},
                {"when": "PERDURE-WATCHDOG-ASK", "content": json.dumps({"tool": "progress", "goal": missing})},
            ]
        }
    )
    result = await ask(env, tmp_path, task_queue, model, missing, "--yes")
    assert "watchdog: no such goal" in result.output and "applied" not in result.output
    _, after_progress = model.requests()
    told = after_progress["last_message"]
    assert told.startswith("TOOL RESULT progress: ") and f"no goal with id '{missing}'" in told, told


async def test_a_nudge_to_no_goal_or_too_long_to_send_is_refused_before_the_maintainer_is_asked(
    env, task_queue, scripted, tmp_path
):
    def proposing(target: str, text: str) -> dict:
        answer = {"answer": "nudge it", "propose": {"nudge": target, "text": text}}
        return {"replies": [{"when": "PERDURE-WATCHDOG-ASK", "content": json.dumps(answer)}]}

    nowhere = await ask(env, tmp_path, task_queue, scripted(proposing("goal-that-never-ran", "go on")), "x", "--yes")
    assert "proposal refused: no goal 'goal-that-never-ran'" in nowhere.output, nowhere.output
    assert "proposed:" not in nowhere.output and "applied" not in nowhere.output
    huge = await ask(env, tmp_path, task_queue, scripted(proposing("goal-that-never-ran", "x" * 9000)), "x", "--yes")
    assert "proposal refused: the nudge's text is not a message a goal takes" in huge.output, huge.output
    assert "proposed:" not in huge.output
