"""Payloads encrypted, readable by those who hold the keys: the codec and its keys
(runtime/codec.py), the files at rest (artifact store, payload store), a goal on the
dev server whose raw history holds no plaintext, the codec server answering the
`temporal` CLI and the Temporal UI in headless Chromium, the golden histories still
replaying with encryption on, and `perdure history` exporting decrypted or as stored.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import History, HistoryEvent
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer
from typer.testing import CliRunner

from bench.common import payloads_in
from perdure.activities.artifacts import ArtifactCorrupt, ArtifactStore, DiskArtifactStore
from perdure.activities.models.profiles import ModelConfig
from perdure.runtime import converter
from perdure.runtime.codec import (
    ENCODING,
    KEY_FILE_ENV,
    KEY_ID_METADATA,
    KEYS_ENV,
    DecryptionError,
    EncryptionCodec,
    Keyring,
    PayloadKeyError,
    UnknownPayloadKey,
    decode_history,
    is_sealed,
    keyring_from_env,
    new_key_entry,
)
from perdure.runtime.converter import data_converter
from perdure.runtime.plugin import PerdurePlugin
from perdure.starters import cli
from perdure.starters.client.goal_starts import start_goal
from perdure.starters.codec_server import CodecServer, CodecServerConfig, ui_origins
from perdure.workers.orchestrator import build_worker
from perdure.workflows.goal.contracts.goal_contracts import GoalResult
from tests import goldens
from tests.builders import SUMMARY_TEXT, demo_script, openai_profile, spec, write_notes
from tests.goldens import HISTORIES, WORKFLOWS, load
from tests.helpers import BIN, CHROMIUM, chromium, dev_server_options, free_ports, new_goal_id
from tests.payload_keys import KEY_A, KEY_B, keyring

# No timing a loaded machine breaks: make test runs its process tests five at a time.
pytestmark = pytest.mark.parallel_safe


MARKER = "ZEBRA-CROSSING-5e1f"
GOAL = f"Summarise the notes into SUMMARY.md for project {MARKER}"
# Text that reaches history only inside payloads: the goal, a file the plan reads, the file the agent writes.
SECRETS = (MARKER, "fix the CSV parser", SUMMARY_TEXT.splitlines()[0])
REFERENCE_TYPE = b"temporal.api.sdk.v1.ExternalStorageReference"


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch):
    """Set PERDURE_PAYLOAD_KEYS to these entries, oldest first; `keys()` turns encryption off."""
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)

    def configure(*entries: str) -> None:
        if entries:
            monkeypatch.setenv(KEYS_ENV, ",".join(entries))
        else:
            monkeypatch.delenv(KEYS_ENV, raising=False)

    return configure


# ------------------------------------------------------------------ the codec and its keys


def test_off_by_default(keys, tmp_path: Path):
    keys()
    assert keyring_from_env() is None
    assert data_converter().payload_codec is None
    assert DiskArtifactStore(tmp_path).keyring is None


async def test_every_payload_is_ciphertext_naming_its_key(keys):
    keys(KEY_A)
    dc = data_converter()
    values = [GOAL, {"prompt": GOAL, "n": 3}]
    payloads = await dc.encode(values)
    for payload in payloads:
        assert payload.metadata["encoding"] == ENCODING and payload.metadata[KEY_ID_METADATA] == b"key-a"
        assert MARKER.encode() not in payload.SerializeToString()
        # The plaintext's own encoding is inside the ciphertext too.
        assert b"json/plain" not in payload.SerializeToString()
    assert await dc.decode(payloads, [str, dict]) == values


async def test_payloads_written_before_encryption_pass_through(keys):
    keys(KEY_A)
    old = await pydantic_data_converter.encode([GOAL])
    assert await data_converter().decode(old, [str]) == [GOAL]


async def test_rotation_old_key_still_decodes_new_key_encrypts_unknown_key_is_named(keys):
    keys(KEY_A)
    [under_a] = await data_converter().encode([GOAL])

    keys(KEY_A, KEY_B)  # B added as the newest
    rotated = data_converter()
    assert await rotated.decode([under_a], [str]) == [GOAL]
    [under_b] = await rotated.encode([GOAL])
    assert under_b.metadata[KEY_ID_METADATA] == b"key-b"

    keys(KEY_B)  # A retired too early
    with pytest.raises(UnknownPayloadKey) as caught:
        await data_converter().decode([under_a], [str])
    message = str(caught.value)
    assert "'key-a'" in message and "configured: key-b" in message and KEYS_ENV in message
    assert await data_converter().decode([under_b], [str]) == [GOAL]


async def test_an_altered_ciphertext_does_not_decrypt():
    codec = EncryptionCodec(keyring(KEY_A))
    [sealed] = await codec.encode(await pydantic_data_converter.encode([GOAL]))
    sealed.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    with pytest.raises(DecryptionError, match="altered"):
        await codec.decode([sealed])
    # Nor does a ciphertext whose key id was swapped for another configured key.
    [other] = await codec.encode(await pydantic_data_converter.encode([GOAL]))
    other.metadata[KEY_ID_METADATA] = b"key-b"
    with pytest.raises(DecryptionError):
        await EncryptionCodec(keyring(KEY_A, KEY_B)).decode([other])


async def test_failure_messages_travel_encrypted_and_an_export_gets_them_back(keys):
    keys(KEY_A)
    dc = data_converter()
    failure = Failure()
    await dc.encode_failure(ApplicationError(f"the model quoted {MARKER}", type="Quoted"), failure)
    assert MARKER.encode() not in failure.SerializeToString()
    assert failure.encoded_attributes.metadata["encoding"] == ENCODING
    assert MARKER in str(await dc.decode_failure(failure))

    history = History(events=[HistoryEvent(event_id=1)])
    history.events[0].activity_task_failed_event_attributes.failure.CopyFrom(failure)
    decoded = await decode_history(history, dc.payload_codec)
    plain = decoded.events[0].activity_task_failed_event_attributes.failure
    assert plain.message == f"the model quoted {MARKER}" and not plain.HasField("encoded_attributes")
    assert history.events[0].activity_task_failed_event_attributes.failure.message != plain.message


def test_a_new_key_entry_is_a_fresh_usable_key():
    first, second = new_key_entry("2027-01"), new_key_entry("2027-01")
    assert first != second and keyring(first).newest == "2027-01"


def test_key_file_oldest_first_with_comments(keys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    keys()
    path = tmp_path / "payload.keys"
    path.write_text(f"# retired in March\n{KEY_A}\n\n{KEY_B}  # current\n")
    monkeypatch.setenv(KEY_FILE_ENV, str(path))
    assert keyring_from_env().key_ids == ("key-a", "key-b") and keyring_from_env().newest == "key-b"
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "missing.keys"))
    with pytest.raises(PayloadKeyError, match="missing.keys: cannot read it"):
        keyring_from_env()


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("key-a", "entry 1 is not id:base64key"),
        ("key-a:not base64!", "not valid base64"),
        (f"key-a:{base64.b64encode(b'x' * 16).decode()}", "is 16 bytes; AES-256 needs 32"),
        (f"{KEY_A},{KEY_A}", "repeated: key-a"),
        ("bad id:" + KEY_A.partition(":")[2], "use 1 to 64 of"),
    ],
)
def test_bad_keys_name_the_variable_and_never_the_key(keys, value: str, complaint: str):
    keys(value)
    with pytest.raises(PayloadKeyError, match=complaint) as caught:
        keyring_from_env()
    assert KEYS_ENV in str(caught.value) and KEY_A.partition(":")[2] not in str(caught.value)
    assert isinstance(caught.value, ValueError)  # the CLI prints ValueErrors without a traceback


# ------------------------------------------------------------------ files at rest


def test_artifacts_are_sealed_at_their_plaintext_address(tmp_path: Path):
    store = DiskArtifactStore(tmp_path, keyring(KEY_A))
    ref = store.put_text(GOAL)
    [path] = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert ref.digest == "sha256:" + hashlib.sha256(GOAL.encode()).hexdigest() and path.name == ref.digest[7:]
    assert is_sealed(path.read_bytes()) and MARKER.encode() not in path.read_bytes()
    assert store.get_text(ref) == GOAL
    assert DiskArtifactStore(tmp_path, keyring(KEY_A, KEY_B)).get_text(ref) == GOAL  # after rotation
    with pytest.raises(UnknownPayloadKey, match="artifact .* is encrypted with key 'key-a'"):
        DiskArtifactStore(tmp_path, keyring(KEY_B)).get_text(ref)
    with pytest.raises(UnknownPayloadKey, match="no keys are configured"):
        DiskArtifactStore(tmp_path, None).get_text(ref)


def test_an_artifact_from_before_encryption_reads_and_the_next_put_seals_it(tmp_path: Path):
    ref = DiskArtifactStore(tmp_path, None).put_text(GOAL)
    [path] = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert path.read_bytes() == GOAL.encode()

    encrypting = DiskArtifactStore(tmp_path, keyring(KEY_A))
    assert encrypting.get_text(ref) == GOAL
    assert encrypting.put_text(GOAL) == ref
    assert is_sealed(path.read_bytes()) and encrypting.get_text(ref) == GOAL
    with pytest.raises(UnknownPayloadKey):
        DiskArtifactStore(tmp_path, None).get_text(ref)


def test_an_altered_sealed_artifact_is_corrupt(tmp_path: Path):
    store = DiskArtifactStore(tmp_path, keyring(KEY_A))
    ref = store.put_text(GOAL)
    [path] = [p for p in tmp_path.rglob("*") if p.is_file()]
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ArtifactCorrupt, match="altered"):
        store.get_text(ref)


# ------------------------------------------------------------------ a goal on the dev server


async def run_goal(client: Client, task_queue: str, workspace: Path, scripted, store: ArtifactStore, goal: str):
    """The demo goal, started as `perdure start` starts it (static summary included), run to its end."""
    if not (workspace / "notes").exists():
        write_notes(workspace)
    config = ModelConfig(profiles={"test": openai_profile(scripted(demo_script()))})
    async with build_worker(client, task_queue=task_queue, store=store, model_config=config):
        handle = await start_goal(client, spec(workspace, goal=goal), new_goal_id("sealed"))
        result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt
    return handle, result


@pytest.fixture
def encrypted(env, keys, monkeypatch: pytest.MonkeyPatch, task_queue: str, tmp_path: Path):
    """Encryption on with key A, a payload store of this test's own; returns a client made after."""
    keys(KEY_A)
    monkeypatch.setenv(converter.STORE_ENV, f"disk:{tmp_path / 'payloads'}")
    monkeypatch.setenv("PERDURE_TASK_QUEUE", task_queue)
    return Client(env.client.service_client, namespace=env.client.namespace, plugins=[PerdurePlugin()])


