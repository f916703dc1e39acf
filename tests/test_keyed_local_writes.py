"""Writes whose re-run is harmless run as local activities (issue 39 item 3): a `keyed` write
(the service deduplicates by its effect key) and a `check` one (looked up before it writes)
need no activity round trip of their own when they are fully known at plan time and have
nothing to undo; a `once` write, an irreversible one, and a harmless one with an undo or
with arguments from other steps or a model keep their activity, scheduled in history
before the call.

The kill test is a real `perdure worker` SIGKILLed by a fault point right after the fake
ledger accepted a keyed write and before its answer reached the goal: the worker that takes
over sends it again under the same key, and the ledger holds it once.
"""

from __future__ import annotations

from collections import Counter

import pytest

from perdure.testing.fakes import LedgerAPI, WebhookReceiver
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import agent, openai_profile, spec
from tests.helpers import activity_outcomes, run_goal, running_worker, tool_timeline


def entry_steps(ledger_url: str, count: int) -> list[dict]:
    """`count` ledger entries, one after another."""
    steps = []
    for i in range(1, count + 1):
        args = {"method": "POST", "url": f"{ledger_url}/entries", "body": {"ref": f"entry-{i}"}}
        step = {"name": f"entry-{i}", "kind": "tool", "tool": "http_request", "args": args}
        if i > 1:
            step["needs"] = [f"entry-{i - 1}"]
        steps.append(step)
    return steps


def step_of(summary: str) -> str:
    return summary.split(" · ")[1]


async def run_writes(env, task_queue, store, scripted, workspace, steps: list[dict], tools: list[str]):
    """Run a goal of these steps with local keyed writes on: its result, its last snapshot, and
    where each tool call ran, (local|activity, step), in the order of its history."""
    goal = spec(workspace, plan={"steps": steps}, allowed_tools=tools, drift_every=0, local_keyed_writes=True)
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle, result = await run_goal(env, task_queue, goal)
        snapshot = await handle.query(GoalWorkflow.progress)
    history = await handle.fetch_history()
    return result, snapshot, [(where, step_of(s)) for where, s in tool_timeline(history)]


@pytest.mark.slow
@pytest.mark.process
async def test_a_keyed_local_write_killed_after_the_service_accepted_it_lands_once(crash_rig, fake_service, tmp_path):
    # The ledger answers 0.3 s after it recorded an entry: the kill comes in between.
    ledger = fake_service(LedgerAPI, respond_delay_s=0.3)
    rig = crash_rig()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    goal = spec(
        workspace,
        plan={"steps": entry_steps(ledger.base_url, 3)},
        allowed_tools=["http_request"],
        drift_every=0,
        local_keyed_writes=True,
    )
    worker = rig.start_worker(fault="after_effect:http_request:2")
    handle = await rig.start_goal(goal)
    await rig.wait_killed(worker)
    assert [e["body"]["ref"] for e in ledger.ledger()] == ["entry-1", "entry-2"]  # accepted before the kill

    rig.start_worker()
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.excerpt
    creates = [e for e in ledger.ledger() if e["op"] == "create"]
    assert Counter(e["body"]["ref"] for e in creates) == {"entry-1": 1, "entry-2": 1, "entry-3": 1}
    # The killed worker's writes were sent again under the same keys (nothing of its task
    # reached history) and answered from the ledger's idempotency store.
    assert ledger.replays >= 2 and len({e["idempotency_key"] for e in creates}) == 3
    history = await handle.fetch_history()
    assert [(where, step_of(s)) for where, s in tool_timeline(history)] == [
        ("local", "entry-1"),
        ("local", "entry-2"),
        ("local", "entry-3"),
    ]
    assert activity_outcomes(history, Activities.RUN_TOOL)[0] == 0


@pytest.mark.slow
async def test_once_writes_keep_their_activity_and_keyed_ones_run_locally(
    env, task_queue, store, workspace, scripted, fake_service
):
    ledger = fake_service(LedgerAPI)
    hook = fake_service(WebhookReceiver)
    steps = [
        *entry_steps(ledger.base_url, 2),
        {
            "name": "notice",
            "kind": "tool",
            "tool": "notify_webhook",
            "needs": ["entry-2"],
            "args": {"url": f"{hook.base_url}/hook", "payload": {"entries": 2}},
        },
    ]
    result, snapshot, placed = await run_writes(
        env, task_queue, store, scripted, workspace, steps, ["http_request", "notify_webhook"]
    )
    assert result.outcome == "succeeded", result.excerpt
    assert placed == [
        ("local", "entry-1"),
        ("local", "entry-2"),
        ("activity", "notice"),
    ]
    nodes = {n.name: n for n in snapshot.nodes}
    assert nodes["entry-1"].placements["http_request"] == (
        "local activity: remote-write, a re-run is deduplicated by its effect key: recorded with its task"
    )
    assert nodes["notice"].placements["notify_webhook"].startswith("activity: remote-write")
    assert len(hook.ledger()) == 1 and len(ledger.ledger()) == 2


