"""Messages a newer client sends to a goal that runs perdure 1.0 code (pinned to its workers
by worker versioning): 1.0 goals refuse any field they do not know, so a field added since is
left out of the payload while it has its default, the client leaves out the sender's name for
a goal 1.0's front ends started (memo: the goal's text, no message format), and what 1.0
cannot take at all (a named signal, a park until a condition) is refused before it is sent."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from perdure.starters.client import PerdureClient
from perdure.starters.client.client_errors import MessageRejected
from perdure.workflows.goal.contracts import messages
from perdure.workflows.goal.contracts.goal_contracts import GOAL_MEMO
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import gate, spec
from tests.helpers import goal_result, new_goal_id, running_worker, wait_until

# The fields each kind took in perdure 1.0 (workflows/goal/contracts/messages.py at 3f10825).
FORMAT_1 = {
    "steer": {"request_id", "kind", "text"},
    "queue": {"request_id", "kind", "text"},
    "answer": {"request_id", "kind", "question_id", "choice", "text"},
    "approve": {"request_id", "kind", "question_id", "approved", "text"},
    "park": {"request_id", "kind", "reason", "until", "expiry_hours"},
    "resume": {"request_id", "kind"},
    "narrow": {"request_id", "kind", "premises", "why"},
    "rewind": {"request_id", "kind", "node", "why"},
    "abort": {"request_id", "kind", "reason", "rollback"},
    "escalate": {"request_id", "kind", "finding", "detail"},
}
EVERY_KIND = [
    messages.Steer(request_id="m1", text="t"),
    messages.Queue(request_id="m1", text="t"),
    messages.Answer(request_id="m1", question_id="q1", choice="continue", text="why"),
    messages.Approve(request_id="m1", question_id="q1"),
    messages.Park(request_id="m1", reason="r", until=datetime(2027, 1, 1, tzinfo=UTC)),
    messages.Resume(request_id="m1"),
    messages.Narrow(request_id="m1", premises={"scope": "a"}),
    messages.Rewind(request_id="m1", node="find", why="w"),
    messages.Abort(request_id="m1", rollback=True),
    messages.Escalate(request_id="m1", finding="stalled", detail="d"),
]


@pytest.mark.parametrize("message", EVERY_KIND, ids=lambda m: m.kind)
def test_a_message_that_uses_nothing_new_is_the_payload_1_0_wrote(message):
    payload = message.model_dump(mode="json")
    assert set(payload) <= FORMAT_1[message.kind], set(payload) - FORMAT_1[message.kind]
    assert messages.beyond_format_1(message) is None
    assert messages.USER_MESSAGE.validate_python(payload) == message  # and this code reads it back


def test_what_1_0_cannot_take_is_named():
    assert "no named signals" in messages.beyond_format_1(messages.Signal(request_id="s", name="ci"))
    park = messages.Park(request_id="p", reason="r", until_file="READY")
    assert "cannot park until a file" in messages.beyond_format_1(park)
    assert messages.beyond_format_1(messages.Park(request_id="p", reason="r", poll_first_s=5)) is None


@pytest.mark.slow
async def test_a_goal_started_by_1_0s_front_ends_gets_messages_it_can_read(env, task_queue, store, workspace):
    client = PerdureClient(env.client)
    goal_spec = spec(workspace, plan={"steps": [gate()]}, allowed_tools=["run_command"])
    async with running_worker(env, task_queue, store):
        # As 1.0's `perdure start` started it: the goal's text in the memo, no message format.
        older = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=goal_spec),
            id=new_goal_id("format-1"),
            task_queue=task_queue,
            memo={GOAL_MEMO: goal_spec.goal},
        )
        await wait_until(older, lambda s: "gate" in s.running)
        steered = await client.steer(older.id, "be brief")
        with pytest.raises(MessageRejected, match="runs perdure 1.0 code, which cannot park until a file"):
            await client.park(older.id, "waiting for CI", until_signal="ci-done")
        with pytest.raises(MessageRejected, match="runs perdure 1.0 code, which takes no named signals"):
            await client.signal(older.id, "ci-done")
        await client.abort(older.id, request_id="end")
        await goal_result(older)
        ended = await older.query(GoalWorkflow.progress)
    assert steered.receipt is not None and steered.receipt.status in ("pending", "applied")
    # Sent without the sender's name (this code would have said "NAME (message end)").
    assert ended.abort is not None and ended.abort.by == "message end"
