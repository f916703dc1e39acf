"""perdure's own model calls never out-spend the work (issue 34, item 2), seen from outside:
what the scripted model server received, what the goal charged, what status, the report and
`perdure result` show, and what `perdure start` says of a goal's budget.

The drift check is the call that grew with the plan: a plan of reads alone once made one
every 12 nodes carrying the whole plan (3,000 reads: 250 calls, 52 M tokens).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from unittest import mock

import pytest
from typer.testing import CliRunner

from perdure.activities.models.profiles import ModelProfile, load_model_config
from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.workflows.goal.contracts.goal_contracts import Budget, GoalResult, GoalSpec
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, llm, openai_profile, spec
from tests.helpers import new_goal_id, perdure_status, run_goal, running_worker, start

ON_TRACK = {"when": "PERDURE-DRIFT", "json": {"on_track": True, "reason": "the plan still serves the goal"}}


def reads(workspace: Path, count: int) -> list[dict]:
    """`count` independent read steps of small files written into `workspace`."""
    for i in range(count):
        (workspace / f"notes-{i:04d}.md").write_text(f"note {i}\n", encoding="utf-8")
    return [
        {"name": f"read-{i:04d}", "kind": "tool", "tool": "read_file", "args": {"path": f"notes-{i:04d}.md"}}
        for i in range(count)
    ]


def drift_requests(server) -> list[dict]:
    return [r for r in server.requests() if r["matched"] == 0]


@pytest.mark.slow
async def test_a_plan_of_reads_alone_asks_no_model_anything(env, task_queue, store, workspace, scripted):
    server = scripted({"replies": [ON_TRACK]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, reads(workspace, 36))
        result = await handle.result()
    assert result.outcome == "succeeded"
    # Before: a drift check every 12 reads, each carrying the whole plan.
    assert server.requests() == []
    assert result.tokens == 0 and result.own_calls == {}


@pytest.mark.slow
async def test_a_drift_check_asked_of_a_large_plan_is_shown_a_bounded_outline(
    env, task_queue, store, workspace, scripted
):
    """Asked for (drift_every), a drift check of a plan of 400 steps costs what one of 40 does."""
    server = scripted({"replies": [ON_TRACK]})
    per_call: dict[int, float] = {}
    async with running_worker(env, task_queue, store, openai_profile(server)):
        for count in (40, 400):
            (workspace / str(count)).mkdir()
            steps = reads(workspace / str(count), count)
            for step in steps:
                step["args"]["path"] = f"{count}/{step['args']['path']}"
            before = len(drift_requests(server))
            handle = await start(env, task_queue, workspace, steps, drift_every=count // 2)
            result = await handle.result()
            sent = drift_requests(server)[before:]
            assert result.outcome == "succeeded" and len(sent) == 2
            assert f"The plan: {count} steps ({count} tool); " in sent[0]["last_message"]
            per_call[count] = result.tokens / len(sent)
            assert result.own_calls["drift check"].calls == 2
            assert result.own_calls["drift check"].tokens == result.tokens  # the steps used none
    # The whole plan of 400 reads was about 40,000 characters a call (10,000 tokens).
    assert per_call[400] <= 2_000
    assert per_call[400] <= per_call[40] * 1.25, per_call


def cli_result(env, home: Path, goal_id: str) -> str:
    variables = {"PERDURE_TEMPORAL": env.client.service_client.config.target_host, "PERDURE_HOME": str(home)}
    with mock.patch.object(terminal.console, "_width", 300):
        shown = CliRunner().invoke(cli.app, ["result", goal_id], env=variables)
    assert shown.exit_code == 0, shown.output
    return shown.output


@pytest.mark.slow
async def test_status_the_report_and_result_show_each_kind_of_own_calls(
    env, task_queue, store, workspace, scripted, tmp_path
):
    plan = {"steps": [llm("draft"), llm("polish", ["draft"])]}
    server = scripted(
        {
            "replies": [
                {"when": "PERDURE-PLANNER", "times": 1, "content": "I would rather not write JSON."},
                {"when": "PERDURE-PLANNER", "json": plan},
                ON_TRACK,
                *STEP_REPLY["replies"],
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(env, task_queue, spec(workspace, drift_every=1))
        snapshot = await handle.query(GoalWorkflow.progress)
        status = await perdure_status(env, handle.id)
    assert result.outcome == "succeeded"
    own = result.own_calls
    assert {kind: spent.calls for kind, spent in own.items()} == {"planning": 1, "repair": 1, "drift check": 2}
    assert all(spent.tokens > 0 and spent.cost_usd > 0 for spent in own.values())
    # In the totals, beside what the steps spent.
    steps = sum(n.tokens for n in snapshot.nodes)
    assert result.tokens == steps + sum(spent.tokens for spent in own.values())
    assert snapshot.own_calls == own

    lines = {
        kind: f"{kind}: {'1 call' if s.calls == 1 else f'{s.calls} calls'}, {s.tokens:,} tokens, ${s.cost_usd:.4f}"
        for kind, s in own.items()
    }
    assert all(f"perdure's own calls · {line}" in status for line in lines.values()), status
    report = store.get_text(result.report)
    assert "## perdure's own model calls" in report
    assert all(f"- {line}\n" in report for line in lines.values()), report
    shown = await asyncio.to_thread(cli_result, env, tmp_path, handle.id)
    assert all(f"perdure's own calls · {line}" in shown for line in lines.values()), shown


@pytest.mark.slow
@pytest.mark.parametrize(
    ("soft_gate", "used", "why"),
    [
        (0.5, 3_000, "drift check 1 not sent: tokens at 60% (3,000 tokens of 5,000 tokens), past the 50% soft gate"),
        (1.0, 4_700, "drift check 1 not sent: its estimate of "),
    ],
    ids=["past-the-soft-gate", "estimate-over-the-limit"],
)
async def test_a_drift_check_the_budget_cannot_afford_is_not_sent(
    env, task_queue, store, workspace, scripted, soft_gate, used, why
):
    step = {**STEP_REPLY["replies"][0], "usage": {"input_tokens": used - 100, "output_tokens": 100}}
    server = scripted({"replies": [ON_TRACK, step]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        limits = Budget(max_tokens=5_000)
        handle = await start(
            env, task_queue, workspace, [llm("one")], drift_every=1, budget=limits, soft_gate=soft_gate
        )
        result = await handle.result()
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded" and result.tokens == used
    assert drift_requests(server) == []
    assert any(entry.startswith(why) for entry in snapshot.gate_log), snapshot.gate_log


# --- the context window -------------------------------------------------------------------


@pytest.mark.slow
async def test_a_3_mb_prompt_is_refused_before_any_money_is_spent(env, task_queue, store, workspace, scripted):
    """48 inputs of 64,000 characters: 3 MB for gpt-4o-mini's 128,000-token window."""
    server = scripted({"replies": STEP_REPLY["replies"]})
    profile = openai_profile(server).model_copy(update={"model": "gpt-4o-mini"})
    steps = reads(workspace, 48)
    for step in steps:
        (workspace / step["args"]["path"]).write_text("word " * 12_800, encoding="utf-8")
    steps.append(llm("summarise", [s["name"] for s in steps]))
    async with running_worker(env, task_queue, store, profile):
        handle, result = await run_goal(env, task_queue, spec(workspace, plan={"steps": steps}))
        snapshot = await handle.query(GoalWorkflow.progress)
    assert server.requests() == []
    assert result.tokens == 0 and result.cost_usd == 0
    [node] = [n for n in snapshot.nodes if n.name == "summarise"]
    assert node.status == "failed"
    assert "llm step summarise: not sent, it cannot fit the model's context window" in node.error
    assert "(3,07" in node.error and "characters at 3 a token" in node.error  # 48 x 64,000 and the headings
    assert "gpt-4o-mini (profile 'test') takes 128,000 tokens in all" in node.error
    # Refused once, not retried: the same call never fits.
    history = await handle.fetch_history()
    assert sum(1 for e in history.events if e.HasField("activity_task_failed_event_attributes")) == 1


