"""The device daemon (`perdure device`): its activities, its options, `perdure devices`.

From outside: what a call may touch (only the root, only the tools the device offers,
the network only when both the device and the call allow it, none of the daemon's
environment), what comes back (inline, capped, with this session's generation), what
the daemon keeps (nothing: the scratch is empty after every call), how sessions fence
each other (a call or lease for a newer session stops this daemon; an older one's
call still runs, its lease is stale), and what the lease heartbeats (the running
calls). The activities run in an ActivityEnvironment, in this process; the tests at
the end run real daemons against a Temporal server of their own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker
from typer.testing import CliRunner

from perdure.activities.devices.device_tools import (
    DeviceSessionState,
    DeviceSuperseded,
    DeviceToolActivities,
    capped_output,
    clear_scratch,
)
from perdure.activities.tools import sandbox
from perdure.runtime.plugin import PerdurePlugin
from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.starters.device_listing import DevicesView, DeviceView, device_views, print_devices
from perdure.testing.http import PingServer
from perdure.testing.repo import git, init_repo
from perdure.workers import device as daemon
from perdure.workers.device import DeviceConfigError, device_config, device_tools, parse_approval
from perdure.workflows.devices.device_contracts import (
    DEVICE_TOOLS,
    MAX_DEVICE_PAYLOAD,
    DeviceActivities,
    DeviceListing,
    DevicePresence,
    DeviceRecord,
    DeviceSession,
    DeviceToolInput,
    DeviceToolResult,
    LeaseInput,
    RunningCall,
    device_queue,
)
from perdure.workflows.devices.device_registry import DeviceRegistryWorkflow
from tests.subprocess_rig import PERDURE, perdure, user_env, worker_process

needs_bwrap = pytest.mark.skipif(sandbox.find_bwrap() is None, reason="needs bwrap (make system-packages)")


@dataclasses.dataclass
class Device:
    """One daemon's activities, as `run_device` builds them, over a root and a scratch."""

    root: Path
    scratch: Path
    state: DeviceSessionState
    acts: DeviceToolActivities

    def call(self, tool: str, args: dict, **fields: Any) -> DeviceToolInput:
        values = {"goal_id": "g1", "node_key": "node:n1", "root": str(self.root), "generation": self.state.generation}
        return DeviceToolInput(tool=tool, args=args, **{**values, **fields})

    async def run(self, tool: str, args: dict, env: ActivityEnvironment | None = None, **fields: Any):
        return await (env or ActivityEnvironment()).run(self.acts.run_tool, self.call(tool, args, **fields))

    def scratch_entries(self) -> list[str]:
        return sorted(str(p.relative_to(self.scratch)) for p in self.scratch.rglob("*"))


def make_device(
    tmp_path: Path,
    *,
    tools: frozenset[str] = frozenset(DEVICE_TOOLS),
    network: bool = False,
    generation: int = 2,
    scratch: Path | None = None,
) -> Device:
    root = (tmp_path / "root").resolve()
    root.mkdir(parents=True, exist_ok=True)
    scratch = scratch or (tmp_path / "scratch")
    clear_scratch(scratch)
    state = DeviceSessionState(name="laptop", generation=generation)
    return Device(root, scratch, state, DeviceToolActivities(root, tools, network, state, scratch))


@pytest.fixture
def device(tmp_path: Path) -> Device:
    return make_device(tmp_path)


# --- what a call may touch --------------------------------------------------------------


async def test_paths_outside_the_root_are_refused(device: Device, tmp_path: Path):
    (tmp_path / "outside.txt").write_text("not yours")
    read = await device.run("read_file", {"path": "../outside.txt"})
    assert not read.ok and "'..'" in (read.error or "")
    assert "not yours" not in (read.output or "")
    wrote = await device.run("write_file", {"path": "../planted.txt", "content": "x"})
    assert not wrote.ok and not (tmp_path / "planted.txt").exists()
    inside = await device.run("write_file", {"path": "notes/a.txt", "content": "kept"})
    assert inside.ok, inside.error
    assert (device.root / "notes" / "a.txt").read_text() == "kept"
    assert inside.output == "wrote 4 bytes to notes/a.txt"  # inline: no artifact reference