@pytest.mark.slow
async def test_an_agents_keyed_write_keeps_its_activity_and_its_place_between_two_reads(
    env, task_queue, store, workspace, scripted, fake_service
):
    ledger = fake_service(LedgerAPI)
    (workspace / "a.md").write_text("ALPHA\n")
    (workspace / "b.md").write_text("BETA-CONTENT\n")
    write = {"method": "POST", "url": f"{ledger.base_url}/entries", "body": {"ref": "between"}}
    calls = [
        {"name": "read_file", "arguments": {"path": "a.md"}},
        {"name": "http_request", "arguments": write},
        {"name": "read_file", "arguments": {"path": "b.md"}},
    ]
    server = scripted(
        {
            "replies": [
                {"when": "BETA-CONTENT", "content": "done"},
                {"when": "PERDURE-AGENT", "tool_calls": calls},
            ]
        }
    )
    goal = spec(
        workspace,
        plan={"steps": [agent("work", "Read a.md, record it, read b.md.", ["read_file", "http_request"])]},
        allowed_tools=["read_file", "http_request"],
        drift_every=0,
        local_keyed_writes=True,
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(env, task_queue, goal)
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt

    # A model's arguments are not known when the plan was made: a rewind of the turn could
    # ask for another write, so this one's intent is in history before it is sent. The
    # reads around it run as local activities, the second once the write ended.
    timeline = [(where, summary.split(" · ")[0]) for where, summary in tool_timeline(await handle.fetch_history())]
    assert timeline == [("local", "tool read_file"), ("activity", "tool http_request"), ("local", "tool read_file")]
    placed = {n.name: n for n in snapshot.nodes}["work"].placements["http_request"]
    assert placed == "activity: remote-write, keyed: its arguments are a model's, not known when the plan was made"


@pytest.mark.slow
async def test_a_write_with_an_undo_or_arguments_from_another_step_keeps_its_activity(
    env, task_queue, store, workspace, scripted, fake_service
):
    ledger = fake_service(LedgerAPI)
    entries = f"{ledger.base_url}/entries"
    fixed = {"method": "POST", "url": entries, "body": {"n": 1}}
    undone = {"method": "POST", "url": entries, "body": {"n": 2}, "undo": {"method": "DELETE", "url": f"{entries}/2"}}
    templated = {"method": "POST", "url": entries, "body": {"after": "{{steps.fixed}}"}}
    steps = [
        {"name": "fixed", "kind": "tool", "tool": "http_request", "args": fixed},
        {"name": "undone", "kind": "tool", "tool": "http_request", "needs": ["fixed"], "args": undone},
        {"name": "templated", "kind": "tool", "tool": "http_request", "needs": ["fixed", "undone"], "args": templated},
    ]
    result, snapshot, placed = await run_writes(env, task_queue, store, scripted, workspace, steps, ["http_request"])
    assert result.outcome == "succeeded", result.excerpt

    # Sent from a local activity, an undoable write could land while a takeover applies an
    # abort with rollback first, with no compensation recorded; a templated one could land
    # twice, different, around a rewind. Their activities are scheduled before the call.
    assert placed == [
        ("local", "fixed"),
        ("activity", "undone"),
        ("activity", "templated"),
    ]
    nodes = {n.name: n for n in snapshot.nodes}
    assert "it has an undo" in nodes["undone"].placements["http_request"]
    assert "other steps' outputs" in nodes["templated"].placements["http_request"]
    assert len(ledger.ledger()) == 3


@pytest.mark.slow
async def test_a_goal_started_before_local_keyed_writes_keeps_its_writes_activities(
    env, task_queue, store, workspace, scripted, fake_service
):
    # A 1.0 goal's spec has no local_keyed_writes: its history must replay on this code.
    ledger = fake_service(LedgerAPI)
    goal = spec(workspace, plan={"steps": entry_steps(ledger.base_url, 2)}, allowed_tools=["http_request"])
    assert not goal.local_keyed_writes
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle, result = await run_goal(env, task_queue, goal)
    assert result.outcome == "succeeded", result.excerpt
    timeline = [(where, step_of(s)) for where, s in tool_timeline(await handle.fetch_history())]
    assert timeline == [("activity", "entry-1"), ("activity", "entry-2")]
