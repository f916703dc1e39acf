"""Device edges a review found, each a test that failed before its fix: a skipped step's
wait that kept a timer firing, an abort held forever by a device write lost mid-call, an
approval for one root used in another, a re-announcing daemon stopping itself, and a
registry holding two leases for one session."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from perdure.activities.devices.device_tools import DeviceSessionState, DeviceToolActivities
from perdure.runtime.plugin import PerdurePlugin
from perdure.workers import device as daemon
from perdure.workflows.devices.device_contracts import (
    DeviceActivities,
    LeaseInput,
    LeaseResult,
    registry_id,
)
from perdure.workflows.devices.device_registry import DeviceRegistryWorkflow
from perdure.workflows.goal.contracts.messages import Abort, Answer, Approve
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.device_rig import (
    InProcessDevice,
    device_call_running,
    freezing_on_first,
    question_of,
    registry_says,
    write_on,
)
from tests.helpers import goal_result, running_worker, start, statuses, submit, wait_until


def timers_started(history) -> int:
    return sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED)


@pytest.mark.slow
async def test_a_skipped_steps_wait_is_gone_and_sets_no_timer_while_another_step_waits(
    env, task_queue, store, workspace, devices
):
    async with running_worker(env, task_queue, store):
        laptop, desktop = devices("laptop"), devices("desktop")
        for device in (laptop, desktop):
            await device.start()
            await device.stop()
        await registry_says(env, task_queue, "laptop", online=False)
        await registry_says(env, task_queue, "desktop", online=False)
        other = {**write_on("desktop", path="b.txt"), "name": "other"}
        steps = [write_on("laptop", device_wait_s=1), other]
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["write_file"])
        card = await question_of(handle, "device_offline")
        await submit(handle, Answer(request_id="skip-1", question_id=card.id, choice="skip"))
        await wait_until(handle, lambda s: statuses(s).get("save") == "abandoned")
        before = timers_started(await handle.fetch_history())
        await asyncio.sleep(4)
        after = timers_started(await handle.fetch_history())
        snap = await handle.query(GoalWorkflow.progress)
        await handle.terminate()
    assert after - before <= 1, f"{after - before} timers in 4 s after the skip"
    assert snap.waiting_for_devices == {"other": "desktop"}


@pytest.mark.slow
async def test_an_abort_while_a_device_write_is_lost_mid_call_ends_with_the_write_uncertain(
    env, task_queue, store, workspace, tmp_path
):
    root = tmp_path / "machine"
    root.mkdir()
    async with running_worker(env, task_queue, store):
        frozen = freezing_on_first("git_commit")
        device = InProcessDevice(env, task_queue, "laptop", root, activities=frozen, approval={"*": "never"})
        await device.start()
        try:
            step = {"name": "commit", "kind": "tool", "tool": "git_commit", "device": "laptop"}
            step["args"] = {"message": "x"}
            handle = await start(env, task_queue, workspace, [step], allowed_tools=["git_commit"])
            await device_call_running(handle)
            await submit(handle, Abort(request_id="stop-1", reason="enough"))
            result = await asyncio.wait_for(goal_result(handle), timeout=30)
            snap = await handle.query(GoalWorkflow.progress)
        finally:
            await device.stop()
    assert result.outcome == "aborted"
    assert statuses(snap) == {"commit": "uncertain"}  # the commit may have happened: never "abandoned"


@pytest.mark.slow
async def test_an_approval_for_one_root_is_not_used_in_another_which_is_asked_about_anew(
    env, task_queue, store, workspace, devices, tmp_path
):
    async with running_worker(env, task_queue, store):
        # The device's own rule asks, the goal's would not: nothing is on an approvals-ahead card
        # (the goal has not heard the device's rules at adoption), so the call asks when it runs.
        laptop = devices("laptop", approval={"write_file": "always"})
        await laptop.start()
        handle = await start(
            env,
            task_queue,
            workspace,
            [write_on("laptop")],
            allowed_tools=["write_file"],
            device_approval={"write_file": "never"},
        )
        card = await question_of(handle, "confirm_device_call")
        assert str(laptop.root) in card.stuck
        await laptop.stop()
        # Another root under the same name is refused while the registry still holds the first
        # session online (DeviceNameTaken): wait until it has heard the sign-off.
        await registry_says(env, task_queue, "laptop", online=False)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        moved = InProcessDevice(env, task_queue, "laptop", elsewhere, approval={"write_file": "always"})
        await moved.start()
        try:
            await wait_until(handle, lambda s: "session 2" in s.devices.get("laptop", ""))
            await submit(handle, Approve(request_id="ok-1", question_id=card.id, approved=True))
            again = await wait_until(
                handle, lambda s: any(q.id != card.id and q.topic == "confirm_device_call" for q in s.questions)
            )
            await handle.terminate()
        finally:
            await moved.stop()
    second = next(q for q in again.questions if q.id != card.id)
    assert str(elsewhere) in second.stuck  # the new card says where it would run now
    assert not (elsewhere / "out.txt").exists() and not (laptop.root / "out.txt").exists()


@pytest.mark.slow
async def test_a_daemon_announcing_itself_again_takes_its_own_new_lease_and_keeps_running(env, tmp_path, monkeypatch):
    client = await Client.connect(
        env.client.service_client.config.target_host, plugins=[PerdurePlugin(payload_store=False)]
    )
    root = (tmp_path / "root").resolve()
    root.mkdir()
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    monkeypatch.setattr(daemon, "RECHECK_S", 0.2)
    real_lease = DeviceToolActivities.lease
    leases = {"n": 0}

    @activity.defn(name=DeviceActivities.LEASE)
    async def lost_first_lease(self, input: LeaseInput) -> LeaseResult:
        leases["n"] += 1
        if leases["n"] == 1:
            raise RuntimeError("network blip: the lease is lost")  # the registry marks the device offline
        return await real_lease(self, input)

    monkeypatch.setattr(DeviceToolActivities, "lease", lost_first_lease)
    real_announce = daemon.announce
    announces = {"n": 0}

    async def slow_answer(client, announcement, queue):
        session = await real_announce(client, announcement, queue)
        announces["n"] += 1
        if announces["n"] > 1:
            await asyncio.sleep(1.0)  # the answer arrives after the lease it scheduled
        return session

    monkeypatch.setattr(daemon, "announce", slow_answer)
    state = DeviceSessionState(name="probe")
    async with Worker(env.client, task_queue=task_queue, workflows=[DeviceRegistryWorkflow]):
        run = asyncio.create_task(
            daemon.run_device(
                client,
                name="probe",
                root=root,
                lease_s=1,
                scratch=tmp_path / "scratch",
                task_queue=task_queue,
                state=state,
            )
        )
        deadline = time.monotonic() + 30
        while not run.done() and time.monotonic() < deadline and announces["n"] < 2:
            await asyncio.sleep(0.2)
        await asyncio.sleep(3)
        stopped = run.done()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
    assert announces["n"] == 2
    assert not state.superseded.is_set() and not stopped, "the daemon took its own new lease for a newer daemon's"
    assert state.generation == 2


@pytest.mark.slow
async def test_the_first_announce_holds_one_lease(env, task_queue, store, tmp_path):
    root = tmp_path / "m"
    root.mkdir()
    async with running_worker(env, task_queue, store):
        device = InProcessDevice(env, task_queue, "laptop", root)
        await device.start()
        registry = env.client.get_workflow_handle(registry_id(task_queue))
        for _ in range(50):
            pending = (await registry.describe()).raw_description.pending_activities
            if pending:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)
        pending = (await registry.describe()).raw_description.pending_activities
        held = device.state.leases
        await device.stop()
    assert [p.activity_type.name for p in pending] == [DeviceActivities.LEASE]
    assert held == 1


async def test_a_device_calls_heartbeat_timeout_follows_the_lease_its_daemon_announced(
    env, task_queue, store, workspace, devices
):
    """`perdure device --lease-s 4`: a call there is judged lost after 1.5 leases (6 s), not
    after the default lease's 15 s (the registry dropped the announced lease before)."""
    laptop = devices("laptop", lease_s=4.0)
    (laptop.root / "notes.md").write_text("a note\n")
    read = {"name": "read", "kind": "tool", "tool": "read_file", "device": "laptop", "args": {"path": "notes.md"}}
    async with running_worker(env, task_queue, store):
        await laptop.start()
        handle = await start(env, task_queue, workspace, [read], allowed_tools=["read_file"])
        result = await asyncio.wait_for(handle.result(), 30)
        history = await handle.fetch_history()
    timeouts = [
        e.activity_task_scheduled_event_attributes.heartbeat_timeout.ToTimedelta()
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.task_queue.name.endswith("-device-laptop")
    ]
    assert result.outcome == "succeeded" and timeouts == [timedelta(seconds=6)]
