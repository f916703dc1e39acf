"""The inbox at its edges, on a real dev server: messages sent while no worker runs are
judged in the order they were sent, whatever batch they arrive in, and a signal or an
update of any shape (no argument, several, not an object, huge, not even decodable)
is refused with a reason while the goal goes on, never failing its workflow task.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.service import RPCError

from perdure.starters.client import goal_reads
from perdure.starters.client import message_delivery as steering
from perdure.starters.client.client_errors import GoalEnded
from perdure.workflows.goal.contracts.messages import Abort, Answer, Escalate, Park, Resume, Steer
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, gate, llm, openai_profile
from tests.helpers import calls_for, goal_result, running_worker, start, submit, workflow_task_failures

FAST = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


async def signal(handle: WorkflowHandle, message) -> None:
    await handle.signal(GoalWorkflow.message_signal, message.model_dump(mode="json"))


async def settled(handle: WorkflowHandle, timeout_s: float = 20):
    """The inbox once every message but steer (applied at a model turn) has its receipt."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            view = await handle.query(GoalWorkflow.inbox)
            if all(e.status != "pending" for e in view.entries if e.kind != "steer"):
                return view
        except RPCError:
            pass  # the first workflow task has not run yet
        assert loop.time() < deadline, "messages still pending"
        await asyncio.sleep(0.1)


# --- 3. messages sent while no worker runs --------------------------------------------


async def test_a_resume_sent_right_behind_a_park_with_no_worker_up_is_applied_in_its_turn(
    env, task_queue, store, workspace, scripted
):
    """The session from the issue: steer, the same steer again, park, resume, all by signal
    while no worker runs. Each gets one row and its receipt; the goal ends running, not parked."""
    server = scripted(STEP_REPLY)
    handle = await start(env, task_queue, workspace, [llm("only")])
    steer = Steer(request_id="s1", text="Use plain words.")
    for message in (steer, steer, Park(request_id="p1", reason="waiting for legal"), Resume(request_id="r1")):
        await signal(handle, message)

    async with running_worker(env, task_queue, store, openai_profile(server)):
        result = await asyncio.wait_for(handle.result(), 30)
        inbox = await handle.query(GoalWorkflow.inbox)

    assert result.outcome == "succeeded"
    assert [(e.request_id, e.kind, e.status) for e in inbox.entries] == [
        ("s1", "steer", "applied"),
        ("p1", "park", "applied"),
        ("r1", "resume", "applied"),
    ]
    assert inbox.refused == []
    assert calls_for(server, "only")[0]["last_message"].count("Use plain words.") == 1


async def test_a_message_that_cannot_apply_in_its_turn_gets_a_rejected_receipt(env, task_queue, store, workspace):
    """By update too: what depends on the messages before it is judged in its turn and
    answered with a receipt that says why; only what no order could fix is refused at the door."""
    handle = await start(env, task_queue, workspace, [gate()])
    async with running_worker(env, task_queue, store):
        not_parked = await submit(handle, Resume(request_id="u1"))
        with pytest.raises(WorkflowUpdateFailedError) as reused:
            await submit(handle, Park(request_id="u1", reason="other content, same id"))
        parked = await submit(handle, Park(request_id="u2", reason="lunch"))
        again = await submit(handle, Park(request_id="u3", reason="still lunch"))
        retry = await submit(handle, Park(request_id="u2", reason="lunch"))
        await submit(handle, Abort(request_id="u4"))
        (workspace / "GO").touch()
        result = await goal_result(handle)
        inbox = await handle.query(GoalWorkflow.inbox)

    assert (not_parked.status, not_parked.note) == ("rejected", "the goal is not parked")
    assert "request id 'u1' was already used for a different resume message" in reused.value.cause.message
    assert parked.status == "applied"
    assert (again.status, again.note) == ("rejected", "the goal is already parked (lunch)")
    assert retry == parked
    assert result.outcome == "aborted"
    assert [(e.request_id, e.status) for e in inbox.entries] == [
        ("u1", "rejected"),
        ("u2", "applied"),
        ("u3", "rejected"),
        ("u4", "applied"),
    ]


