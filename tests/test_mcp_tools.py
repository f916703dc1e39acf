"""MCP servers named in config.toml as tool sources (issue 23, part 1b), shown from outside:
calls counted in the test server's own ledger (testing/ledger_mcp_server.py, a real stdio MCP
server on the official SDK), outputs read from the goal's report and nodes, and the goal's
history searched for the server's secret."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.testing import ActivityEnvironment

from perdure.activities.mcp.mcp_calls import McpServers
from perdure.activities.mcp.mcp_config import McpConfigInvalid, load_mcp_servers, resolve_headers, servers_from
from perdure.activities.models.model_activities import agent_tools, tool_catalogue
from perdure.activities.tools.run_tool import ToolActivities
from perdure.starters.client.goal_specs import plan_from_mapping, plan_tools
from perdure.starters.client.start_checks import start_problems
from perdure.testing.ledger_mcp_server import read_ledger
from perdure.workers.worker_capabilities import CapabilitiesResult
from perdure.workflows.goal.contracts.messages import Approve
from perdure.workflows.goal.contracts.plan import Plan, check_plan
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared.contracts import ToolInput
from perdure.workflows.shared.mcp_tools import McpTool, mcp_tool_name, tool_table
from tests.builders import agent, openai_profile, spec
from tests.helpers import free_ports, goal_result, running_worker, start, submit, wait_until
from tests.subprocess_rig import PERDURE, stop

SECRET_ENV = "PERDURE_TEST_MCP_TOKEN"
SECRET = "mcp-secret-7f3a9c1e5b"
NOTE = "mcp__notes__add_note"


def ledger_dir(tmp_path: Path) -> Path:
    """Where the test server writes its ledger: the one directory its sandbox may write."""
    directory = tmp_path / "ledger"
    directory.mkdir(exist_ok=True)
    return directory


def notes_config(tmp_path: Path, tools: str = "", extra: str = "") -> Path:
    """A config.toml naming the test server as `notes`, its ledger in tmp_path/ledger."""
    config = tmp_path / "config.toml"
    directory = ledger_dir(tmp_path)
    config.write_text(
        "[mcp_servers.notes]\n"
        f"command = {json.dumps(sys.executable)}\n"
        f'args = ["-m", "perdure.testing.ledger_mcp_server", "--ledger", '
        f"{json.dumps(str(directory / 'ledger.jsonl'))}, "
        f'"--hold", {json.dumps(str(directory / "hold"))}, "--secret-env", "{SECRET_ENV}"]\n'
        f'env = ["{SECRET_ENV}"]\n'
        f"writable = [{json.dumps(str(directory))}]\n" + extra + tools
    )
    return config


@pytest.fixture
def notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The test server's McpServers as a worker loads them, with its secret in the worker's environment."""
    monkeypatch.setenv(SECRET_ENV, SECRET)

    def make(tools: str = "") -> McpServers:
        return McpServers(load_mcp_servers(notes_config(tmp_path, tools)))

    return make


def ledger(tmp_path: Path, tool: str | None = None) -> list[dict]:
    return [e for e in read_ledger(ledger_dir(tmp_path) / "ledger.jsonl") if tool is None or e["tool"] == tool]


@pytest.fixture
def one_step_goal(env, task_queue, store, workspace, scripted):
    """`async with one_step_goal(servers, tool, args, name) as handle`: a goal of one tool
    step (the tool allowed), run by a worker with these MCP servers."""

    @asynccontextmanager
    async def run(servers: McpServers, tool: str, args: dict, name: str) -> AsyncIterator[WorkflowHandle]:
        steps = [{"name": name, "kind": "tool", "tool": tool, "args": args}]
        async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []})), mcp=servers):
            yield await start(env, task_queue, workspace, steps, allowed_tools=[tool])

    return run


@pytest.mark.slow
async def test_a_plan_step_calls_an_mcp_tool_once_and_its_output_is_the_step_output_and_in_the_report(
    store, one_step_goal, notes, tmp_path
):
    async with one_step_goal(notes(), NOTE, {"title": "groceries", "body": "milk, eggs"}, "note") as handle:
        result = await handle.result()

    assert result.outcome == "succeeded", result.failure
    assert store.get_text(result.outputs["note"]) == "note 'groceries' added (10 characters)"
    assert "note 'groceries' added" in store.get_text(result.report)
    calls = ledger(tmp_path, "add_note")
    assert [c["args"] for c in calls] == [{"title": "groceries", "body": "milk, eggs"}]
    # Undeclared: remote-write / once, sent with its effect key in the request's _meta.
    assert calls[0]["effect_key"].startswith("fx-")


