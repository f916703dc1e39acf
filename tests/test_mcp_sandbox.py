"""A stdio MCP server runs in the bubblewrap sandbox, as a shell command does (issue 34, item 1).

The end-to-end test runs a real `perdure worker` subprocess with canary keys in its
environment, payload encryption on (its key in a key file) and a stdio MCP server whose
tool runs whatever shell command it is given: every route to the worker's keys and files
is tried, and the canary appears in no history (decrypted), log, artifact (decrypted),
offloaded payload, status or result. The server still gets the credential its config
names, and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.history.v1 import History
from temporalio.client import Client

from perdure.activities.mcp.mcp_calls import McpServers, call_tool
from perdure.activities.mcp.mcp_config import McpConfigInvalid, load_mcp_servers
from perdure.activities.tools import sandbox
from perdure.activities.tools.catalogue.tool_errors import ToolError
from perdure.runtime.codec import (
    KEY_FILE_ENV,
    KEYS_ENV,
    EncryptionCodec,
    decode_history,
    keyring_from_env,
    new_key_entry,
)
from perdure.runtime.plugin import PerdurePlugin
from perdure.testing.crash import CrashRig
from perdure.testing.http import PingServer
from perdure.workflows.shared.mcp_tools import McpArgs, McpTool
from tests.builders import spec
from tests.helpers import files_text, history_text, perdure_result, perdure_status, plant_canaries
from tests.subprocess_rig import marker_sleep, process_gone, process_running

pytestmark = pytest.mark.skipif(sandbox.find_bwrap() is None, reason="needs bwrap (make system-packages)")

SECRET_ENV = "PERDURE_TEST_MCP_TOKEN"
RUN = "mcp__probe__run"


def probe_table(name: str, extra: str = "") -> str:
    """A stdio server `name` whose `run` tool runs a shell command where the server runs."""
    return (
        f"[mcp_servers.{name}]\n"
        f"command = {json.dumps(sys.executable)}\n"
        f'args = ["-m", "perdure.testing.ledger_mcp_server", "--secret-env", "{SECRET_ENV}"]\n'
        f'env = ["{SECRET_ENV}"]\n' + extra
    )


@pytest.fixture
def ping():
    with PingServer() as server:
        yield server


@pytest.mark.slow
@pytest.mark.process
async def test_a_worker_s_keys_and_files_reach_no_mcp_server_and_so_nothing_the_goal_records(
    env, workspace, tmp_path, payload_store, ping, monkeypatch
):
    canary, planted = f"CANARY-{uuid.uuid4().hex}", f"PLANTED-{uuid.uuid4().hex}"
    server_secret = f"mcp-secret-{uuid.uuid4().hex}"
    # In this process's environment, which the `perdure worker` subprocess inherits.
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    monkeypatch.setenv("PERDURE_MAIL_KEY", canary)
    monkeypatch.setenv(SECRET_ENV, server_secret)  # the one credential the server's config names
    worker_home = tmp_path / "worker-home"
    monkeypatch.setenv("HOME", str(worker_home))
    key_file = tmp_path / "keys" / "payload.keys"
    key_file.parent.mkdir()
    key_entry = new_key_entry("canary-key")
    key_file.write_text(key_entry + "\n")
    payload_key = key_entry.partition(":")[2]
    monkeypatch.delenv(KEYS_ENV, raising=False)
    monkeypatch.setenv(KEY_FILE_ENV, str(key_file))
    client = Client(env.client.service_client, namespace=env.client.namespace, plugins=[PerdurePlugin()])
    rig = CrashRig(client, tmp_path / "rig")
    planted_files = plant_canaries(planted, worker_home, rig.home, payload_store)
    rig.config.write_text(probe_table("probe") + f"# {planted}\n")
    routes = {
        "environ": "cat /proc/*/environ | tr '\\0' '\\n'",
        # The server's parent (the worker, were it not sandboxed); failing with what it read:
        # the error of a failed call goes to the worker's log and the history.
        "parent": "tr '\\0' '\\n' < /proc/$(ps -o ppid= -p $PPID | tr -d ' ')/environ; exit 3",
        "pid1": "tr '\\0' '\\n' < /proc/1/environ",
        "env": "env",
        "ps": "ps eww -e; ps auxeww",
        "cmdlines": "cat /proc/*/cmdline | tr '\\0' ' '",
        "worker_home": f"ls -a {worker_home}; cat {planted_files[0]}",
        "perdure_home": f"ls -R {rig.home}; cat {planted_files[1]} {planted_files[2]}",
        "config": f"cat {rig.config}; cat {key_file}",
        "payload_store": f"ls {payload_store}; cat {planted_files[3]}",
        "network": f"curl -sS -m 5 {ping.base_url}/canary-net",
    }
    # `; true`: a route that finds nothing still answers, with what it printed.
    commands = {name: c if name == "parent" else f"{c}; true" for name, c in routes.items()}
    steps = [{"name": name, "kind": "tool", "tool": RUN, "args": {"command": c}} for name, c in commands.items()]

    try:
        worker = rig.start_worker()
        await worker.wait_polling()
        handle = await rig.start_goal(spec(workspace, plan={"steps": steps}, allowed_tools=[RUN]))
        result = await rig.result(handle)
        outputs = {name: rig.store.get_text(ref) for name, ref in result.outputs.items()}
        raw_history = await handle.fetch_history()
        decoded = await decode_history(History(events=raw_history.events), EncryptionCodec(keyring_from_env()))
        recorded = {
            "step outputs": "\n".join(outputs.values()),
            "history": history_text(decoded),
            "history as stored": history_text(raw_history),
            "worker log": worker.log_text(),
            "artifact store": files_text(rig.home, skip=set(planted_files), keyring=keyring_from_env()),
            "payload store": files_text(payload_store, skip=set(planted_files), keyring=keyring_from_env()),
            "perdure status": await perdure_status(env, handle.id),
            "perdure result": await perdure_result(env, handle.id, rig.home),
        }
        secrets = {
            "the worker's key": canary,
            "a file of the worker's": planted,
            "the payload key": payload_key,
            "the server's own credential": server_secret,
        }
        hits = {
            f"{what} in the {where}": text.count(value)
            for where, text in recorded.items()
            for what, value in secrets.items()
            if value in text
        }
        assert not hits, json.dumps(hits, indent=1)

        # Each route was taken and led nowhere; the failing one failed its step only.
        assert result.outcome == "partial", result.failure
        assert set(outputs) == set(routes) - {"parent"}, sorted(outputs)
        assert "exit code 3" in recorded["history"]
        # The server has its credential (redacted from what it answers) and no other key.
        assert f"{SECRET_ENV}=[redacted]" in outputs["env"] and "PATH=" in outputs["env"]
        assert f"HOME={(rig.home / 'mcp' / 'probe').resolve()}\n" in outputs["pid1"]  # bwrap's: the same
        assert "OPENAI_API_KEY" not in outputs["env"] + outputs["environ"] + outputs["pid1"] + outputs["ps"]
        assert "perdure worker" not in outputs["cmdlines"] + outputs["ps"]
        for route in ("config", "worker_home", "perdure_home", "payload_store"):
            assert "No such file or directory" in outputs[route], outputs[route]
        assert "Couldn't connect" in outputs["network"] or "Could not resolve" in outputs["network"]
        assert ping.hits == []
        # The search read payloads: what the steps printed is in the decrypted history only.
        assert "[redacted]" in recorded["history"] and "[redacted]" not in recorded["history as stored"]
    finally:
        rig.close()
        planted_files[3].unlink()


# --- what a sandboxed server may reach, by its config table -----------------------------


def probe_servers(tmp_path: Path, tables: str) -> McpServers:
    """The servers of `tables` as a worker whose home is tmp_path (its artifact store
    tmp_path/artifacts) has them."""
    config = tmp_path / "mcp.toml"
    config.write_text(tables)
    return McpServers(load_mcp_servers(config), artifact_store=tmp_path / "artifacts", home=tmp_path)


async def run(servers: McpServers, command: str, server: str = "probe") -> str:
    """What the server's `run` tool printed for `command` (ToolError when it cannot run)."""
    tool = McpTool(name=f"mcp__{server}__run", server=server, tool="run", input_schema={"type": "object"})
    return await call_tool(servers, tool, McpArgs(command=command), effect_key=None)


