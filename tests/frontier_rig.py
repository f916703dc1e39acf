"""Large goals for the frontier tests (tests/test_frontier.py, tests/test_frontier_store.py):
chains of reads, a gated goal, a start by reference, waits and the carried inputs. Not a test module."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowHandle

from perdure.workflows.goal import plan_cache
from perdure.workflows.goal.contracts.goal_contracts import GoalResult, GoalSpec, ProgressSnapshot
from perdure.workflows.goal.contracts.messages import Rewind
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import gate, spec
from tests.goldens import replayer
from tests.helpers import (
    goal_result,
    new_goal_id,
    run_ids,
    submit,
    wait_until,
)

WIDTH = 10


def chains(workspace: Path, width: int, depth: int) -> list[dict]:
    """`width` independent chains of `depth` reads (each read needs the one before it)."""
    for c in range(width):
        (workspace / f"c{c}.txt").write_text(f"chain {c}\n")
    steps = []
    for c in range(width):
        for d in range(depth):
            step = {"name": f"c{c}-{d:04d}", "kind": "tool", "tool": "read_file", "args": {"path": f"c{c}.txt"}}
            if d:
                step["needs"] = [f"c{c}-{d - 1:04d}"]
            steps.append(step)
    return steps


def reads_goal(workspace: Path, depth: int, **overrides) -> GoalSpec:
    """WIDTH chains of `depth` reads, nothing else to do."""
    return spec(
        workspace,
        plan={"steps": chains(workspace, WIDTH, depth)},
        drift_every=0,
        allowed_tools=["read_file"],
        **overrides,
    )


def gated_reads(workspace: Path, depth: int = 120) -> GoalSpec:
    """WIDTH chains of `depth` reads and a step that waits for GO after chain 0, a new run
    every 300 steps settled: by the time the gate waits, most reads are stored."""
    steps = [*chains(workspace, WIDTH, depth), gate([f"c0-{depth - 1:04d}"])]
    tools = ["read_file", "run_command"]
    return spec(workspace, plan={"steps": steps}, drift_every=0, allowed_tools=tools, continue_as_new_after_nodes=300)


async def start_large(env, task_queue: str, goal: GoalSpec) -> tuple[WorkflowHandle, WorkflowHandle]:
    """The goal started as `perdure start` starts it (its task timeout), and a handle on the
    latest run of its chain (queries and updates reach the run that holds the goal now)."""
    handle = await env.client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=goal),
        id=new_goal_id("frontier"),
        task_queue=task_queue,
        task_timeout=goal.task_timeout(),
    )
    return handle, env.client.get_workflow_handle(handle.id)


async def until_the_gate_waits(latest: WorkflowHandle, reads: int = WIDTH * 120) -> ProgressSnapshot:
    # Generous: 1,200 reads and four run boundaries on a loaded machine.
    return await wait_until(
        latest, lambda snap: "gate" in snap.running and snap.counts.get("succeeded") == reads, timeout_s=180
    )


async def rewind_a_stored_read_and_finish(
    handle: WorkflowHandle, latest: WorkflowHandle, workspace: Path, depth: int, request_id: str
) -> GoalResult:
    """Rewind c3-0010 of `gated_reads` (most of its chain stored by now): it voids the rest of
    chain 3 and is applied; then the gate opens and the goal runs to its end."""
    receipt = await submit(latest, Rewind(request_id=request_id, node="c3-0010", why="read it again"))
    assert receipt.status == "applied", receipt
    assert receipt.detail["void"] == [f"c3-{d:04d}" for d in range(10, depth)]
    (workspace / "GO").write_text("go\n")
    return await goal_result(handle)


async def replay_elsewhere(history) -> None:
    """Replay `history` as a worker that never read the goal's plan would: the plans this
    process's worker validated and kept (workflows/goal/plan_cache.py) are forgotten first, so
    each chunk is validated by the replay as its local activity's result comes."""
    plan_cache._chunks.clear()
    plan_cache._plans.clear()
    await replayer().replay_workflow(history)


async def carried_inputs(handle: WorkflowHandle) -> list[GoalInput]:
    """The input each run after the first started with (the carried state), decoded as a
    worker decodes it (through the payload store)."""
    client = handle._client
    inputs = []
    for run_id in (await run_ids(handle))[1:]:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        payloads = history.events[0].workflow_execution_started_event_attributes.input.payloads
        [carried] = await client.data_converter.decode(payloads, [GoalInput])
        inputs.append(carried)
    return inputs
