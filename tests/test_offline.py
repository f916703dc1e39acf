"""A new user's own plans run offline, and a goal given only as text says plainly that no
model ran and nothing was done: no model key, the default profile, the CLI as a user runs it
(`perdure worker` and `perdure start ... --watch` as subprocesses).

The default offline profile answers the demo by its hand-written script and anything else by
the offline policy of activities/models/scripted.py, over the OpenAI wire format, at no cost. Unit tests
of the policy check what it derives from a request: the refusal to plan a goal's text (and the
plan for queued work), the router's light answer to a question, the watchdog judge's offline
verdict, the step text naming its inputs, the tool calls and their schema-built arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import openai
import pytest
import yaml

from perdure.activities.models.scripted import ScriptedServer, schema_arguments
from perdure.activities.tools.catalogue import TOOL_SPECS
from tests.subprocess_rig import perdure, user_env, worker_process

# No timing a loaded machine breaks: make test runs its process tests five at a time.
pytestmark = pytest.mark.parallel_safe

NOTES = "# Notes\n\n- ship the export fix\n- answer Ana about the invoice\n"


@pytest.fixture
def offline_worker(env, tmp_path, task_queue) -> Iterator[dict[str, str]]:
    """A `perdure worker` as a user starts it with no key: the environment to run the CLI in."""
    variables = user_env(env, tmp_path, task_queue)
    with worker_process(variables, tmp_path / "worker.log"):
        yield variables


@pytest.mark.process
def test_a_users_own_plan_runs_offline_end_to_end(offline_worker, tmp_path):
    workspace = tmp_path / "project"
    workspace.mkdir()
    (workspace / "notes.md").write_text(NOTES)
    plan = tmp_path / "my-plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "goal": "Tidy up my notes",
                "steps": [
                    {"name": "outline", "kind": "llm", "prompt": "Outline what the notes are about."},
                    {
                        "name": "tidy",
                        "kind": "agent",
                        "needs": ["outline"],
                        "tools": ["read_file", "write_file"],
                        "prompt": "Read notes.md and write a tidy copy next to it.",
                    },
                ],
            }
        )
    )
    started = perdure(
        "start", "--plan", str(plan), "--workspace", str(workspace), "--id", "offline-plan-1", "--watch",
        env=offline_worker,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    assert "goal offline-plan-1 started" in started.stdout
    assert "succeeded" in started.stdout
    assert "no reply matches" not in started.stdout + started.stderr
    # The agent read the file the prompt names and wrote only a file of its own.
    assert (workspace / "notes.md").read_text() == NOTES
    assert (workspace / "offline-tidy.md").read_text() == "Written offline by step tidy.\n"

    report = perdure("result", "offline-plan-1", env=offline_worker)
    assert report.returncode == 0, report.stderr
    text = " ".join(report.stdout.split())
    assert "[offline] step outline: Outline what the notes are about. inputs: none" in text
    assert "[offline] step tidy done: read_file returned '# Notes - ship the export fix" in text
    assert "write_file returned 'wrote 30 bytes to offline-tidy.md" in text
    # Tokens counted, priced at zero.
    assert re.search(r"outcome: succeeded · tokens [1-9][0-9]* · \$0\.0000", text), text[:500]


@pytest.mark.process
def test_a_goal_text_run_offline_says_plainly_that_no_model_ran_and_nothing_was_done(offline_worker, tmp_path):
    workspace = tmp_path / "project"
    workspace.mkdir()
    started = perdure(
        "start", "List three risks of shipping on Friday", "--workspace", str(workspace), "--id", "offline-goal-1",
        "--watch", env=offline_worker,
    )  # fmt: skip
    watched = " ".join(started.stdout.split())
    status = " ".join(perdure("status", "offline-goal-1", env=offline_worker).stdout.split())
    result = perdure("result", "offline-goal-1", env=offline_worker)
    report = " ".join(result.stdout.split())
    assert "Traceback" not in started.stderr + result.stderr, started.stderr[-2000:]
    # Said before it runs, too: the worker's profile is the offline stand-in.
    warned = " ".join(started.stderr.split())
    assert "warning: model profile 'scripted' is perdure's offline stand-in" in warned, warned
    assert "no model will run and nothing will be done toward it" in warned
    for said in (watched, status, report):
        assert "no model ran" in said and "nothing was done toward this goal" in said, said[:1500]
        assert "succeeded" not in said, said[:1500]  # no step ran, and the goal does not pass for done
    assert "outcome: failed · tokens 0 · $0.0000" in watched and "outcome: failed" in report
    assert "No steps ran." in report
    assert "--plan" in report  # what to do instead
    assert list(workspace.iterdir()) == []


# --- the policy, over the real OpenAI client ------------------------------------------


@pytest.fixture
def offline_server() -> Iterator[ScriptedServer]:
    server = ScriptedServer({"policy": "offline", "steps": {"fetch": {"http_get": {"url": "http://127.0.0.1:9/x"}}}})
    server.start()
    yield server
    server.stop()


def chat(server: ScriptedServer, messages: list[dict], tools: list[str] = ()) -> object:
    client = openai.OpenAI(api_key="unused", base_url=server.openai_base_url, max_retries=0)
    offered = [
        {
            "type": "function",
            "function": {
                "name": n,
                "description": f"{TOOL_SPECS[n].description} (risk: {TOOL_SPECS[n].risk})",
                "parameters": TOOL_SPECS[n].json_schema(),
            },
        }
        for n in tools
    ]
    return client.chat.completions.create(model="scripted", messages=messages, **({"tools": offered} if tools else {}))


def test_the_planner_refuses_a_goals_text_and_revises_a_running_plan_with_one_llm_step(offline_server):
    planner = {"role": "system", "content": "[PERDURE-PLANNER]\nYou are the planner"}
    goal = "Goal:\nWrite the release notes\n\nPremises (current values):\n- a = b"
    with pytest.raises(openai.BadRequestError) as refused:
        chat(offline_server, [planner, {"role": "user", "content": goal}])
    assert refused.value.body["type"] == "perdure_offline"
    assert refused.value.body["message"].startswith("no model ran: ")
    assert "nothing was done toward this goal" in refused.value.body["message"]
    revision = f"{goal}\n\nRevise the current plan. Reason: queued work\n\nCurrent plan:\n{{}}"
    reply = chat(offline_server, [planner, {"role": "user", "content": revision}])
    plan = yaml.safe_load(reply.choices[0].message.content)
    assert plan == {
        "steps": [
            {
                "name": "answer",
                "kind": "llm",
                "prompt": "Work toward this goal and report what you did and found: Write the release notes",
            }
        ]
    }
    assert [r["matched"] for r in offline_server.requests()] == ["offline", "offline"]


def test_the_router_answers_a_question_lightly_and_the_answer_says_no_model_ran(offline_server):
    def route(text: str) -> dict:
        system = {"role": "system", "content": "[PERDURE-ROUTER] You route a user's message"}
        user = {"role": "user", "content": f"Message: {text}\n\nCandidates:\n[]\n\nRecent:\n(nothing)"}
        return yaml.safe_load(chat(offline_server, [system, user]).choices[0].message.content)

    assert route("what is a good font for posters?")["target"] == "answer"
    assert route("How long does the export take")["target"] == "answer"
    assert route("write the release notes")["target"] == "new"
    assert route("do a review of the export code")["target"] == "new"  # an order, not a question
    answer = chat(
        offline_server,
        [{"role": "system", "content": "[PERDURE-ROUTER-ANSWER] Answer"}, {"role": "user", "content": "user: why?"}],
    )
    assert answer.choices[0].message.content.startswith("[offline] no model ran: ")


def test_the_watchdogs_judge_offline_says_no_model_judged_and_asks_for_nothing(offline_server):
    system = {"role": "system", "content": "You are perdure's watchdog. PERDURE-WATCHDOG-JUDGE. Answer with JSON"}
    reply = chat(offline_server, [system, {"role": "user", "content": "Goal g-1: ..."}])
    verdict = json.loads(reply.choices[0].message.content)
    assert verdict["verdict"] == "healthy" and verdict["confidence"] == 0  # no action follows
    assert verdict["reason"].startswith("offline: no model judged this goal")


def test_the_drift_check_is_on_track(offline_server):
    reply = chat(offline_server, [{"role": "system", "content": "[PERDURE-DRIFT]\n"}, {"role": "user", "content": "x"}])
    assert yaml.safe_load(reply.choices[0].message.content)["on_track"] is True


def test_an_agent_calls_each_tool_once_then_names_what_they_returned(offline_server):
    system = {"role": "system", "content": "[PERDURE-AGENT]\nYou carry out one step"}
    first = {"role": "user", "content": "step: fetch\n\nFetch the page and save it."}
    turn1 = chat(offline_server, [system, first], ["http_get", "write_file"]).choices[0].message
    assert [(c.function.name, c.function.arguments) for c in turn1.tool_calls] == [
        ("http_get", '{"url": "http://127.0.0.1:9/x"}')  # the script's per-step entry
    ]
    called = {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in turn1.tool_calls]}
    result = {"role": "tool", "tool_call_id": turn1.tool_calls[0].id, "content": "ERROR: connection refused"}
    turn2 = chat(offline_server, [system, first, called, result], ["http_get", "write_file"]).choices[0].message
    assert turn2.tool_calls[0].function.name == "write_file"
    assert yaml.safe_load(turn2.tool_calls[0].function.arguments) == {
        "path": "offline-fetch.md",
        "content": "Written offline by step fetch.\n",
    }
    called2 = {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in turn2.tool_calls]}
    result2 = {"role": "tool", "tool_call_id": turn2.tool_calls[0].id, "content": "wrote 31 bytes"}
    final = chat(offline_server, [system, first, called, result, called2, result2], ["http_get", "write_file"])
    message = final.choices[0].message
    assert not message.tool_calls
    assert message.content == (
        "[offline] step fetch done: http_get returned 'ERROR: connection refused'; write_file returned 'wrote 31 bytes'"
    )


def test_schema_arguments_fill_required_fields_with_simple_values():
    def arguments(tool: str, prompt: str = "") -> dict:
        spec = TOOL_SPECS[tool]
        return schema_arguments(spec.json_schema(), "s", prompt, f"x (risk: {spec.risk})")

    assert arguments("read_file", "Read docs/plan.md, then notes.txt") == {"path": "docs/plan.md"}
    assert arguments("write_file", "Write docs/plan.md") == {
        "path": "offline-s.md",
        "content": "Written offline by step s.\n",
    }
    assert arguments("run_command") == {"command": "echo offline s"}
    assert arguments("list_dir") == {}
    assert arguments("make_payment") == {"amount_cents": 1, "currency": "offline", "recipient": "offline"}


def test_a_script_without_the_policy_still_refuses_what_it_does_not_match():
    server = ScriptedServer({"replies": [{"when": "hello", "content": "hi"}]}).start()
    try:
        with pytest.raises(openai.BadRequestError, match="no reply matches"):
            chat(server, [{"role": "system", "content": "[PERDURE-STEP]"}, {"role": "user", "content": "step: a"}])
    finally:
        server.stop()
