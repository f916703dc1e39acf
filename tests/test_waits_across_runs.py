"""A question open for hours must not freeze a long goal (issue 14, section 2): the
wait is state that crosses continue-as-new, the goal keeps dispatching other work,
and the answer, arriving runs later, is acted on once."""

from __future__ import annotations

import pytest

from testing.fakes import PAYMENTS_KEY, PaymentsAPI, WebhookReceiver
from tests.builders import openai_profile
from tests.helpers import running_worker, start, statuses, submit, wait_until
from workflows.messages import Answer, Approve

READS = 150


@pytest.fixture
def payments(fake_service) -> PaymentsAPI:
    return fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)


async def start_long(env, task_queue, workspace, steps, tools, **extra):
    """A goal that continues as new every 50 events."""
    return await start(
        env, task_queue, workspace, steps, allowed_tools=tools, continue_as_new_after_events=50, drift_every=0, **extra
    )


def reads(count: int, chained: bool = False) -> list[dict]:
    # Distinct arguments, so each read is its own node key (no reuse between them).
    args = [{"path": "notes.md", "max_bytes": 1_000 + i} for i in range(count)]
    return [
        {"name": f"read-{i:03d}", "kind": "tool", "tool": "read_file", "args": a}
        | ({"needs": [f"read-{i - 1:03d}"]} if chained and i else {})
        for i, a in enumerate(args)
    ]


async def test_an_open_approval_lets_a_chain_of_reads_finish_across_runs_then_pays_once(
    env, task_queue, store, workspace, scripted, payments
):
    (workspace / "notes.md").write_text("a note\n")
    pay = {"amount_cents": 4_200, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 7"}
    steps = [{"name": "pay", "kind": "tool", "tool": "make_payment", "args": pay}, *reads(READS, chained=True)]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        # Each read its own activity (no read segments), one after the other: a run of 50
        # events holds a dozen of them, so the chain needs many runs.
        handle = await start_long(
            env, task_queue, workspace, steps, ["read_file", "make_payment"], local_activities_up_to_s=0
        )
        done = await wait_until(
            handle, lambda s: sum(v == "succeeded" for v in statuses(s).values()) == READS, timeout_s=120
        )
        assert statuses(done)["pay"] == "blocked" and [q.id for q in done.questions] == ["q1"]
        assert done.runs >= 3, done.runs  # it continued as new while the question stayed open
        assert payments.ledger() == []
        await submit(handle, Approve(request_id="ok-1", question_id="q1"))
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    assert [e["kind"] for e in payments.ledger()] == ["payment"]


async def test_an_uncertain_answer_given_after_continue_as_new_is_acted_on_in_the_new_run(
    env, task_queue, store, workspace, scripted, fake_service
):
    hook = fake_service(WebhookReceiver)
    hook.reply_status = 503  # every attempt fails without a definite answer: uncertain
    (workspace / "notes.md").write_text("a note\n")
    notice = {"url": f"{hook.base_url}/deploys", "payload": {"release": "2.0"}}
    steps = [{"name": "notice", "kind": "tool", "tool": "notify_webhook", "args": notice}, *reads(60)]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start_long(env, task_queue, workspace, steps, ["read_file", "notify_webhook"])
        asked = await wait_until(
            handle, lambda s: s.questions and sum(v == "succeeded" for v in statuses(s).values()) == 60, timeout_s=120
        )
        assert asked.runs >= 2 and statuses(asked)["notice"] == "uncertain"
        sent = len(hook.ledger())
        await submit(handle, Answer(request_id="u-1", question_id=asked.questions[0].id, choice="happened"))
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    assert len(hook.ledger()) == sent  # "happened" records it; nothing is sent again
