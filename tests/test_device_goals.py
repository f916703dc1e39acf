"""Goals with device steps against a dev server, the devices run in this process (the real
device activities on their own task queues, announced to the real registry): approvals,
a long absence that becomes a question, a device that never existed, abort while waiting,
the agent's tools on a device. Killed and restarted daemons are in test_devices.py."""

from __future__ import annotations

import pytest

from perdure.workflows.goal.contracts.messages import Abort, Answer, Approve
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import agent, openai_profile, spec, tool_then_answer
from tests.device_rig import question_of, registry_says, write_on
from tests.helpers import (
    cards_until_the_end,
    goal_result,
    run_goal,
    running_worker,
    start,
    statuses,
    submit,
    wait_until,
)


@pytest.mark.slow
async def test_a_write_on_a_device_waits_for_a_persons_approval_showing_what_runs_where(
    env, task_queue, store, workspace, devices
):
    async with running_worker(env, task_queue, store):
        laptop = devices("laptop")
        await laptop.start()
        handle = await start(env, task_queue, workspace, [write_on("laptop")], allowed_tools=["write_file"])
        # Asked at adoption on the approvals-ahead card (issue 38): the call and the device it runs
        # on (its root is not known before the device announces itself; it is bound at first use).
        card = await question_of(handle, "approvals_ahead")
        [entry] = card.ahead
        assert (entry.step, entry.on) == ("save", "laptop") and '"content":"hello\\n"' in card.stuck
        assert "on laptop" in card.stuck
        await wait_until(handle, lambda s: statuses(s).get("save") == "blocked")
        assert not (laptop.root / "out.txt").exists()  # nothing ran before the answer
        await submit(handle, Approve(request_id="ok-1", question_id=card.id, approved=True))
        seen = await cards_until_the_end(handle)
        result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt
    assert seen == set()  # no second card on the device
    assert (laptop.root / "out.txt").read_text() == "hello\n"
    assert not (workspace / "out.txt").exists()


@pytest.mark.slow
async def test_a_refused_device_call_fails_its_step_and_runs_nothing(env, task_queue, store, workspace, devices):
    async with running_worker(env, task_queue, store):
        laptop = devices("laptop")
        await laptop.start()
        handle = await start(env, task_queue, workspace, [write_on("laptop")], allowed_tools=["write_file"])
        card = await question_of(handle, "approvals_ahead")
        await submit(handle, Approve(request_id="no-1", question_id=card.id, approved=False, text="not my laptop"))
        result = await goal_result(handle)
        snap = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "failed"  # its only step
    node = next(n for n in snap.nodes if n.name == "save")
    assert node.status == "failed" and "a person refused write_file: not my laptop" in (node.error or "")
    assert not (laptop.root / "out.txt").exists()


async def test_a_device_that_allows_a_tool_runs_it_without_asking(env, task_queue, store, workspace, devices):
    async with running_worker(env, task_queue, store):
        laptop = devices("laptop", approval={"write_file": "never"})
        await laptop.start()
        handle = await start(env, task_queue, workspace, [write_on("laptop")], allowed_tools=["write_file"])
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.outcome == "succeeded", result.excerpt
    assert (laptop.root / "out.txt").read_text() == "hello\n"
    assert "confirm_device_call" not in history.to_json()


@pytest.mark.slow
async def test_a_long_absence_becomes_a_question_and_another_device_can_take_the_step(
    env, task_queue, store, workspace, devices
):
    async with running_worker(env, task_queue, store):
        laptop, desktop = devices("laptop"), devices("desktop", approval={"*": "never"})
        await laptop.start()
        await desktop.start()
        await laptop.stop()
        await registry_says(env, task_queue, "laptop", online=False)
        # The goal's rule asks nobody for writes (else the step is on an approvals-ahead card,
        # and the goal waits on a person first): this test is about the device's absence.
        handle = await start(
            env,
            task_queue,
            workspace,
            [write_on("laptop", device_wait_s=2)],
            allowed_tools=["write_file"],
            device_approval={"write_file": "never"},
        )
        snap = await wait_until(handle, lambda s: s.waiting_for_devices == {"save": "laptop"})
        assert snap.phase == "awaiting_device" and statuses(snap) == {"save": "offline"}
        card = await question_of(handle, "device_offline")
        assert [o["id"] for o in card.options] == ["wait", "device:desktop", "skip"]
        await submit(handle, Answer(request_id="move-1", question_id=card.id, choice="device:desktop"))
        result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt
    assert (desktop.root / "out.txt").read_text() == "hello\n"
    assert not (laptop.root / "out.txt").exists()


