"""Every shell command runs in the bubblewrap sandbox (activities/tools/sandbox.py).

From the command's side: the workspace is writable and is $HOME, /etc is read-only,
/tmp is private, no process of the worker is visible and none of its environment,
its files (PERDURE_HOME, the config file, the artifact and payload stores, its home
directory) are not there, and there is no network unless the goal or the plan step
allows it. From the worker's side: every process a command started is gone when the
step ends, a worker without a usable bwrap refuses commands with how to install it,
and PERDURE_UNSANDBOXED_COMMANDS=1 runs them directly (with a warning at start).

The end-to-end test runs a real `perdure worker` subprocess with canary keys in its
environment and an agent that tries every route to them; the canary appears in no
history, log, artifact, payload, status or result.
"""

from __future__ import annotations

import asyncio
import glob
import os
import time
import uuid
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from perdure.activities.artifacts import ArtifactStore, DiskArtifactStore
from perdure.activities.tools import sandbox
from perdure.activities.tools.run_tool import ToolActivities
from perdure.testing.crash import write_model_config
from perdure.testing.http import PingServer
from perdure.workflows.shared.contracts import ToolInput, ToolResult
from tests.builders import agent, spec
from tests.helpers import (
    files_text,
    history_text,
    perdure_result,
    perdure_status,
    plant_canaries,
    running_worker,
    start,
)
from tests.subprocess_rig import marker_sleep, process_gone, process_running

pytestmark = pytest.mark.skipif(sandbox.find_bwrap() is None, reason="needs bwrap (make system-packages)")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def ping():
    with PingServer() as server:
        yield server


async def command(store: ArtifactStore, ws: Path, text: str, **kw) -> tuple[ToolResult, str]:
    """Run `text` as run_command through the tool activity: its result and its output."""
    tool_input = ToolInput(goal_id="g1", node_key="n1", tool="run_command", workspace=str(ws), args={"command": text})
    result = await ActivityEnvironment().run(ToolActivities(store).run_tool, tool_input.model_copy(update=kw))
    return result, store.get_text(result.output) if result.output else ""


# --- what a command can reach ----------------------------------------------------------


async def test_the_workspace_is_writable_and_is_home(store: ArtifactStore, ws: Path):
    result, output = await command(store, ws, 'echo built > out.txt; echo "home=$HOME"; echo x > ~/at-home')
    assert result.ok, result.error
    assert (ws / "out.txt").read_text() == "built\n" and (ws / "at-home").read_text() == "x\n"
    assert f"home={ws}" in output


async def test_etc_is_read_only_and_its_secrets_are_masked(store: ArtifactStore, ws: Path):
    probe = Path(f"/etc/perdure-probe-{uuid.uuid4().hex[:8]}")
    try:
        result, output = await command(store, ws, f"touch {probe}; head -c 40 /etc/shadow; cat /etc/hostname")
        assert not probe.exists()
    finally:
        probe.unlink(missing_ok=True)
    assert f"touch: cannot touch '{probe}': Read-only file system" in output
    if Path("/etc/shadow").exists():
        assert "cannot open '/etc/shadow' for reading: Permission denied" in output, output
        assert Path("/etc/shadow").read_text()[:40] not in output
    if Path("/etc/hostname").exists():
        assert Path("/etc/hostname").read_text().strip() in output  # /etc itself is there to read
    secrets = [Path(p) for pattern in sandbox.SYSTEM_SECRETS for p in glob.glob(pattern)]
    listing = "; ".join(f"ls -A {p}" if p.is_dir() else f"head -c 1 {p} >/dev/null && echo READ {p}" for p in secrets)
    if secrets:
        result, output = await command(store, ws, listing)
        shown = output.split("\n", 1)[1]  # after the `$ command` line
        assert "READ " not in shown, output
        for directory in (p for p in secrets if p.is_dir() and any(p.iterdir())):
            assert next(directory.iterdir()).name not in shown, output


