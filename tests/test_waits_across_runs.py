"""A question open for hours must not freeze a long goal (issue 14, section 2): the
wait is state that crosses continue-as-new, the goal keeps dispatching other work,
and the answer, arriving runs later, is acted on once."""

from __future__ import annotations

import pytest

from perdure.testing.fakes import WebhookReceiver
from perdure.workflows.goal.contracts.messages import Answer, Approve, Park, Resume, Rewind, Steer
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, agent, llm, openai_profile, tool_then_answer
from tests.helpers import calls_for, running_worker, start, statuses, submit, wait_until

# Waits on purpose (chains across continue-as-new, services slow to answer): not in test-fast.
pytestmark = pytest.mark.slow

READS = 150
# Enough chained reads for three runs of 50 events (a dozen reads each) and a margin.
SHORT_CHAIN = 45


async def start_long(env, task_queue, workspace, steps, tools, events: int = 50, **extra):
    """A goal that continues as new every `events` events."""
    limits = {"continue_as_new_after_events": events, "drift_every": 0}
    return await start(env, task_queue, workspace, steps, allowed_tools=tools, **limits, **extra)


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
    # Pinned first (not deferred behind the reads): its question is to stay open while they run.
    steps = [{"name": "pay", "kind": "tool", "tool": "make_payment", "args": pay, "defer": False}]
    steps += reads(READS, chained=True)
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
        handle = await start_long(
            env, task_queue, workspace, steps, ["read_file", "notify_webhook"], local_activities_up_to_s=0
        )
        asked = await wait_until(
            handle, lambda s: s.questions and sum(v == "succeeded" for v in statuses(s).values()) == 60, timeout_s=120
        )
        assert asked.runs >= 2 and statuses(asked)["notice"] == "uncertain"
        sent = len(hook.ledger())
        await submit(handle, Answer(request_id="u-1", question_id=asked.questions[0].id, choice="happened"))
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    assert len(hook.ledger()) == sent  # "happened" records it; nothing is sent again