async def test_a_tool_the_device_does_not_offer_is_refused_whatever_the_call_says(tmp_path: Path):
    reader = make_device(tmp_path, tools=frozenset({"read_file", "list_dir"}))
    result = await reader.run("write_file", {"path": "a.txt", "content": "x"}, confirmed=True)
    assert not result.ok
    assert result.error == "device laptop does not offer write_file (offers: list_dir, read_file); nothing was run"
    assert not (reader.root / "a.txt").exists()
    # Not a device tool at all: refused the same way, before any implementation is looked up.
    result = await reader.run("http_get", {"url": "http://127.0.0.1:1/"})
    assert not result.ok and "does not offer http_get" in (result.error or "")


async def test_a_call_for_another_root_is_refused_and_runs_nothing(device: Device, tmp_path: Path):
    other = tmp_path / "other-root"
    other.mkdir()
    result = await device.run("write_file", {"path": "a.txt", "content": "x"}, root=str(other))
    assert not result.ok and f"now works in {device.root}, not in {other}" in (result.error or "")
    assert not (device.root / "a.txt").exists() and not (other / "a.txt").exists()


@needs_bwrap
async def test_the_device_without_network_wins_over_a_call_that_asks_for_it(tmp_path: Path):
    with PingServer() as ping:
        curl = {"command": f"curl -sS -m 5 {ping.base_url}/from-device"}
        offline = make_device(tmp_path / "a", network=False)
        result = await offline.run("run_command", curl, network=True)
        assert not result.ok and "Couldn't connect" in (result.output or "")
        assert ping.hits == []
        # The same call on a device started with --network reaches the server: the refusal above was the device's.
        online = make_device(tmp_path / "b", network=True)
        result = await online.run("run_command", curl, network=True)
        assert result.ok, result.error
        assert ping.hits == ["/from-device"]
        # And a device with the network still gives it only to calls that are allowed it.
        result = await online.run("run_command", curl, network=False)
        assert not result.ok and ping.hits == ["/from-device"]


@needs_bwrap
async def test_a_command_sees_none_of_the_daemon_s_environment(device: Device, monkeypatch: pytest.MonkeyPatch):
    canary = f"sk-device-canary-{uuid.uuid4().hex}"
    # What the daemon holds now (its own variables) and what a process of it was started with
    # (/proc/PID/environ shows the start environment, so a stand-in process carries it).
    monkeypatch.setenv("PERDURE_DEVICE_TEST_SECRET", canary)
    holder = await asyncio.create_subprocess_exec("sleep", "60", env={**os.environ})
    try:
        routes = "env; cat /proc/*/environ; cat /proc/1/environ; cat /proc/$PPID/environ; ps auxe"
        result = await device.run("run_command", {"command": routes + "; true"})
    finally:
        holder.kill()
        await holder.wait()
    assert result.ok, result.error
    assert canary not in (result.output or "") and "PERDURE_DEVICE_TEST_SECRET" not in (result.output or "")
    assert f"HOME={device.root}" in (result.output or "")  # the routes were read: the allowlist is what they show


@needs_bwrap
async def test_a_scratch_inside_the_root_is_hidden_from_commands(tmp_path: Path):
    root = (tmp_path / "root").resolve()
    inside = make_device(tmp_path, scratch=root / ".perdure-scratch")
    # A blob another call holds at this moment.
    held = inside.scratch / "call-other" / "sha256"
    held.mkdir(parents=True)
    (held / "blob").write_text("ANOTHER-CALL-OUTPUT")
    reads = "cat .perdure-scratch/call-other/sha256/blob; echo LISTING; ls -A .perdure-scratch"
    result = await inside.run("run_command", {"command": reads})
    shown = (result.output or "").split("\n", 1)[1]  # after the `$ command` line
    assert "ANOTHER-CALL-OUTPUT" not in shown and "No such file" in shown
    assert shown.split("LISTING\n")[1].startswith("\n[exit code"), shown  # the scratch shows empty
    assert (held / "blob").read_text() == "ANOTHER-CALL-OUTPUT"  # masked, not removed


