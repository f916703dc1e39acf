"""Verify before resuming: after a long park, a goal checks its finished steps before new
work and voids (with their downstream) exactly those that no longer hold: a file read
that changed, a declared `verify` command that fails now. Against a dev server with the
production worker; `verify_after_s` is set short so a park of seconds counts as long."""

from __future__ import annotations

import asyncio

import pytest

from tests.builders import gate
from tests.helpers import perdure_status, running_worker, start, wait_until
from tests.verify_rig import checked, checks_made, park_then_resume, read, runs_of


@pytest.mark.slow
async def test_a_file_edited_during_a_long_park_voids_exactly_the_steps_that_read_it(env, task_queue, store, workspace):
    (workspace / "a.md").write_text("alpha\n")
    (workspace / "b.md").write_text("beta\n")
    steps = [read("read-a", "a.md"), read("read-b", "b.md"), gate(["read-a", "read-b"])]
    async with running_worker(env, task_queue, store):
        handle = await start(
            env, task_queue, workspace, steps, allowed_tools=["read_file", "run_command"], verify_after_s=1
        )
        await wait_until(handle, lambda s: "gate" in s.running)
        shown = await perdure_status(env, handle.id)
        assert "oldest read: read-" in shown and "(2 finished steps read files)" in shown  # staleness shown
        await park_then_resume(handle, lambda: (workspace / "a.md").write_text("alpha, edited\n"))
        snapshot = await wait_until(handle, lambda s: s.plan_version == 2 and "gate" in s.running)
        (workspace / "GO").write_text("")
        result = await asyncio.wait_for(handle.result(), 30)
        history = await handle.fetch_history()
    assert result.outcome == "succeeded"
    assert runs_of(history, "read-a") == 2 and runs_of(history, "read-b") == 1
    assert store.get_text(result.outputs["read-a"]) == "alpha, edited\n"
    said = checked(snapshot)
    assert said.startswith("resumed after ") and "re-verified: 1 kept, 2 void (read-a: a.md changed since" in said


@pytest.mark.slow
async def test_a_declared_verify_command_that_fails_after_the_park_runs_its_step_again(
    env, task_queue, store, workspace
):
    (workspace / "status").mkdir()
    (workspace / "status" / "green").write_text("")
    build = {
        "name": "build",
        "kind": "tool",
        "tool": "run_command",
        "args": {"command": "echo built", "replay": "safe"},
        "verify": {"command": "test -f status/green"},
    }
    steps = [build, gate(["build"])]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["run_command"], verify_after_s=1)
        await wait_until(handle, lambda s: "gate" in s.running)
        await park_then_resume(handle, lambda: (workspace / "status" / "green").unlink())
        snapshot = await wait_until(handle, lambda s: s.plan_version == 2)
        (workspace / "GO").write_text("")
        result = await asyncio.wait_for(handle.result(), 30)
    assert result.outcome == "succeeded"
    said = checked(snapshot)
    assert "void (build: its check `test -f status/green` exited 1, expected 0)" in said, said


@pytest.mark.slow
async def test_a_short_park_and_a_trusting_goal_check_nothing(env, task_queue, store, workspace):
    (workspace / "a.md").write_text("alpha\n")
    steps = [read("read-a", "a.md"), gate(["read-a"])]
    async with running_worker(env, task_queue, store):
        short = await start(env, task_queue, workspace, steps, allowed_tools=["read_file", "run_command"])
        trusting = await start(
            env,
            task_queue,
            workspace,
            steps,
            allowed_tools=["read_file", "run_command"],
            verify_after_s=1,
            recovery_mode="trust",
        )
        for handle in (short, trusting):
            await wait_until(handle, lambda s: "gate" in s.running)
        edit = lambda: (workspace / "a.md").write_text("alpha, edited\n")  # noqa: E731
        await asyncio.gather(park_then_resume(short, edit, 0.1), park_then_resume(trusting, edit))
        (workspace / "GO").write_text("")
        results = [await asyncio.wait_for(h.result(), 30) for h in (short, trusting)]
        histories = [await h.fetch_history() for h in (short, trusting)]
    assert [r.outcome for r in results] == ["succeeded", "succeeded"]
    for history in histories:
        assert runs_of(history, "read-a") == 1  # kept as it was: an hour's park is not a short one
        assert checks_made(history) == 0