@pytest.mark.slow
async def test_a_server_reaches_the_network_only_when_its_table_says_network_true(tmp_path: Path, ping: PingServer):
    servers = probe_servers(tmp_path, probe_table("probe") + probe_table("online", "network = true\n"))
    offline = await run(servers, f"curl -sS -m 5 {ping.base_url}/offline; true")
    assert "Couldn't connect" in offline and ping.hits == []
    online = await run(servers, f"curl -sS -m 5 {ping.base_url}/online", server="online")
    assert '"pong": true' in online and ping.hits == ["/online"]


@pytest.mark.slow
async def test_its_scratch_directory_is_home_and_outlives_the_call_and_it_reaches_only_the_paths_listed(
    tmp_path: Path,
):
    data, shared, other = tmp_path / "data", tmp_path / "shared", tmp_path / "other"
    for directory in (data, shared, other):
        directory.mkdir()
    (data / "in.txt").write_text("listed as readable")
    (other / "secret.txt").write_text("SECRET-FILE")
    table = f"readable = [{json.dumps(str(data))}]\nwritable = [{json.dumps(str(shared))}]\n"
    servers = probe_servers(tmp_path, probe_table("probe", table))

    said = await run(
        servers,
        f"echo kept > ~/kept; echo home=$HOME; cat {data}/in.txt; echo out > {shared}/out.txt; "
        f"touch {data}/new 2>&1; cat {other}/secret.txt 2>&1; ls {tmp_path} 2>&1; true",
    )
    scratch = (tmp_path / "mcp" / "probe").resolve()
    assert f"home={scratch}\n" in said and "listed as readable" in said
    assert (shared / "out.txt").read_text() == "out\n"
    assert "Read-only file system" in said and not (data / "new").exists()
    assert "SECRET-FILE" not in said and "No such file or directory" in said
    assert "artifacts" not in said and "mcp.toml" not in said  # tmp_path itself shows only what is bound in it
    assert (scratch / "kept").read_text() == "kept\n"
    assert await run(servers, "cat ~/kept") == "kept\n"  # a new server process, the same directory