async def test_no_process_of_the_worker_is_visible(store: ArtifactStore, ws: Path):
    listing = "ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '; echo; cat /proc/1/comm; cat /proc/*/cmdline | tr '\\0' ' '"
    result, output = await command(store, ws, listing)
    assert result.ok, result.error
    _, pids, pid1, cmdlines = output.split("\n", 3)
    # The namespace's own: bwrap as PID 1, the shell and the pipeline's few.
    visible = [int(pid) for pid in pids.split()]
    assert 1 in visible and max(visible) < 20, visible
    assert pid1 == "bwrap"
    ours = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert ours not in cmdlines, cmdlines  # this process (the worker here) is not there


async def _environ_shows(pid: int, text: str) -> bool:
    # Right after the spawn the child may still be between fork and exec, and its environ
    # reads empty for that moment (seen once on CI): read again until exec has happened.
    for _ in range(100):
        if text in Path(f"/proc/{pid}/environ").read_text(errors="replace"):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_command_sees_no_key_of_the_worker_anywhere_in_proc(store: ArtifactStore, ws: Path):
    # /proc/PID/environ shows what a process was started with, so the key is given to a
    # process at its start: a stand-in for the worker (this test process's own environment
    # would not show a variable set after it started).
    canary = f"sk-canary-{uuid.uuid4().hex}"
    holder = await asyncio.create_subprocess_exec("sleep", "60", env={**os.environ, "OPENAI_API_KEY": canary})
    try:
        assert await _environ_shows(holder.pid, canary)
        routes = "cat /proc/*/environ; cat /proc/$PPID/environ; cat /proc/1/environ; env; ps auxe; cat /proc/*/cmdline"
        result, output = await command(store, ws, routes)
    finally:
        holder.kill()
        await holder.wait()
    assert result.ok, result.error
    assert canary not in output and "OPENAI_API_KEY" not in output
    assert f"HOME={ws}" in output  # the routes were read: the allowlist is what they show


async def test_tmp_is_private_and_goes_with_the_command(store: ArtifactStore, ws: Path, tmp_path: Path):
    name = f"perdure-private-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "host-tmp-file"
    marker.write_text("on the host")
    result, output = await command(store, ws, f"echo mine > /tmp/{name}; cat /tmp/{name}; ls {marker}")
    assert "mine" in output and "No such file or directory" in output
    assert not (Path("/tmp") / name).exists()
    again, output = await command(store, ws, f"cat /tmp/{name}")
    assert not again.ok and "No such file or directory" in output


async def test_the_worker_home_perdure_state_and_stores_are_not_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # All of them inside the workspace, the hardest case: they are masked even there.
    ws = (tmp_path / "ws").resolve()
    home, state = ws / "worker-home", ws / "perdure-home"
    for directory in (home, state, ws / "store", ws / "payloads"):
        directory.mkdir(parents=True)
        (directory / "secret").write_text("SECRET-FILE")
    (ws / "config.toml").write_text("SECRET-FILE")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PERDURE_HOME", str(state))
    monkeypatch.setenv("PERDURE_CONFIG", str(ws / "config.toml"))
    monkeypatch.setenv("PERDURE_PAYLOAD_STORE", f"disk:{ws / 'payloads'}")
    store = DiskArtifactStore(ws / "store")
    reads = "for f in worker-home/secret perdure-home/secret store/secret payloads/secret config.toml; do cat $f; done"
    result, output = await command(store, ws, f"{reads}; echo visible > ok.txt")
    assert "SECRET-FILE" not in output, output
    assert (ws / "ok.txt").read_text() == "visible\n"  # the rest of the workspace is as it was