def test_a_profile_knows_its_models_window_and_config_can_set_one(tmp_path, monkeypatch):
    monkeypatch.delenv("PERDURE_OPENAI_MODEL", raising=False)
    monkeypatch.delenv("PERDURE_ANTHROPIC_MODEL", raising=False)
    config = tmp_path / "config.toml"
    config.write_text(
        '[profiles.local]\nprovider = "openai"\nmodel = "llama-3-8b"\nbase_url = "http://127.0.0.1:9"\n'
        "context_window = 8192\n\n[profiles.anthropic]\nmax_output_tokens = 4096\n",
        encoding="utf-8",
    )
    profiles = load_model_config(config).profiles
    assert profiles["local"].window() == 8_192
    assert profiles["anthropic"].window() == 200_000  # claude-sonnet-4-5, from the built-in table
    assert profiles["openai"].window() == 128_000  # gpt-4o-mini
    assert profiles["scripted"].window() is None  # not judged
    assert ModelProfile(name="x", provider="openai", model="gpt-4.1").window() == 1_047_576


# --- a goal's default budget --------------------------------------------------------------


def perdure_start(env, tmp_path: Path, task_queue: str, *args: str):
    """`perdure start` of a one-step plan file, in this process, against the test's worker."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("steps:\n  - {name: look, kind: tool, tool: list_dir, args: {path: .}}\n", encoding="utf-8")
    variables = {
        "PERDURE_TEMPORAL": env.client.service_client.config.target_host,
        "PERDURE_TASK_QUEUE": task_queue,
        "PERDURE_HOME": str(tmp_path / "home"),
        "PERDURE_CONFIG": str(tmp_path / "config.toml"),
    }
    command = ["start", *args, "--plan", str(plan), "--profile", "test", "--workspace", str(tmp_path)]
    with mock.patch.object(terminal.console, "_width", 300):
        return CliRunner().invoke(cli.app, command, env=variables)


async def started_spec(env, goal_id: str) -> GoalSpec:
    async for event in env.client.get_workflow_handle(goal_id).fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        [goal_input] = await env.client.data_converter.decode(payloads, [GoalInput])
        return goal_input.spec
    raise AssertionError("no start event")


@pytest.mark.slow
async def test_a_goal_started_with_no_budget_gets_the_default_and_start_says_so(
    env, task_queue, store, tmp_path, scripted
):
    async def started(*args: str):
        return await asyncio.to_thread(perdure_start, env, tmp_path, task_queue, *args)

    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        goal_id = new_goal_id("ob")
        said = await started("tidy the notes", "--id", goal_id)
        assert said.exit_code == 0, said.output
        default = "budget: 2,000,000 tokens (the default; --max-tokens or --max-cost set your own, --no-budget none)"
        assert default in said.output
        assert (await started_spec(env, goal_id)).budget == Budget(max_tokens=2_000_000)

        own = await started("x", "--id", "ob-own-" + goal_id, "--max-cost", "1")
        assert own.exit_code == 0 and "budget: $1\n" in own.output, own.output
        assert (await started_spec(env, "ob-own-" + goal_id)).budget == Budget(max_cost_usd=1.0)

        none = await started("x", "--id", "ob-none-" + goal_id, "--no-budget")
        assert none.exit_code == 0 and "budget: none\n" in none.output, none.output
        assert (await started_spec(env, "ob-none-" + goal_id)).budget == Budget()

        both = await started("x", "--id", "ob-both-" + goal_id, "--no-budget", "--max-tokens", "9")
        assert both.exit_code == 2 and "no budget means no limit at all" in both.output, both.output
        for started_id in (goal_id, "ob-own-" + goal_id, "ob-none-" + goal_id):
            result = await env.client.get_workflow_handle(started_id, result_type=GoalResult).result()
            assert result.outcome == "succeeded"


# --- calls bounded whatever the size of the plan (pure) -----------------------------------


def plan_and_nodes(count: int, finished: int):
    from perdure.workflows.goal.contracts.plan import Plan
    from perdure.workflows.goal.contracts.state import Node

    steps = [
        {"name": f"read-{i:05d}", "kind": "tool", "tool": "read_file", "args": {"path": f"notes/{i:05d}.md"}}
        for i in range(count)
    ]
    nodes = {
        s["name"]: Node(
            name=s["name"], kind="tool", status="succeeded" if i < finished else "pending", preview="x" * 300
        )
        for i, s in enumerate(steps)
    }
    return Plan.model_validate({"steps": steps}), nodes


def test_a_drift_outline_is_as_long_for_3000_steps_as_for_30():
    from perdure.workflows.goal.rules.drift_outline import OUTLINE_CHARS, outline

    small, large = (outline(*plan_and_nodes(count, count // 2)) for count in (30, 3_000))
    assert (large.steps, large.finished, large.kinds) == (3_000, 1_500, {"tool": 3_000})
    assert len(large.upcoming) == len(large.recent) == 12
    assert large.upcoming[0].startswith('read-01500 (tool, pending): read_file {"path": "notes/01500.md"}')
    assert len(large.model_dump_json()) <= OUTLINE_CHARS
    assert len(large.model_dump_json()) <= len(small.model_dump_json()) + 100


def test_the_watchdogs_judge_is_shown_as_much_of_a_goal_of_3000_steps_as_of_30():
    from perdure.workflows.watchdog.watchdog_contracts import GoalObservation
    from perdure.workflows.watchdog.watchdog_rules import judge_prompt

    def prompt(finished: int) -> str:
        plan = [f"read-{i:05d} (tool): succeeded" for i in range(30)]  # the scan shows the first 30
        goal = GoalObservation(goal_id="g", goal_text="tidy", plan=plan, new_information=[0.25] * finished)
        return judge_prompt(goal, "its last three steps add little")

    assert len(prompt(3_000)) <= len(prompt(30)) + 40
    assert "(the last 20 of 3000) 25%, 25%" in prompt(3_000)
