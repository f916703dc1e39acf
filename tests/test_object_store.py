"""Artifacts (and large payloads) in an S3-compatible object store: PERDURE_ARTIFACT_STORE
=s3://bucket/prefix against moto's real S3 server (tests/conftest.py `s3_server`), which
perdure's boto3 client reaches over HTTP as it would AWS or MinIO. What is checked is what an
operator would see: the objects in the bucket, their bytes, and what `perdure worker`,
`perdure result` and `perdure ui` say, each run from a PERDURE_HOME of its own.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from perdure.activities.artifacts import (
    ArtifactCorrupt,
    ArtifactMissing,
    DiskArtifactStore,
    artifact_store,
)
from perdure.activities.artifacts.s3_store import S3ArtifactStore
from perdure.runtime import converter, settings
from perdure.runtime.codec import KEY_FILE_ENV, KEYS_ENV, MAGIC, is_sealed
from perdure.runtime.plugin import PerdurePlugin
from perdure.runtime.s3_client import S3Location
from perdure.starters.ui_server import build_app
from perdure.testing.crash import PERDURE, CrashRig
from perdure.testing.s3_server import S3Server
from perdure.testing.servers import free_ports
from tests.builders import SUMMARY_TEXT, demo_script, spec, write_notes
from tests.helpers import new_goal_id
from tests.payload_keys import KEY_A, keyring

MARKER = "OBJECT-STORE-MARKER-91c4"


def object_store(location: S3Location, *keys: str) -> S3ArtifactStore:
    return S3ArtifactStore(location, keyring(*keys) if keys else None)


# ------------------------------------------------------------------ the setting


def test_the_setting_picks_the_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("PERDURE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(settings.ARTIFACT_STORE_ENV, raising=False)
    default = artifact_store()
    assert isinstance(default, DiskArtifactStore) and default.root == tmp_path / "home" / "artifacts"
    monkeypatch.setenv(settings.ARTIFACT_STORE_ENV, str(tmp_path / "shared"))
    assert artifact_store().where == str(tmp_path / "shared")
    monkeypatch.setenv(settings.ARTIFACT_STORE_ENV, "s3://perdure-prod/team/a/")
    s3 = artifact_store()
    assert isinstance(s3, S3ArtifactStore) and s3.location == S3Location("perdure-prod", "team/a")
    assert s3.where == "s3://perdure-prod/team/a" and s3.local_dir is None


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("s3://", "no bucket name"),
        ("s3://Not_A_Bucket/x", "is not a bucket name"),
        ("gs://bucket/x", "use an absolute directory or s3://bucket/prefix"),
        ("relative/artifacts", "must be an absolute path"),
    ],
)
def test_a_setting_perdure_cannot_use_is_one_line_naming_it(monkeypatch, value: str, complaint: str):
    monkeypatch.setenv(settings.ARTIFACT_STORE_ENV, value)
    with pytest.raises(settings.ArtifactStoreConfigError, match=complaint) as caught:
        artifact_store()
    assert f"{settings.ARTIFACT_STORE_ENV}={value!r}" in str(caught.value)
    assert isinstance(caught.value, ValueError)  # the CLI prints ValueErrors without a traceback


# ------------------------------------------------------------------ the store's contract on S3


def test_blobs_are_sealed_at_their_plaintext_address_under_the_prefix(s3_server: S3Server, s3_artifacts):
    store = object_store(s3_artifacts, KEY_A)
    ref = store.put_text(f"notes for {MARKER}")
    [(key, blob)] = s3_server.objects(s3_artifacts.bucket).items()
    # The disk layout, under the prefix: a directory synced to a bucket stays a store.
    hexdigest = ref.digest.removeprefix("sha256:")
    assert key == f"perdure/artifacts/sha256/{hexdigest[:2]}/{hexdigest}"
    assert is_sealed(blob) and MARKER.encode() not in blob
    assert store.get_text(ref) == f"notes for {MARKER}" and store.has(ref)
    # Another process, another machine: the same bucket and key read it.
    assert object_store(s3_artifacts, KEY_A).get_text(ref) == f"notes for {MARKER}"


def test_a_second_put_of_the_same_bytes_does_not_touch_the_object(s3_server: S3Server, s3_artifacts):
    store = object_store(s3_artifacts, KEY_A)
    ref = store.put_text(MARKER)
    client, key = s3_server.client(), store.key(ref.digest)
    before = client.head_object(Bucket=s3_artifacts.bucket, Key=key)
    blob = s3_server.objects(s3_artifacts.bucket)[key]
    # Sealing draws a fresh nonce: a rewrite would change the bytes and the ETag.
    assert store.put_text(MARKER) == ref and object_store(s3_artifacts, KEY_A).put_text(MARKER) == ref
    after = client.head_object(Bucket=s3_artifacts.bucket, Key=key)
    assert (after["ETag"], after["LastModified"]) == (before["ETag"], before["LastModified"])
    assert s3_server.objects(s3_artifacts.bucket) == {key: blob}


def test_a_plaintext_object_is_sealed_in_place(s3_server: S3Server, s3_artifacts):
    ref = object_store(s3_artifacts).put_text(MARKER)
    key = object_store(s3_artifacts).key(ref.digest)
    assert s3_server.objects(s3_artifacts.bucket)[key] == MARKER.encode()
    encrypting = object_store(s3_artifacts, KEY_A)
    assert encrypting.get_text(ref) == MARKER  # read as it is
    assert encrypting.put_text(MARKER) == ref
    assert MAGIC in s3_server.objects(s3_artifacts.bucket)[key] and encrypting.get_text(ref) == MARKER


def test_an_object_changed_in_the_bucket_is_refused(s3_server: S3Server, s3_artifacts):
    store = object_store(s3_artifacts)
    ref = store.put_text(MARKER)
    s3_server.client().put_object(Bucket=s3_artifacts.bucket, Key=store.key(ref.digest), Body=b"something else")
    with pytest.raises(ArtifactCorrupt, match=r"at s3://.*/perdure/artifacts/sha256/.* does not match its digest"):
        store.get_text(ref)
    sealed = object_store(s3_artifacts, KEY_A)
    other = sealed.put_text("another " + MARKER)
    blob = s3_server.objects(s3_artifacts.bucket)[sealed.key(other.digest)]
    flipped = blob[:-1] + bytes([blob[-1] ^ 1])
    s3_server.client().put_object(Bucket=s3_artifacts.bucket, Key=sealed.key(other.digest), Body=flipped)
    with pytest.raises(ArtifactCorrupt):
        sealed.get_text(other)


def test_a_blob_not_in_the_bucket_is_missing_and_names_the_store(s3_artifacts):
    store = object_store(s3_artifacts)
    ref = store.put_text("kept")
    lost = S3ArtifactStore(S3Location(s3_artifacts.bucket, "other/prefix"), None)
    assert not lost.has(ref)
    with pytest.raises(ArtifactMissing, match=f"not in the store at s3://{s3_artifacts.bucket}/other/prefix"):
        lost.get_text(ref)
    with pytest.raises(ArtifactMissing):
        store.get_text("sha256:../../etc/passwd")  # a model's guess is no address


# ------------------------------------------------------------------ large payloads beside the artifacts


async def test_large_payloads_follow_an_s3_artifact_store(s3_server: S3Server, s3_artifacts, monkeypatch):
    from temporalio.api.common.v1 import Payload
    from temporalio.converter import StorageDriverRetrieveContext, StorageDriverStoreContext

    monkeypatch.delenv(converter.STORE_ENV, raising=False)
    [driver] = converter.data_converter().external_storage.drivers
    assert driver.type() == "aws.s3driver"
    big = Payload(metadata={"encoding": b"json/plain"}, data=(f'"{MARKER}' + "x" * 5000 + '"').encode())
    [claim] = await driver.store(StorageDriverStoreContext(), [big])
    [key] = s3_server.objects(s3_artifacts.bucket, "perdure/artifacts/payloads/")
    assert claim.claim_data["bucket"] == s3_artifacts.bucket and key.endswith(claim.claim_data["hash_value"])
    assert await driver.retrieve(StorageDriverRetrieveContext(), [claim]) == [big]
    # Named explicitly, it wins over the artifact store's bucket.
    monkeypatch.setenv(converter.STORE_ENV, f"s3://{s3_artifacts.bucket}/elsewhere")
    [driver] = converter.data_converter().external_storage.drivers
    await driver.store(StorageDriverStoreContext(), [big])
    assert len(s3_server.objects(s3_artifacts.bucket, "elsewhere/")) == 1


# ------------------------------------------------------------------ a store that cannot be used


@pytest.fixture
def broken_stores(s3_server: S3Server, s3_artifacts: S3Location):
    """Per way of failing: the variables that make it so, and the line perdure must say."""
    refusing = S3Server(check_credentials=True).start()
    (dead_port,) = free_ports(1)
    yield {
        "no bucket": ({settings.ARTIFACT_STORE_ENV: "s3://perdure-no-such-bucket/x"}, "does not exist"),
        "refused credentials": (
            {"AWS_ENDPOINT_URL_S3": refusing.endpoint, "AWS_ACCESS_KEY_ID": "AKIAUNKNOWNKEY000000"},
            "credentials were refused|the store does not know these credentials",
        ),
        "endpoint down": ({"AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{dead_port}"}, "does not answer"),
        "no credentials": ({"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}, "no AWS credentials found"),
    }
    refusing.stop()


def assert_one_clear_line(done: subprocess.CompletedProcess, said: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"error: the (artifact|payload) store s3://", lines[0]), done.stderr
    assert re.search(said, lines[0]) and "Traceback" not in done.stdout + done.stderr
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert secret not in done.stdout + done.stderr


def broken(base: dict[str, str], change: dict[str, str]) -> dict[str, str]:
    variables = {**base, **change}
    return {k: v for k, v in variables.items() if v != ""}


# No kill and no timing: safe beside other tests (make test's first pass).
@pytest.mark.process
@pytest.mark.parallel_safe
@pytest.mark.slow
@pytest.mark.parametrize("failure", ["no bucket", "refused credentials", "endpoint down", "no credentials"])
def test_a_worker_whose_store_cannot_be_used_says_why_in_one_line(broken_stores, failure, tmp_path, monkeypatch):
    change, said = broken_stores[failure]
    variables = broken(dict(os.environ, PERDURE_HOME=str(tmp_path / "home"), HOME=str(tmp_path)), change)
    # A Temporal address nobody answers: the store is checked first, so this is never reached.
    variables["PERDURE_TEMPORAL"] = f"127.0.0.1:{free_ports(1)[0]}"
    done = subprocess.run(
        [PERDURE, "worker", "--unversioned"], env=variables, capture_output=True, text=True, timeout=90
    )
    assert_one_clear_line(done, said)


@pytest.mark.process
@pytest.mark.parallel_safe
@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "store"),
    [
        # The payloads in a bucket of their own, which the worker checks as it checks the artifacts'.
        (["worker", "--unversioned"], {converter.STORE_ENV: "s3://perdure-no-such-payloads/p"}),
        (["ui", "--port", "PORT"], {settings.ARTIFACT_STORE_ENV: "s3://perdure-no-such-bucket/x"}),
        (["mcp"], {settings.ARTIFACT_STORE_ENV: "s3://perdure-no-such-bucket/x"}),
    ],
)
def test_every_command_that_serves_checks_its_stores_at_its_start(s3_artifacts, command, store, tmp_path):
    variables = dict(os.environ, PERDURE_HOME=str(tmp_path / "home"), HOME=str(tmp_path), **store)
    # A Temporal address nobody answers: the stores are checked first, so this is never reached.
    variables["PERDURE_TEMPORAL"] = f"127.0.0.1:{free_ports(1)[0]}"
    argv = [PERDURE, *(str(free_ports(1)[0]) if arg == "PORT" else arg for arg in command)]
    done = subprocess.run(argv, env=variables, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90)
    assert_one_clear_line(done, "does not exist")
    assert "perdure-no-such" in done.stderr


# ------------------------------------------------------------------ a goal whose artifacts are in the bucket


@pytest.mark.process
@pytest.mark.parallel_safe
@pytest.mark.slow
async def test_a_goal_s_artifacts_live_in_the_bucket_and_read_from_anywhere(
    env, s3_server: S3Server, s3_artifacts: S3Location, broken_stores, scripted, tmp_path, monkeypatch
):
    # Encrypted, and with large payloads offloaded too (PERDURE_PAYLOAD_STORE unset: beside the artifacts).
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.setenv(KEYS_ENV, KEY_A)
    monkeypatch.delenv(converter.STORE_ENV, raising=False)
    monkeypatch.setenv(converter.THRESHOLD_ENV, "2048")
    client = Client(env.client.service_client, namespace=env.client.namespace, plugins=[PerdurePlugin()])
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    write_notes(workspace)
    rig = CrashRig(client, tmp_path / "worker", model=scripted(demo_script()))
    worker = rig.start_worker()
    try:
        await rig.wait_polling()
        goal = f"Summarise the notes into SUMMARY.md for {MARKER}. " + "Background the planner may use. " * 100
        handle = await rig.start_goal(spec(workspace, goal=goal), new_goal_id("s3"))
        result = await rig.result(handle)
    finally:
        rig.close()
    assert result.outcome == "succeeded", result.excerpt
    assert s3_artifacts.url in worker.log_text()  # the worker says where its artifacts go

    # The bucket, as an operator lists it: every blob sealed, no plaintext in any of them.
    objects = s3_server.objects(s3_artifacts.bucket)
    artifacts = {k: v for k, v in objects.items() if "/sha256/" in k and "/payloads/" not in k}
    payloads = {k: v for k, v in objects.items() if "/payloads/" in k}
    assert len(artifacts) >= 8 and payloads, sorted(objects)
    for key, blob in objects.items():
        for plaintext in (MARKER, "CSV parser", SUMMARY_TEXT.splitlines()[0]):
            assert plaintext.encode() not in blob, f"{plaintext!r} in plaintext at {key}"
    assert all(is_sealed(blob) for blob in artifacts.values())
    # Nothing on the worker's disk: its PERDURE_HOME holds no artifact, no payload, no watchdog
    # memory; only what docs/guide/deployment.md lists as this host's (its memory store's SQLite
    # file, which the worker warns about, the fences of the workspaces it writes to, the journal).
    assert not (rig.home / "artifacts").exists() and not (rig.home / "payloads").exists()
    # The read batches' journal (answers kept until their task is recorded) is this host's too, sealed.
    assert {p.name for p in rig.home.iterdir()} <= {"memory", "workspace-versions", "batch-journal"}, sorted(
        rig.home.rglob("*")
    )
    for kept in (p for p in (rig.home / "batch-journal").rglob("*") if p.is_file()):
        assert MARKER.encode() not in kept.read_bytes(), f"{MARKER!r} in plaintext in {kept}"
    assert "the memory store is this host's own SQLite file" in worker.log_text()

    # What they are: the outputs, the agent's transcript and the write_file call's arguments.
    reader = object_store(s3_artifacts, KEY_A)
    texts = [reader.get_text("sha256:" + key.rsplit("/", 1)[1]) for key in artifacts]
    assert reader.get_text(result.report).startswith("# ") and reader.has(result.report)
    assert any('"role": "assistant"' in t and "write_file" in t for t in texts), "no agent transcript"
    assert any(t.startswith("{") and SUMMARY_TEXT.splitlines()[0] in t and '"path"' in t for t in texts), "no args"
    assert any("notes/ideas.md" in t or "- cache the export" in t for t in texts), "no tool output"

    # `perdure result` from another machine's home: the whole report, read from the bucket.
    reading = {**os.environ, "PERDURE_HOME": str(tmp_path / "reader-home"), "PERDURE_TEMPORAL": rig.target}
    shown = await asyncio.to_thread(
        subprocess.run, [PERDURE, "result", handle.id], env=reading, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert "not in the artifact store" not in shown.stdout and "Totals" in shown.stdout, shown.stdout
    assert not (tmp_path / "reader-home" / "artifacts").exists()

    # `perdure ui`'s report page, served from yet another home.
    monkeypatch.setenv("PERDURE_HOME", str(tmp_path / "ui-home"))
    transport = httpx.ASGITransport(app=build_app(client))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as ui:
        page = await ui.get(f"/api/goals/{handle.id}/report")
        assert page.status_code == 200, page.text
        assert page.json()["report"] == reader.get_text(result.report)
        # A store that cannot be used: the page says why (502), the server keeps serving.
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_ports(1)[0]}")
        down = await ui.get(f"/api/goals/{handle.id}/report")
        assert down.status_code == 502 and "store s3://" in down.text and "does not answer" in down.text, down.text

    # And `perdure result` with a store it cannot use: one line, no traceback, whatever the cause.
    # The payloads are named on their own here, so that a bucket that is not there is the artifacts'.
    reading[converter.STORE_ENV] = s3_artifacts.under("payloads").url
    for change, said in broken_stores.values():
        done = await asyncio.to_thread(
            subprocess.run,
            [PERDURE, "result", handle.id],
            env=broken({**reading, "HOME": str(tmp_path)}, change),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert_one_clear_line(done, said)