@pytest.mark.slow
async def test_its_scratch_directory_is_under_perdure_home_wherever_the_artifact_store_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PERDURE_HOME", str(tmp_path / "home"))
    config = tmp_path / "mcp.toml"
    config.write_text(probe_table("probe"))
    # The artifact store on a volume every host mounts: a server's own state is not put there.
    servers = McpServers(load_mcp_servers(config), artifact_store=tmp_path / "shared" / "artifacts")
    assert await run(servers, "echo home=$HOME") == f"home={(tmp_path / 'home' / 'mcp' / 'probe').resolve()}\n"
    assert not (tmp_path / "shared" / "mcp").exists()


@pytest.mark.slow
async def test_a_path_perdure_keeps_or_that_does_not_exist_is_refused_by_name_and_one_in_the_home_directory_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    perdure_home, user_home = tmp_path / "perdure-home", tmp_path / "user-home"
    for directory in (perdure_home / "sub", user_home / "notes"):
        directory.mkdir(parents=True)
    monkeypatch.setenv("PERDURE_HOME", str(perdure_home))
    monkeypatch.setenv("HOME", str(user_home))
    for refused in (perdure_home, perdure_home / "sub", user_home):
        servers = probe_servers(tmp_path, probe_table("probe", f"writable = [{json.dumps(str(refused))}]\n"))
        with pytest.raises(ToolError, match=f"writable path {refused} is hidden from every sandbox"):
            await run(servers, "true")
    servers = probe_servers(tmp_path, probe_table("probe", f"readable = [{json.dumps(str(tmp_path / 'gone'))}]\n"))
    with pytest.raises(ToolError, match="readable path .*gone does not exist on this worker"):
        await run(servers, "true")
    notes = user_home / "notes"
    servers = probe_servers(tmp_path, probe_table("probe", f"writable = [{json.dumps(str(notes))}]\n"))
    assert await run(servers, f"echo n > {notes}/n.txt; ls {user_home}") == "notes\n"
    assert (notes / "n.txt").read_text() == "n\n"


