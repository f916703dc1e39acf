"""The goal's durable event stream, seen as a subscriber sees it (the SDK's Workflow Streams
client against a dev server): typed events for nodes, plans, questions, receipts and the
end; reduced idempotently; resumable from any offset; across continue-as-new; bounded."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from perdure.runtime.converter import data_converter
from perdure.workflows.goal import stream as goal_stream
from perdure.workflows.goal.contracts.events import (
    EVENTS_TOPIC,
    GateDecision,
    GoalView,
    NodeChanged,
    reduce,
)
from perdure.workflows.goal.contracts.messages import Approve, Steer
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import chain, gate, openai_profile
from tests.helpers import running_worker, start, statuses, stream_events, submit, wait_until

READS = [
    {"name": f"read-{i}", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md", "max_bytes": 100 + i}}
    for i in range(3)
]


async def collect(env, goal_id: str, from_offset: int = 0, until_end: bool = True, limit: int | None = None):
    """(offset, event) pairs of the goal's own events from `from_offset` until its end event
    (or `limit` events), read as perdure reads them (the poll query)."""
    seen = []
    async for offset, event in stream_events(env, goal_id, from_offset, tokens=False):
        seen.append((offset, event))
        if (until_end and event.type == "end") or (limit is not None and len(seen) >= limit):
            break
    return seen


async def test_a_subscriber_sees_every_node_settle_the_plan_and_the_end_and_reduces_them_to_the_outcome(
    env, task_queue, store, workspace
):
    (workspace / "notes.md").write_text("a note\n")
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, READS, allowed_tools=["read_file"])
        events = await asyncio.wait_for(collect(env, handle.id), 60)
    kinds = [e.type for _, e in events]
    assert kinds[0] in ("plan", "node", "progress") and kinds[-1] == "end"
    view = GoalView()
    for _, event in events:
        reduce(view, event)
    assert {name: n.status for name, n in view.nodes.items()} == {f"read-{i}": "succeeded" for i in range(3)}
    assert view.plans[1].steps == 3 and view.plans[1].source == "plan-file"
    assert view.ended is not None and view.ended.outcome == "succeeded" and view.ended.report
    assert view.progress is not None and view.progress.percent_done == 100
    settled = [e for _, e in events if isinstance(e, NodeChanged) and e.status == "succeeded"]
    assert all(e.duration_s is not None and e.placement for e in settled)
    again = GoalView()
    for _, event in events + events:  # every event twice: a retried publish changes nothing
        reduce(again, event)
    assert again.model_dump() == view.model_dump()
    offsets = [o for o, _ in events]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))


async def test_a_subscriber_resumes_from_the_offset_it_saw_and_gets_exactly_the_rest(env, task_queue, store, workspace):
    (workspace / "notes.md").write_text("a note\n")
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, READS, allowed_tools=["read_file"])
        everything = await asyncio.wait_for(collect(env, handle.id), 60)
        first = everything[:3]
        rest = await asyncio.wait_for(collect(env, handle.id, from_offset=first[-1][0] + 1), 60)
    assert [o for o, _ in first + rest] == [o for o, _ in everything]
    assert [e.id for _, e in rest] == [e.id for _, e in everything[3:]]


@pytest.mark.slow
async def test_questions_and_receipts_are_events_and_the_stream_crosses_continue_as_new(
    env, task_queue, store, workspace, scripted
):
    pay = {"amount_cents": 500, "currency": "EUR", "recipient": "ACME", "memo": "x"}
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "ok"}]})
    steps = [*chain(16), {"name": "pay", "kind": "tool", "tool": "make_payment", "args": pay, "needs": ["s15"]}]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(
            env,
            task_queue,
            workspace,
            steps,
            allowed_tools=["make_payment"],
            continue_as_new_after_events=50,
            drift_every=0,
        )
        subscriber = asyncio.create_task(collect(env, handle.id))
        await wait_until(handle, lambda s: bool(s.questions), timeout_s=60)
        await submit(handle, Steer(request_id="steer-1", text="keep the memo short"))
        await submit(handle, Approve(request_id="ok-1", question_id="q1", approved=False))
        events = await asyncio.wait_for(subscriber, 90)
        snap = await wait_until(handle, lambda s: s.phase in ("finished", "failed"))
        inbox = await handle.query(GoalWorkflow.inbox)
    assert snap.runs >= 2  # the goal continued as new while the subscriber read on
    view = GoalView()
    for _, event in events:
        reduce(view, event)
    assert set(view.nodes) == {*(f"s{i:02d}" for i in range(16)), "pay"}
    assert [(q.status, q.answer) for q in view.questions.values()] == [("answered", "reject")]
    # Each message's receipt event says what its inbox row says.
    assert {r.request_id: r.status for r in view.receipts.values()} == {e.request_id: e.status for e in inbox.entries}
    assert set(view.receipts) == {"steer-1", "ok-1"}
    offsets = [o for o, _ in events]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


async def test_the_stream_keeps_its_last_events_only(env, task_queue, store, workspace, monkeypatch):
    monkeypatch.setattr(goal_stream, "STREAM_EVENTS_KEPT", 10)
    (workspace / "notes.md").write_text("a note\n")
    reads = [{**READS[0], "name": f"r{i:02d}", "args": {"path": "notes.md", "max_bytes": 100 + i}} for i in range(20)]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, reads, allowed_tools=["read_file"])
        await handle.result()
        events = await asyncio.wait_for(collect(env, handle.id), 60)
    assert 10 <= len(events) < 20  # truncated to the last 10 (and what came after the last truncation)
    assert events[0][0] > 20 and events[-1][1].type == "end"


@pytest.mark.parametrize("steps", [READS])
async def test_publishing_events_adds_no_history_event(env, task_queue, store, workspace, steps):
    """Publishes are workflow state, not commands: a goal's history without subscribers is
    what it was before the stream existed (the golden histories replay: tests/test_replay.py)."""
    (workspace / "notes.md").write_text("a note\n")
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["read_file"])
        await handle.result()
        history = await handle.fetch_history()
    names = {e.WhichOneof("attributes") for e in history.events}
    assert not any("update" in (n or "") for n in names)  # nobody subscribed: no poll updates


async def test_a_malformed_publish_on_the_goals_stream_is_refused_and_the_goal_goes_on(
    env, task_queue, store, workspace
):
    from temporalio.contrib.workflow_streams import PublishEntry, PublishInput

    (workspace / "notes.md").write_text("a note\n")
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, [gate()], allowed_tools=["run_command"])
        await wait_until(handle, lambda s: "gate" in s.running)
        poison = PublishInput(items=[PublishEntry(topic="goal", data="!!not base64")], publisher_id="x", sequence=1)
        await handle.signal("__temporal_workflow_stream_publish", poison)
        await handle.signal("__temporal_workflow_stream_publish")  # no argument at all
        (workspace / "GO").write_text("")
        result = await asyncio.wait_for(handle.result(), 30)
        events = await asyncio.wait_for(collect(env, handle.id), 30)
    assert result.outcome == "succeeded"  # no workflow task failed on the signal
    assert all(e.type != "node" or e.node == "gate" for _, e in events)  # nothing injected


async def test_a_node_event_says_running_again_after_an_answer_and_a_failed_one_carries_its_error(
    env, task_queue, store, workspace
):
    from tests.device_rig import InProcessDevice, write_on

    missing = {"name": "missing", "kind": "tool", "tool": "read_file", "args": {"path": "nope.md"}}
    async with running_worker(env, task_queue, store):
        laptop = InProcessDevice(env, task_queue, "laptop", workspace)
        await laptop.start()
        try:
            handle = await start(
                env, task_queue, workspace, [write_on("laptop"), missing], allowed_tools=["write_file", "read_file"]
            )
            # The write is on the approvals-ahead card (q1) at adoption: answered once it waits for it.
            await wait_until(handle, lambda s: statuses(s).get("save") == "blocked")
            await submit(handle, Approve(request_id="ok-1", question_id="q1"))
            await handle.result()
            events = await asyncio.wait_for(collect(env, handle.id), 30)
        finally:
            await laptop.stop()
    save = [e.status for _, e in events if isinstance(e, NodeChanged) and e.node == "save"]
    assert "blocked" in save and save[save.index("blocked") + 1] == "running" and save[-1] == "succeeded", save
    failed = [e for _, e in events if isinstance(e, NodeChanged) and e.node == "missing"][-1]
    assert failed.status == "failed" and "does not exist" in (failed.error or "")


def test_an_event_is_the_payload_perdures_converter_would_make_of_it():
    """The stream encodes its events itself (workflows/goal/stream.py event_payload), so a
    subscriber decoding with the converter must get back the very event."""
    at = datetime(2026, 12, 2, 14, 0, 0, 123456, tzinfo=UTC)
    events = [
        NodeChanged(id="node:a:0", at=at, node="a", kind="tool", status="running", key="k", preview='é\n"x"'),
        NodeChanged(
            id="node:a:1",
            at=at,
            node="a",
            kind="tool",
            status="failed",
            key="k",
            tokens=7,
            cost_usd=0.0125,
            duration_s=1.5,
            error="boom",
        ),
        GateDecision(id="gate:2", at=at, entry="soft gate: degraded"),
    ]
    converter = data_converter(payload_store=False).payload_converter
    for event in events:
        made = goal_stream.event_payload(event)
        assert made == converter.to_payloads([event])[0]
        assert converter.from_payloads([made], [type(event)])[0] == event


async def test_the_sdk_s_poll_update_is_refused_before_it_enters_the_goal_s_history(env, task_queue, store, workspace):
    """An update accepted after a workflow task that recorded only a local activity's result
    replays in another order than it ran (sdk-core issue 1146): a goal watched by the SDK's
    long-poll subscriber could no longer be replayed (seen in CI). Watchers read by query."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.contrib.workflow_streams import WorkflowStreamClient

    (workspace / "notes.md").write_text("a note\n")
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, [gate()], allowed_tools=["run_command"])
        await wait_until(handle, lambda s: "gate" in s.running)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            async for _ in WorkflowStreamClient.create(env.client, handle.id).subscribe(EVENTS_TOPIC, 0):
                break
        read = await asyncio.wait_for(collect(env, handle.id, limit=2), 30)  # the query reads it
        (workspace / "GO").write_text("")
        result = await asyncio.wait_for(handle.result(), 30)
        history = await handle.fetch_history()
    assert "poll query" in str(refused.value.cause), refused.value.cause
    assert len(read) == 2 and result.outcome == "succeeded"
    names = {e.WhichOneof("attributes") for e in history.events}
    assert not any("update" in (n or "") for n in names), names