# --- what comes back, and what stays -------------------------------------------------------


@needs_bwrap
async def test_the_scratch_is_empty_after_every_call(device: Device):
    assert (await device.run("write_file", {"path": "a.txt", "content": "hello"})).ok
    assert (await device.run("read_file", {"path": "a.txt"})).output == "hello"
    failed = await device.run("run_command", {"command": "echo some output; exit 3"})
    assert not failed.ok and "some output" in (failed.output or "") and "[exit code 3]" in (failed.output or "")
    missing = await device.run("read_file", {"path": "nope.txt"})
    assert not missing.ok and missing.output is None
    assert device.scratch.is_dir() and device.scratch_entries() == []


async def test_two_calls_at_once_with_the_same_output_both_get_it(device: Device):
    (device.root / "same.txt").write_text("identical")
    results = await asyncio.gather(*(device.run("read_file", {"path": "same.txt"}) for _ in range(8)))
    assert [r.output for r in results] == ["identical"] * 8
    assert device.scratch_entries() == []


async def test_an_output_over_the_device_payload_is_cut_with_a_note(device: Device):
    size = 1_048_576
    (device.root / "big.txt").write_text("é" * (size // 2))  # two bytes each: a cut may fall mid-character
    result = await device.run("read_file", {"path": "big.txt", "max_bytes": size})
    assert result.ok, result.error
    output = result.output or ""
    assert len(output.encode("utf-8")) <= MAX_DEVICE_PAYLOAD
    assert output.endswith("bytes]") and f"[truncated: the device returns at most {MAX_DEVICE_PAYLOAD} bytes" in output
    assert output.startswith("é" * 1000) and "\ufffd" not in output


def test_capped_output_keeps_what_fits_and_says_how_much_there_was():
    assert capped_output("short", limit=100) == "short"
    cut = capped_output("x" * 500, limit=200)
    assert len(cut.encode()) <= 200 and cut.startswith("xxx") and "it was 500 bytes]" in cut


async def test_a_git_commit_sent_twice_under_one_effect_key_commits_once(device: Device):
    init_repo(device.root)
    (device.root / "change.txt").write_text("v1\n")
    args = {"message": "device commit", "paths": ["change.txt"]}
    first = await device.run("git_commit", args)
    assert first.ok, first.error
    head = git(device.root, "rev-parse", "HEAD")
    assert first.receipt == {"commit": head} and first.effect_key
    again = await device.run("git_commit", args)
    assert again.ok, again.error
    assert again.effect_key == first.effect_key
    assert again.receipt == {"commit": head, "found_by": "its Effect-Key trailer"}
    assert git(device.root, "rev-list", "--count", "HEAD") == "2"  # the initial commit and this one
    assert first.compensation is not None and first.compensation.tool == "git_revert"
    assert device.scratch_entries() == []


# --- sessions ---------------------------------------------------------------------------


async def test_a_call_for_a_newer_session_stops_this_daemon_and_runs_nothing(device: Device):
    with pytest.raises(ApplicationError) as raised:
        await device.run("write_file", {"path": "a.txt", "content": "x"}, generation=3)
    assert isinstance(raised.value, DeviceSuperseded)
    assert raised.value.type == "DeviceSuperseded" and raised.value.non_retryable
    assert "session 3" in raised.value.message and "session 2" in raised.value.message
    assert device.state.superseded.is_set()
    assert not (device.root / "a.txt").exists()


async def test_a_call_queued_for_an_older_session_runs_and_answers_with_this_one(device: Device):
    result = await device.run("write_file", {"path": "a.txt", "content": "queued"}, generation=1)
    assert result == DeviceToolResult(tool="write_file", ok=True, generation=2, output="wrote 6 bytes to a.txt")
    assert (device.root / "a.txt").read_text() == "queued"
    assert not device.state.superseded.is_set()


async def test_a_lease_for_an_older_session_is_stale_at_once(device: Device):
    result = await asyncio.wait_for(
        ActivityEnvironment().run(device.acts.lease, LeaseInput(name="laptop", session="old", generation=1)), 2
    )
    assert result.ended == "stale" and not device.state.superseded.is_set()


async def test_a_lease_for_a_newer_session_stops_this_daemon(device: Device):
    with pytest.raises(DeviceSuperseded):
        await ActivityEnvironment().run(device.acts.lease, LeaseInput(name="laptop", session="new", generation=3))
    assert device.state.superseded.is_set()


def lease_env(beats: list, heartbeat_timeout_s: float = 0.3) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=heartbeat_timeout_s))
    env.on_heartbeat = lambda *details: beats.append(details[0] if details else None)
    return env


