"""A worker of another code version taking a goal checks the goal's finished work before
new work, as a long park does: what the new code would read differently is not trusted.
The same code on a restarted worker checks nothing. Against a dev server with two
production workers, one after the other, told apart by their build ids."""

from __future__ import annotations

import asyncio

import pytest

from perdure.activities.models.profiles import ModelConfig
from perdure.workers.code_version import code_version
from perdure.workers.orchestrator import build_worker
from perdure.workflows.goal.contracts.messages import Park, Resume
from tests.builders import gate
from tests.helpers import local_activities, start, submit, wait_until
from tests.verify_rig import checks_made


def read(name: str, path: str) -> dict:
    return {"name": name, "kind": "tool", "tool": "read_file", "args": {"path": path}}


def runs_of(history, step: str) -> int:
    return sum(1 for _, _, summary, _ in local_activities(history) if f"· {step} " in summary + " ")


async def hand_over(env, task_queue, store, workspace, build_ids: tuple[str, str]):
    """The goal reads a.md under the first worker and parks; a.md is edited while no worker
    runs; the second worker takes the resume. Returns (result, history, gate log)."""
    (workspace / "a.md").write_text("alpha\n")
    wait = gate(["read-a"])
    wait["args"]["replay"] = "safe"  # cut off by the first worker's shutdown, it runs again
    steps = [read("read-a", "a.md"), wait]
    config = ModelConfig(profiles={})
    first = build_worker(env.client, task_queue=task_queue, store=store, model_config=config, build_id=build_ids[0])
    async with first:
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["read_file", "run_command"])
        await wait_until(handle, lambda s: "gate" in s.running)
        await submit(handle, Park(request_id="park-1", reason="deploying"))
        await wait_until(handle, lambda s: s.parked)
    (workspace / "a.md").write_text("alpha, edited\n")
    second = build_worker(env.client, task_queue=task_queue, store=store, model_config=config, build_id=build_ids[1])
    async with second:
        await submit(handle, Resume(request_id="resume-1"))
        await wait_until(handle, lambda s: not s.parked and "gate" in s.running)
        (workspace / "GO").write_text("")
        result = await asyncio.wait_for(handle.result(), 30)
        snapshot = await wait_until(handle, lambda s: True)
    return result, await handle.fetch_history(), snapshot.gate_log


@pytest.mark.slow
async def test_a_worker_of_another_code_version_voids_the_steps_whose_reads_changed(env, task_queue, store, workspace):
    result, history, gate_log = await hand_over(env, task_queue, store, workspace, ("perdure-old", "perdure-new"))
    assert result.outcome == "succeeded"
    assert runs_of(history, "read-a") == 2
    assert store.get_text(result.outputs["read-a"]) == "alpha, edited\n"
    said = next(entry for entry in gate_log if "re-verified" in entry)
    assert said.startswith("a worker of another code version (perdure-new) took the goal: re-verified: ")
    assert "void (read-a: a.md changed since it was read)" in said


@pytest.mark.slow
async def test_a_restarted_worker_of_the_same_code_checks_nothing(env, task_queue, store, workspace):
    result, history, gate_log = await hand_over(env, task_queue, store, workspace, (code_version(), code_version()))
    assert result.outcome == "succeeded"
    assert runs_of(history, "read-a") == 1  # the park was short and the code the same: kept
    assert checks_made(history) == 0
    assert not any("re-verified" in entry for entry in gate_log)


async def test_a_worker_without_a_build_id_given_runs_as_its_code_version(env, store):
    worker = build_worker(env.client, task_queue="unused", store=store, model_config=ModelConfig(profiles={}))
    assert worker.config()["build_id"] == code_version()
    assert code_version().startswith("perdure-") and len(code_version()) == len("perdure-") + 16