@pytest.mark.slow
async def test_an_agent_is_offered_the_mcp_tool_with_its_schema_and_bad_arguments_go_back_to_it_as_data(
    env, task_queue, store, workspace, scripted, notes, tmp_path
):
    echo = "mcp__notes__echo"
    server = scripted(
        {
            "replies": [
                {"tool_calls": [{"name": echo, "arguments": {"words": "hi"}}], "times": 1},
                {"tool_calls": [{"name": echo, "arguments": {"text": "hi"}}], "times": 1},
                {"content": "the server said: echo: hi", "times": 1},
            ]
        }
    )
    safe_echo = '[mcp_servers.notes.tools.echo]\nrisk = "read"\nreplay = "safe"\n'
    steps = [agent("ask", "Echo hi through the notes server.", [echo])]
    async with running_worker(env, task_queue, store, openai_profile(server), mcp=notes(safe_echo)):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=[echo])
        await wait_until(handle, lambda s: s.report is not None, timeout_s=20)
        result = await handle.result()

    assert result.outcome == "succeeded", result.failure
    first, second, third = server.requests()
    assert first["tools"] == [echo]
    # The wrong call never reached the server: it came back to the model, saying what was wrong.
    told = second["last_message"]
    assert "bad arguments for mcp__notes__echo" in told and "'text' is a required property" in told
    assert "expected fields: text (required)" in told
    assert "echo: hi" in third["last_message"]
    assert [c["args"] for c in ledger(tmp_path, "echo")] == [{"text": "hi"}]


@pytest.mark.slow
async def test_the_planner_is_shown_the_mcp_tool_and_a_plan_with_arguments_its_schema_refuses_is_repaired(
    env, task_queue, store, workspace, scripted, notes, tmp_path
):
    step = {"name": "note", "kind": "tool", "tool": NOTE, "args": {"title": "plan"}}
    fixed = {**step, "args": {"title": "plan", "body": "made by the planner"}}
    server = scripted(
        {
            "replies": [
                # Matched only if the planner's prompt lists the tool with its risk and schema.
                {
                    "when": ["PERDURE-PLANNER", f"- {NOTE} (risk: remote-write)", '"required": ["title", "body"]'],
                    "when_last": "Goal:",
                    "times": 1,
                    "json": {"steps": [step]},
                },  # fmt: skip
                {"when_last": "'body' is a required property", "times": 1, "json": {"steps": [fixed]}},
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server), mcp=notes()):
        goal_spec = spec(workspace, allowed_tools=[NOTE], goal="Write a note about the plan.")
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=f"plan-mcp-{tmp_path.name}", task_queue=task_queue
        )
        result = await handle.result()

    assert result.outcome == "succeeded", result.failure
    assert [r["matched"] for r in server.requests()] == [0, 1]
    assert [c["args"] for c in ledger(tmp_path, "add_note")] == [{"title": "plan", "body": "made by the planner"}]


@pytest.mark.slow
async def test_an_irreversible_mcp_tool_asks_first_and_runs_once_after_approval(store, one_step_goal, notes, tmp_path):
    irreversible = notes('[mcp_servers.notes.tools.pay]\nrisk = "irreversible"\nreplay = "once"\n')
    pay = {"amount_cents": 500, "recipient": "ACME"}
    async with one_step_goal(irreversible, "mcp__notes__pay", pay, "pay") as handle:
        snapshot = await wait_until(handle, lambda s: s.questions)
        assert ledger(tmp_path, "pay") == []  # nothing sent before a person said yes
        assert '"amount_cents":500' in snapshot.questions[0].stuck + snapshot.questions[0].title
        await submit(handle, Approve(request_id="ok-1", question_id=snapshot.questions[0].id))
        result = await handle.result()

    assert result.outcome == "succeeded", result.failure
    assert store.get_text(result.outputs["pay"]) == "paid 500 cents to ACME"
    assert len(ledger(tmp_path, "pay")) == 1


@pytest.mark.slow
async def test_the_servers_secret_reaches_its_process_but_not_the_goals_history(store, one_step_goal, notes, tmp_path):
    whoami = "mcp__notes__whoami"
    async with one_step_goal(notes(), whoami, {}, "who") as handle:
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.outcome == "succeeded", result.failure
    assert [c["secret"] for c in ledger(tmp_path, "whoami")] == [SECRET]  # the server had it
    # The server echoed it; what the step kept is redacted.
    assert store.get_text(result.outputs["who"]) == "secret present: True; value: [redacted]"
    assert SECRET.encode() not in history.to_json().encode()
    assert SECRET_ENV.encode() not in history.to_json().encode()