@needs_bwrap
@pytest.mark.slow
async def test_the_lease_heartbeats_the_calls_running_and_ends_with_its_term(device: Device):
    beats: list = []
    lease = asyncio.create_task(
        lease_env(beats).run(device.acts.lease, LeaseInput(name="laptop", session="s", generation=2, term_s=3))
    )
    while not beats:
        await asyncio.sleep(0.01)
    assert beats[0] == []  # nothing runs yet
    command_env = ActivityEnvironment()
    command_env.info = dataclasses.replace(command_env.info, workflow_id="goal-a", activity_id="7")
    result = await device.run("run_command", {"command": "sleep 1.2"}, env=command_env, goal_id="goal-a")
    assert result.ok, result.error
    while len(beats) < 3 or beats[-1] != []:
        await asyncio.sleep(0.05)  # the beat after the call ended
    assert (await asyncio.wait_for(lease, 5)).ended == "term"
    running = [RunningCall.model_validate(b[0]) for b in beats if b]
    assert running and {(c.goal_id, c.node_key, c.tool) for c in running} == {("goal-a", "node:n1", "run_command")}
    assert device.state.running == {} and device.state.leases == 0


async def test_a_cancelled_lease_is_not_a_replacement(device: Device):
    env = lease_env([])
    lease = asyncio.create_task(env.run(device.acts.lease, LeaseInput(name="laptop", session="s", generation=2)))
    while device.state.leases == 0:
        await asyncio.sleep(0.01)
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(lease, 2)
    assert not device.state.superseded.is_set() and device.state.leases == 0


@pytest.mark.slow
async def test_a_stopping_daemon_ends_its_lease_as_stopped_once_its_calls_have_finished(device: Device):
    beats: list = []
    lease = asyncio.create_task(
        lease_env(beats).run(device.acts.lease, LeaseInput(name="laptop", session="s", generation=2))
    )
    started = datetime.now(UTC)
    device.state.running["goal-a/7"] = RunningCall(
        goal_id="goal-a", node_key="n", tool="run_command", started_at=started
    )
    device.state.stopping.set()
    await asyncio.sleep(0.5)
    assert not lease.done()  # still online while the call runs
    del device.state.running["goal-a/7"]
    assert (await asyncio.wait_for(lease, 2)).ended == "stopped"


# --- options ----------------------------------------------------------------------------