def history_payloads(history: WorkflowHistory) -> Iterator[Payload]:
    """Every payload in history a codec sees. Not search attributes, which the server indexes
    (perdure's are a status, numbers, flags, a time, and the SDK's list of patch ids), nor the
    bookkeeping the SDK's core writes into markers: a patch marker's id, a local activity's
    sequence number, attempt, activity type and times (its result is a payload like any other)."""
    for event in history.events:
        event = HistoryEvent.FromString(event.SerializeToString())
        # Each behind HasField: touching another member of the attributes oneof would replace the event's own.
        if event.HasField("upsert_workflow_search_attributes_event_attributes"):
            event.upsert_workflow_search_attributes_event_attributes.ClearField("search_attributes")
        if event.HasField("workflow_execution_started_event_attributes"):
            event.workflow_execution_started_event_attributes.ClearField("search_attributes")
        if event.HasField("marker_recorded_event_attributes"):
            details = event.marker_recorded_event_attributes.details
            for bookkeeping in ("data", "patch-data"):
                if bookkeeping in details:
                    del details[bookkeeping]
        yield from payloads_in(event)


@pytest.mark.slow
async def test_encrypted_goal_leaves_no_plaintext_in_history_or_the_stores(
    env, encrypted: Client, task_queue, workspace, scripted, monkeypatch, tmp_path
):
    # Every payload of 1 KiB or more goes to the payload store: the goal's input is one.
    monkeypatch.setenv(converter.THRESHOLD_ENV, "1024")
    client = Client(env.client.service_client, namespace=env.client.namespace, plugins=[PerdurePlugin()])
    store = DiskArtifactStore(tmp_path / "artifacts")  # keys from the environment, as workers get them
    long_goal = GOAL + ". Background the planner may use: " + "the notes are short. " * 60
    handle, result = await run_goal(client, task_queue, workspace, scripted, store, long_goal)
    assert MARKER in result.excerpt

    # The history as the server holds it, read by a client without the codec.
    plain = Client(env.client.service_client, namespace=env.client.namespace)
    history = await plain.get_workflow_handle(handle.id).fetch_history()
    raw = b"".join(event.SerializeToString() for event in history.events)
    for secret in SECRETS:
        assert secret.encode() not in raw, secret
    payloads = list(history_payloads(history))
    assert len(payloads) > 20
    references = [p for p in payloads if p.metadata.get("messageType") == REFERENCE_TYPE]
    assert references, "the goal input should have been offloaded"
    inline = [p for p in payloads if p not in references]
    assert [dict(p.metadata) for p in inline if p.metadata.get("encoding") != ENCODING] == []
    assert history.events[0].user_metadata.summary.metadata["encoding"] == ENCODING  # the UI's summary too
    # Even with the payload store, a client without the keys cannot read the result.
    keyless = dataclasses.replace(client.data_converter, payload_codec=None)
    without_keys = Client(env.client.service_client, namespace=env.client.namespace, data_converter=keyless)
    with pytest.raises(Exception, match="binary/encrypted"):
        await without_keys.get_workflow_handle(handle.id).result()

    # With the codec it reads as ever.
    assert (await client.get_workflow_handle(handle.id, result_type=GoalResult).result()).excerpt == result.excerpt

    # The files at rest: every artifact sealed, every offloaded payload ciphertext.
    artifacts = [p for p in (tmp_path / "artifacts").rglob("*") if p.is_file() and not p.name.startswith(".")]
    offloaded = [p for p in (tmp_path / "payloads").rglob("*") if p.is_file()]
    assert artifacts and offloaded
    for path in artifacts + offloaded:
        data = path.read_bytes()
        assert not any(secret.encode() in data for secret in SECRETS), path
    assert all(is_sealed(p.read_bytes()) for p in artifacts if "sha256" in p.parts)
    for path in offloaded:
        stored = Payload()
        stored.ParseFromString(path.read_bytes())
        assert stored.metadata["encoding"] == ENCODING

    # A worker replaying it reads the references and decrypts.
    await goldens.replayer().replay_workflow(history)