async def test_paths_named_in_perdure_sandbox_hide_are_masked(
    store: ArtifactStore, ws: Path, monkeypatch: pytest.MonkeyPatch
):
    (ws / "keys").mkdir()
    (ws / "keys" / "worker.env").write_text("SECRET-FILE")
    (ws / "deploy.env").write_text("SECRET-FILE")
    monkeypatch.setenv(sandbox.HIDE_ENV, f"{ws / 'keys'}:{ws / 'deploy.env'}")
    result, output = await command(store, ws, "cat keys/worker.env deploy.env; echo LISTING; ls -A keys")
    assert "SECRET-FILE" not in output
    assert output.split("LISTING\n")[-1].startswith("\n[exit code"), output  # keys/ shows empty


async def test_the_object_store_s_credentials_reach_no_command(
    store: ArtifactStore, ws: Path, monkeypatch: pytest.MonkeyPatch
):
    # A worker on an S3 artifact store has its keys in its environment, or in a credentials
    # file a variable names: here one inside the workspace, the one place a command can read.
    canary = f"AWS-CANARY-{uuid.uuid4().hex}"
    (ws / ".aws").mkdir()
    (ws / ".aws" / "credentials").write_text(f"[default]\naws_secret_access_key = {canary}\n")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", canary)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(ws / ".aws" / "credentials"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    result, output = await command(store, ws, "env; cat .aws/credentials; cat /proc/1/environ | tr '\\0' '\\n'")
    assert canary not in output and "AWS_" not in output, output
    assert "PATH=" in output  # the environment was printed, and held no AWS variable


async def test_no_network_unless_the_call_allows_it(store: ArtifactStore, ws: Path, ping: PingServer):
    curl = f"curl -sS -m 5 {ping.base_url}/from-sandbox"
    result, output = await command(store, ws, curl)
    assert not result.ok and "Couldn't connect" in output
    assert ping.hits == []
    result, output = await command(store, ws, curl, network=True)
    assert result.ok, result.error
    assert '"pong": true' in output and ping.hits == ["/from-sandbox"]


async def test_a_model_cannot_grant_itself_the_network_in_the_call_s_arguments(
    store: ArtifactStore, ws: Path, ping: PingServer
):
    args = {"command": f"curl -sS -m 5 {ping.base_url}/granted", "network": True}
    tool_input = ToolInput(goal_id="g1", node_key="n1", tool="run_command", workspace=str(ws), args=args)
    result = await ActivityEnvironment().run(ToolActivities(store).run_tool, tool_input)
    assert not result.ok and "bad arguments for run_command" in (result.error or "")
    assert ping.hits == []


# --- how a command ends -------------------------------------------------------------


async def test_background_and_setsid_children_are_gone_when_the_step_ends(store: ArtifactStore, ws: Path):
    plain, detached, nohup = marker_sleep(), marker_sleep(), marker_sleep()
    result, _ = await command(store, ws, f"{plain} & setsid {detached} & nohup {nohup} >/dev/null 2>&1 & echo started")
    assert result.ok, result.error
    for leftover in (plain, detached, nohup):
        assert process_gone(leftover), f"`{leftover}` outlived its step"


@pytest.mark.slow
async def test_a_setsid_child_is_gone_after_a_timeout(store: ArtifactStore, ws: Path):
    detached = marker_sleep()
    started = time.monotonic()
    tool_input = ToolInput(
        goal_id="g1",
        node_key="n1",
        tool="run_command",
        workspace=str(ws),
        args={"command": f"setsid {detached} & sleep 30", "timeout_s": 1},
    )
    result = await ActivityEnvironment().run(ToolActivities(store).run_tool, tool_input)
    assert not result.ok and "timed out after 1s" in (result.error or "")
    assert time.monotonic() - started < 10
    assert process_gone(detached)


# --- without a usable bwrap ---------------------------------------------------------


