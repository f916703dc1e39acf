"""The embedded dev server launcher against the real `temporal` binary.

Each test uses its own data directory and free ports, so it never meets a
server on 7233. Every server a test starts is stopped by pid in teardown.
Search attributes are checked through the SDK's operator service, not through
the CLI the launcher itself uses.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from perdure.starters.devserver import (
    DevServerError,
    dev_server_argv,
    dev_server_status,
    start_dev_server,
    stop_dev_server,
)
from perdure.workflows.shared.search_attributes import ALL_KEYS, CUSTOM_SEARCH_ATTRIBUTES, GOAL_STATUS
from tests.helpers import dev_server_options, free_ports
from tests.subprocess_rig import kill_raw, registered_attributes, spawn_raw_server

pytestmark = [pytest.mark.process, pytest.mark.timeout(60), pytest.mark.parallel_safe]

# Expected types come from the SDK keys, independently of the launcher's own
# CLI-name -> enum table.
EXPECTED_TYPES = {key.name: f"INDEXED_VALUE_TYPE_{key.indexed_value_type.name}" for key in ALL_KEYS}


def process_exists(pid: int) -> bool:
    """True while the pid has any /proc entry, a zombie included."""
    return Path(f"/proc/{pid}").exists()


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    data = tmp_path / "data"
    yield data
    stop_dev_server(data)


def test_start_status_reuse_stop_restart(data_dir: Path) -> None:
    port, ui_port = free_ports(2)
    first = start_dev_server(port=port, ui_port=ui_port, data_dir=data_dir)
    assert first.reused is False
    assert first.pid is not None and process_exists(first.pid)
    assert first.address == f"127.0.0.1:{port}"
    assert first.ui_url == f"http://localhost:{ui_port}"
    assert (data_dir / "server.pid").read_text().strip() == str(first.pid)
    assert first.db == data_dir / "temporal.db" and first.db.exists()

    status = dev_server_status(data_dir, port=port)
    assert (status.running, status.managed, status.pid, status.address) == (True, True, first.pid, first.address)
    assert status.ui_url == first.ui_url

    assert set(CUSTOM_SEARCH_ATTRIBUTES) == set(EXPECTED_TYPES)
    assert registered_attributes(first.address) == EXPECTED_TYPES

    # A durable fact for after the restart: a workflow (no worker needed)
    # carrying a custom search attribute, which lives in the SQLite visibility.
    workflow_id = f"devserver-probe-{uuid.uuid4().hex[:8]}"
    asyncio.run(start_probe(first.address, workflow_id))

    again = start_dev_server(port=port, ui_port=ui_port, data_dir=data_dir)
    assert again.reused is True
    assert again.pid == first.pid

    assert stop_dev_server(data_dir) is True
    assert not process_exists(first.pid)
    assert not (data_dir / "server.pid").exists()
    assert stop_dev_server(data_dir) is False
    assert dev_server_status(data_dir, port=port).running is False

    restarted = start_dev_server(port=port, ui_port=ui_port, data_dir=data_dir)
    assert restarted.reused is False
    assert restarted.pid != first.pid
    assert registered_attributes(restarted.address) == EXPECTED_TYPES
    asyncio.run(check_probe_survived(restarted.address, workflow_id))


def test_the_dev_server_gets_no_key_or_credential_of_the_shell_that_starts_it(tmp_path: Path) -> None:
    port, ui_port = free_ports(2)
    canary = f"canary-{uuid.uuid4().hex}"
    leaky = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY", "TEMPORAL_API_KEY", "SOME_TOKEN")
    shell = {**os.environ, "PERDURE_DEV_DIR": str(tmp_path / "dev"), **dict.fromkeys(leaky, canary)}
    perdure = [str(Path(sys.executable).parent / "perdure"), "server"]
    started = subprocess.run(
        [*perdure, "start", "--port", str(port), "--ui-port", str(ui_port)],
        env=shell,
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        assert started.returncode == 0, started.stderr
        pid = int((tmp_path / "dev" / "data" / "server.pid").read_text())
        environ = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in v)
        assert canary not in Path(f"/proc/{pid}/environ").read_text()
        assert environ.get("PATH") == os.environ["PATH"] and not set(leaky) & set(environ)
    finally:
        subprocess.run([*perdure, "stop"], env=shell, capture_output=True, timeout=60)


async def start_probe(address: str, workflow_id: str) -> None:
    client = await Client.connect(address)
    await client.start_workflow(
        "PerdureDevServerProbe",
        id=workflow_id,
        task_queue="devserver-probe",
        search_attributes=TypedSearchAttributes([SearchAttributePair(GOAL_STATUS, "probe")]),
    )


async def check_probe_survived(address: str, workflow_id: str) -> None:
    client = await Client.connect(address)
    described = await client.get_workflow_handle(workflow_id).describe()
    assert described.status == WorkflowExecutionStatus.RUNNING
    assert described.typed_search_attributes.get(GOAL_STATUS) == "probe"
    deadline = time.monotonic() + 10
    while True:
        found = [w.id async for w in client.list_workflows(f'PerdureStatus = "probe" AND WorkflowId = "{workflow_id}"')]
        if found == [workflow_id]:
            return
        assert time.monotonic() < deadline, "the probe is not listed by its custom search attribute after restart"
        await asyncio.sleep(0.2)


def test_attribute_added_to_the_list_later_is_registered_on_an_existing_db(data_dir: Path) -> None:
    """start-dev ignores --search-attribute on an existing db; the launcher must not rely on it."""
    port, ui_port = free_ports(2)
    data_dir.mkdir(parents=True)
    older = spawn_raw_server(
        port, ui_port, "--db-filename", str(data_dir / "temporal.db"), "--search-attribute", "PerdureStatus=Keyword"
    )
    try:
        assert registered_attributes(f"127.0.0.1:{port}") == {"PerdureStatus": "INDEXED_VALUE_TYPE_KEYWORD"}
    finally:
        older.terminate()
        older.wait(15)

    server = start_dev_server(port=port, ui_port=ui_port, data_dir=data_dir)
    assert server.reused is False
    assert registered_attributes(server.address) == EXPECTED_TYPES


def test_someone_elses_server_is_reused_and_never_stopped(tmp_path: Path, data_dir: Path) -> None:
    port, ui_port, our_port, our_ui_port = free_ports(4)
    foreign = spawn_raw_server(port, ui_port, "--headless")
    try:
        assert registered_attributes(f"127.0.0.1:{port}") == {}
        reused = start_dev_server(port=port, ui_port=ui_port, data_dir=tmp_path / "other")
        assert reused.reused is True
        assert reused.pid is None
        assert reused.ui_url is None  # headless: nothing answers on the UI port
        assert registered_attributes(reused.address) == EXPECTED_TYPES
        assert not (tmp_path / "other" / "server.pid").exists()

        ours = start_dev_server(port=our_port, ui_port=our_ui_port, data_dir=data_dir)
        assert ours.pid is not None and ours.pid != foreign.pid

        # Stopping signals only the recorded pid: the other temporal process,
        # same binary name, keeps running.
        assert stop_dev_server(tmp_path / "other") is False
        assert stop_dev_server(data_dir) is True
        assert not process_exists(ours.pid)
        assert foreign.poll() is None
        assert registered_attributes(reused.address) == EXPECTED_TYPES
    finally:
        kill_raw(foreign)


def test_stale_pid_files_neither_block_start_nor_get_signalled(data_dir: Path) -> None:
    port, ui_port = free_ports(2)
    data_dir.mkdir(parents=True)
    pid_file = data_dir / "server.pid"

    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        pid_file.write_text(f"{bystander.pid}\n")  # alive, but not our server
        assert stop_dev_server(data_dir) is False
        assert bystander.poll() is None
        assert not pid_file.exists()
    finally:
        bystander.kill()
        bystander.wait()

    finished = subprocess.Popen(["true"])
    finished.wait()
    pid_file.write_text(f"{finished.pid}\n")  # dead
    server = start_dev_server(port=port, ui_port=ui_port, data_dir=data_dir)
    assert server.reused is False
    assert server.pid != finished.pid
    assert pid_file.read_text().strip() == str(server.pid)


def test_a_server_that_dies_at_start_reports_its_log(data_dir: Path) -> None:
    port, ui_port = free_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ui_port))
        taken.listen()
        with pytest.raises(DevServerError) as failure:
            start_dev_server(port=port, ui_port=ui_port, data_dir=data_dir, wait_s=15)
    assert "exited with code" in str(failure.value)
    assert "address already in use" in str(failure.value)  # the tail of server.log
    assert not (data_dir / "server.pid").exists()


def test_a_port_held_by_something_else_is_a_clear_error(data_dir: Path) -> None:
    port, ui_port = free_ports(2)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        stop = threading.Event()

        def hang_up() -> None:
            listener.settimeout(0.1)
            while not stop.is_set():
                try:
                    connection, _ = listener.accept()
                    connection.close()
                except OSError:
                    continue

        thread = threading.Thread(target=hang_up, daemon=True)
        thread.start()
        try:
            with pytest.raises(DevServerError, match="does not answer as a Temporal frontend"):
                start_dev_server(port=port, ui_port=ui_port, data_dir=data_dir, wait_s=1)
        finally:
            stop.set()
            thread.join()
    assert not (data_dir / "server.pid").exists()


@activity.defn(name="test.devserver.noop")
async def noop_step(n: int) -> int:
    return n


@workflow.defn(name="test.devserver.Steps")
class SequentialSteps:
    @workflow.run
    async def run(self, count: int) -> int:
        for n in range(count):
            await workflow.execute_activity(noop_step, n, start_to_close_timeout=timedelta(seconds=30))
        return count


def test_workflow_tasks_after_activities_are_not_held_to_the_default_transfer_read_rate() -> None:
    """temporal-dev/dynamic-config.yaml raises history.transferProcessorMaxPollRPS (Temporal's
    default: 20 reads a second per shard, and start-dev has one shard). With the default,
    past a burst of 20 each workflow task that follows an activity waited for the next
    read: 35-40 ms from scheduled to started on the in-memory database, a few ms with
    the file's value. The server ignores a key it does not know, so this checks the value
    takes effect, given as `perdure server start` gives it (its command line's values)."""
    argv = dev_server_argv(7233, 8233)
    flags = [arg for i, arg in enumerate(argv) if i and argv[i - 1] == "--dynamic-config-value"]
    assert any(flag.startswith("history.transferProcessorMaxPollRPS=") for flag in flags)
    waits = asyncio.run(workflow_task_waits([arg for flag in flags for arg in ("--dynamic-config-value", flag)], 100))
    # The first tasks ride the burst either way; the rest show the rate.
    later = waits[40:]
    assert statistics.median(later) < 0.02, f"median wait {statistics.median(later):.3f} s"


async def workflow_task_waits(server_args: list[str], steps: int) -> list[float]:
    """Seconds from scheduled to started of each workflow task of one run of `steps` activities,
    on a dev server of its own (in-memory database, as the benchmarks use)."""
    async with await WorkflowEnvironment.start_local(**dev_server_options(*server_args)) as environment:
        return await run_steps(environment.client, steps)


async def run_steps(client: Client, steps: int) -> list[float]:
    task_queue = f"devserver-steps-{uuid.uuid4().hex[:8]}"
    # Unsandboxed: this module's imports are not for a workflow sandbox, and the server is what is tested.
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[SequentialSteps],
        activities=[noop_step],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    async with worker:
        handle = await client.start_workflow(SequentialSteps.run, steps, id=task_queue, task_queue=task_queue)
        assert await handle.result() == steps
    scheduled, waits = None, []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled = event.event_time.ToDatetime()
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and scheduled is not None:
            waits.append((event.event_time.ToDatetime() - scheduled).total_seconds())
    return waits
