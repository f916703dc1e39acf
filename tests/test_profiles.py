"""`perdure profiles` and the checks of `perdure start` ask a running worker, as a user runs them.

Real `perdure worker` and CLI subprocesses against the session's dev server. What is checked is
what the worker knows (its config.toml, read again when it changes, and its environment), and a
refused start leaves no goal behind; with no worker up, `profiles` says so and `start` warns and
starts the goal, which waits durably.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import pytest
import yaml
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from perdure.runtime.codec import new_key_entry
from tests.subprocess_rig import perdure, user_env, worker_process

pytestmark = [pytest.mark.process, pytest.mark.parallel_safe]

KNOWN_PROFILES = "anthropic, default (= scripted), openai, scripted"


@pytest.fixture
def worker_env(env, tmp_path, task_queue) -> Iterator[dict[str, str]]:
    """A `perdure worker` with a config file of its own (PERDURE_CONFIG), absent at first."""
    variables = {**user_env(env, tmp_path, task_queue), "PERDURE_CONFIG": str(tmp_path / "config.toml")}
    with worker_process(variables, tmp_path / "worker.log"):
        yield variables


def goal_exists(env, goal_id: str, terminate: bool = False) -> bool:
    """Asked on a client of its own: the session's client belongs to another event loop."""

    async def look() -> bool:
        client = await Client.connect(env.client.service_client.config.target_host)
        try:
            await client.get_workflow_handle(goal_id).describe()
            if terminate:
                await client.get_workflow_handle(goal_id).terminate("test over")
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return True

    return asyncio.run(look())


def test_profiles_lists_what_the_worker_knows(worker_env):
    listed = perdure("profiles", env=worker_env, timeout=60)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    out = listed.stdout
    assert "scripted (default)" in out and "openai" in out and "anthropic" in out
    assert "default means: scripted" in out
    assert "tools: " in out and "read_file" in out and "make_payment" in out


def test_profiles_with_no_worker_says_so(env, tmp_path, task_queue):
    started = time.monotonic()
    listed = perdure("profiles", env=user_env(env, tmp_path, task_queue), timeout=60)
    assert listed.returncode == 1
    assert f"no worker polls task queue '{task_queue}'" in listed.stderr
    assert "start one with `perdure worker`" in listed.stderr
    assert time.monotonic() - started < 20  # answered from the task queue, not after a long wait


def test_a_profile_added_to_the_config_file_is_used_without_restarting_the_worker(worker_env, tmp_path):
    script = tmp_path / "mine.yaml"
    script.write_text(
        yaml.safe_dump(
            {"policy": "offline", "steps": {"tidy": {"write_file": {"path": "TIDY.md", "content": "tidied by mine"}}}}
        )
    )
    config = tmp_path / "config.toml"
    config.write_text(f'[profiles.mine]\nprovider = "scripted"\nmodel = "mine-model"\nscript = "{script}"\n')

    listed = perdure("profiles", env=worker_env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "mine-model" in listed.stdout

    workspace = tmp_path / "ws"
    workspace.mkdir()
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {"goal": "tidy", "steps": [{"name": "tidy", "kind": "agent", "tools": ["write_file"], "prompt": "Tidy."}]}
        )
    )
    ran = perdure(
        "start", "--plan", str(plan), "--workspace", str(workspace), "--profile", "mine", "--id", "prof-mine-1",
        "--watch", env=worker_env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "succeeded" in ran.stdout
    assert (workspace / "TIDY.md").read_text() == "tidied by mine"  # the per-step entry of the new script

    # A file that no longer parses: the last good profiles stay, and profiles says why.
    config.write_text("[profiles.mine\n")
    broken = perdure("profiles", env=worker_env, timeout=60)
    assert broken.returncode == 0, broken.stderr
    assert "mine-model" in broken.stdout
    assert "cannot read model profiles from" in " ".join(broken.stdout.split())


def test_start_refuses_names_the_worker_does_not_know_before_any_goal_exists(env, worker_env, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()

    bad_profile = perdure("start", "a goal", "--workspace", str(workspace), "--profile", "gpt-9", "--id", "bad-p",
                          env=worker_env)  # fmt: skip
    assert bad_profile.returncode == 2
    said = " ".join(bad_profile.stderr.split())
    assert "unknown model profile 'gpt-9'" in said and KNOWN_PROFILES in said

    bad_tool = perdure("start", "a goal", "--workspace", str(workspace), "--tool", "read_fiel", "--id", "bad-t",
                       env=worker_env)  # fmt: skip
    assert bad_tool.returncode == 2
    said = " ".join(bad_tool.stderr.split())
    assert "unknown tool 'read_fiel'" in said and "offers: " in said and "read_file" in said

    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"steps": [{"name": "a", "kind": "tool", "tool": "read_fiel", "args": {}}]}))
    bad_plan = perdure("start", "a goal", "--plan", str(plan), "--workspace", str(workspace), "--id", "bad-pl",
                       env=worker_env)  # fmt: skip
    assert bad_plan.returncode == 2
    said = " ".join(bad_plan.stderr.split())
    assert "unknown tool 'read_fiel'" in said and "read_file" in said

    for goal_id in ("bad-p", "bad-t", "bad-pl"):
        assert not goal_exists(env, goal_id)