async def test_a_worker_without_bwrap_refuses_commands_with_the_install_hint(
    store: ArtifactStore, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    bare = tmp_path / "bin-without-bwrap"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    result, _ = await command(store, ws, "echo ran > ran.txt")
    assert not result.ok and not result.uncertain
    assert "run_command refused" in (result.error or "") and "apt-get install bubblewrap" in (result.error or "")
    assert sandbox.UNSANDBOXED_ENV in (result.error or "")
    assert not (ws / "ran.txt").exists()


async def test_a_bwrap_that_cannot_create_namespaces_is_refused_with_what_it_said(
    store: ArtifactStore, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    result, _ = await command(store, ws, "echo ran > ran.txt")
    assert not result.ok
    assert "No permissions to create new namespace" in (result.error or "")
    assert "apt-get install bubblewrap" in (result.error or "")
    assert not (ws / "ran.txt").exists()


async def test_unsandboxed_commands_run_directly_when_the_worker_says_so(
    store: ArtifactStore, ws: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(sandbox.UNSANDBOXED_ENV, "1")
    result, output = await command(store, ws, f"echo ran > ran.txt; cat /proc/{os.getpid()}/comm")
    assert result.ok, result.error
    assert (ws / "ran.txt").read_text() == "ran\n"
    # Without the sandbox the worker's own process is in view.
    assert Path(f"/proc/{os.getpid()}/comm").read_text().strip() in output


# --- the network permission, from the plan and the goal -----------------------------


async def test_a_plan_step_with_network_true_reaches_the_network_and_its_neighbour_does_not(
    env, task_queue, store, workspace, ping
):
    url = f"{ping.base_url}/step"
    steps = [
        {"name": "fetch", "kind": "tool", "tool": "run_command", "network": True,
         "args": {"command": f"curl -sS -m 5 {url}/fetch"}},
        {"name": "offline", "kind": "tool", "tool": "run_command",
         "args": {"command": f"curl -sS -m 5 {url}/offline || echo no-network"}},
    ]  # fmt: skip
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["run_command"])
        result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt
    assert ping.hits == ["/step/fetch"]


# --- end to end: a real worker with canary keys -----------------------------------------


def outputs_by_command(store: ArtifactStore) -> dict[str, str]:
    """run_command's outputs in the store, by the command they start with (`$ COMMAND`)."""
    found = {}
    for path in store.root.glob("sha256/*/*"):
        text = store.get_bytes(f"sha256:{path.name}").decode("utf-8", errors="replace")
        if text.startswith("$ "):
            found[text.splitlines()[0][2:]] = text
    return found


@pytest.mark.process
async def test_a_worker_s_keys_and_files_reach_no_command_and_so_nothing_the_goal_records(
    env, crash_rig, scripted, workspace, tmp_path, payload_store, ping, monkeypatch
):
    canary, planted = f"CANARY-{uuid.uuid4().hex}", f"PLANTED-{uuid.uuid4().hex}"
    # In this process's environment, which the `perdure worker` subprocess inherits.
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    monkeypatch.setenv("PERDURE_MAIL_KEY", canary)
    worker_home = tmp_path / "worker-home"
    monkeypatch.setenv("HOME", str(worker_home))
    rig = crash_rig()
    planted_files = plant_canaries(planted, worker_home, rig.home, payload_store)
    routes = {
        "every environ": "cat /proc/*/environ | tr '\\0' '\\n'",
        # Failing with the keys first: a failed command's output tail is in its error, which
        # goes to the worker's log and the history.
        "parent environ": "tr '\\0' '\\n' < /proc/$PPID/environ | grep -E 'KEY|TOKEN|SECRET'; exit 3",
        "pid 1 environ": "cat /proc/1/environ | tr '\\0' '\\n'",
        "env": "env",
        "ps e": "ps e",
        "ps auxe": "ps auxe",
        "command lines": "cat /proc/*/cmdline | tr '\\0' ' '",
        "worker home": f"ls -a {worker_home}; cat {planted_files[0]}",
        "perdure home": f"ls -R {rig.home}; cat {planted_files[1]}",
        "config file": f"cat {rig.config}",
        "artifact store": f"ls -R {rig.home / 'artifacts'}; cat {planted_files[2]}",
        "payload store": f"ls {payload_store}; cat {planted_files[3]}",
        "network": f"curl -sS -m 5 {ping.base_url}/canary-net",
    }
    calls = [{"name": "run_command", "arguments": {"command": c}} for c in routes.values()]
    server = scripted(
        {
            "replies": [
                {"when": "PERDURE-AGENT", "times": 1, "tool_calls": calls},
                {"when": "PERDURE-AGENT", "content": "I found nothing."},
            ]
        }
    )
    write_model_config(rig.config, server)
    rig.config.write_text(rig.config.read_text() + f"# {planted}\n")
    probe = agent("probe", "Find the keys.", ["run_command"])

    try:
        worker = rig.start_worker()
        await worker.wait_polling()
        handle = await rig.start_goal(spec(workspace, plan={"steps": [probe]}, allowed_tools=["run_command"]))
        result = await rig.result(handle)
        assert result.outcome == "succeeded", result.excerpt

        outputs = outputs_by_command(rig.store)
        assert set(routes.values()) <= set(outputs), sorted(outputs)
        recorded = {
            "command outputs": "\n".join(outputs.values()),
            "history": history_text(await handle.fetch_history()),
            "worker log": worker.log_text(),
            "artifact store": files_text(rig.home, skip=set(planted_files)),
            "payload store": files_text(payload_store, skip=set(planted_files)),
            "perdure status": await perdure_status(env, handle.id),
            "perdure result": await perdure_result(env, handle.id, rig.home),
        }
        for where, text in recorded.items():
            assert canary not in text, f"the worker's key reached the {where}"
            assert planted not in text, f"a file of the worker's reached the {where}"
        # Each route was taken (it printed what the sandbox has) and led nowhere.
        assert "HOME=" in outputs[routes["pid 1 environ"]] and "PATH=" in outputs[routes["every environ"]]
        assert "bin/perdure worker" not in outputs[routes["command lines"]]
        assert "No such file or directory" in outputs[routes["config file"]]
        assert "Couldn't connect" in outputs[routes["network"]] and ping.hits == []
        assert "shell commands run in a bubblewrap sandbox" in worker.log_text()

        # The same calls in a goal that allows the network: only the network call changes.
        server.reset()
        handle = await rig.start_goal(
            spec(workspace, plan={"steps": [probe]}, allowed_tools=["run_command"], allow_network=True)
        )
        assert (await rig.result(handle)).outcome == "succeeded"
        assert ping.hits == ["/canary-net"]
        history = history_text(await handle.fetch_history())
        assert canary not in history and planted not in history
    finally:
        planted_files[3].unlink()


@pytest.mark.process
async def test_a_command_s_processes_die_with_a_sigkilled_worker(crash_rig, workspace):
    rig = crash_rig()
    plain, detached = marker_sleep(), marker_sleep()
    step = {"name": "hold", "kind": "tool", "tool": "run_command", "args": {"command": f"setsid {detached} & {plain}"}}
    worker = rig.start_worker()
    await worker.wait_polling()
    handle = await rig.start_goal(spec(workspace, plan={"steps": [step]}, allowed_tools=["run_command"]))
    try:
        deadline = time.monotonic() + 30
        while not (process_running(plain) and process_running(detached)):
            assert time.monotonic() < deadline, f"the command never started; log:\n{worker.log_tail()}"
            await asyncio.sleep(0.05)
        worker.kill()  # SIGKILL: no finally of the activity runs
        assert process_gone(plain) and process_gone(detached), "the command outlived its worker"
    finally:
        await handle.terminate()


@pytest.mark.process
async def test_a_worker_started_unsandboxed_warns_at_start(crash_rig, monkeypatch):
    monkeypatch.setenv(sandbox.UNSANDBOXED_ENV, "1")
    rig = crash_rig()
    worker = rig.start_worker()
    await worker.wait_polling()
    line = next(line for line in worker.log_text().splitlines() if "WITHOUT a sandbox" in line)
    assert "warning" in line and sandbox.UNSANDBOXED_ENV in line