@pytest.mark.slow
async def test_skipping_a_step_whose_device_stays_away_abandons_it_and_what_needs_it(
    env, task_queue, store, workspace, devices
):
    async with running_worker(env, task_queue, store):
        laptop = devices("laptop")
        await laptop.start()
        await laptop.stop()
        await registry_says(env, task_queue, "laptop", online=False)
        after = {"name": "after", "kind": "tool", "tool": "list_dir", "needs": ["save"], "args": {}}
        handle = await start(
            env,
            task_queue,
            workspace,
            [write_on("laptop", device_wait_s=1), after],
            allowed_tools=["write_file", "list_dir"],
        )
        card = await question_of(handle, "device_offline")
        await submit(handle, Answer(request_id="skip-1", question_id=card.id, choice="skip"))
        result = await goal_result(handle)
        snap = await handle.query(GoalWorkflow.progress)
    assert statuses(snap) == {"save": "abandoned", "after": "abandoned"}
    assert result.outcome == "failed" and result.failure == "no step succeeded (2 abandoned)"


@pytest.mark.slow
async def test_a_device_coming_back_closes_its_question_and_the_step_runs(env, task_queue, store, workspace, devices):
    async with running_worker(env, task_queue, store):
        laptop = devices("laptop", approval={"*": "never"})
        await laptop.start()
        await laptop.stop()
        await registry_says(env, task_queue, "laptop", online=False)
        handle = await start(
            env, task_queue, workspace, [write_on("laptop", device_wait_s=1)], allowed_tools=["write_file"]
        )
        await question_of(handle, "device_offline")
        back = devices("laptop", approval={"*": "never"})
        await back.start()
        result = await handle.result()
        snap = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt
    assert snap.questions == []  # the card was closed: nobody needs to answer it now
    assert (laptop.root / "out.txt").read_text() == "hello\n"


async def test_a_plan_naming_a_device_that_never_announced_itself_is_refused_with_the_devices_there_are(
    env, task_queue, store, workspace, devices
):
    async with running_worker(env, task_queue, store):
        await devices("laptop").start()
        handle = await start(env, task_queue, workspace, [write_on("ghost")], allowed_tools=["write_file"])
        with pytest.raises(Exception) as failure:
            await handle.result()
    message = str(failure.value.cause)
    assert "no device named 'ghost'" in message and "laptop (" in message, message


@pytest.mark.slow
async def test_aborting_a_goal_waiting_for_an_offline_device_ends_it_at_once(
    env, task_queue, store, workspace, devices
):
    async with running_worker(env, task_queue, store):
        laptop = devices("laptop")
        await laptop.start()
        await laptop.stop()
        await registry_says(env, task_queue, "laptop", online=False)
        handle = await start(env, task_queue, workspace, [write_on("laptop")], allowed_tools=["write_file"])
        await wait_until(handle, lambda s: s.waiting_for_devices == {"save": "laptop"})
        await submit(handle, Abort(request_id="stop-1", reason="the laptop is gone"))
        result = await goal_result(handle)
        snap = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "aborted"
    assert statuses(snap) == {"save": "abandoned"}


@pytest.mark.slow
async def test_an_agent_step_on_a_device_reads_there_and_its_model_sees_the_devices_file(
    env, task_queue, store, workspace, devices, scripted
):
    server = scripted(tool_then_answer("read_file", {"path": "todo.md"}, when="water the plants", answer="one thing"))
    async with running_worker(env, task_queue, store, openai_profile(server)):
        laptop = devices("laptop", approval={"*": "never"})
        await laptop.start()
        (laptop.root / "todo.md").write_text("- water the plants\n")
        step = agent("tidy", "Read todo.md and say how many things are on it.", ["read_file"], device="laptop")
        handle = await start(env, task_queue, workspace, [step], allowed_tools=["read_file"])
        result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt
    first, second = server.requests()
    assert "water the plants" in second["last_message"]  # the tool result came from the device's root


@pytest.mark.slow
async def test_the_planner_is_told_the_devices_and_a_plan_naming_another_is_sent_back_to_repair(
    env, task_queue, store, workspace, devices, scripted
):
    on = {"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "todo.md"}}
    server = scripted(
        {
            "replies": [
                {"when": "Your plan was rejected", "json": {"steps": [{**on, "device": "laptop"}]}},
                # Matches only a planner prompt that lists the device: the planner is told.
                {"when": "- laptop: online; works in", "times": 1, "json": {"steps": [{**on, "device": "ghost"}]}},
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        laptop = devices("laptop", tools=["read_file", "list_dir"])
        await laptop.start()
        (laptop.root / "todo.md").write_text("- water the plants\n")
        goal = spec(workspace, goal="Read my todo list on the laptop", allowed_tools=["read_file"])
        handle, result = await run_goal(env, task_queue, goal)
        snap = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt
    first, repair = server.requests()[:2]
    assert first["matched"] == 1 and repair["matched"] == 0
    assert "no device named 'ghost' (devices: laptop (read_file, list_dir))" in repair["last_message"]
    assert snap.nodes[0].placements["read_file"].startswith("device laptop")
    assert store.get_text(snap.results["read"]) == "- water the plants\n"