def test_start_with_no_worker_warns_and_starts_the_goal(env, tmp_path, task_queue):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    started = perdure("start", "a goal", "--workspace", str(workspace), "--profile", "gpt-9", "--id", "no-worker-1",
                      env=user_env(env, tmp_path, task_queue), timeout=60)  # fmt: skip
    assert started.returncode == 0, started.stderr
    said = " ".join(started.stderr.split())
    assert f"no worker polls task queue '{task_queue}', so the profile and the tools were not checked" in said
    assert "goal no-worker-1 started" in started.stdout
    assert goal_exists(env, "no-worker-1", terminate=True)


def capabilities_workflows(env, task_queue: str) -> int:
    """Workflows started on the queue to ask a worker what it offers (the check used to start one per start)."""

    async def count() -> int:
        client = await Client.connect(env.client.service_client.config.target_host)
        query = f"WorkflowType = 'PerdureCapabilities' AND TaskQueue = '{task_queue}'"
        return (await client.count_workflows(query)).count

    return asyncio.run(count())


def test_start_and_profiles_right_after_the_last_worker_was_killed_check_against_its_offer(env, tmp_path, task_queue):
    """A worker SIGKILLed a moment before: the task queue still lists it, and asking it used to
    start a workflow that timed out on the server (a WorkflowFailureError traceback, nothing
    started). Its offer is read from the server instead: the start is checked and made."""
    variables = {**user_env(env, tmp_path, task_queue), "PERDURE_CONFIG": str(tmp_path / "config.toml")}
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with worker_process(variables, tmp_path / "worker.log") as worker:
        alive = perdure("profiles", env=variables, timeout=60)
        assert alive.returncode == 0, alive.stderr
        worker.send_signal(signal.SIGKILL)
        worker.wait()

    started = perdure("start", "a goal", "--workspace", str(workspace), "--id", "after-kill-1",
                      env=variables, timeout=60)  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert "goal after-kill-1 started" in started.stdout and "Traceback" not in started.stderr
    assert "not checked" not in started.stderr  # checked, against the offer the killed worker published
    assert goal_exists(env, "after-kill-1", terminate=True)

    refused = perdure("start", "a goal", "--workspace", str(workspace), "--profile", "gpt-9", "--id", "after-kill-2",
                      env=variables, timeout=60)  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "unknown model profile 'gpt-9'" in " ".join(refused.stderr.split())
    assert not goal_exists(env, "after-kill-2")

    listed = perdure("profiles", env=variables, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "scripted (default)" in listed.stdout and "as published by worker" in listed.stdout
    assert capabilities_workflows(env, task_queue) == 0


def test_a_cli_whose_payload_key_the_worker_lacks_is_refused_in_one_line(env, worker_env, tmp_path):
    """The worker has no payload keys; a CLI with one would start a goal the worker cannot
    read (it used to print a traceback after 10 s, and a retry left a stuck goal)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    keyed = {**worker_env, "PERDURE_PAYLOAD_KEYS": new_key_entry("cli-key-1")}
    refused = perdure("start", "a goal", "--workspace", str(workspace), "--id", "keys-1", env=keyed, timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert "could not decrypt the goal" in said and "'cli-key-1'" in said and "no payload keys" in said
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) <= 4
    assert not goal_exists(env, "keys-1")


def test_a_tool_only_a_subgoals_plan_names_is_checked_against_the_worker(env, worker_env, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    plan = tmp_path / "plan.yaml"
    child = {"steps": [{"name": "note", "kind": "tool", "tool": "mcp__nosuch__add_note", "args": {}}]}
    plan.write_text(yaml.safe_dump({"goal": "notes", "steps": [{"name": "part", "kind": "subgoal", "plan": child}]}))
    refused = perdure("start", "--plan", str(plan), "--workspace", str(workspace), "--id", "sub-t", env=worker_env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert "unknown tool 'mcp__nosuch__add_note'" in said and "offers: " in said
    assert not goal_exists(env, "sub-t")
