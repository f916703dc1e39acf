"""The router: one workflow per user that sends each message to the goal it is for. Explicit
routes (a goal named, an object a goal owns, a card answered) need no model; otherwise a
scripted model chooses among the user's goals, `new` or `answer`, and an unsure or unreadable
choice is asked back. Against a dev server with the production worker and a scripted model;
every routed message is checked where it lands: in the goal's own inbox. And the goals'
end-of-goal memory cards the router holds: answered there (kept in the memory store, or
skipped), carried across continue-as-new, dropped when their memories' shelf life ends."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from perdure.starters.client import goal_reads, router_calls
from perdure.starters.client.client_errors import SayRefused
from perdure.workflows.goal.contracts.goal_contracts import GoalResult
from perdure.workflows.goal.contracts.messages import Abort
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.router.router_contracts import (
    CardAction,
    Pick,
    RouterHandlers,
    RouterInput,
    RouterView,
    Say,
    router_id,
)
from perdure.workflows.router.router_workflow import RouterWorkflow
from perdure.workflows.shared.search_attributes import OWNER
from tests.builders import gate, openai_profile, spec
from tests.helpers import running_worker, wait_until


def writes(path: str) -> list[dict]:
    """A plan that writes `path` and then keeps the goal open until GO exists."""
    step = {"name": "write", "kind": "tool", "tool": "write_file", "args": {"path": path, "content": "v1\n"}}
    return [step, gate(["write"])]


def choice(target: str, confidence: float = 0.9, mode: str = "steer", reason: str = "scripted") -> str:
    return json.dumps({"target": target, "mode": mode, "confidence": confidence, "reason": reason})


def router_requests(server) -> list[dict]:
    """The router's choices asked of the model (their user message starts so)."""
    return [r for r in server.requests() if r["last_message"].startswith("Message: ")]


@pytest.fixture
def user(monkeypatch, task_queue) -> str:
    monkeypatch.setenv("PERDURE_TASK_QUEUE", task_queue)
    return f"u{uuid.uuid4().hex[:8]}"


async def said(env, user: str, text: str, request_id: str, workspace, **fields):
    message = Say(request_id=request_id, text=text, workspace=str(workspace), **fields)
    return await router_calls.say(env.client, user, message, profile="test")


async def inbox_of(env, goal_id: str):
    return await env.client.get_workflow_handle(goal_id).query(GoalWorkflow.inbox)


async def signalled(env, goal_id: str) -> dict[str, dict]:
    """Request id -> the message the goal was sent by signal (as its history holds it)."""
    found = {}
    async for event in env.client.get_workflow_handle(goal_id).fetch_history_events():
        if event.HasField("workflow_execution_signaled_event_attributes"):
            attributes = event.workflow_execution_signaled_event_attributes
            [message] = await env.client.data_converter.decode(attributes.input.payloads)
            found[message["request_id"]] = message
    return found


async def goal_input(env, goal_id: str) -> GoalInput:
    history = await env.client.get_workflow_handle(goal_id).fetch_history()
    payloads = history.events[0].workflow_execution_started_event_attributes.input.payloads
    [value] = await env.client.data_converter.decode(payloads, [GoalInput])
    return value


def goal_ids(user: str) -> tuple[str, str]:
    return f"poster-{user}", f"report-{user}"


async def open_goal(env, task_queue, workspace, goal_id: str, path: str, owner: str | None = None):
    """A goal under `goal_id` that has written `path` and stays open (until GO exists)."""
    goal_spec = spec(workspace, plan={"steps": writes(path)}, allowed_tools=["write_file", "run_command"])
    owned = TypedSearchAttributes([SearchAttributePair(OWNER, owner)] if owner else [])
    handle = await env.client.start_workflow(
        GoalWorkflow.run, GoalInput(spec=goal_spec), id=goal_id, task_queue=task_queue, search_attributes=owned
    )
    await wait_until(handle, lambda s: "gate" in s.running)
    return handle


async def two_open_goals(env, task_queue, workspace, user: str):
    poster_id, report_id = goal_ids(user)
    return (
        await open_goal(env, task_queue, workspace, poster_id, "poster.svg"),
        await open_goal(env, task_queue, workspace, report_id, "report.md"),
    )


