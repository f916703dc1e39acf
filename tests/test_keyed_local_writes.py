"""Writes whose re-run is harmless run as local activities (issue 39 item 3): a `keyed` write
(the service deduplicates by its effect key) and a `check` one (looked up before it writes)
need no activity round trip of their own; a `once` write and an irreversible one keep their
activity, scheduled in history before the call.

The kill test is a real `perdure worker` SIGKILLed by a fault point right after the fake
ledger accepted a keyed write and before its answer reached the goal: the worker that takes
over sends it again under the same key, and the ledger holds it once.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from temporalio.api.enums.v1 import EventType

from perdure.testing.fakes import LedgerAPI, WebhookReceiver
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import agent, openai_profile, spec
from tests.helpers import _summary, activity_outcomes, run_goal, running_worker, tool_timeline


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
    goal = spec(
        workspace,
        plan={"steps": steps},
        allowed_tools=["http_request", "notify_webhook"],
        drift_every=0,
        local_keyed_writes=True,
    )
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle, result = await run_goal(env, task_queue, goal)
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt

    history = await handle.fetch_history()
    assert [(where, step_of(s)) for where, s in tool_timeline(history)] == [
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
async def test_an_agents_keyed_write_between_two_reads_keeps_its_place(
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
    assert result.outcome == "succeeded", result.excerpt

    # The reads around the write run as local activities too, but never beside it: the
    # write starts once the first read ended, and the second read once the write ended.
    calls_made = tool_local_activities(await handle.fetch_history())
    assert [tool for tool, _, _ in calls_made] == ["read_file", "http_request", "read_file"]
    (_, _, read_a_done), (_, write_scheduled, write_done), (_, read_b_scheduled, _) = calls_made
    assert read_a_done <= write_scheduled and write_done <= read_b_scheduled


TIMES = ("original_schedule_time", "complete_time")


def tool_local_activities(history) -> list[tuple[str, float, float]]:
    """(tool, scheduled, completed) of each local perdure.tool.run, from its marker."""
    found = []
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        data = json.loads(event.marker_recorded_event_attributes.details["data"].payloads[0].data)
        if data["activity_type"] != Activities.RUN_TOOL:
            continue
        times = [data[k]["seconds"] + data[k].get("nanos", 0) / 1e9 for k in TIMES]
        found.append((_summary(event).split(" · ")[0].removeprefix("tool "), *times))
    return sorted(found, key=lambda call: call[1])


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