@dataclass
class Sequential:
    """What applying the messages one after another, in the order sent, must give: the
    goal's rules restated independently of the inbox's code."""

    rows: dict[str, list[str]] = field(default_factory=dict)  # request id -> [kind, status]
    contents: dict[str, dict] = field(default_factory=dict)
    conflicts: int = 0
    parked: bool = False
    aborting: bool = False
    questions: dict[str, str] = field(default_factory=dict)  # id -> "open" or the answer

    def send(self, message) -> None:
        content = message.model_dump(mode="json", exclude={"request_id"})
        rid = message.request_id
        if rid in self.contents:
            self.conflicts += self.contents[rid] != content
            return
        self.contents[rid] = content
        self.rows[rid] = [message.kind, self._apply(message)]

    def _apply(self, message) -> str:
        kind = message.kind
        if kind == "steer":
            return "pending"  # at a model turn; this plan has none
        if self.aborting and kind != "abort":
            return "rejected"
        if kind == "park":
            if self.parked:
                return "rejected"
            self.parked = True
        elif kind == "resume":
            if not self.parked:
                return "rejected"
            self.parked = False
        elif kind == "abort":
            self.aborting = True
        elif kind == "escalate":
            self.questions[f"q{len(self.questions) + 1}"] = "open"
        elif kind == "answer":
            if self.questions.get(message.question_id) != "open" or message.choice not in ESCALATION_OPTIONS:
                return "rejected"
            self.questions[message.question_id] = message.choice
            self.parked = self.parked or message.choice == "park"
            self.aborting = self.aborting or message.choice == "abort"
        return "applied"


ESCALATION_OPTIONS = ("continue", "park", "abort")
FRESH = st.one_of(
    st.builds(lambda t: Steer(request_id="x", text=t), st.sampled_from(["Be brief.", "Cite sources."])),
    st.builds(lambda r: Park(request_id="x", reason=r), st.sampled_from(["waiting for legal", "lunch"])),
    st.just(Resume(request_id="x")),
    st.just(Abort(request_id="x")),
    st.just(Escalate(request_id="x", finding="stalled", detail="no progress for an hour")),
    st.builds(
        lambda q, c: Answer(request_id="x", question_id=q, choice=c),
        st.sampled_from(["q1", "q2"]),
        st.sampled_from([*ESCALATION_OPTIONS, "maybe"]),
    ),
)
# Each send: a fresh message, an exact retry of an earlier one, or other content under an earlier id.
SENDS = st.lists(
    st.tuples(st.sampled_from(["fresh", "fresh", "fresh", "retry", "reuse"]), FRESH, st.integers(0, 7)),
    min_size=1,
    max_size=8,
)


def messages_of(sends: list[tuple[str, Any, int]]) -> list:
    sent: list = []
    for how, message, pick in sends:
        if how == "retry" and sent:
            sent.append(sent[pick % len(sent)])
        elif how == "reuse" and sent:
            earlier = sent[pick % len(sent)]
            sent.append(Steer(request_id=earlier.request_id, text=f"other content for {earlier.request_id}"))
        else:
            sent.append(message.model_copy(update={"request_id": f"m{len(sent)}"}))
    return sent


# The session from the issue, then a person answering an escalation by parking, and a resume.
ISSUE_SESSION = [
    ("fresh", Steer(request_id="x", text="Be brief."), 0),
    ("retry", None, 0),
    ("fresh", Park(request_id="x", reason="waiting for legal"), 0),
    ("fresh", Resume(request_id="x"), 0),
    ("reuse", None, 2),
    ("fresh", Escalate(request_id="x", finding="stalled", detail="no progress"), 0),
    ("fresh", Answer(request_id="x", question_id="q1", choice="park"), 0),
    ("fresh", Resume(request_id="x"), 0),
]


@FAST
@given(sends=SENDS)
@example(sends=ISSUE_SESSION)
@pytest.mark.slow
async def test_any_interleaving_sent_before_a_worker_starts_ends_as_a_sequential_application(
    env, store, tmp_path, sends
):
    messages = messages_of(sends)
    expected = Sequential()
    for message in messages:
        expected.send(message)
    task_queue, workspace = f"tq-{uuid.uuid4().hex[:10]}", tmp_path / uuid.uuid4().hex[:8]
    workspace.mkdir()
    handle = await start(env, task_queue, workspace, [gate()])
    for message in messages:
        await signal(handle, message)

    async with running_worker(env, task_queue, store):
        if expected.aborting:
            await asyncio.wait_for(goal_result(handle), 30)
        inbox = await settled(handle)
        snapshot = await handle.query(GoalWorkflow.progress)
        (workspace / "GO").touch()
        if not expected.aborting:
            await handle.terminate("example checked")
        history = await handle.fetch_history()

    steer_at_end = "rejected" if expected.aborting else "pending"  # never applied: the goal ended first
    rows = {rid: [kind, steer_at_end if kind == "steer" else status] for rid, (kind, status) in expected.rows.items()}
    assert [(e.request_id, [e.kind, e.status]) for e in inbox.entries] == list(rows.items())
    assert len(inbox.refused) == expected.conflicts
    assert all("was already used for a different" in r.reason for r in inbox.refused)
    if not expected.aborting:
        assert snapshot.parked == expected.parked
        assert sorted(q.id for q in snapshot.questions) == sorted(
            q for q, answer in expected.questions.items() if answer == "open"
        )
    assert workflow_task_failures(history) == []


