"""Subgoals: a plan step of kind `subgoal` runs as a child goal (its own workflow, plan,
inbox and share of the budget), joined all_settled or fail_fast; the parent's steering
reaches its children; the parent's ledger and report include theirs. Against a dev
server with the production worker and a scripted model."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError

from perdure.workflows.goal.contracts.goal_contracts import GoalResult, Signals
from perdure.workflows.goal.contracts.messages import Abort, Park, Resume, Signal, Steer
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, gate, llm, openai_profile, spec
from tests.helpers import goal_result, perdure_status, running_worker, start, statuses, submit, wait_until


def read(name: str, path: str) -> dict:
    return {"name": name, "kind": "tool", "tool": "read_file", "args": {"path": path}}


def subgoal(name: str, steps: list[dict], **extra) -> dict:
    return {"name": name, "kind": "subgoal", "goal": f"Do part {name}.", "plan": {"steps": steps}, **extra}


async def child_result(env, child_id: str) -> GoalResult:
    return await env.client.get_workflow_handle(child_id, result_type=GoalResult).result()


async def started(env, child_id: str):
    """The child's handle once its parent has started it."""
    handle = env.client.get_workflow_handle(child_id, result_type=GoalResult)
    for _ in range(200):
        try:
            await handle.describe()
            return handle
        except RPCError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"{child_id} was never started")


async def test_two_subgoals_run_as_child_goals_and_the_parent_counts_what_they_spent(
    env, task_queue, store, workspace, scripted
):
    server = scripted(STEP_REPLY)
    (workspace / "notes.md").write_text("a note\n")
    steps = [
        subgoal("part-a", [llm("sum-a")], budget_share=0.5),
        subgoal("part-b", [read("read-b", "notes.md")]),
        read("after", "notes.md") | {"needs": ["part-a", "part-b"]},
    ]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(
            env, task_queue, workspace, steps, allowed_tools=["read_file"], budget={"max_tokens": 100_000}
        )
        result = await asyncio.wait_for(handle.result(), 60)
        a = await child_result(env, f"{handle.id}--part-a-1")
        b = await child_result(env, f"{handle.id}--part-b-1")
        child_a = await env.client.get_workflow_handle(f"{handle.id}--part-a-1").describe()
    assert result.outcome == "succeeded" and (a.outcome, b.outcome) == ("succeeded", "succeeded")
    assert a.tokens > 0 and result.tokens == a.tokens + b.tokens  # the parent made no model call of its own
    assert store.get_text(result.outputs["part-a"]) == store.get_text(a.report)  # the child's report is its output
    assert child_a.parent_id == handle.id
    assert len([r for r in server.requests() if r["last_message"].startswith("step: sum-a\n")]) == 1


async def test_a_failed_fail_fast_subgoal_stops_its_running_sibling_and_the_parent_waits_for_it(
    env, task_queue, store, workspace
):
    steps = [
        subgoal("broken", [read("missing", "nope.md")], join="fail_fast"),
        subgoal("slow", [gate()], join="fail_fast"),
    ]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["read_file", "run_command"])
        result = await asyncio.wait_for(goal_result(handle), 60)
        slow = env.client.get_workflow_handle(f"{handle.id}--slow-1", result_type=GoalResult)
        slow_result = await asyncio.wait_for(goal_result(slow), 10)
        parent_events = (await handle.fetch_history()).events
    assert result.outcome == "failed" and sorted(result.failed_steps) == ["broken", "slow"]
    assert slow_result.outcome == "aborted"  # asked to stop, with rollback, by its failed sibling
    # The parent decided only once both children had told it how they ended (a child closes
    # in the workflow task after it signals, so close times alone may come in either order).
    settled = Signals.SUBGOAL_SETTLED
    told = [e.event_id for e in parent_events if e.workflow_execution_signaled_event_attributes.signal_name == settled]
    ended = parent_events[-1]
    assert ended.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED  # no step of it succeeded
    assert len([i for i in told if i < ended.event_id]) == 2, told


@pytest.mark.slow
async def test_park_resume_steer_and_abort_of_a_parent_reach_its_running_subgoal(env, task_queue, store, workspace):
    steps = [subgoal("waiting", [gate()])]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["run_command"])
        child = await started(env, f"{handle.id}--waiting-1")
        await wait_until(child, lambda s: "gate" in s.running)
        shown = await perdure_status(env, handle.id)
        assert f"runs as goal {child.id}" in shown  # the parent's step row
        assert f"└ waiting → {child.id} · phase running" in shown  # and the child under it
        await submit(handle, Park(request_id="pk-1", reason="lunch"))
        parked = await wait_until(child, lambda s: s.parked)
        await submit(handle, Resume(request_id="rs-1"))
        await wait_until(child, lambda s: not s.parked)
        await submit(handle, Steer(request_id="st-1", text="prefer small diffs"))
        await wait_until_inbox_has(child, "parent.st-1")
        await submit(handle, Abort(request_id="ab-1", reason="priorities changed"))
        result = await asyncio.wait_for(goal_result(handle), 30)
        child_outcome = (await asyncio.wait_for(goal_result(child), 10)).outcome
        inbox = await child.query(GoalWorkflow.inbox)
    assert parked.pause_reason == "lunch"
    assert result.outcome == "aborted" and child_outcome == "aborted"
    told = {(e.request_id, e.kind) for e in inbox.entries}
    assert {("parent.pk-1", "park"), ("parent.rs-1", "resume"), ("parent.st-1", "steer")} <= told