@pytest.mark.slow
async def test_golden_histories_replay_with_encryption_on(keys):
    keys(KEY_B, KEY_A)
    plugin = PerdurePlugin()
    assert isinstance(plugin.data_converter.payload_codec, EncryptionCodec)
    replayer = goldens.replayer(plugins=[plugin])
    results = [await replayer.replay_workflow(load(p), raise_on_replay_failure=False) for p in HISTORIES]
    assert len(results) >= 2
    assert [r.replay_failure for r in results] == [None] * len(results)


@pytest.mark.slow
async def test_history_export_is_decrypted_by_default_and_as_stored_with_encoded(
    env, encrypted: Client, task_queue, workspace, scripted, keys, tmp_path
):
    handle, _ = await run_goal(encrypted, task_queue, workspace, scripted, DiskArtifactStore(tmp_path / "a"), GOAL)
    address = {"PERDURE_TEMPORAL": env.client.service_client.config.target_host}
    decoded, encoded = tmp_path / "decoded.json", tmp_path / "encoded.json"
    for out, extra in ((decoded, []), (encoded, ["--encoded"])):
        args = ["history", handle.id, "--out", str(out), *extra]
        ran = await asyncio.to_thread(CliRunner().invoke, cli.app, args, env=address)
        assert ran.exit_code == 0, ran.output
    assert "(encoded, as the server holds them)" in ran.output
    # Payload data is base64 in the JSON: look at the events as bytes.
    plain = WorkflowHistory.from_json(handle.id, decoded.read_text())
    stored = WorkflowHistory.from_json(handle.id, encoded.read_text())
    assert MARKER.encode() in b"".join(e.SerializeToString() for e in plain.events)
    assert MARKER.encode() not in b"".join(e.SerializeToString() for e in stored.events)
    assert not any(p.metadata.get("encoding") == ENCODING for p in history_payloads(plain))
    assert any(p.metadata.get("encoding") == ENCODING for p in history_payloads(stored))

    # The decrypted export replays without any key; the encoded one needs the key.
    keys()
    keyless = Replayer(workflows=WORKFLOWS, plugins=[PerdurePlugin()])
    await keyless.replay_workflow(plain)
    assert (await keyless.replay_workflow(stored, raise_on_replay_failure=False)).replay_failure is not None
    keys(KEY_A)
    await Replayer(workflows=WORKFLOWS, plugins=[PerdurePlugin()]).replay_workflow(stored)