@pytest.mark.slow
async def test_a_tool_that_returns_an_error_fails_its_step_with_the_servers_message(
    store, one_step_goal, notes, tmp_path
):
    refuse = "mcp__notes__refuse"
    async with one_step_goal(notes(), refuse, {"reason": "closed today"}, "no") as handle:
        result = await goal_result(handle)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert result.outcome == "failed"  # its only step failed
    (node,) = [n for n in snapshot.nodes if n.name == "no"]
    assert node.status == "failed"
    assert "MCP tool refuse on server 'notes' returned an error" in (node.error or "")
    assert len(ledger(tmp_path, "refuse")) == 1  # an answer, not a loss: never sent again


@pytest.mark.slow
async def test_a_server_that_dies_during_a_once_call_is_not_called_again_and_a_person_is_asked(
    store, one_step_goal, notes, tmp_path
):
    die = "mcp__notes__die"
    async with one_step_goal(notes(), die, {"text": "x"}, "d") as handle:
        snapshot = await wait_until(handle, lambda s: s.questions)

    assert [n.status for n in snapshot.nodes if n.name == "d"] == ["uncertain"]
    assert "may have reached MCP server 'notes' (tool die) but no answer says so" in snapshot.questions[0].stuck
    assert len(ledger(tmp_path, "die")) == 1


@pytest.mark.slow
async def test_a_server_that_cannot_start_fails_the_goal_at_once_saying_why(store, one_step_goal, tmp_path):
    broken = McpServers(_broken_config(tmp_path))
    async with one_step_goal(broken, "mcp__broken__add_note", {"title": "a", "body": "b"}, "note") as handle:
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()

    said = str(failed.value.cause)
    assert "the plan file cannot run: unknown tool 'mcp__broken__add_note'" in said
    assert "MCP server 'broken' could not be reached" in said and "cannot start (asked to fail)" in said


def _broken_config(tmp_path: Path) -> dict:
    config = tmp_path / "broken.toml"
    config.write_text(
        "[mcp_servers.broken]\n"
        f"command = {json.dumps(sys.executable)}\n"
        f'args = ["-m", "perdure.testing.ledger_mcp_server", "--ledger", "{tmp_path / "x"}", "--fail-start"]\n'
    )
    return load_mcp_servers(config)


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('[mcp_servers.a]\nargs = ["x"]\n', "give exactly one of `command`"),
        ('[mcp_servers.a]\ncommand = "x"\nurl = "https://h/mcp"\n', "give exactly one of `command`"),
        ('[mcp_servers.a]\ncommand = "x"\n[mcp_servers.a.tools.t]\nrisk = "dangerous"\n', "tools.t.risk"),
        ('[mcp_servers.a]\ncommand = "x"\n[mcp_servers.a.tools.t]\nreplay = "check"\n', "'check' needs a lookup"),
        ('[mcp_servers.a]\ncommand = "x"\nenv = ["sk-live-123=abc"]\n', "is not a variable name"),
        ('[mcp_servers.A_B]\ncommand = "x"\n', "[mcp_servers.A_B] is invalid: name"),
        ("mcp_servers = 3\n", "'mcp_servers' must be a table"),
    ],
)
def test_bad_mcp_config_is_a_one_line_error_saying_where_and_what(tmp_path: Path, table: str, says: str):
    config = tmp_path / "config.toml"
    config.write_text(table)
    with pytest.raises(McpConfigInvalid) as caught:
        load_mcp_servers(config)
    message = str(caught.value)
    assert says in message and "\n" not in message
    assert str(config) in message