@pytest.mark.slow
async def test_a_parent_parked_until_a_signal_parks_its_subgoal_until_it_resumes(env, task_queue, store, workspace):
    steps = [subgoal("waiting", [gate()])]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["run_command"])
        child = await started(env, f"{handle.id}--waiting-1")
        await wait_until(child, lambda s: "gate" in s.running)
        await submit(handle, Park(request_id="pk-1", reason="CI", until_signal="ci-done"))
        parked = await wait_until(child, lambda s: s.parked)
        await submit(handle, Signal(request_id="sg-1", name="ci-done"))  # it reaches only the parent
        resumed = await wait_until(child, lambda s: not s.parked)
        await submit(handle, Abort(request_id="ab-1"))
        await asyncio.wait_for(goal_result(handle), 30)
    assert parked.pause_reason == "CI (until the parent goal resumes)"
    assert not resumed.parked


async def wait_until_inbox_has(handle, request_id: str) -> None:
    for _ in range(100):
        if any(e.request_id == request_id for e in (await handle.query(GoalWorkflow.inbox)).entries):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{request_id} never reached the child")


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_a_subgoal_step_refuses_a_budget_share_outside_zero_to_one(share):
    from pydantic import ValidationError

    from perdure.workflows.goal.contracts.plan import Plan

    with pytest.raises(ValidationError, match="budget_share"):
        Plan.model_validate({"steps": [subgoal("x", [read("r", "a.md")], budget_share=share)]})


def test_a_subgoal_step_needs_a_goal_or_a_plan():
    from pydantic import ValidationError

    from perdure.workflows.goal.contracts.plan import Plan

    with pytest.raises(ValidationError, match="needs a goal \\(text\\) or a plan"):
        Plan.model_validate({"steps": [{"name": "x", "kind": "subgoal"}]})


@pytest.mark.process
async def test_a_worker_killed_while_a_subgoal_runs_leaves_parent_and_child_to_the_next_worker(
    env, crash_rig, tmp_path
):
    rig = crash_rig()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    waiting = gate() | {"args": {"command": gate()["args"]["command"], "replay": "safe"}}
    goal = spec(
        workspace,
        plan={"steps": [subgoal("part", [waiting]), read("after", "GO") | {"needs": ["part"]}]},
        allowed_tools=["run_command", "read_file"],
    )
    worker = rig.start_worker()
    parent = await rig.start_goal(goal)
    child = await started(env, f"{parent.id}--part-1")
    await wait_until(child, lambda s: "gate" in s.running, timeout_s=60)
    worker.kill()  # SIGKILL, with the child's command in flight
    second = rig.start_worker()
    (workspace / "GO").write_text("go\n")
    try:
        result = await rig.result(parent, timeout_s=90)
    except TimeoutError:
        child_says = await child.query(GoalWorkflow.progress)
        raise AssertionError(
            f"the parent did not finish; child: {child_says.phase} {child_says.running}; "
            f"second worker's log:\n{second.log_tail()}"
        ) from None
    child_outcome = (await child.result()).outcome
    assert result.outcome == "succeeded" and child_outcome == "succeeded"
    assert rig.store.get_text(result.outputs["after"]) == "go\n"


async def test_a_planner_may_propose_a_subgoal_and_the_goal_runs_it_as_a_child(
    env, task_queue, store, workspace, scripted
):
    (workspace / "notes.md").write_text("a note\n")
    planned = {"steps": [subgoal("survey", [read("look", "notes.md")], budget_share=0.3)]}
    server = scripted({"replies": [{"when": "[PERDURE-PLANNER]", "json": planned}]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, allowed_tools=["read_file"], drift_every=0)),
            id=f"planned-{task_queue}",
            task_queue=task_queue,
        )
        result = await asyncio.wait_for(handle.result(), 60)
        child = await child_result(env, f"{handle.id}--survey-1")
    assert result.outcome == "succeeded" and child.outcome == "succeeded"
    assert "survey" in result.outputs


