"""`perdure fork` and `perdure diff` (issue 20, section 2): a fork pays only from its node on.

The fork point is pure (workflows/goal/rules/forking.py) and tested on states built here; the rest runs
the CLI in this process (typer's CliRunner) against the session's dev server, with the
production worker in this process too, and counts model requests at the scripted server.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from unittest import mock

import pytest
from typer.testing import CliRunner

from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.workflows.goal.contracts.goal_contracts import GoalResult
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.goal.contracts.state import GoalInput, GoalState, Node, PlanVersion, RetiredNode
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.rules.forking import ForkPointInput, fork_point
from perdure.workflows.shared.contracts import ArtifactRef
from perdure.workflows.shared.graph import node_key
from tests.builders import chain, gate, llm, openai_profile, spec
from tests.helpers import calls_for, new_goal_id, running_worker, wait_until

STEP_REPLY = {"replies": [{"when": "PERDURE-STEP", "content": "step done"}]}

# --- the fork point, pure --------------------------------------------------------------


def ref(text: str) -> ArtifactRef:
    return ArtifactRef(digest="sha256:" + hashlib.sha256(text.encode()).hexdigest(), size=len(text))


def goal_state(steps: list[dict], done: list[str], premises: dict[str, str] | None = None, **statuses) -> GoalState:
    """A goal whose `done` steps succeeded (keyed as its scheduler keys them) and whose other
    steps have the status `statuses` gives them (pending by default)."""
    plan = Plan.model_validate({"steps": steps})
    premises = premises or {}
    state = GoalState(
        spec=spec(Path("/tmp/ws"), premises=premises),
        premises=premises,
        plan_versions=[PlanVersion(version=1, plan=plan, reason="test", source="plan-file")],
    )
    digests: dict[str, str] = {}
    for step in plan.steps:
        if step.name in done:
            output = ref(f"output of {step.name}")
            key = node_key(step, {d: digests[d] for d in step.needs}, premises)
            node = Node(name=step.name, kind=step.kind, needs=step.needs, status="succeeded", key=key, output=output)
            digests[step.name] = output.digest
            state.outputs_by_key[key] = output
        else:
            node = Node(name=step.name, kind=step.kind, needs=step.needs, status=statuses.get(step.name, "pending"))
        state.nodes[step.name] = node
    return state


def test_a_fork_reuses_the_work_before_its_node_under_the_keys_the_goal_gave_it():
    state = goal_state(chain(4), done=["s00", "s01", "s02", "s03"])
    point = fork_point(state, ForkPointInput(node="s02"))
    assert point.refusal is None
    assert point.reused == ["s00", "s01"]
    assert point.rerun == {"s02": "the fork's step", "s03": "downstream of s02"}
    # The same keys the goal's own scheduler gave them: the fork's scheduler finds them.
    assert point.reuse_outputs == {state.nodes[n].key: state.nodes[n].output for n in ("s00", "s01")}
    assert point.plan == state.plan and point.spec is not None and point.spec.plan is None


def test_a_premise_change_runs_anew_the_steps_it_leaves_without_a_valid_output_and_their_downstream():
    steps = [
        llm("loose", premises={"scope": None}),
        llm("narrow-ok", premises={"scope": ["all", "module_a"]}),
        llm("all-only", premises={"scope": ["all"]}),
        llm("after-all-only", ["all-only"]),
        llm("free"),
        llm("end", ["loose", "narrow-ok", "after-all-only", "free"]),
    ]
    names = [s["name"] for s in steps]
    state = goal_state(steps, done=names, premises={"scope": "all"})
    point = fork_point(state, ForkPointInput(node="end", premises={"scope": "module_a"}))
    assert point.reused == ["narrow-ok", "free"]
    assert point.rerun == {
        "loose": "declares premise scope",
        "all-only": "declares premise scope",
        "after-all-only": "downstream of all-only (premise scope)",
        "end": "the fork's step",
    }
    assert point.premises == {"scope": "module_a"}
    # all-only keys on its declared values, not the premise's: only leaving it out of the
    # reused work makes it run again.
    assert state.nodes["all-only"].key not in point.reuse_outputs
    assert len(point.reuse_outputs) == 2


def test_unfinished_work_and_what_needs_it_runs_in_the_fork_of_a_running_goal():
    state = goal_state(chain(4), done=["s00"], s01="running")
    point = fork_point(state, ForkPointInput(node="s03"))
    assert point.reused == ["s00"]
    assert point.rerun == {"s01": "running in the goal", "s02": "pending in the goal", "s03": "the fork's step"}


def test_a_twin_of_the_fork_node_runs_anew_with_it():
    steps = [llm("one"), {**llm("two"), "prompt": "Do one."}, llm("after", ["one"])]
    state = goal_state(steps, done=["one", "two", "after"])
    assert state.nodes["one"].key == state.nodes["two"].key
    point = fork_point(state, ForkPointInput(node="two"))
    assert point.reused == [] and point.reuse_outputs == {}
    assert point.rerun["one"] == "the same work as two, which runs anew"


def test_refusals_name_what_is_wrong():
    state = goal_state(chain(2), done=["s00", "s01"], premises={"scope": "all"})
    state.plan_versions.append(PlanVersion(version=2, plan=state.plan, reason="rewind", source="rewind"))
    state.retired_nodes.append(RetiredNode(node=Node(name="old", kind="llm"), plan_version=1, dropped_by=2))
    unknown = fork_point(state, ForkPointInput(node="nope")).refusal
    assert unknown == "no step 'nope' in the goal's plan (v2); its steps: s00, s01"
    older = fork_point(state, ForkPointInput(node="old")).refusal
    assert older == (
        "step 'old' is of plan v1, not of the current plan v2: fork from a step of the current plan (s00, s01)"
    )
    refused = fork_point(state, ForkPointInput(node="s01", premises={"scoop": "x"})).refusal
    assert refused == (
        "premise 'scoop' is not a premise of the goal and no step declares it "
        "(premises the goal and its steps name: scope)"
    )
    planning = GoalState(spec=spec(Path("/tmp/ws")))
    assert "no plan yet" in fork_point(planning, ForkPointInput(node="s00")).refusal


def test_a_premise_no_step_declares_is_a_warning_and_runs_nothing_anew():
    state = goal_state(chain(3), done=["s00", "s01", "s02"], premises={"scope": "all"})
    point = fork_point(state, ForkPointInput(node="s02", premises={"scope": "module_a"}))
    assert point.refusal is None and point.reused == ["s00", "s01"]
    assert point.warnings == [
        "no step declares premise scope: nothing re-runs for it, only the steps that run anew see module_a"
    ]


# --- the CLI against a real goal ----------------------------------------------------------


async def perdure(env, task_queue: str, home: Path, *args: str, code: int | None = 0):
    """`perdure ARGS` in a thread (the CLI runs its own event loop); stdout and stderr as a terminal shows them."""
    variables = {
        "PERDURE_TEMPORAL": env.client.service_client.config.target_host,
        "PERDURE_TASK_QUEUE": task_queue,
        "PERDURE_HOME": str(home),
        "PERDURE_CONFIG": str(home / "config.toml"),
    }
    with mock.patch.object(terminal.console, "_width", 300), mock.patch.object(terminal.err_console, "_width", 300):
        result = await asyncio.to_thread(CliRunner().invoke, cli.app, list(args), env=variables)
    said = result.stdout + result.stderr
    assert "Traceback" not in said, said
    assert result.exception is None or isinstance(result.exception, SystemExit), said + repr(result.exception)
    if code is not None:
        assert result.exit_code == code, said
    return result


async def start_goal(env, task_queue: str, workspace: Path, steps: list[dict], **overrides):
    return await env.client.start_workflow(
        GoalWorkflow.run,
        GoalInput(spec=spec(workspace, plan={"steps": steps}, **overrides)),
        id=new_goal_id("fork"),
        task_queue=task_queue,
    )


async def history_length(handle) -> int:
    return len((await handle.fetch_history()).events)


def requested_steps(server, since: int) -> list[str]:
    return [r["last_message"].partition("\n")[0].removeprefix("step: ") for r in server.requests()[since:]]


@pytest.mark.slow
async def test_a_fork_with_another_profile_pays_only_from_its_node_on_and_leaves_the_original_untouched(
    env, task_queue, store, tmp_path, workspace, scripted
):
    server = scripted(STEP_REPLY)
    # Another model at another price on the same wire format (the first import of another
    # provider's SDK in this loaded process can outlast an activity's heartbeat timeout).
    pricey = openai_profile(server, "pricey").model_copy(
        update={"model": "scripted-pricier", "price_input_per_mtok": 3.0, "price_output_per_mtok": 15.0}
    )
    profiles = (openai_profile(server, "test"), pricey)
    async with running_worker(env, task_queue, store, *profiles):
        original = await start_goal(env, task_queue, workspace, chain(4))
        await original.result()
        events_before, requests_before = await history_length(original), len(server.requests())

        forked = await perdure(
            env, task_queue, tmp_path, "fork", original.id, "s02", "--why", "try the pricier model",
            "--profile", "pricey", "--id", f"{original.id}-f",
        )  # fmt: skip
        fork = env.client.get_workflow_handle(f"{original.id}-f", result_type=GoalResult)
        result = await fork.result()
        status = await perdure(env, task_queue, tmp_path, "status", fork.id)
        diff = await perdure(env, task_queue, tmp_path, "diff", original.id, fork.id, "--json")
        table = await perdure(env, task_queue, tmp_path, "diff", original.id, fork.id)
        assert await history_length(original) == events_before

    # Paid only from s02 on: its model requests are s02's and s03's, on the fork's profile.
    assert requested_steps(server, requests_before) == ["s02", "s03"], server.requests()[requests_before:]
    assert {r["model"] for r in server.requests()[requests_before:]} == {"scripted-pricier"}
    assert result.outcome == "succeeded" and sorted(result.outputs) == ["s00", "s01", "s02", "s03"]
    assert f"goal {fork.id} started" in forked.stdout
    assert "reused from" in forked.stdout and "(2): s00, s01" in forked.stdout
    assert "s02: the fork's step" in forked.stdout and "s03: downstream of s02" in forked.stdout
    assert f"forked from {original.id} at step s02: try the pricier model · changes: profile=pricey" in status.stdout

    compared = json.loads(diff.stdout)
    rows = {s["name"]: s for s in compared["steps"]}
    assert compared["same"] == ["s00", "s01"] and compared["differing"] == ["s02", "s03"]
    for name in ("s00", "s01"):
        assert rows[name]["b"]["reused"] and not rows[name]["a"]["reused"]
        assert rows[name]["b"]["cost_usd"] == 0 and rows[name]["a"]["output"] == rows[name]["b"]["output"]
    for name in ("s02", "s03"):
        assert rows[name]["differs"] == ["cost"] and not rows[name]["b"]["reused"]
        assert rows[name]["b"]["cost_usd"] > rows[name]["a"]["cost_usd"] > 0
    assert compared["cost_usd"]["b"] == pytest.approx(rows["s02"]["b"]["cost_usd"] + rows["s03"]["b"]["cost_usd"])
    assert compared["b_forked_from"]["node"] == "s02"
    assert "succeeded · reused" in table.stdout and "differ (2): s02, s03" in table.stdout


@pytest.mark.slow
async def test_a_fork_that_sets_a_premise_reruns_the_steps_that_declare_it_and_reuses_the_rest(
    env, task_queue, store, tmp_path, workspace, scripted
):
    server = scripted(STEP_REPLY)
    steps = [
        llm("loose", premises={"scope": None}),
        llm("listed", premises={"scope": ["all", "module_a"]}),
        llm("all-only", premises={"scope": ["all"]}),
        llm("after-loose", ["loose"]),
        llm("free"),
        llm("end", ["free"]),
    ]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        original = await start_goal(env, task_queue, workspace, steps, premises={"scope": "all"})
        await original.result()
        requests_before = len(server.requests())
        forked = await perdure(
            env, task_queue, tmp_path, "fork", original.id, "end", "--why", "module a only", "--set",
            "scope=module_a", "--id", f"{original.id}-f",
        )  # fmt: skip
        await env.client.get_workflow_handle(f"{original.id}-f").result()

    assert sorted(requested_steps(server, requests_before)) == ["after-loose", "all-only", "end", "loose"]
    assert "(2): listed, free" in forked.stdout
    assert "loose: declares premise scope" in forked.stdout and "all-only: declares premise scope" in forked.stdout


@pytest.mark.slow
async def test_a_fork_of_a_running_goal_and_a_fork_of_that_fork(env, task_queue, store, tmp_path, workspace, scripted):
    server = scripted(STEP_REPLY)
    steps = [llm("s00"), llm("s01", ["s00"]), gate(["s01"]), llm("s02", ["gate"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        original = await start_goal(env, task_queue, workspace, steps)
        await wait_until(original, lambda s: "gate" in s.running)
        await perdure(
            env, task_queue, tmp_path, "fork", original.id, "s01", "--why", "again", "--id", "f1-" + original.id
        )
        (workspace / "GO").write_text("")
        await original.result()
        await env.client.get_workflow_handle("f1-" + original.id).result()
        before = len(server.requests())
        second = await perdure(env, task_queue, tmp_path, "fork", "f1-" + original.id, "s02", "--why", "once more")
        second_id = second.stdout.split("goal ", 1)[1].split(" started", 1)[0]
        await env.client.get_workflow_handle(second_id).result()
        status = await perdure(env, task_queue, tmp_path, "status", second_id)

    # The running goal had finished s00 only: the fork ran s01 (its step) and s02, never s00
    # (the original and the first fork ran s01 and s02 once each, the second fork s02).
    assert [len(calls_for(server, name)) for name in ("s00", "s01", "s02")] == [1, 2, 3]
    assert requested_steps(server, before) == ["s02"]
    assert "(3): s00, s01, gate" in second.stdout
    assert f"forked from f1-{original.id} at step s02: once more" in status.stdout


@pytest.mark.slow
async def test_fork_errors_are_one_line_with_exit_codes(env, task_queue, store, tmp_path, workspace, scripted):
    server = scripted(STEP_REPLY)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        goal = await start_goal(env, task_queue, workspace, chain(2), premises={"scope": "all"})
        await goal.result()
        unknown_goal = await perdure(env, task_queue, tmp_path, "fork", "no-such-goal", "s00", "--why", "x", code=2)
        unknown_node = await perdure(env, task_queue, tmp_path, "fork", goal.id, "nope", "--why", "x", code=2)
        malformed = await perdure(
            env, task_queue, tmp_path, "fork", goal.id, "s00", "--why", "x", "--set", "scope", code=2
        )
        premise = await perdure(
            env, task_queue, tmp_path, "fork", goal.id, "s00", "--why", "x", "--set", "scoop=1", code=2
        )
        no_why = await perdure(env, task_queue, tmp_path, "fork", goal.id, "s00", code=2)
    assert unknown_goal.stderr.strip() == "error: no goal with id 'no-such-goal' (list goals with `perdure ls`)"
    assert unknown_node.stderr.strip() == (
        f"error: cannot fork goal {goal.id} at 'nope': no step 'nope' in the goal's plan (v1); its steps: s00, s01"
    )
    assert malformed.stderr.strip() == "error: 'scope' is not KEY=VALUE"
    assert "premise 'scoop' is not a premise of the goal" in premise.stderr
    assert len(premise.stderr.strip().splitlines()) == 1
    assert "--why" in no_why.stderr


async def test_a_fork_when_no_worker_runs_says_so_and_starts_nothing(env, task_queue, tmp_path, workspace):
    goal = await start_goal(env, task_queue, workspace, chain(2))
    said = await perdure(
        env, task_queue, tmp_path, "fork", goal.id, "s01", "--why", "x", "--id", goal.id + "-f", code=1
    )
    assert said.stderr.startswith(f"error: no worker polls task queue '{task_queue}'"), said.stderr
    assert "start one (`perdure worker`)" in said.stderr
    listed = [wf.id async for wf in env.client.list_workflows(f"WorkflowId = '{goal.id}-f'")]
    assert listed == []