def test_device_options_are_checked_with_what_is_allowed(tmp_path: Path):
    (tmp_path / "file.txt").write_text("")
    cases = [
        ({"name": "My Laptop", "root": tmp_path}, "device name 'My Laptop' is not allowed"),
        ({"name": "a", "root": tmp_path / "missing"}, f"--root {tmp_path / 'missing'} does not exist"),
        ({"name": "a", "root": tmp_path / "file.txt"}, "is not a directory"),
        ({"name": "a", "root": tmp_path, "lease_s": 0.5}, "--lease-s 0.5 is out of range"),
        ({"name": "a", "root": tmp_path, "scratch": tmp_path}, "--scratch must not be the root"),
    ]
    for options, message in cases:
        with pytest.raises(DeviceConfigError) as raised:
            device_config(**options)
        assert message in str(raised.value)
    (tmp_path / "sub").mkdir()
    config = device_config(name="laptop-2", root=tmp_path / "sub" / "..")
    assert config.root == tmp_path.resolve() and config.tools == frozenset(DEVICE_TOOLS)


def test_tools_and_approval_rules_are_parsed_or_refused_with_the_choices():
    assert device_tools(None)[0] == frozenset(DEVICE_TOOLS)
    assert device_tools(" read_file, list_dir ,")[0] == frozenset({"read_file", "list_dir"})
    with pytest.raises(DeviceConfigError) as raised:
        device_tools("read_file,http_get")
    assert str(raised.value).startswith("unknown device tool http_get; a device can offer: " + ", ".join(DEVICE_TOOLS))
    rules = parse_approval(["run_command=always", "*=never", "write_file = risk >= local-write"])
    assert rules == {"run_command": "always", "*": "never", "write_file": "risk>=local-write"}
    for bad, said in [
        ("run_command", "is not TOOL=RULE"),
        ("run_command=sometimes", "the rule must be one of always, never, risk>=local-write"),
        ("send_email=never", "send_email is not a device tool"),
    ]:
        with pytest.raises(DeviceConfigError) as raised:
            parse_approval([bad])
        assert said in str(raised.value)


def test_cli_errors_are_one_line_without_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PERDURE_TEMPORAL", "127.0.0.1:1")
    monkeypatch.setattr(terminal.err_console, "width", 1000)  # one message, one line
    runner = CliRunner()
    cases = [
        (["--name", "Bad", "--root", str(tmp_path)], "device name 'Bad' is not allowed"),
        (["--name", "a", "--root", str(tmp_path / "none")], "does not exist"),
        (["--name", "a", "--root", str(tmp_path), "--tools", "nope"], "unknown device tool nope"),
        (["--name", "a", "--root", str(tmp_path), "--approve", "x=y"], "x is not a device tool"),
        (["--name", "a", "--root", str(tmp_path)], "cannot reach Temporal at 127.0.0.1:1"),
    ]
    for args, said in cases:
        result = runner.invoke(cli.app, ["device", *args])
        assert result.exit_code == 1, result.output
        assert said in result.output and "Traceback" not in result.output
        assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    result = runner.invoke(cli.app, ["devices"])
    assert result.exit_code == 1 and "cannot reach Temporal" in result.output and "Traceback" not in result.output


def test_an_unusable_scratch_or_bad_payload_keys_are_one_line_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PERDURE_TEMPORAL", "127.0.0.1:1")
    monkeypatch.setattr(terminal.err_console, "width", 1000)
    runner = CliRunner()
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for scratch in ("/proc/nope", str(a_file)):
        result = runner.invoke(cli.app, ["device", "--name", "a", "--root", str(tmp_path), "--scratch", scratch])
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert result.output.startswith(f"error: cannot use {scratch} as the scratch directory"), result.output
    monkeypatch.setenv("PERDURE_PAYLOAD_KEYS", "nonsense")
    for argv in (["device", "--name", "a", "--root", str(tmp_path)], ["devices"]):
        result = runner.invoke(cli.app, argv)
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert result.output.startswith("error: ") and "PERDURE_PAYLOAD_KEYS" in result.output, result.output


# --- the daemon keeps itself announced ---------------------------------------------------


