"""A stdio MCP server runs in the bubblewrap sandbox, as a shell command does (issue 34, item 1).

The end-to-end test runs a real `perdure worker` subprocess with canary keys in its
environment, payload encryption on (its key in a key file) and a stdio MCP server whose
tool runs whatever shell command it is given: every route to the worker's keys and files
is tried, and the canary appears in no history (decrypted), log, artifact (decrypted),
offloaded payload, status or result. The server still gets the credential its config
names, and nothing else.
"""

from __future__ import annotations

import json
import sys
import uuid

import pytest
from temporalio.api.history.v1 import History
from temporalio.client import Client

from activities import sandbox
from runtime.codec import KEY_FILE_ENV, KEYS_ENV, EncryptionCodec, decode_history, keyring_from_env, new_key_entry
from runtime.plugin import PerdurePlugin
from testing.crash import CrashRig
from testing.http import PingServer
from tests.builders import spec
from tests.helpers import files_text, history_text, perdure_result, perdure_status

pytestmark = pytest.mark.skipif(sandbox.find_bwrap() is None, reason="needs bwrap (make system-packages)")

SECRET_ENV = "PERDURE_TEST_MCP_TOKEN"
RUN = "mcp__probe__run"


def probe_table(name: str, extra: str = "") -> str:
    """A stdio server `name` whose `run` tool runs a shell command where the server runs."""
    return (
        f"[mcp_servers.{name}]\n"
        f"command = {json.dumps(sys.executable)}\n"
        f'args = ["-m", "testing.ledger_mcp_server", "--secret-env", "{SECRET_ENV}"]\n'
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
    planted_files = [
        worker_home / ".perdure" / "planted",
        rig.home / "planted",
        rig.home / "artifacts" / "planted",
        payload_store / f"planted-{uuid.uuid4().hex[:8]}",
    ]
    for path in planted_files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(planted)
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