@pytest.mark.slow
async def test_a_parent_continues_as_new_while_its_subgoal_runs_and_still_hears_how_it_ended(
    env, task_queue, store, workspace
):
    (workspace / "notes.md").write_text("a note\n")
    # A chain: each read completes in a workflow task of its own, so the first run passes 60
    # events however loaded the machine (reads ready together may all complete in one task).
    reads = [
        read(f"r{i:02d}", "notes.md")
        | {"args": {"path": "notes.md", "max_bytes": 100 + i}, "needs": [f"r{i - 1:02d}"] if i else []}
        for i in range(12)
    ]
    steps = [subgoal("waiting", [gate()]), *reads]
    async with running_worker(env, task_queue, store):
        handle = await start(
            env,
            task_queue,
            workspace,
            steps,
            allowed_tools=["read_file", "run_command"],
            continue_as_new_after_events=60,
            local_activities_up_to_s=0,
        )
        child = await started(env, f"{handle.id}--waiting-1")
        await wait_until(
            handle, lambda s: s.runs >= 2 and all(n.status == "succeeded" for n in s.nodes if n.name != "waiting")
        )
        (workspace / "GO").write_text("")
        result = await asyncio.wait_for(handle.result(), 30)
        child_outcome = (await child.result()).outcome
    assert result.outcome == "succeeded" and child_outcome == "succeeded"
    assert "waiting" in result.outputs  # the child's report, taken by a later run than the one that started it


async def test_a_forged_or_malformed_subgoal_settled_signal_changes_nothing(env, task_queue, store, workspace):
    steps = [subgoal("waiting", [gate()])]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["run_command"])
        child = await started(env, f"{handle.id}--waiting-1")
        await wait_until(child, lambda s: "gate" in s.running)
        await handle.signal("subgoal_settled", "not an outcome")
        await handle.signal("subgoal_settled")  # no argument at all
        await handle.signal("subgoal_settled", {"child_id": "someone-else", "failure": "made up"})
        await handle.signal("subgoal_settled", {"child_id": child.id, "result": {"outcome": "nonsense"}})
        still = await wait_until(handle, lambda s: True)
        (workspace / "GO").write_text("")
        result = await asyncio.wait_for(handle.result(), 30)
    assert statuses(still)["waiting"] == "running"  # nothing settled it but its child
    assert result.outcome == "succeeded"


async def granted_budget(env, child_id: str):
    """The budget a child goal was started with (its start event's input)."""
    history = await env.client.get_workflow_handle(child_id).fetch_history()
    payloads = history.events[0].workflow_execution_started_event_attributes.input.payloads
    [started_with] = await env.client.data_converter.decode(payloads, [GoalInput])
    return started_with.spec.budget


@pytest.mark.slow
async def test_subgoals_started_side_by_side_are_granted_no_more_than_the_parent_has_left(
    env, task_queue, store, workspace, scripted
):
    server = scripted(STEP_REPLY)
    steps = [
        llm("first"),
        subgoal("part-a", [gate()], budget_share=0.6) | {"needs": ["first"]},
        subgoal("part-b", [gate()], budget_share=0.6) | {"needs": ["first"]},
    ]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(
            env, task_queue, workspace, steps, allowed_tools=["run_command"], budget={"max_tokens": 10_000}
        )
        await started(env, f"{handle.id}--part-a-1")
        await started(env, f"{handle.id}--part-b-1")
        shown = await perdure_status(env, handle.id)
        (workspace / "GO").write_text("")
        result = await asyncio.wait_for(handle.result(), 60)
        grants = [await granted_budget(env, f"{handle.id}--part-{p}-1") for p in "ab"]
    assert result.outcome == "succeeded"
    first = grants[0].max_tokens
    assert first == 6_000  # the share of the limit: 10,000 x 0.6, the parent having spent less than 4,000
    spent_first = result.tokens  # the children made no model call
    assert 0 < spent_first < 4_000
    assert grants[1].max_tokens == 10_000 - first - spent_first  # the rest, not another 6,000
    assert "with running subgoals" in shown, shown


def test_a_tool_named_only_in_a_subgoals_plan_is_allowed_by_the_start_that_names_it(tmp_path):
    """`perdure start --plan`, the web UI and the MCP server allow the tools a plan file names;
    a subgoal's own plan and its `tools` are part of that file, so its tools are allowed too
    (the goal would otherwise start, then fail with "tool 'http_request' is not allowed")."""
    from perdure.starters.client.goal_specs import StartRequest, load_plan_file, plan_tools, start_spec
    from perdure.workflows.goal.contracts.plan import check_plan

    post = {"name": "post", "kind": "tool", "tool": "http_request",
            "args": {"method": "POST", "url": "http://127.0.0.1:9/notes", "body": {"a": 1}}}  # fmt: skip
    plan = {
        "goal": "post a note from a part of the work",
        "steps": [
            read("r", "a.md"),
            subgoal("part", [post]),
            {"name": "side", "kind": "subgoal", "goal": "tell the team", "tools": ["notify_webhook"]},
        ],
    }
    spec, _ = start_spec(StartRequest(plan=plan, workspace=str(tmp_path)))
    assert {"http_request", "notify_webhook", "read_file"} <= set(spec.allowed_tools)
    assert check_plan(spec.plan, spec.allowed_tools) == []

    path = tmp_path / "plan.yaml"
    path.write_text(__import__("yaml").safe_dump(plan))
    parsed, _ = load_plan_file(path)
    assert {"http_request", "notify_webhook"} <= set(plan_tools(parsed))