class FakeRegistry:
    """The registry as `_keep_announced` sees it: a query and an announce."""

    def __init__(self, record: DeviceRecord | None, answers: bool = True) -> None:
        self.record = record
        self.answers = answers
        self.announced: list[str] = []

    def get_workflow_handle(self, workflow_id: str) -> FakeRegistry:
        return self

    async def query(self, *args: Any, **kwargs: Any) -> DeviceListing:
        if not self.answers:
            raise RPCError("query timed out", RPCStatusCode.DEADLINE_EXCEEDED, b"")
        return DeviceListing(devices=[self.record] if self.record else [])

    async def execute_update_with_start_workflow(self, update: str, announcement, **kwargs: Any) -> DeviceSession:
        self.announced.append(announcement.session)
        return DeviceSession(name=announcement.name, session=announcement.session, generation=7)


def record(generation: int, online: bool, session: str) -> DeviceRecord:
    return DeviceRecord(presence=DevicePresence(name="laptop", generation=generation, online=online), session=session)


async def keep_announced(registry: FakeRegistry, state: DeviceSessionState, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(daemon, "RECHECK_S", 0.05)
    config = device_config(name="laptop", root=tmp_path, lease_s=1)
    state.lease_seen -= 10  # no lease for longer than the lapse
    task = asyncio.create_task(daemon._keep_announced(registry, config, state, "perdure"))  # type: ignore[arg-type]
    await asyncio.sleep(0.3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_daemon_whose_lease_lapsed_announces_itself_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    state = DeviceSessionState(name="laptop", generation=2)
    first = state.session
    registry = FakeRegistry(record(2, online=False, session=first))
    await keep_announced(registry, state, tmp_path, monkeypatch)
    assert len(registry.announced) == 1 and registry.announced[0] != first  # a new session
    assert state.generation == 7 and state.session == registry.announced[0] and not state.superseded.is_set()


async def test_a_daemon_replaced_by_another_stops_instead_of_announcing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    state = DeviceSessionState(name="laptop", generation=2)
    registry = FakeRegistry(record(3, online=True, session="someone-else"))
    await keep_announced(registry, state, tmp_path, monkeypatch)
    assert registry.announced == [] and state.superseded.is_set()


async def test_a_daemon_announces_nothing_while_no_worker_answers_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    state = DeviceSessionState(name="laptop", generation=2)
    registry = FakeRegistry(None, answers=False)
    await keep_announced(registry, state, tmp_path, monkeypatch)
    assert registry.announced == [] and not state.superseded.is_set() and state.generation == 2


async def test_a_daemon_holding_its_lease_announces_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    state = DeviceSessionState(name="laptop", generation=2)
    state.leases = 1
    registry = FakeRegistry(record(2, online=False, session=state.session))
    await keep_announced(registry, state, tmp_path, monkeypatch)
    assert registry.announced == [] and not state.superseded.is_set()


# --- perdure devices ----------------------------------------------------------------------


def test_the_devices_table_shows_presence_last_seen_and_running_steps():
    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    call = RunningCall(
        goal_id="goal-x", node_key="node:abc", tool="run_command", started_at=now - timedelta(seconds=42)
    )
    view = DevicesView(
        devices=[
            DeviceView(
                name="laptop", online=True, since=now - timedelta(hours=1), last_seen=now - timedelta(seconds=3),
                generation=4, root="/home/me/src", tools=["read_file", "run_command"], running=[call],
            ),
            DeviceView(
                name="desktop", online=False, since=now - timedelta(minutes=5), last_seen=now - timedelta(minutes=5),
                generation=1, root="/srv/w", tools=["list_dir"],
            ),
        ]
    )  # fmt: skip
    console = Console(width=250, record=True, color_system=None)
    print_devices(console, view, now=now)
    text = console.export_text()
    laptop = next(line for line in text.splitlines() if "laptop" in line)
    desktop = next(line for line in text.splitlines() if "desktop" in line)
    assert "online" in laptop and "2026-12-01 11:59:57 (3 s ago)" in laptop and " 4 " in laptop
    assert "goal-x · abc · run_command · 42 s" in laptop and "/home/me/src" in laptop
    assert "offline" in desktop and "(5 min ago)" in desktop and "—" in desktop
    console = Console(width=250, record=True, color_system=None)
    print_devices(console, None)
    assert "no device has announced itself yet" in console.export_text()


# --- real daemons, on the session's server (each test's task queue has its own registry) ----


@workflow.defn(name="DeviceCallProbe", sandboxed=False)  # a test double: this module is no workflow module
class DeviceCallProbe:
    """Sends one call to a device, as a goal would (the goal's side is tested elsewhere)."""

    @workflow.run
    async def run(self, call: DeviceToolInput) -> DeviceToolResult:
        return await workflow.execute_activity(
            DeviceActivities.RUN_TOOL,
            call,
            result_type=DeviceToolResult,
            task_queue=device_queue("probe", workflow.info().task_queue),
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=5),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


async def wait_for(condition, timeout_s: float = 30, every_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while not (value := await condition()):
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(every_s)
    return value


@pytest.mark.process
async def test_devices_lists_a_daemon_online_with_the_step_it_runs(
    env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # The daemon's client as `perdure device` makes it: payloads inline.
    plain = await Client.connect(
        env.client.service_client.config.target_host, plugins=[PerdurePlugin(payload_store=False)]
    )
    root = (tmp_path / "root").resolve()
    root.mkdir()
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    registry = Worker(env.client, task_queue=task_queue, workflows=[DeviceRegistryWorkflow, DeviceCallProbe])
    state = DeviceSessionState(name="probe")
    daemon_task = asyncio.create_task(
        daemon.run_device(
            plain, name="probe", root=root, lease_s=3, scratch=tmp_path / "scratch", task_queue=task_queue, state=state
        )
    )
    try:
        await asyncio.sleep(1)
        assert state.generation == 0  # no worker yet: the daemon waits to be registered
        async with registry:
            await wait_for(lambda: _is(state.leases > 0))
            assert state.generation == 1
            call = DeviceToolInput(
                goal_id="goal-probe", node_key="node:sleepy", tool="run_command",
                args={"command": "sleep 2; echo slept"}, root=str(root), generation=1,
            )  # fmt: skip
            probe = await env.client.start_workflow(
                DeviceCallProbe.run, call, id=f"probe-{uuid.uuid4().hex[:8]}", task_queue=task_queue
            )

            async def running_listed() -> DeviceView | None:
                view = await device_views(env.client, task_queue)
                listed = view.devices[0] if view and view.devices else None
                return listed if listed and listed.running else None

            listed = await wait_for(running_listed, every_s=0.2)
            assert listed.name == "probe" and listed.online and listed.generation == 1
            assert [(c.goal_id, c.node_key, c.tool) for c in listed.running] == [
                ("goal-probe", "node:sleepy", "run_command")
            ]
            assert listed.last_seen is not None and datetime.now(UTC) - listed.last_seen < timedelta(seconds=5)
            result = await probe.result()
            assert result.ok and result.generation == 1 and "slept" in (result.output or "")
    finally:
        daemon_task.cancel()
        await asyncio.gather(daemon_task, return_exceptions=True)


async def _is(value: bool) -> bool:
    return value


def devices_listed(variables: dict[str, str]) -> DevicesView:
    shown = perdure("devices", "--json", env=variables, timeout=30)
    assert shown.returncode == 0, shown.stderr
    return DevicesView.model_validate_json(shown.stdout)


def wait_listed(variables: dict[str, str], wanted, timeout_s: float = 60) -> DeviceView:
    deadline = time.monotonic() + timeout_s
    while True:
        view = devices_listed(variables)
        found = next((d for d in view.devices if wanted(d)), None)
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"no device as wanted in {view}"
        time.sleep(0.2)


def wait_in_log(log: Path, text: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{text!r} not in:\n{log.read_text()[-2000:]}"
        time.sleep(0.1)


@pytest.mark.process
def test_a_killed_daemon_goes_offline_and_comes_back_with_a_new_session(env: WorkflowEnvironment, tmp_path: Path):
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    variables = user_env(env, tmp_path, task_queue)
    root = tmp_path / "laptop-root"
    root.mkdir()
    nothing = perdure("devices", env=variables)
    assert nothing.returncode == 0 and "no device has announced itself yet" in nothing.stdout, nothing.stderr

    def start_daemon(log_path: Path) -> subprocess.Popen:
        with open(log_path, "w") as log:
            argv = [
                PERDURE,
                "device",
                "--name",
                "a",
                "--root",
                str(root),
                "--lease-s",
                "2",
                "--tools",
                "read_file,list_dir",
            ]
            return subprocess.Popen(argv, env=variables, stdout=log, stderr=subprocess.STDOUT)

    first_log = tmp_path / "device-1.log"
    first = start_daemon(first_log)
    # Another waiting daemon, stopped before any worker came: a clean stop, not a traceback.
    # Started beside the first: each says it waits only when its first announce try (10 s) ends.
    # Stopped as soon as it says so, in the pause before its next try: a stop while a try is
    # in flight logs the cancelled update's never-retrieved error, a traceback (announce, in
    # workers/device.py, does not retrieve it).
    with open(tmp_path / "early.log", "w") as log:
        early = subprocess.Popen(
            [PERDURE, "device", "--name", "b", "--root", str(root)],
            env=variables,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_in_log(tmp_path / "early.log", "waiting for a perdure worker to register device b")
        early.send_signal(signal.SIGTERM)
        assert early.wait(20) == 0
        said = (tmp_path / "early.log").read_text()
        assert "stopped before a worker registered it" in said and "Traceback" not in said
        wait_in_log(first_log, "waiting for a perdure worker to register device a")
        with worker_process(variables, tmp_path / "worker.log"):
            wait_in_log(first_log, f"device a online · session 1 · root {root.resolve()} · tools list_dir, read_file")
            online = wait_listed(variables, lambda d: d.name == "a" and d.online)
            assert (
                online.generation == 1
                and online.tools == ["read_file", "list_dir"]
                and online.root == str(root.resolve())
            )
            assert first_log.read_text().count("waiting for a perdure worker") == 1

            first.send_signal(signal.SIGKILL)
            first.wait(10)
            killed_at = time.monotonic()
            offline = wait_listed(variables, lambda d: d.name == "a" and not d.online)
            lapse_s = time.monotonic() - killed_at
            assert offline.generation == 1 and lapse_s < 3 + 10, lapse_s  # the lease (3 s) and the poll
            # Started again with its scratch deleted: nothing it needs was there.
            shutil.rmtree(tmp_path / "home" / "devices" / "a" / "scratch")
            second_log = tmp_path / "device-2.log"
            second = start_daemon(second_log)
            try:
                again = wait_listed(variables, lambda d: d.name == "a" and d.online and d.generation > 1)
                assert again.since is not None and again.since > offline.since
                assert "waiting for a perdure worker" not in second_log.read_text()
                # Ctrl-C (SIGTERM here) with nothing running: it stops at once, and says so.
                second.send_signal(signal.SIGTERM)
                assert second.wait(20) == 0
                assert "device a stopping" in second_log.read_text() and "Traceback" not in second_log.read_text()
                wait_listed(variables, lambda d: d.name == "a" and not d.online and d.generation >= again.generation)
            finally:
                second.kill()
                second.wait()
    finally:
        for daemon_process in (first, early):
            daemon_process.kill()
            daemon_process.wait()
    assert "Traceback" not in first_log.read_text()
