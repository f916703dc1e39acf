"""A large goal's cost grows with its frontier, not its past: the state carried into each
new run holds the work in flight and about to start, not every step settled before it
(the settled ones go to the artifact store), and the plan travels by reference.
Measured from outside: each run's input in the goal's real history."""

from __future__ import annotations

import json

import pytest
from temporalio.service import RPCError

from perdure.starters.client.plan_upload import with_stored_plan
from perdure.workflows.goal.contracts.goal_contracts import Budget
from perdure.workflows.goal.contracts.messages import Abort
from perdure.workflows.goal.contracts.past_chunks import READ_PAST, PastChunk, PlanChunk
from perdure.workflows.goal.contracts.plan import StoredPlan
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import gate, spec
from tests.frontier_rig import (
    WIDTH,
    carried_inputs,
    chains,
    gated_reads,
    reads_goal,
    replay_elsewhere,
    rewind_a_stored_read_and_finish,
    start_large,
    until_the_gate_waits,
)
from tests.goldens import replayer
from tests.helpers import (
    goal_result,
    local_activities,
    new_goal_id,
    perdure_status,
    run_cli,
    run_goal,
    run_ids,
    running_worker,
    submit,
    wait_until,
)


@pytest.mark.slow
async def test_the_state_carried_into_each_run_does_not_grow_with_the_steps_settled_before_it(
    env, task_queue, store, workspace
):
    """2,400 reads in 10 chains, a new run every 400 settled: six runs. Every step settled
    leaves the carried state; what is carried is the frontier (a step in flight or ready
    per chain) and refs, so the last run starts with no more than the second did."""
    depth = 240
    goal = reads_goal(workspace, depth, continue_as_new_after_nodes=400)
    async with running_worker(env, task_queue, store):
        handle, result = await run_goal(env, task_queue, goal, as_started=True)
    assert result.outcome == "succeeded", result.excerpt
    # Every step's output is findable: the frontier's in `outputs`, the rest in the stored chunks.
    stored = [node for ref in result.past for node in PastChunk.model_validate_json(store.get_text(ref)).nodes]
    assert {n.name for n in stored}.isdisjoint(result.outputs)
    found = {**result.outputs, **{n.name: n.output for n in stored}}
    assert len(found) == WIDTH * depth and all(ref is not None for ref in found.values())
    report = store.get_text(result.report)
    assert f"{WIDTH * depth} steps: {WIDTH * depth} succeeded." in report
    assert report.count(" | tool | succeeded | ") == 100  # the last that succeeded, not 2,400 rows
    carried = await carried_inputs(handle)
    assert len(carried) >= 4, len(carried)
    sizes = [len(c.state or "") for c in carried]
    # Growth with the past was ~1 KB per settled step (a 10,000-step goal carried 15 MB).
    assert sizes[-1] <= sizes[0] * 1.1, sizes
    assert max(sizes) < 64_000, sizes


@pytest.mark.slow
async def test_a_large_goal_brings_its_stored_steps_back_to_rewind_one_and_status_lists_its_frontier(
    env, task_queue, store, workspace
):
    """1,200 reads in 10 chains and a step that waits for GO after chain 0: a new run every
    300 steps settled, so by the time the gate waits most reads are stored. A rewind of a
    stored step brings them back and voids it with everything after it in its chain (110
    steps), which run again; `perdure status` meanwhile lists the frontier, not 1,201 rows."""
    depth = 120
    async with running_worker(env, task_queue, store):
        handle, latest = await start_large(env, task_queue, gated_reads(workspace, depth))
        done = await until_the_gate_waits(latest)
        assert done.unlisted > 0 and len(done.nodes) <= 200, (done.unlisted, len(done.nodes))
        status = await perdure_status(env, handle.id)
        assert "more steps not listed" in status and "succeeded 1200" in status, status
        result = await rewind_a_stored_read_and_finish(handle, latest, workspace, depth, "r1")
    assert result.outcome == "succeeded", result.excerpt
    assert "rewind of 'c3-0010'" in store.get_text(result.report)
    runs = await run_ids(handle)
    assert len(runs) >= 3
    stored = [json.loads(c.state or "{}").get("past", {}).get("count", 0) for c in await carried_inputs(handle)]
    assert max(stored) >= 600, stored
    histories = [await env.client.get_workflow_handle(handle.id, run_id=r).fetch_history() for r in runs]
    assert any(a[1] == READ_PAST for h in histories for a in local_activities(h)), "the rewind restored nothing"
    # Every run replays: storing, loading and restoring are recorded like any other work; and
    # on a worker that never validated the plan (its chunks are validated as they are read back).
    for history in histories:
        await replayer().replay_workflow(history)
        await replay_elsewhere(history)


