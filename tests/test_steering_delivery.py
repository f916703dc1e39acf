"""How perdure's clients deliver a message to a running goal: by signal, its receipt read
from the inbox query, never by update. An update accepted in the workflow task after one
that recorded only a local activity's result is replayed in another order than it ran
(sdk-core issue 1146, its v1 history chunking), and a goal runs a local activity (memory
recall) before each llm step: steering while it ran made histories that no worker could
replay again (4 goals in 8 under load, seen first in CI), so the goal would fail every
workflow task after its next replay."""

from __future__ import annotations

import pytest
from temporalio.api.enums.v1 import EventType

from perdure.starters.client import message_delivery
from perdure.starters.client.client_errors import GoalEnded, MessageRejected
from perdure.workflows.goal.contracts.messages import Steer
from tests import goldens
from tests.builders import chain, openai_profile
from tests.helpers import run_ids, running_worker, start, wait_until

pytestmark = pytest.mark.slow

STEERS = 40


async def test_steering_a_goal_while_its_steps_run_leaves_a_history_every_worker_can_replay(
    env, task_queue, store, workspace, scripted
):
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "ok", "delay_s": 0.05}]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, chain(20), continue_as_new_after_events=80, drift_every=0)
        receipts = []
        for i in range(STEERS):
            steer = Steer(request_id=f"s{i}", text=f"note {i}")
            try:
                receipts.append((await message_delivery.deliver(env.client, handle.id, steer)).receipt)
            except (GoalEnded, MessageRejected):  # it finished meanwhile
                break
        snap = await wait_until(handle, lambda s: s.phase in ("finished", "failed"), timeout_s=120)
        inbox = await message_delivery.inbox(env.client, handle.id)
    assert snap.phase == "finished"
    assert len(receipts) >= 10, len(receipts)  # steered while the steps ran
    # Each was taken (a receipt that did not come within the send's wait, on a loaded machine, is None).
    assert {e.request_id for e in inbox.entries if e.kind == "steer"} == {f"s{i}" for i in range(len(receipts))}
    assert all(r.kind == "steer" for r in receipts if r is not None)
    for run_id in await run_ids(handle):
        history = await env.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        kinds = [e.event_type for e in history.events]
        assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED not in kinds, run_id
        replayed = await goldens.replayer().replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, (run_id, replayed.replay_failure)