# ------------------------------------------------------------------ the codec server


@pytest.fixture
def codec_servers() -> Iterator:
    """Factory: `codec_servers(keyring, **config)` starts a codec server on a free port; stopped after."""
    started: list[CodecServer] = []

    def start(ring: Keyring, **config) -> CodecServer:
        server = CodecServer(ring, CodecServerConfig(**{"port": 0, **config})).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def payloads_json(*payloads: Payload) -> str:
    return json_format.MessageToJson(Payloads(payloads=payloads))


@pytest.mark.slow
async def test_codec_server_speaks_the_remote_codec_protocol(codec_servers):
    ui = "http://localhost:8233"
    server = codec_servers(keyring(KEY_A), origins=(ui,), namespaces=("default",), token="t0ken")
    auth = {"Authorization": "Bearer t0ken", "X-Namespace": "default", "Content-Type": "application/json"}
    [plain] = await pydantic_data_converter.encode([GOAL])
    async with httpx.AsyncClient(base_url=server.url) as http:
        preflight = await http.options(
            "/decode",
            headers={"Origin": ui, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x"},
        )
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == ui
        allowed = {h.strip() for h in preflight.headers["access-control-allow-headers"].split(",")}
        assert {"x-namespace", "content-type", "authorization"} <= allowed
        assert "POST" in preflight.headers["access-control-allow-methods"]
        stranger = await http.options("/decode", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in stranger.headers

        encoded = await http.post("/encode", content=payloads_json(plain), headers={**auth, "Origin": ui})
        assert encoded.status_code == 200 and encoded.headers["access-control-allow-origin"] == ui
        [sealed] = json_format.Parse(encoded.text, Payloads()).payloads
        assert sealed.metadata["encoding"] == ENCODING and MARKER not in encoded.text
        decoded = await http.post("/default/decode", content=encoded.text, headers=auth)
        assert decoded.status_code == 200
        assert list(json_format.Parse(decoded.text, Payloads()).payloads) == [plain]

        no_token = await http.post("/decode", content=encoded.text, headers={"X-Namespace": "default"})
        assert no_token.status_code == 401
        other_ns = await http.post("/decode", content=encoded.text, headers={**auth, "X-Namespace": "prod"})
        assert other_ns.status_code == 403 and "'prod'" in other_ns.json()["error"]
        bad_body = await http.post("/decode", content="{not json", headers=auth)
        assert bad_body.status_code == 400
        assert (await http.post("/stats", content="{}", headers=auth)).status_code == 404
        assert (await http.get("/decode")).status_code == 405

    async with httpx.AsyncClient(base_url=codec_servers(keyring(KEY_B)).url) as http:
        unknown = await http.post("/decode", content=payloads_json(sealed), headers={"X-Namespace": "default"})
        assert unknown.status_code == 422 and "'key-a'" in unknown.json()["error"]


@pytest.mark.process
def test_perdure_codec_server_serves_with_the_keys_of_its_environment():
    port = free_ports(1)[0]
    variables = {k: v for k, v in os.environ.items() if k not in (KEYS_ENV, KEY_FILE_ENV)}
    variables.update(COLUMNS="300", NO_COLOR="1", PERDURE_UI="http://localhost:8233")
    command = [str(BIN / "perdure"), "codec-server", "--port", str(port), "--namespace", "default"]
    refused = subprocess.run(command, env=variables, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "no payload keys" in refused.stderr

    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"hello"')
    sealed = EncryptionCodec(keyring(KEY_A)).encrypt(plain)
    server = subprocess.Popen(command, env={**variables, KEYS_ENV: KEY_A}, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                reply = httpx.post(
                    f"http://127.0.0.1:{port}/decode", content=payloads_json(sealed), headers={"X-Namespace": "default"}
                )
                break
            except httpx.ConnectError:
                assert server.poll() is None and time.monotonic() < deadline, "the codec server did not start"
                time.sleep(0.1)
        assert reply.status_code == 200
        assert list(json_format.Parse(reply.text, Payloads()).payloads) == [plain]
    finally:
        server.kill()
        output = server.communicate()[0]
    assert f"codec server at http://127.0.0.1:{port}" in output and "keys key-a (newest key-a)" in output
    assert "CORS for http://localhost:8233, http://127.0.0.1:8233" in output


def test_the_default_ui_origin_covers_both_loopback_names():
    assert ui_origins("http://localhost:8233/") == ("http://localhost:8233", "http://127.0.0.1:8233")
    assert ui_origins("https://temporal.example.com/ui") == ("https://temporal.example.com",)
    with pytest.raises(ValueError, match="not a URL"):
        ui_origins("localhost:8233")


def temporal_show(env: WorkflowEnvironment, goal_id: str, *extra: str) -> subprocess.CompletedProcess:
    address = env.client.service_client.config.target_host
    command = [str(BIN / "temporal"), "workflow", "show", "-w", goal_id, "--address", address, *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
async def test_temporal_cli_shows_the_goal_through_the_codec_server(
    env, encrypted: Client, task_queue, workspace, scripted, codec_servers, tmp_path
):
    handle, _ = await run_goal(encrypted, task_queue, workspace, scripted, DiskArtifactStore(tmp_path / "a"), GOAL)
    ring = keyring_from_env()
    server = codec_servers(ring, namespaces=(env.client.namespace,))

    without = await asyncio.to_thread(temporal_show, env, handle.id)
    assert without.returncode == 0, without.stderr
    assert "WorkflowExecutionCompleted" in without.stdout and MARKER not in without.stdout
    shown = await asyncio.to_thread(temporal_show, env, handle.id, "--codec-endpoint", server.url)
    assert shown.returncode == 0, shown.stderr
    assert MARKER in shown.stdout
    # The CLI's per-namespace template, and a token the CLI sends (refused without it: the
    # protocol test above; the CLI would retry a refusal until its 10 s deadline).
    guarded = codec_servers(ring, namespaces=(env.client.namespace,), token="s3cret")
    templated = f"{guarded.url}/{{namespace}}"
    allowed = await asyncio.to_thread(
        temporal_show, env, handle.id, "--codec-endpoint", templated, "--codec-auth", "Bearer s3cret"
    )
    assert allowed.returncode == 0, allowed.stderr
    assert MARKER in allowed.stdout


@pytest.mark.process
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium (make installs it)")
async def test_temporal_ui_shows_the_goal_through_the_codec_server(
    keys, monkeypatch, task_queue, workspace, scripted, codec_servers, tmp_path
):
    keys(KEY_A)
    monkeypatch.setenv("PERDURE_TASK_QUEUE", task_queue)
    ui_port, codec_port = free_ports(2)
    ui = f"http://127.0.0.1:{ui_port}"
    ring = keyring_from_env()
    server = codec_servers(ring, port=codec_port, origins=(ui,))
    options = dev_server_options("--ui-codec-endpoint", server.url)
    async with await WorkflowEnvironment.start_local(**options, ui=True, ui_port=ui_port) as ui_env:
        handle, _ = await run_goal(
            ui_env.client, task_queue, workspace, scripted, DiskArtifactStore(tmp_path / "a"), GOAL
        )
        page = f"{ui}/namespaces/{ui_env.client.namespace}/workflows/{handle.id}"

        # One load for the DOM and the screenshot (Chromium dumps the DOM after taking it).
        shot = tmp_path / "ui-codec.png"
        window = ("--hide-scrollbars", "--window-size=1280,640", f"--screenshot={shot}")
        dom = await asyncio.to_thread(chromium, page, tmp_path / "profile1", *window, "--dump-dom")
        assert handle.id in dom and MARKER in dom
        assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20_000
        if os.environ.get("PERDURE_UI_SCREENSHOT"):
            shutil.copy(shot, os.environ["PERDURE_UI_SCREENSHOT"])

        # The same endpoint, serving another origin only: the browser refuses the answers.
        server.stop()
        codec_servers(ring, port=codec_port, origins=("http://elsewhere.example:8233",))
        dom = await asyncio.to_thread(chromium, page, tmp_path / "profile3", "--dump-dom")
        assert handle.id in dom and MARKER not in dom


# ------------------------------------------------------------------ docker-compose.yml


def test_compose_runs_encrypted_with_the_ui_decrypting_through_the_codec_server():
    compose = yaml.safe_load((Path(__file__).resolve().parents[1] / "docker-compose.yml").read_text())
    services = compose["services"]
    # The keys come from the shell or .env, by reference only, and compose refuses to start without them.
    for name in ("worker", "cli", "codec-server"):
        value = services[name]["environment"][KEYS_ENV]
        assert re.fullmatch(r"\$\{PERDURE_PAYLOAD_KEYS:\?[^}]+\}", value), (name, value)
    assert services["codec-server"]["environment"]["PERDURE_CODEC_TOKEN"] is None  # by name, optional

    command = services["codec-server"]["command"]
    port = command[command.index("--port") + 1]
    assert services["codec-server"]["ports"] == [f"127.0.0.1:{port}:{port}"]  # the host's loopback only
    assert services["temporal-ui"]["environment"]["TEMPORAL_CODEC_ENDPOINT"] == f"http://localhost:{port}"
    ui_host_port = services["temporal-ui"]["ports"][0].split(":")[0]
    origins = [command[i + 1] for i, arg in enumerate(command) if arg == "--ui-origin"]
    assert f"http://localhost:{ui_host_port}" in origins


async def test_a_stuck_goals_failure_reads_as_its_message_with_encryption_on(keys):
    from perdure.starters.client.goal_reads import failure_message

    keys(KEY_A)
    failure = Failure()
    await data_converter().encode_failure(ApplicationError(f"workflow code broke on {MARKER}"), failure)
    assert failure.message == "Encoded failure"
    assert await failure_message(data_converter(), failure) == f"workflow code broke on {MARKER}"
    assert failure.message == "Encoded failure"  # the event itself is left as it was
    keys()  # a CLI without the keys says what history says, and does not crash
    assert await failure_message(data_converter(), failure) == "Encoded failure"


def test_the_watchdogs_memory_file_is_sealed_and_read_back_with_the_keys(keys, tmp_path: Path):
    from perdure.activities.watchdog.watchdog_memory import load_memory, memory_path, save_memory
    from perdure.workflows.watchdog.watchdog_contracts import GoalMemory, WatchdogMemory

    keys(KEY_A)
    path = memory_path(tmp_path, "perdure")
    save_memory(path, WatchdogMemory(goals={f"goal-{MARKER}": GoalMemory(seen_at=datetime.now(UTC))}))
    assert MARKER.encode() not in path.read_bytes()
    memory, problem = load_memory(path)
    assert problem is None and list(memory.goals) == [f"goal-{MARKER}"]
    keys()  # without the keys: an empty memory and why, as for any unreadable file
    memory, problem = load_memory(path)
    assert memory.goals == {} and "encrypted with key 'key-a'" in problem


@pytest.mark.slow
async def test_a_goal_whose_input_the_worker_cannot_decrypt_fails_at_once_saying_why(
    env, keys, task_queue, workspace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """Started by a CLI with a payload key while no worker ran (the start could not be checked),
    taken by a worker with none: the goal fails on its first workflow task naming the key,
    instead of a workflow task failing "Failed decoding arguments" forever (a stuck goal)."""
    keys(KEY_A)
    monkeypatch.setenv("PERDURE_TASK_QUEUE", task_queue)
    keyed = Client(env.client.service_client, namespace=env.client.namespace, plugins=[PerdurePlugin()])
    handle = await start_goal(keyed, spec(workspace, goal=GOAL), new_goal_id("unreadable"))
    keys()
    keyless = build_worker(env.client, task_queue=task_queue, store=DiskArtifactStore(tmp_path / "artifacts"),
                           model_config=ModelConfig(profiles={}))  # fmt: skip
    async with keyless:
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(env.client.get_workflow_handle(handle.id).result(), 30)
    said = str(failed.value.cause)
    assert "encrypted with payload key 'key-a'" in said and "has no payload keys" in said, said
    assert "--replace" in said
    history = await env.client.get_workflow_handle(handle.id).fetch_history()
    kinds = [e.event_type for e in history.events]
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in kinds
    assert kinds[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED


async def test_the_router_lists_a_goal_whose_input_it_cannot_decrypt_without_its_text(keys) -> None:
    """A closed goal started by a client with a payload key the router's worker lacks is
    still a candidate (by its id and status), not an AttributeError on the undecryptable
    input (seen in a process run: `'UndecryptedInput' object has no attribute 'spec'`)."""
    from types import SimpleNamespace

    from perdure.activities.router.router_activities import RouterIO
    from perdure.workflows.goal.contracts.state import GoalInput

    keys(new_key_entry("client-key"))
    sealed = await data_converter(payload_store=False).encode([GoalInput(spec=spec(Path("/tmp"), goal="secret"))])
    keys()
    router = RouterIO(SimpleNamespace(data_converter=data_converter(payload_store=False)), ModelConfig(profiles={}))
    assert await router._decoded(sealed, GoalInput) is None
