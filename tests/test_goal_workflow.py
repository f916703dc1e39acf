"""GoalWorkflow on a real dev server, with the real openai/anthropic clients
talking HTTP to a scripted model server, real files and real subprocesses.
"""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from perdure.workflows.goal.contracts.goal_contracts import Activities, GoalResult
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import SUMMARY_TEXT, anthropic_profile, demo_script, openai_profile, spec, write_notes
from tests.helpers import (
    largest_event_bytes,
    local_activities,
    run_goal,
    running_worker,
    scheduled_activities,
    started_attempts,
    tool_timeline,
)


@pytest.mark.slow
async def test_demo_shaped_goal_completes_over_http(env, task_queue, store, workspace, scripted):
    write_notes(workspace)
    server = scripted(demo_script())
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(env, task_queue, spec(workspace))
        snapshot = await handle.query(GoalWorkflow.progress)

    assert isinstance(result, GoalResult)
    assert result.outcome == "succeeded", result.excerpt
    assert (workspace / "SUMMARY.md").read_text() == SUMMARY_TEXT
    assert set(result.outputs) == {"inventory", "read-ideas", "read-todo", "summarize", "write-summary"}
    assert store.get_text(result.outputs["read-todo"]) == "- [ ] fix the CSV parser\n- [ ] retry uploads\n"
    assert "12 words" in store.get_text(result.outputs["write-summary"])
    report = store.get_text(result.report)
    assert "write-summary" in report and "succeeded" in report
    # planner + summarize + three agent turns, each priced from the profile
    assert snapshot.model_calls == 5 and snapshot.tool_calls == 5
    assert snapshot.counts == {"succeeded": 5}
    assert snapshot.percent_done == 100 and result.cost_usd > 0 and result.tokens > 0

    history = await handle.fetch_history()
    activities = scheduled_activities(history)
    summaries = [summary for _, _, summary in activities]
    assert summaries[0] == "plan"
    assert any(s.startswith("agent turn 3/8 · write-summary") for s in summaries)
    assert summaries[-1] == "report · succeeded"
    # The three independent reads ran together as one segment of local activities,
    # committed by one workflow task, before the next model call was scheduled.
    tool_calls = [(eid, s, task) for eid, kind, s, task in local_activities(history) if kind == Activities.RUN_TOOL]
    reads = [(eid, s, task) for eid, s, task in tool_calls if "turn" not in s]
    assert sorted(s.split(" · ")[1] for _, s, _ in reads) == ["inventory", "read-ideas", "read-todo"]
    assert len({task for _, _, task in reads}) == 1
    summarize_scheduled = next(eid for eid, _, s in activities if s.startswith("llm · summarize"))
    assert max(eid for eid, _, _ in reads) < summarize_scheduled
    placements = {n.name: n.placements for n in snapshot.nodes}
    assert placements["read-todo"]["read_file"].startswith("local activity: read, safe to re-run")
    assert placements["write-summary"]["run_command"].startswith("activity: replay policy 'once'")
    # History carries references, not outputs.
    assert largest_event_bytes(history) < 16_000


@pytest.mark.slow
async def test_invalid_plan_is_repaired_once_then_accepted(env, task_queue, store, workspace, scripted):
    write_notes(workspace)
    bad_plan = {"steps": [{"name": "a", "kind": "tool", "tool": "delete_everything", "args": {}}]}
    script = demo_script()
    script["replies"].insert(0, {"when": "PERDURE-PLANNER", "times": 1, "json": bad_plan})
    server = scripted(script)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(env, task_queue, spec(workspace))

    assert result.outcome == "succeeded"
    planner_requests = [r for r in server.requests() if r.get("matched") in (0, 1)]
    assert [r["matched"] for r in planner_requests] == [0, 1]
    assert "unknown tool 'delete_everything'" in planner_requests[1]["last_message"]
    summaries = [s for _, _, s in scheduled_activities(await handle.fetch_history())]
    assert summaries[:2] == ["plan", "plan · repair 1 of 2"]