@pytest.mark.slow
async def test_a_message_naming_a_file_a_goal_owns_goes_to_that_goal_without_a_model_call(
    env, task_queue, store, workspace, scripted, user
):
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        poster, report = await two_open_goals(env, task_queue, workspace, user)
        # Another user's goal owning a poster.svg too is none of this user's business.
        await open_goal(env, task_queue, workspace, f"theirs-{user}", "poster.svg", owner="someone-else")
        routing = await said(env, user, "in poster.svg make the title bigger", "m1", workspace)
        inbox = await inbox_of(env, poster.id)
    assert routing is not None and routing.status == "routed"
    assert (routing.by, routing.action, routing.goal_id) == ("bound object", "steer", poster.id)
    assert routing.reason == f"it names poster.svg, which goal {poster.id} owns"
    assert f"theirs-{user}" not in routing.candidates
    assert router_requests(server) == []  # decided without a model
    [entry] = [e for e in inbox.entries if e.request_id == "router.m1"]
    assert entry.kind == "steer" and entry.status in ("pending", "applied")


@pytest.mark.slow
async def test_wednesday_a_message_without_names_reaches_mondays_goal_by_the_models_choice(
    env, task_queue, store, workspace, scripted, user
):
    poster_id, _ = goal_ids(user)
    warmer = {"when": ["[PERDURE-ROUTER]", "a bit warmer"], "content": choice(poster_id, reason="poster")}
    server = scripted({"replies": [warmer]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        poster, report = await two_open_goals(env, task_queue, workspace, user)
        routing = await said(env, user, "make the poster a bit warmer", "wed-1", workspace)
        inbox = await inbox_of(env, poster.id)
    assert routing is not None
    assert (routing.by, routing.action, routing.goal_id, routing.confidence) == ("model", "steer", poster.id, 0.9)
    assert set(routing.candidates) >= {poster.id, report.id} and routing.reason == "poster"
    [request] = router_requests(server)
    assert poster.id in json.dumps(request) and report.id in json.dumps(request)  # the model saw both
    assert any(e.request_id == "router.wed-1" and e.kind == "steer" for e in inbox.entries)


@pytest.mark.slow
async def test_an_unsure_choice_is_asked_back_and_the_users_pick_routes_it(
    env, task_queue, store, workspace, scripted, user
):
    poster_id, report_id = goal_ids(user)
    unsure = {"when": ["[PERDURE-ROUTER]", "tweak it"], "content": choice(poster_id, confidence=0.3, reason="maybe")}
    server = scripted({"replies": [unsure]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        poster, report = await two_open_goals(env, task_queue, workspace, user)
        asked = await said(env, user, "tweak it", "m-unsure", workspace)
        picked = await said(env, user, "pick", "m-pick", workspace, pick=Pick(request_id="m-unsure", choice=report_id))
        wrong = await said(env, user, "pick", "m-pick-2", workspace, pick=Pick(request_id="m-unsure", choice=report_id))
        inbox = await inbox_of(env, report.id)
        view = await router_calls.view(env.client, user)
    assert asked is not None and asked.status == "asked" and asked.goal_id is None
    assert asked.reason == "the model was unsure (maybe)" and {poster_id, report_id, "new", "answer"} <= set(
        asked.choices
    )
    assert picked is not None and (picked.by, picked.goal_id, picked.action) == ("person", report_id, "steer")
    [original] = [m for m in view.messages if m.request_id == "m-unsure"]
    assert (original.status, original.by, original.goal_id) == ("routed", "person", report_id)
    assert any(e.request_id == "router.m-unsure" and e.kind == "steer" for e in inbox.entries)  # the original text
    assert wrong is not None and wrong.status == "failed" and "nothing is waiting for a pick" in wrong.reason
    assert view.asked == []


@pytest.mark.slow
async def test_an_unreadable_model_reply_is_asked_back_not_guessed(env, task_queue, store, workspace, scripted, user):
    bad = [
        {"when": ["[PERDURE-ROUTER]", "alpha"], "content": "the poster one, I think", "times": 1},
        {"when": ["[PERDURE-ROUTER]", "bravo"], "content": choice("no-such-goal"), "times": 1},
    ]
    server = scripted({"replies": bad})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        first = await said(env, user, "alpha", "m-bad-1", workspace)
        second = await said(env, user, "bravo", "m-bad-2", workspace)
    assert first is not None and first.status == "asked"
    assert first.reason.startswith("the model's choice could not be read (the reply is not JSON")
    assert second is not None and second.status == "asked"
    assert "'no-such-goal', which is none of the candidates" in second.reason


@pytest.mark.slow
async def test_a_light_request_is_answered_by_the_router_and_grows_into_a_goal_when_followed_up(
    env, task_queue, store, workspace, scripted, user
):
    script = [
        {"when": ["[PERDURE-ROUTER]", "good font"], "content": choice("answer", reason="a quick question"), "times": 1},
        {"when": ["[PERDURE-ROUTER-ANSWER]", "good font"], "content": "A bold sans-serif, such as Inter.", "times": 1},
        {
            "when": ["[PERDURE-ROUTER]", "three variants"],
            "content": choice("t-light-1", reason="same"),
            "times": 1,
        },
        {"when": ["[PERDURE-ROUTER]", "weather"], "content": choice("answer", reason="quick"), "times": 1},
        {"when": ["[PERDURE-ROUTER-ANSWER]", "weather"], "content": "NEEDS_GOAL: it needs a web lookup"},
    ]
    server = scripted({"replies": script, "policy": "offline"})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        light = await said(env, user, "what is a good font for posters?", "light-1", workspace)
        grown = await said(env, user, "ok, make three variants of the poster with it", "light-2", workspace)
        needs = await said(env, user, "what will the weather be on Saturday?", "light-3", workspace)
        started = await goal_input(env, grown.goal_id)
        for goal_id in (grown.goal_id, needs.goal_id):
            await goal_reads.result(env.client, goal_id)  # offline, a goal's text is not planned: it fails
    assert light is not None and (light.action, light.reply) == ("answered", "A bold sans-serif, such as Inter.")
    assert light.goal_id is None
    assert grown is not None and grown.action == "upgraded" and grown.goal_id
    assert grown.reason == "a follow-up of a light request: same"
    conversation = started.spec.goal
    assert "user: what is a good font for posters?" in conversation
    assert "router: A bold sans-serif, such as Inter." in conversation and "three variants" in conversation
    assert started.spec.workspace == str(workspace)
    assert needs is not None and needs.action == "upgraded" and needs.reason == "it needs a goal: it needs a web lookup"


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["completed", "failed"])
async def test_a_message_for_a_goal_that_has_ended_starts_a_follow_up_in_its_workspace(
    env, task_queue, store, workspace, scripted, user, ending
):
    server = scripted({"replies": [], "policy": "offline"})
    done_id = f"notes-{user}"
    async with running_worker(env, task_queue, store, openai_profile(server)):
        # Owned by this user: the other parametrisation's goal (no owner would be anyone's) is no candidate.
        handle = await open_goal(env, task_queue, workspace, done_id, "notes.md", owner=user)
        if ending == "completed":
            (workspace / "GO").write_text("")
        else:  # aborted: its workflow fails, the result (what it owns) in the failure
            await handle.signal(GoalWorkflow.message_signal, Abort(request_id="stop").model_dump(mode="json"))
        await goal_reads.ended(handle)
        routing = await said(env, user, "fix the typo in notes.md", "m-follow", workspace / "elsewhere")
        started = await goal_input(env, routing.goal_id)
    assert routing is not None and (routing.by, routing.action) == ("bound object", "follow-up goal"), routing
    assert routing.goal_id != done_id and f"{done_id} has ended ({ending})" in routing.reason
    assert started.spec.workspace == str(workspace)  # the ended goal's, not the message's
    assert f"This follows goal {done_id}" in started.spec.goal


@pytest.mark.slow
async def test_offline_a_question_is_answered_as_a_light_request_and_a_goal_made_offline_says_nothing_was_done(
    env, task_queue, store, workspace, scripted, user
):
    server = scripted({"replies": [], "policy": "offline"})  # the offline policy answers every call
    async with running_worker(env, task_queue, store, openai_profile(server)):
        question = await said(env, user, "what is a good font for posters?", "off-q", workspace)
        order = await said(env, user, "compose a haiku about penguins", "off-new", workspace)
        result = await goal_reads.result(env.client, order.goal_id)  # a failed goal still carries its result
    assert question is not None and (question.action, question.goal_id) == ("answered", None), question
    assert question.reply.startswith("[offline] no model ran: ") and "not answered" in question.reply
    assert order is not None and order.action == "new goal"
    assert result.outcome == "failed" and "nothing was done toward this goal" in (result.failure or "")


async def test_explicit_goal_queue_and_a_card_answer_reach_the_goal_through_its_own_admission(
    env, task_queue, store, workspace, scripted, user
):
    server = scripted({"replies": []})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        poster, report = await two_open_goals(env, task_queue, workspace, user)
        by_at = await said(env, user, f"@{report.id} add a summary table", "m-at", workspace)
        queued = await said(env, user, "then a cover page", "m-q", workspace, goal_id=poster.id, queue=True)
        card = CardAction(goal_id=poster.id, question_id="q-none", choice="approve")
        carded = await said(env, user, "approve", "m-card", workspace, card=card)
        missing = await said(env, user, "hello", "m-missing", workspace, goal_id=f"gone-{user}")
        poster_inbox, report_inbox = await inbox_of(env, poster.id), await inbox_of(env, report.id)
        to_poster, to_report = await signalled(env, poster.id), await signalled(env, report.id)
    assert router_requests(server) == []
    assert (by_at.by, by_at.action, by_at.goal_id) == ("explicit goal", "steer", report.id)
    assert any(e.request_id == "router.m-at" and e.kind == "steer" for e in report_inbox.entries)
    assert to_report["router.m-at"]["text"] == "add a summary table"  # the @name is the address, not the message
    assert (queued.action, queued.goal_id) == ("queue", poster.id)
    assert any(e.request_id == "router.m-q" and e.kind == "queue" for e in poster_inbox.entries)
    assert (carded.by, carded.action) == ("card", "answer")
    assert any(e.request_id == "router.m-card" and e.kind == "answer" for e in poster_inbox.entries)
    assert to_poster["router.m-card"] | {"request_id": ""} == {
        "request_id": "",
        "kind": "answer",
        "question_id": "q-none",
        "choice": "approve",
        "text": None,
        "by": user,  # the router sends for its user: the goal's decision log names them
    }
    assert missing.status == "failed" and f"goal gone-{user} cannot take messages" in missing.reason


@pytest.mark.slow
async def test_messages_sent_while_no_worker_runs_are_kept_and_routed_in_order_once_one_does(
    env, task_queue, store, workspace, scripted, user
):
    server = scripted({"replies": []})
    poster_id, _ = goal_ids(user)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        poster = await open_goal(env, task_queue, workspace, poster_id, "poster.svg")
        await router_calls.ensure_router(env.client, user, "test")
    handle = env.client.get_workflow_handle(router_id(user))
    # No worker: the update cannot be answered, so each message goes by signal.
    router_calls.ACCEPT_WAIT, wait = router_calls.ACCEPT_WAIT.__class__(seconds=1), router_calls.ACCEPT_WAIT
    try:
        first = await said(env, user, "poster.svg: bigger title", "offline-1", workspace)
        second = await said(env, user, "poster.svg: and a border", "offline-2", workspace)
    finally:
        router_calls.ACCEPT_WAIT = wait
    await handle.signal(RouterHandlers.SAY)  # no argument
    await handle.signal(RouterHandlers.SAY, {"request_id": "x", "text": 42})  # wrong type
    await handle.signal("sya", {"request_id": "x", "text": "typo in the signal name"})
    assert first is None and second is None
    async with running_worker(env, task_queue, store, openai_profile(server)):
        view = await wait_for_view(env, user, lambda v: v.pending == 0 and len(v.refusals) == 3)
        inbox = await inbox_of(env, poster.id)
    routed = [m for m in view.messages if m.request_id.startswith("offline-")]
    assert [(m.request_id, m.status, m.goal_id) for m in routed] == [
        ("offline-1", "routed", poster_id),
        ("offline-2", "routed", poster_id),
    ]
    steers = [e.request_id for e in inbox.entries if e.request_id.startswith("router.offline-")]
    assert steers == ["router.offline-1", "router.offline-2"]  # in the order they were sent
    reasons = [r.reason for r in view.refusals]
    assert "carries no argument" in reasons[0] and "text" in reasons[1] and "unknown signal 'sya'" in reasons[2]


async def wait_for_view(env, user: str, predicate, timeout_s: float = 30) -> RouterView:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            view = await router_calls.view(env.client, user)
            if predicate(view):
                return view
        except Exception:  # noqa: BLE001 - not answering yet
            pass
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the router never got there")
        await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_a_question_open_at_continue_as_new_is_carried_and_its_pick_lands_in_the_next_run(
    env, task_queue, store, workspace, scripted, user
):
    poster_id, _ = goal_ids(user)
    unsure = {"when": ["[PERDURE-ROUTER]", "tweak"], "content": choice(poster_id, confidence=0.2), "times": 1}
    server = scripted({"replies": [unsure]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        poster = await open_goal(env, task_queue, workspace, poster_id, "poster.svg")
        router = await env.client.start_workflow(
            RouterWorkflow.run,
            RouterInput(user=user, profile="test", continue_after=2),
            id=router_id(user),
            task_queue=task_queue,
        )
        asked = await said(env, user, "tweak the colours", "can-1", workspace)
        await said(env, user, "poster.svg: a border", "can-2", workspace)
        view = await wait_for_view(env, user, lambda v: v.runs == 2)
        picked = await said(env, user, "pick", "can-3", workspace, pick=Pick(request_id="can-1", choice=poster_id))
        after = await router_calls.view(env.client, user)
        inbox = await inbox_of(env, poster.id)
    first_run = env.client.get_workflow_handle(router_id(user), run_id=router.first_execution_run_id)
    assert (await first_run.describe()).status == WorkflowExecutionStatus.CONTINUED_AS_NEW
    assert asked.status == "asked" and [m.request_id for m in view.asked] == ["can-1"]  # carried
    assert picked.status == "routed" and picked.goal_id == poster_id and after.asked == []
    assert [e.request_id for e in inbox.entries if e.request_id.startswith("router.")] == [
        "router.can-2",
        "router.can-1",
    ]


@pytest.mark.slow  # starts the CLI four times
def test_perdure_say_and_inbox_router_print_the_decision_and_why_without_a_traceback(
    env, task_queue, store, workspace, scripted, user, tmp_path
):
    """The CLI from outside: `perdure say` prints where the message went and why,
    `perdure inbox --router` lists it; bad input is one clear line."""
    server = scripted({"replies": []})
    poster_id, _ = goal_ids(user)
    cli_env = {
        **os.environ,
        "PERDURE_TEMPORAL": env.client.service_client.config.target_host,
        "PERDURE_TASK_QUEUE": task_queue,
        "PERDURE_USER": user,
        "NO_COLOR": "1",
        "COLUMNS": "200",
    }

    def perdure(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(Path(sys.executable).parent / "perdure"), *args],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    async def scenario() -> list[subprocess.CompletedProcess]:
        async with running_worker(env, task_queue, store, openai_profile(server)):
            await open_goal(env, task_queue, workspace, poster_id, "poster.svg")
            return [
                await asyncio.to_thread(perdure, "say", "poster.svg: bigger title", "--workspace", str(workspace)),
                await asyncio.to_thread(perdure, "inbox", "--router"),
                await asyncio.to_thread(perdure, "say", "--pick", "nonsense"),
                await asyncio.to_thread(perdure, "say", ""),
            ]

    said_, inbox, bad_pick, empty = asyncio.run(scenario())
    assert said_.returncode == 0, said_.stderr
    assert f"→ steer {poster_id} (by bound object): it names poster.svg, which goal {poster_id} owns" in said_.stdout
    assert inbox.returncode == 0 and "poster.svg: bigger title" in inbox.stdout and "bound object" in inbox.stdout
    for bad in (bad_pick, empty):
        assert bad.returncode == 2 and "Traceback" not in bad.stderr + bad.stdout
    assert "REQUEST_ID=CHOICE" in bad_pick.stderr


@pytest.mark.slow
async def test_the_json_api_takes_a_message_for_the_router_and_shows_its_decisions(
    env, task_queue, store, workspace, scripted, user, ui, monkeypatch
):
    import httpx

    monkeypatch.setenv("PERDURE_USER", user)
    server = scripted({"replies": []})
    poster_id, _ = goal_ids(user)
    async with running_worker(env, task_queue, store, openai_profile(server)), httpx.AsyncClient(base_url=ui) as http:
        await open_goal(env, task_queue, workspace, poster_id, "poster.svg")
        said_ = await http.post("/api/say", json={"text": "poster.svg: a bigger title"}, timeout=40)
        listed = await http.get("/api/router")
        wrong = await http.post("/api/say", json={"text": 3})
        empty = await http.post("/api/say", json={"text": ""})
        extra = await http.post("/api/say", json={"text": "hi", "colour": "red"})
    assert said_.status_code == 200, said_.text
    assert wrong.status_code == 400
    assert (said_.json()["by"], said_.json()["goal_id"]) == ("bound object", poster_id)
    assert listed.status_code == 200 and [m["goal_id"] for m in listed.json()["messages"]] == [poster_id]
    assert wrong.json() == {"error": "text: Input should be a valid string"}
    assert empty.status_code == 400 and "text" in empty.json()["error"]
    assert extra.status_code == 400 and "colour" in extra.json()["error"]


# --- the goals' memory cards ---------------------------------------------------------------


def concluding(step: str, *claims: str) -> dict:
    """The scripted reply of an llm step `step` stating these claims as conclusions."""
    return {"when_last": f"step: {step}\n", "content": "\n".join(f"CONCLUSION: {c} = true" for c in claims)}


async def goal_with_card(env, task_queue, workspace, goal_id: str, user: str, step: str) -> GoalResult:
    """A goal of `user` whose one llm step concludes something: it ends at once, its card
    sent to the user's router."""
    goal_spec = spec(workspace, plan={"steps": [{"name": step, "kind": "llm", "prompt": "Look."}]}, drift_every=0)
    handle = await env.client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=goal_spec),
        id=goal_id,
        task_queue=task_queue,
        search_attributes=TypedSearchAttributes([SearchAttributePair(OWNER, user)]),
    )
    return await handle.result()


def semantic_texts(home: Path, goal_id: str) -> list[str]:
    from perdure.memory.store import open_store

    memory = open_store(home=home, create=False)
    try:
        return sorted(m.text for m in memory.listing(goal=goal_id, layer="semantic"))
    finally:
        memory.close()


@pytest.mark.slow
async def test_a_memory_card_is_answered_by_number_through_the_json_api_and_skip_keeps_nothing(
    env, task_queue, store, workspace, scripted, user, ui, monkeypatch, tmp_path
):
    import httpx

    monkeypatch.setenv("PERDURE_USER", user)
    server = scripted(
        {
            "replies": [
                concluding("facts", "the parser is generated by the build", "the tests need the generated parser"),
                concluding("other", "the docs build needs the theme installed"),
            ]
        }
    )
    facts, other = f"facts-{user}", f"other-{user}"
    async with running_worker(env, task_queue, store, openai_profile(server)), httpx.AsyncClient(base_url=ui) as http:
        await goal_with_card(env, task_queue, workspace, facts, user, "facts")  # starts the router
        await goal_with_card(env, task_queue, workspace, other, user, "other")  # signals the running one
        held = await wait_for_view(env, user, lambda v: len(v.cards) == 2)
        card = {"goal_id": facts, "question_id": "memory"}
        wrong = await http.post("/api/say", json={"text": "maybe", "card": card | {"choice": "maybe"}}, timeout=40)
        chose = await http.post("/api/say", json={"text": "2", "card": card | {"choice": "choose"}}, timeout=40)
        skipped = await said(
            env, user, "skip", "skip-1", workspace, card=CardAction(goal_id=other, question_id="memory", choice="skip")
        )
        after = await router_calls.view(env.client, user)

    assert [c.goal_id for c in held.cards] == [facts, other]
    assert [c.text for c in held.cards[0].candidates] == [
        "the parser is generated by the build (holds)",
        "the tests need the generated parser (holds)",
    ]
    assert wrong.status_code == 200 and wrong.json()["status"] == "failed"
    assert "'maybe' does not answer a memory card; one of: project, global, skip, choose" in wrong.json()["reason"]
    assert chose.status_code == 200, chose.text
    assert (chose.json()["by"], chose.json()["action"], chose.json()["goal_id"]) == ("card", "kept", facts)
    assert semantic_texts(tmp_path, facts) == ["the tests need the generated parser (holds)"]  # only number 2
    assert (skipped.action, skipped.reason) == ("kept", f"kept none of 1 conclusion(s) of goal {other} (skip)")
    assert semantic_texts(tmp_path, other) == []
    assert after.cards == []
    assert [(k.goal_id, k.answer, k.scope, len(k.promoted)) for k in after.kept] == [
        (facts, "choose", "project", 1),
        (other, "skip", None, 0),
    ]


@pytest.mark.slow
async def test_a_memory_card_survives_the_routers_continue_as_new_and_other_card_answers_still_go_to_goals(
    env, task_queue, store, workspace, scripted, user, tmp_path
):
    server = scripted({"replies": [concluding("probe", "the release script needs a signed tag")]})
    done_id, poster_id = f"done-{user}", f"poster-{user}"
    async with running_worker(env, task_queue, store, openai_profile(server)):
        router = await env.client.start_workflow(
            RouterWorkflow.run,
            RouterInput(user=user, profile="test", continue_after=2),
            id=router_id(user),
            task_queue=task_queue,
        )
        poster = await open_goal(env, task_queue, workspace, poster_id, "poster.svg", owner=user)
        await goal_with_card(env, task_queue, workspace, done_id, user, "probe")
        await wait_for_view(env, user, lambda v: len(v.cards) == 1)
        for n in (1, 2):
            await said(env, user, "hello", f"can-{n}", workspace, goal_id=f"gone-{user}")
        carried = await wait_for_view(env, user, lambda v: v.runs == 2)
        kept = await said(
            env,
            user,
            "keep",
            "keep-1",
            workspace,
            card=CardAction(goal_id=done_id, question_id="memory", choice="global"),
        )
        # Not a card the router holds: to the goal, as any card's answer.
        again = await said(
            env,
            user,
            "keep",
            "keep-2",
            workspace,
            card=CardAction(goal_id=done_id, question_id="memory", choice="global"),
        )
        forwarded = await said(
            env,
            user,
            "yes",
            "fwd-1",
            workspace,
            card=CardAction(goal_id=poster_id, question_id="memory", choice="project"),
        )
        inbox = await inbox_of(env, poster.id)
    first_run = env.client.get_workflow_handle(router_id(user), run_id=router.first_execution_run_id)
    assert (await first_run.describe()).status == WorkflowExecutionStatus.CONTINUED_AS_NEW
    assert [c.goal_id for c in carried.cards] == [done_id]
    assert (kept.by, kept.action, kept.goal_id) == ("card", "kept", done_id)
    assert "kept 1 of 1 conclusion(s)" in kept.reason and "everywhere" in kept.reason
    assert semantic_texts(tmp_path, done_id) == ["the release script needs a signed tag (holds)"]
    assert again.status == "failed" and f"goal {done_id} cannot take messages" in again.reason
    assert (forwarded.by, forwarded.action, forwarded.goal_id) == ("card", "answer", poster_id)
    assert any(e.request_id == "router.fwd-1" and e.kind == "answer" for e in inbox.entries)


@pytest.mark.slow
async def test_an_unanswered_memory_card_is_dropped_when_its_memories_shelf_life_ends(
    ts_env, task_queue, store, workspace, scripted, user
):
    """With time skipping, the idle router's clock jumps to its next timer: the end of
    the card's shelf life (90 days on), where it drops the card."""
    server = scripted({"replies": [concluding("probe", "the release script needs a signed tag")]})
    goal_id = f"old-{user}"
    async with running_worker(ts_env, task_queue, store, openai_profile(server)):
        await goal_with_card(ts_env, task_queue, workspace, goal_id, user, "probe")
        view = await wait_for_view(ts_env, user, lambda v: v.cards == [] and v.runs == 1)
        history = await ts_env.client.get_workflow_handle(router_id(user)).fetch_history()
    signalled_at = next(
        e.event_time.ToDatetime()
        for e in history.events
        if e.HasField("workflow_execution_signaled_event_attributes")
        and e.workflow_execution_signaled_event_attributes.signal_name == RouterHandlers.MEMORY_CARD
    )
    [timer] = [e for e in history.events if e.HasField("timer_started_event_attributes")]
    waited = timer.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
    assert timedelta(days=89) < waited <= timedelta(days=90)
    assert any(e.HasField("timer_fired_event_attributes") for e in history.events)
    assert history.events[-1].event_time.ToDatetime() - signalled_at >= timedelta(days=89)
    assert view.cards == [] and view.kept == []  # dropped, nothing kept


def test_offline_the_router_picks_the_goal_sharing_most_words_and_else_a_new_one():
    from perdure.activities.models.scripted import offline_reply
    from perdure.activities.router.router_activities import ANSWER_PROMPT, CHOOSE_PROMPT

    def body(system: str, user: str) -> dict:
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}

    listed = [{"id": "poster-1", "goal": "Design the bake sale poster"}, {"id": "report-1", "goal": "Quarterly report"}]
    asked = f"Message: make the bake sale poster warmer\n\nCandidates:\n{json.dumps(listed)}\n\nRecent:\n(nothing)"
    unrelated = f"Message: book a dentist appointment\n\nCandidates:\n{json.dumps(listed)}\n\nRecent:\n(nothing)"
    assert offline_reply(body(CHOOSE_PROMPT, asked), {}).json_value["target"] == "poster-1"
    assert offline_reply(body(CHOOSE_PROMPT, unrelated), {}).json_value["target"] == "new"
    assert offline_reply(body(ANSWER_PROMPT, "user: hi"), {}).content.startswith("[offline]")


@pytest.mark.slow
async def test_a_long_message_sent_again_is_the_same_message_and_another_under_its_id_is_refused(
    env, task_queue, store, workspace, scripted, user
):
    server = scripted({"replies": []})
    poster_id, _ = goal_ids(user)
    long_text = "poster.svg: " + "make it warmer and friendlier " * 30  # past the 500 chars the router shows
    async with running_worker(env, task_queue, store, openai_profile(server)):
        await open_goal(env, task_queue, workspace, poster_id, "poster.svg")
        first = await said(env, user, long_text, "long-1", workspace)
        again = await said(env, user, long_text, "long-1", workspace)
        with pytest.raises(SayRefused, match="already used for another message"):
            await said(env, user, "poster.svg: something else", "long-1", workspace)
        view = await router_calls.view(env.client, user)
        inbox = await inbox_of(env, poster_id)
    assert first.status == again.status == "routed" and again.goal_id == poster_id
    assert [m.request_id for m in view.messages] == ["long-1"]
    assert [e.request_id for e in inbox.entries if e.request_id.startswith("router.")] == ["router.long-1"]


@pytest.mark.slow
@pytest.mark.process  # runs `perdure say` as a user does
async def test_perdure_say_returns_within_seconds_when_no_worker_runs_and_a_retry_is_routed_once(
    env, task_queue, store, workspace, scripted, user
):
    """Just after the last worker stopped (the server still lists its pollers) `perdure say`
    cannot get a decision: it says the message is accepted, within seconds, instead of
    waiting forever for the update. A retry with the same request id is the same message:
    once a worker runs it reaches the goal once."""
    server = scripted({"replies": []})
    poster_id, _ = goal_ids(user)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        poster = await open_goal(env, task_queue, workspace, poster_id, "poster.svg")
        await router_calls.ensure_router(env.client, user, "test")
    cli_env = {**os.environ, "PERDURE_TEMPORAL": env.client.service_client.config.target_host, "PERDURE_USER": user}
    cli_env |= {"NO_COLOR": "1", "COLUMNS": "200"}
    say = [str(Path(sys.executable).parent / "perdure"), "say", "poster.svg: bigger title", "--request-id", "late-1"]

    def timed_say() -> tuple[subprocess.CompletedProcess, float]:
        started = time.monotonic()
        done = subprocess.run(say, env=cli_env, capture_output=True, text=True, timeout=60)
        return done, time.monotonic() - started

    first, first_s = await asyncio.to_thread(timed_say)
    retry, retry_s = await asyncio.to_thread(timed_say)
    for done, seconds in ((first, first_s), (retry, retry_s)):
        assert done.returncode == 0, done.stderr
        assert "accepted as late-1" in done.stdout and "routed when a worker runs" in done.stdout
        assert "Traceback" not in done.stdout + done.stderr
        assert seconds < 15, seconds
    async with running_worker(env, task_queue, store, openai_profile(server)):
        view = await wait_for_view(env, user, lambda v: v.pending == 0 and v.messages)
        inbox = await inbox_of(env, poster.id)
    assert [(m.request_id, m.status, m.goal_id) for m in view.messages] == [("late-1", "routed", poster_id)]
    assert [e.request_id for e in inbox.entries if e.request_id.startswith("router.")] == ["router.late-1"]