@pytest.mark.process
def test_a_worker_with_bad_mcp_config_refuses_to_start_in_one_line(tmp_path: Path):
    config = tmp_path / "config.toml"
    config.write_text('[mcp_servers.notes]\ncommand = "x"\n[mcp_servers.notes.tools.t]\nrisk = "dangerous"\n')
    variables = {**os.environ, "PERDURE_CONFIG": str(config), "PERDURE_HOME": str(tmp_path / "home"), "COLUMNS": "400"}
    ran = subprocess.run([PERDURE, "worker"], env=variables, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2, ran.stderr
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and "[mcp_servers.notes] is invalid: tools.t.risk" in lines[-1]
    assert "Traceback" not in ran.stderr


# --- the catalogue as prompts and plan checks see it (pure) -------------------------

ECHO = McpTool(
    name="mcp__notes__echo",
    server="notes",
    tool="echo",
    description="Echo the text back.",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    risk="read",
    replay="safe",
)


def test_an_mcp_tool_name_fits_the_model_apis_tool_name_pattern():
    name = mcp_tool_name("notes", "weird.tool/name with spaces" + "x" * 80)
    assert re.fullmatch(r"^[a-zA-Z0-9_-]{1,64}$", name) and name.startswith("mcp__notes__weird_tool_name")


def test_the_planner_and_the_agent_are_shown_the_servers_description_and_schema():
    (offered,) = agent_tools([ECHO.name], [ECHO])
    assert offered.json_schema == ECHO.input_schema
    assert offered.description == "[MCP server notes] Echo the text back. (risk: read)"
    catalogue = tool_catalogue(["read_file", ECHO.name], [ECHO])
    assert "- mcp__notes__echo (risk: read): [MCP server notes] Echo the text back." in catalogue
    assert '"required": ["text"]' in catalogue


def test_a_plan_step_is_checked_against_the_mcp_tools_schema_where_the_catalogue_is_known():
    plan = Plan.model_validate({"steps": [{"name": "e", "kind": "tool", "tool": ECHO.name, "args": {"text": 3}}]})
    problems = check_plan(plan, [ECHO.name], tools=tool_table([ECHO]))
    assert problems == ["step 'e': bad arguments for mcp__notes__echo: text: 3 is not of type 'string'"]
    assert check_plan(plan, [ECHO.name]) == []  # no catalogue here (the CLI): the goal checks it


def test_a_plan_file_allows_the_mcp_tools_it_names_and_the_cli_leaves_them_to_the_worker():
    data = {"steps": [{"name": "n", "kind": "tool", "tool": NOTE, "args": {"title": "a", "body": "b"}}]}
    plan, _ = plan_from_mapping(data)
    assert plan_tools(plan) == [NOTE]


@pytest.fixture
def http_notes(tmp_path: Path):
    """The test server over streamable HTTP on a free port, as someone else's service."""
    (port,) = free_ports(1)
    ledger_file = str(ledger_dir(tmp_path) / "ledger.jsonl")
    proc = subprocess.Popen(
        [sys.executable, "-m", "perdure.testing.ledger_mcp_server", "--ledger", ledger_file, "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the HTTP MCP server did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


@pytest.mark.slow
async def test_a_streamable_http_server_gets_its_header_from_the_workers_variable_and_the_history_does_not(
    store, one_step_goal, http_notes, tmp_path, monkeypatch
):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    config = tmp_path / "http.toml"
    config.write_text(
        f'[mcp_servers.tracker]\nurl = "{http_notes}"\nheaders = {{ Authorization = "Bearer ${{{SECRET_ENV}}}" }}\n'
    )
    note = "mcp__tracker__add_note"
    servers = McpServers(load_mcp_servers(config))
    async with one_step_goal(servers, note, {"title": "over http", "body": "hi"}, "note") as handle:
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.outcome == "succeeded", result.failure
    assert store.get_text(result.outputs["note"]) == "note 'over http' added (2 characters)"
    (call,) = ledger(tmp_path, "add_note")
    assert call["authorization"] == f"Bearer {SECRET}"
    assert SECRET.encode() not in history.to_json().encode()


def test_an_unset_header_variable_is_named_and_its_value_never_shown(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    servers = servers_from(
        {"t": {"url": "https://h/mcp", "headers": {"Authorization": f"Bearer ${{{SECRET_ENV}}}"}}}, "x"
    )
    with pytest.raises(McpConfigInvalid, match=f"header variable {SECRET_ENV} not set on this worker"):
        resolve_headers(servers["t"])


def test_perdure_start_leaves_an_mcp_tool_to_the_goal_when_the_worker_names_its_server():
    offer = CapabilitiesResult(profiles=[], default_profile="scripted", tools=["read_file"], mcp_servers=["notes"])
    assert start_problems(spec(Path("/w"), allowed_tools=["read_file", NOTE], model_profile="default"), offer) == []
    (problem,) = start_problems(spec(Path("/w"), allowed_tools=["mcp__other__x"], model_profile="default"), offer)
    assert "unknown tool 'mcp__other__x'" in problem and "and the tools of MCP servers notes" in problem


async def test_a_tool_the_workers_config_made_irreversible_since_the_goal_listed_it_is_refused_unconfirmed(
    store, notes, tmp_path
):
    """The goal's catalogue says remote-write; this worker's config now says irreversible:
    the activity takes the graver class and sends nothing without a person's confirmation."""
    servers = notes('[mcp_servers.notes.tools.add_note]\nrisk = "irreversible"\n')
    listed = McpTool(name=NOTE, server="notes", tool="add_note", input_schema={"type": "object"})
    call = ToolInput(goal_id="g", node_key="k", tool=NOTE, workspace=str(tmp_path), args={"title": "a", "body": "b"})
    result = await ActivityEnvironment().run(
        ToolActivities(store, mcp=servers).run_tool, call.model_copy(update={"mcp": listed})
    )

    assert not result.ok and result.risk == "irreversible"
    assert "is irreversible and needs a human confirmation" in (result.error or "")
    assert ledger(tmp_path, "add_note") == []