async def test_plan_still_invalid_after_repairs_fails_with_reason(env, task_queue, store, workspace, scripted):
    cyclic = {
        "steps": [
            {"name": "a", "kind": "llm", "needs": ["b"], "prompt": "x"},
            {"name": "b", "kind": "llm", "needs": ["a"], "prompt": "y"},
        ]
    }
    server = scripted({"replies": [{"when": "PERDURE-PLANNER", "json": cyclic}]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, _ = await run_goal(env, task_queue, spec(workspace, max_plan_repairs=1))
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()

    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "GoalFailed"
    assert "no valid plan in 2 attempt(s)" in cause.message
    assert "cycle: a -> b -> a" in cause.message
    assert len(server.requests()) == 2
    # The report node still ran and is attached to the failure.
    failed = GoalResult.model_validate(cause.details[0])
    assert failed.outcome == "failed" and "cycle" in store.get_text(failed.report)


@pytest.mark.slow
async def test_model_500_is_retried(env, task_queue, store, workspace, scripted):
    write_notes(workspace)
    script = demo_script()
    script["replies"].insert(0, {"when": "PERDURE-PLANNER", "times": 1, "status": 500, "headers": {"Retry-After": "1"}})
    server = scripted(script)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(env, task_queue, spec(workspace))

    assert result.outcome == "succeeded"
    history = await handle.fetch_history()
    plan_event = scheduled_activities(history)[0][0]
    assert started_attempts(history)[plan_event] == 2
    assert [r["status"] for r in server.requests()][:2] == [500, 200]


async def test_model_400_is_not_retried(env, task_queue, store, workspace, scripted):
    write_notes(workspace)
    script = demo_script()
    script["replies"].insert(
        0,
        {
            "when": "PERDURE-STEP",
            "status": 400,
            "body": {"error": {"message": "prompt is too long", "type": "invalid_request_error"}},
        },
    )
    server = scripted(script)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(env, task_queue, spec(workspace))
        snapshot = await handle.query(GoalWorkflow.progress)

    assert result.outcome == "partial"
    nodes = {n.name: n for n in snapshot.nodes}
    assert nodes["summarize"].status == "failed"
    assert "prompt is too long" in (nodes["summarize"].error or "")
    assert nodes["write-summary"].status == "abandoned"
    assert sum(1 for r in server.requests() if r["status"] == 400) == 1
    assert result.failed_steps == ["summarize", "write-summary"]


@pytest.mark.slow
async def test_anthropic_provider_runs_a_goal(env, task_queue, store, workspace, scripted):
    write_notes(workspace)
    server = scripted(demo_script())
    async with running_worker(env, task_queue, store, anthropic_profile(server)):
        _, result = await run_goal(env, task_queue, spec(workspace))

    assert result.outcome == "succeeded", result.excerpt
    assert (workspace / "SUMMARY.md").read_text() == SUMMARY_TEXT
    paths = {r["path"] for r in server.requests()}
    assert paths == {"/v1/messages"}


async def test_failing_tool_fails_its_node_with_the_reason(env, task_queue, store, workspace, scripted):
    plan = {
        "steps": [
            {"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "missing.txt"}},
            {"name": "use", "kind": "llm", "needs": ["read"], "prompt": "use it"},
        ]
    }
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(env, task_queue, spec(workspace, plan=plan))
        snapshot = await handle.query(GoalWorkflow.progress)

    nodes = {n.name: n for n in snapshot.nodes}
    assert result.outcome == "failed" and result.failure == "no step succeeded (1 failed, 1 abandoned)"
    assert nodes["read"].status == "failed" and "missing.txt" in (nodes["read"].error or "")
    assert nodes["use"].status == "abandoned"
    assert server.requests() == []


async def test_identical_work_gets_one_key_and_runs_once(env, task_queue, store, workspace, scripted):
    (workspace / "a.txt").write_text("same")
    plan = {
        "steps": [
            {"name": "first", "kind": "tool", "tool": "read_file", "args": {"path": "a.txt"}},
            {"name": "again", "kind": "tool", "tool": "read_file", "args": {"path": "a.txt"}, "needs": ["first"]},
            {"name": "copy", "kind": "tool", "tool": "read_file", "args": {"path": "a.txt"}, "needs": ["first"]},
        ]
    }
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(env, task_queue, spec(workspace, plan=plan))
        snapshot = await handle.query(GoalWorkflow.progress)

    keys = {n.name: n.key for n in snapshot.nodes}
    # "again" and "copy" have the same kind, input and dependency digests.
    assert keys["again"] == keys["copy"] != keys["first"]
    assert len(tool_timeline(await handle.fetch_history())) == 2
    assert result.outcome == "succeeded"


async def test_plan_file_with_forbidden_tool_fails_clearly(env, task_queue, store, workspace, scripted):
    plan = {"steps": [{"name": "w", "kind": "tool", "tool": "write_file", "args": {"path": "x", "content": "y"}}]}
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        _, result = await run_goal(env, task_queue, spec(workspace, plan=plan, allowed_tools=["read_file"]))
    assert result.outcome == "failed" and "tool 'write_file' is not allowed" in (result.failure or "")
    assert not (workspace / "x").exists()