# --- 4. a malformed signal must not break a goal --------------------------------------

UNDECODABLE = RawValue(Payload(metadata={"encoding": b"json/plain"}, data=b"{not json"))


async def test_signals_of_any_shape_are_refused_with_a_reason_and_the_goal_goes_on(
    env, task_queue, store, workspace, scripted
):
    server = scripted(STEP_REPLY)
    handle = await start(env, task_queue, workspace, [llm("only")])
    name = GoalWorkflow.message_signal
    await handle.signal(name)  # `temporal workflow signal --name message` without --input
    await handle.signal(name, args=[{"request_id": "a", "kind": "steer", "text": "x"}, {"also": 1}])
    await handle.signal(name, ["not", "an", "object"])
    await handle.signal(name, "steer: be brief")
    await handle.signal(name, None)
    await handle.signal(name, UNDECODABLE)
    await handle.signal(name, {"request_id": "huge", "kind": "steer", "text": "x" * 1_500_000})
    await handle.signal(name, {"request_id": "long", "kind": "steer", "text": "x", "y" * 5000: 1})
    await handle.signal("mesage", {"request_id": "typo", "kind": "steer", "text": "x"})
    await signal(handle, Steer(request_id="ok", text="Use plain words."))

    async with running_worker(env, task_queue, store, openai_profile(server)):
        result = await asyncio.wait_for(handle.result(), 30)
        inbox = await handle.query(GoalWorkflow.inbox)
        history = await handle.fetch_history()

    assert workflow_task_failures(history) == []
    assert result.outcome == "succeeded"
    assert [(e.request_id, e.status) for e in inbox.entries] == [("ok", "applied")]
    reasons = [(r.request_id, r.reason) for r in inbox.refused]
    assert reasons[0][1].startswith("the 'message' signal carries no argument; it takes exactly one JSON object")
    assert reasons[1][1].startswith("the 'message' signal carries 2 arguments")
    assert reasons[2][1] == "malformed message: expected a JSON object with request_id and kind, got an array"
    assert reasons[3][1].endswith("got a string") and reasons[4][1].endswith("got null")
    assert reasons[5][1].startswith("argument 1 could not be decoded (encoding json/plain)")
    assert reasons[6] == ("huge", "malformed message: steer.text: String should have at most 8000 characters")
    assert reasons[7][0] == "long" and len(reasons[7][1]) == 600 and reasons[7][1].endswith("…")
    assert reasons[8] == (None, "unknown signal 'mesage'; a goal takes messages on the 'message' signal")
    assert len(reasons) == 9


async def test_an_update_of_the_wrong_arity_is_refused_with_a_reason(env, task_queue, store, workspace):
    handle = await start(env, task_queue, workspace, [gate()])
    async with running_worker(env, task_queue, store):
        with pytest.raises(WorkflowUpdateFailedError) as none:
            await handle.execute_update(GoalWorkflow.submit, args=[])
        with pytest.raises(WorkflowUpdateFailedError) as two:
            await handle.execute_update(GoalWorkflow.submit, args=[Abort(request_id="a").model_dump(), {}])
        with pytest.raises(WorkflowUpdateFailedError) as text:
            await handle.execute_update(GoalWorkflow.submit, "abort")
        receipt = await submit(handle, Abort(request_id="b"))
        (workspace / "GO").touch()
        result = await goal_result(handle)
        history = await handle.fetch_history()

    assert none.value.cause.message.startswith("the 'submit' update carries no argument")
    assert two.value.cause.message.startswith("the 'submit' update carries 2 arguments")
    assert text.value.cause.message.endswith("got a string")
    assert receipt.status == "applied" and result.outcome == "aborted"
    assert workflow_task_failures(history) == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