@pytest.mark.slow
async def test_a_plan_file_of_thousands_of_steps_starts_by_reference_and_its_graph_is_checked(
    env, task_queue, store, workspace
):
    """As `perdure start` starts it: the plan's chunks in the artifact store, the goal's input
    names them (no step in it), the goal loads and checks them. One whose chunks make a cycle
    (stored by hand: the client refuses such a plan file) ends failed, saying so."""
    depth = 150
    goal = reads_goal(workspace, depth)
    started = await with_stored_plan(goal, store)
    assert started.plan is None and started.stored_plan is not None and started.stored_plan.steps == WIDTH * depth
    assert len(GoalInput(spec=started).model_dump_json()) < 5_000
    async with running_worker(env, task_queue, store):
        handle, result = await run_goal(env, task_queue, started, as_started=True)
        assert result.outcome == "succeeded", result.excerpt
        for run_id in await run_ids(handle):
            await replay_elsewhere(await env.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history())
        looped = goal.plan.model_dump()["steps"]
        looped[0]["needs"] = [looped[depth - 1]["name"]]  # chain c0's first step needs its last: a cycle
        chunk = store.put_text(PlanChunk.model_validate({"steps": looped}).model_dump_json(), "application/json")
        cyclic = started.model_copy(update={"stored_plan": StoredPlan(chunks=[chunk], steps=len(looped))})
        _, failed = await run_goal(env, task_queue, cyclic, as_started=True)
    assert failed.outcome == "failed" and "the plan file cannot run: steps form a cycle" in (failed.failure or "")


@pytest.mark.slow
async def test_a_large_goal_aborted_early_counts_the_steps_that_never_started(env, task_queue, store, workspace):
    """1,200 reads wait behind one step; the goal is aborted while it runs: its result and
    report count the reads that never started in one line, not one per step."""
    steps = [gate(), *chains(workspace, WIDTH, 120)]
    for step in steps[1:]:
        step.setdefault("needs", ["gate"])
    goal = spec(workspace, plan={"steps": steps}, drift_every=0, allowed_tools=["read_file", "run_command"])
    async with running_worker(env, task_queue, store):
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal), id=new_goal_id("frontier"), task_queue=task_queue
        )
        await wait_until(handle, lambda snap: "gate" in snap.running, timeout_s=60)
        await submit(handle, Abort(request_id="a1", reason="not needed after all"))
        result = await goal_result(handle)
    assert result.outcome == "aborted"
    assert "(and 1200 steps that never started)" in result.unfinished
    assert len(result.unfinished) < 10, result.unfinished