async def test_without_bwrap_a_server_is_not_started_and_the_error_says_how_to_fix_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    bare = tmp_path / "bin-without-bwrap"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))  # the server's command is an absolute path: only bwrap is missing
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    table = probe_table("probe", f"writable = [{json.dumps(str(ledger))}]\n").replace(
        '"--secret-env"', f'"--ledger", {json.dumps(str(ledger / "calls.jsonl"))}, "--secret-env"'
    )
    servers = probe_servers(tmp_path, table)
    with pytest.raises(ToolError) as refused:
        await run(servers, "echo ran")
    said = refused.value.message
    assert "MCP server 'probe' cannot be started" in said and "apt-get install bubblewrap" in said
    assert sandbox.UNSANDBOXED_ENV in said and "`sandbox = false` in [mcp_servers.probe]" in said
    assert not (ledger / "calls.jsonl").exists()  # nothing was started


async def test_with_unsandboxed_commands_a_server_runs_directly_with_the_scrubbed_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(sandbox.UNSANDBOXED_ENV, "1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary-unsandboxed")
    said = await run(probe_servers(tmp_path, probe_table("probe")), f"env; cat /proc/{os.getpid()}/comm")
    assert "sk-canary-unsandboxed" not in said and "OPENAI_API_KEY" not in said
    assert f"HOME={(tmp_path / 'mcp' / 'probe').resolve()}\n" in said
    assert Path(f"/proc/{os.getpid()}/comm").read_text() in said  # no sandbox: the worker is in view


async def test_a_server_with_sandbox_false_runs_as_the_workers_child(tmp_path: Path):
    servers = probe_servers(tmp_path, probe_table("probe", "sandbox = false\n"))
    said = await run(servers, f"cat /proc/{os.getpid()}/comm")
    assert said == Path(f"/proc/{os.getpid()}/comm").read_text()


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('[mcp_servers.a]\nurl = "https://h/mcp"\nnetwork = true\n', "are for a `command` server"),
        ('[mcp_servers.a]\ncommand = "x"\nsandbox = false\nwritable = ["/srv"]\n', "with `sandbox = false` it"),
        ('[mcp_servers.a]\ncommand = "x"\nreadable = ["data"]\n', "'data' is not an absolute path"),
        ('[mcp_servers.a]\ncommand = "x"\nnetwork = "yes"\n', "network"),
    ],
)
def test_a_bad_sandbox_setting_is_a_one_line_error_saying_where_and_what(tmp_path: Path, table: str, says: str):
    config = tmp_path / "config.toml"
    config.write_text(table)
    with pytest.raises(McpConfigInvalid) as caught:
        load_mcp_servers(config)
    assert says in str(caught.value) and "\n" not in str(caught.value) and str(config) in str(caught.value)


# --- the worker's side --------------------------------------------------------------


@pytest.mark.process
async def test_the_worker_warns_at_start_once_for_each_server_with_sandbox_false(crash_rig):
    rig = crash_rig()
    rig.config.write_text(
        probe_table("probe") + probe_table("legacy", "sandbox = false\n") + probe_table("old", "sandbox = false\n")
    )
    worker = rig.start_worker()
    await worker.wait_polling()
    warned = [line for line in worker.log_text().splitlines() if "runs WITHOUT a sandbox" in line]
    assert len(warned) == 2 and all("warning" in line for line in warned), warned
    assert "MCP server 'legacy'" in warned[0] + warned[1] and "MCP server 'old'" in warned[0] + warned[1]


@pytest.mark.slow
@pytest.mark.process
async def test_a_servers_processes_die_with_a_sigkilled_worker(crash_rig, workspace):
    rig = crash_rig()
    rig.config.write_text(probe_table("probe"))
    plain, detached = marker_sleep(), marker_sleep()
    step = {"name": "hold", "kind": "tool", "tool": RUN, "args": {"command": f"setsid {detached} & {plain}"}}
    worker = rig.start_worker()
    await worker.wait_polling()
    handle = await rig.start_goal(spec(workspace, plan={"steps": [step]}, allowed_tools=[RUN]))
    try:
        deadline = time.monotonic() + 30
        while not (process_running(plain) and process_running(detached)):
            assert time.monotonic() < deadline, f"the server's command never started; log:\n{worker.log_tail()}"
            await asyncio.sleep(0.05)
        worker.kill()  # SIGKILL: nothing of the worker closes the session
        assert process_gone(plain) and process_gone(detached), "the server's processes outlived the worker"
    finally:
        await handle.terminate()