KINDS = ["steer", "park", "resume", "rewind", "narrow", "answer", "abort", "teleport"]
NEAR_MESSAGE = st.builds(
    lambda rid, kind, extra: {"request_id": rid, "kind": kind, **extra},
    st.sampled_from(["r1", "r2", "bad id!", ""]),
    st.sampled_from(KINDS),
    st.dictionaries(st.sampled_from(["text", "reason", "node", "question_id", "choice", "premises"]), JSON, max_size=2),
)
RAW_CALLS = st.lists(
    st.tuples(st.sampled_from(["signal", "update"]), st.lists(JSON | NEAR_MESSAGE, max_size=3)), min_size=1, max_size=6
)


@FAST
@given(calls=RAW_CALLS)
@pytest.mark.slow
async def test_random_raw_signals_and_updates_never_fail_a_workflow_task(env, store, tmp_path, scripted, calls):
    server = scripted(STEP_REPLY)
    task_queue, workspace = f"tq-{uuid.uuid4().hex[:10]}", tmp_path / uuid.uuid4().hex[:8]
    workspace.mkdir()
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [gate(), llm("after", ["gate"])])
        for how, args in calls:
            try:
                if how == "signal":
                    await handle.signal(GoalWorkflow.message_signal, args=args)
                else:
                    await handle.execute_update(GoalWorkflow.submit, args=args)
            except (WorkflowUpdateFailedError, RPCError):
                pass  # refused at the door, or the goal already ended (a random abort)
        with contextlib.suppress(RPCError):  # the goal may have ended (a random abort)
            await signal(handle, Resume(request_id=f"end-{uuid.uuid4().hex[:6]}"))  # in case a random park applied
        (workspace / "GO").touch()
        result = await asyncio.wait_for(goal_result(handle), 30)
        history = await handle.fetch_history()
    assert workflow_task_failures(history) == []
    assert result.outcome in ("succeeded", "aborted")


async def test_a_message_retried_after_the_goal_ended_gets_its_receipt_and_a_new_one_is_refused(
    env, task_queue, store, workspace
):
    """A client whose answer was lost retries the same message (same request id); the goal has
    ended meanwhile. Found by the MCP test once goals finished faster: the retry was refused
    with "it takes no more messages" although the goal had applied it."""
    handle = await start(env, task_queue, workspace, [gate()])
    async with running_worker(env, task_queue, store):
        first = await submit(handle, Steer(request_id="s1", text="be brief"))
        (workspace / "GO").touch()
        await handle.result()
        retried = await steering.deliver(env.client, handle.id, Steer(request_id="s1", text="be brief"))
        with pytest.raises(GoalEnded, match="it takes no more messages"):
            await steering.deliver(env.client, handle.id, Steer(request_id="s2", text="be brief"))
    assert (first.request_id, first.kind) == ("s1", "steer")
    # The receipt as the goal left it: a steer waits for a model turn, which this goal never had.
    assert retried.receipt is not None and (retried.receipt.request_id, retried.receipt.kind) == ("s1", "steer")
    assert retried.receipt.status == "rejected" and first.status == "pending"


async def test_a_message_sent_as_the_goal_finishes_is_answered_as_for_an_ended_goal(
    env, task_queue, store, workspace, monkeypatch
):
    """The goal finishes between the client's describe (open) and its update: the server
    answers "workflow execution already completed". Found by the MCP approval test in CI:
    the retried approve failed with "no such goal" although the goal had applied it."""
    handle = await start(env, task_queue, workspace, [gate()])
    async with running_worker(env, task_queue, store):
        first = await submit(handle, Steer(request_id="s1", text="be brief"))
        open_desc = await handle.describe()
        (workspace / "GO").touch()
        await handle.result()
        real_describe, calls = goal_reads.describe, []

        async def describe_seen_before_it_finished(client, goal_id):
            # Each deliver's first look sees the goal open; a second look sees it as it is.
            calls.append(goal_id)
            return open_desc if len(calls) % 2 else await real_describe(client, goal_id)

        monkeypatch.setattr(goal_reads, "describe", describe_seen_before_it_finished)
        retried = await steering.deliver(env.client, handle.id, Steer(request_id="s1", text="be brief"))
        with pytest.raises(GoalEnded, match="it takes no more messages"):
            await steering.deliver(env.client, handle.id, Steer(request_id="s2", text="be brief"))
    assert len(calls) == 4  # each send saw the goal open first, then looked again
    assert retried.receipt is not None and (retried.receipt.request_id, retried.receipt.kind) == ("s1", "steer")
    assert first.status == "pending"