@pytest.mark.slow
async def test_a_write_late_in_a_large_goal_is_checked_against_what_the_steps_before_it_read(
    env, task_queue, store, workspace
):
    """'early' reads early.txt; 1,100 reads in 10 chains follow it, a new run every 300
    settled; 'w' writes early.txt once chain c0 is done. The write is checked against the
    version 'early' read (tool_runner.versions_seen): 'early' stays in the node table until
    'w' settles, and the write goes through (before: 'early' was stored at the first boundary
    and the write was refused as replacing content the step had not seen)."""
    (workspace / "early.txt").write_text("first\n")
    steps = [{"name": "early", "kind": "tool", "tool": "read_file", "args": {"path": "early.txt"}}]
    for step in chains(workspace, WIDTH, 110):
        steps.append(step if "needs" in step else step | {"needs": ["early"]})
    steps.append(
        {
            "name": "w",
            "kind": "tool",
            "tool": "write_file",
            "args": {"path": "early.txt", "content": "second\n"},
            "needs": ["c0-0109"],
        }
    )
    goal = spec(
        workspace,
        plan={"steps": steps},
        drift_every=0,
        allowed_tools=["read_file", "write_file"],
        continue_as_new_after_nodes=300,
    )
    async with running_worker(env, task_queue, store):
        handle, result = await run_goal(env, task_queue, goal, as_started=True)
    assert result.outcome == "succeeded", result.unfinished[:3]
    assert (workspace / "early.txt").read_text() == "second\n"
    # The other chains' reads were stored meanwhile: the frontier still works.
    stored = [json.loads(c.state or "{}").get("past", {}).get("count", 0) for c in await carried_inputs(handle)]
    assert max(stored) >= 300, stored


@pytest.mark.slow
async def test_an_emergency_stop_of_a_large_goal_abandons_the_steps_not_started_by_count(
    env, task_queue, store, workspace
):
    """A command outlives the wall budget while 1,200 reads wait behind it, and a wrap-up step
    after them: the clock's emergency stop abandons the reads without a node each, the result
    says so in one line, and the wrap-up step still runs (before: a node was made for each,
    and the unfinished work listed 1,200 lines)."""
    steps = [gate(), *chains(workspace, WIDTH, 120)]
    for step in steps[1:]:
        step.setdefault("needs", ["gate"])
    tidy = {"name": "tidy", "kind": "tool", "tool": "list_dir", "args": {"path": "."}, "wrap_up": True}
    steps.append(tidy | {"needs": ["c0-0119"]})
    goal = spec(
        workspace,
        plan={"steps": steps},
        drift_every=0,
        allowed_tools=["read_file", "run_command", "list_dir"],
        budget=Budget(max_wall_seconds=31),
    )
    async with running_worker(env, task_queue, store):
        handle, result = await run_goal(env, task_queue, goal, as_started=True)
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "aborted" and "emergency stop" in (result.failure or ""), result.failure
    assert "tidy" in result.outputs, result.unfinished[:5]
    assert len(result.unfinished) < 10, result.unfinished[:5]
    said = "(and 1200 steps abandoned, not started: aborted: emergency stop"
    assert any(line.startswith(said) for line in result.unfinished), result.unfinished
    assert snapshot.counts.get("abandoned", 0) >= 1_200, snapshot.counts
    report = store.get_text(result.report)
    assert "1202 steps: 1201 abandoned, 1 succeeded." in report, report[:600]  # the gate, stopped, and tidy


async def test_a_plan_of_thousands_of_steps_is_refused_in_one_line_when_the_payload_store_is_off(
    env, tmp_path, workspace, monkeypatch
):
    """Such a goal's carried state may pass Temporal's 2 MB payload limit without the payload
    store: `perdure start` says so in one line and starts nothing."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"goal": "read a lot", "steps": chains(workspace, WIDTH, 100)}))
    monkeypatch.setenv("PERDURE_PAYLOAD_STORE", "off")
    goal_id = new_goal_id("frontier")
    args = ["start", "--plan", str(plan), "--workspace", str(workspace), "--id", goal_id]
    refused = await run_cli(env, tmp_path / "home", *args, code=None)
    said = [line for line in (refused.stdout + refused.stderr).splitlines() if line.strip()]
    assert refused.exit_code != 0 and len(said) == 1, said
    assert "a plan of 1000 steps needs the payload store, and PERDURE_PAYLOAD_STORE is off" in said[0], said
    assert "nothing started" in said[0]
    with pytest.raises(RPCError):
        await env.client.get_workflow_handle(goal_id).describe()