async def test_an_agent_waiting_for_approval_lets_reads_finish_across_runs_then_pays_once_without_a_new_model_turn(
    env, task_queue, store, workspace, scripted, payments
):
    (workspace / "notes.md").write_text("a note\n")
    pay = {"amount_cents": 4_200, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 7"}
    server = scripted(tool_then_answer("make_payment", pay, when="to ACME GmbH (payment", answer="Paid invoice 7."))
    # Pinned (defer: false): the agent is to ask while the reads run, not after them.
    steps = [agent("settle", "Settle invoice 7.", ["make_payment"], defer=False), *reads(SHORT_CHAIN, chained=True)]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_long(
            env, task_queue, workspace, steps, ["read_file", "make_payment"], local_activities_up_to_s=0
        )
        done = await wait_until(
            handle, lambda s: sum(v == "succeeded" for v in statuses(s).values()) == SHORT_CHAIN, timeout_s=120
        )
        assert statuses(done)["settle"] == "blocked" and [q.id for q in done.questions] == ["q1"]
        assert done.runs >= 3, done.runs  # the agent's wait crossed continue-as-new
        assert payments.ledger() == [] and len(server.requests()) == 1
        await submit(handle, Approve(request_id="ok-1", question_id="q1"))
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    assert [e["kind"] for e in payments.ledger()] == ["payment"]
    # The turn that asked for the payment was not asked again in the new run: one more
    # turn, which saw the payment's result.
    first, second = server.requests()
    assert "to ACME GmbH (payment" in second["last_message"]


async def test_a_parked_agent_crosses_continue_as_new_and_goes_on_from_its_turn_on_resume(
    env, task_queue, store, workspace, scripted
):
    (workspace / "clue.txt").write_text("CLUE-7f3: the key is under the mat\n")
    read = {"name": "read_file", "arguments": {"path": "clue.txt"}}
    # Turn 1 is slow, so the park lands while it runs and turn 2 is held by it.
    server = scripted(
        {
            "replies": [
                {"when": "CLUE-7f3", "content": "Under the mat."},
                {"when": "PERDURE-AGENT", "tool_calls": [read], "delay_s": 1.0},
            ]
        }
    )
    hunt = agent("hunt", "Find the key.", ["read_file"])
    async with running_worker(env, task_queue, store, openai_profile(server)):
        # Room in the first run for the park and a hint before it continues as new.
        handle = await start_long(env, task_queue, workspace, [hunt], ["read_file"], events=90)
        await wait_until(handle, lambda s: len(server.requests()) >= 1)
        await submit(handle, Park(request_id="p-1", reason="lunch"))
        await wait_until(handle, lambda s: statuses(s)["hunt"] == "parked")
        # Guidance sent while parked fills the history until the goal continues as new.
        sent = 0
        assert (await handle.query(GoalWorkflow.progress)).runs == 1  # the hints start in the first run
        while (await handle.query(GoalWorkflow.progress)).runs < 2:
            assert sent < 40, "the goal never continued as new while its agent was parked"
            await submit(handle, Steer(request_id=f"s-{sent}", text=f"hint {sent}: look near the door"))
            sent += 1
        parked = await handle.query(GoalWorkflow.progress)
        assert statuses(parked)["hunt"] == "parked" and parked.phase == "parked"
        assert len(server.requests()) == 1
        await submit(handle, Resume(request_id="p-2"))
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    # Resumed at turn 2, with turn 1's read and the hints sent while parked in its
    # prompt (the reply matched is the one for a prompt with the clue), not a fresh turn 1.
    first, second = server.requests()
    assert second["matched"] == 0 and "hint 0: look near the door" in second["last_message"]


async def test_a_stall_card_open_across_runs_is_judged_once_and_its_answer_reaches_the_next_turn(
    env, task_queue, store, workspace, scripted
):
    (workspace / "notes.md").write_text("a note\n")
    (workspace / "same.txt").write_text("the same answer every time\n")
    loop = {"name": "read_file", "arguments": {"path": "same.txt"}}
    server = scripted(
        {
            "replies": [
                {"when": "said to continue", "content": "Giving up on same.txt; done."},
                {"when": "PERDURE-AGENT", "tool_calls": [loop]},
            ]
        }
    )
    hunt = agent("hunt", "Find something new.", ["read_file"], max_turns=30)
    steps = [hunt, *reads(SHORT_CHAIN, chained=True)]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_long(
            env, task_queue, workspace, steps, ["read_file"], local_activities_up_to_s=0, stall_threshold=2
        )
        done = await wait_until(
            handle,
            lambda s: s.questions and sum(v == "succeeded" for v in statuses(s).values()) == SHORT_CHAIN,
            timeout_s=120,
        )
        assert statuses(done)["hunt"] == "blocked"
        assert [q.title for q in done.questions] == ["Step 'hunt' is going in circles"]
        assert done.runs >= 3, done.runs
        turns = len(server.requests())
        await submit(handle, Answer(request_id="c-1", question_id=done.questions[0].id, choice="continue"))
        result = await handle.result()
        final = await handle.query(GoalWorkflow.progress)

    assert result.outcome == "succeeded", result.excerpt
    assert len(server.requests()) == turns + 1  # one more turn, which saw the person's answer
    # The turn after the answer was told of it (the reply matched is the one for that note).
    assert server.requests()[-1]["matched"] == 0
    assert final.questions == []


async def test_twin_payments_waiting_on_one_approval_cross_runs_and_pay_once(
    env, task_queue, store, workspace, scripted, payments
):
    (workspace / "notes.md").write_text("a note\n")
    pay = {"amount_cents": 900, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 9"}
    # The same call twice: the second step shares the first's work (and its question).
    twins = [{"name": name, "kind": "tool", "tool": "make_payment", "args": pay} for name in ("pay", "pay-again")]
    steps = [*twins, *reads(SHORT_CHAIN, chained=True)]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start_long(
            env, task_queue, workspace, steps, ["read_file", "make_payment"], local_activities_up_to_s=0
        )
        done = await wait_until(
            handle, lambda s: sum(v == "succeeded" for v in statuses(s).values()) == SHORT_CHAIN, timeout_s=120
        )
        assert done.runs >= 3, done.runs
        assert [q.id for q in done.questions] == ["q1"]
        await submit(handle, Approve(request_id="ok-9", question_id="q1"))
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    assert [e["kind"] for e in payments.ledger()] == ["payment"]


async def test_a_rewind_upstream_of_an_agent_waiting_for_approval_voids_its_wait_and_it_asks_anew(
    env, task_queue, store, workspace, scripted, payments
):
    pay = {"amount_cents": 4_200, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 7"}
    server = scripted(
        {
            "replies": [
                {"when": "to ACME GmbH (payment", "content": "Paid invoice 7."},
                {"when": "PERDURE-AGENT", "tool_calls": [{"name": "make_payment", "arguments": pay}]},
                *STEP_REPLY["replies"],
            ]
        }
    )
    steps = [llm("invoice"), agent("settle", "Settle the invoice.", ["make_payment"], needs=["invoice"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["make_payment"], drift_every=0)
        await wait_until(handle, lambda s: [q.id for q in s.questions] == ["q1"])
        await submit(handle, Rewind(request_id="rw-1", node="invoice", why="that was last month's invoice"))
        # The wait was for work the rewind voided: closed, the step ran again and asks anew.
        asked = await wait_until(handle, lambda s: [q.id for q in s.questions] == ["q2"])
        await submit(handle, Approve(request_id="ok-2", question_id="q2"))
        result = await handle.result()
        inbox = await handle.query(GoalWorkflow.inbox)

    assert result.outcome == "succeeded", result.excerpt
    assert [e["kind"] for e in payments.ledger()] == ["payment"]
    assert statuses(asked) == {"invoice": "succeeded", "settle": "blocked"}
    [rewind] = [e for e in inbox.entries if e.request_id == "rw-1"]
    assert rewind.status == "applied" and rewind.detail["void"] == ["invoice", "settle"]
    assert len(calls_for(server, "invoice")) == 2  # the rewound step ran again
