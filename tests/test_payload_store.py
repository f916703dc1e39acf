"""Large payloads outside history: the disk driver on its own, the environment
parsing of runtime/converter.py, and a real goal on the dev server whose input is
over the threshold, checked in the raw history, on disk and in replay.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import StorageDriverClaim, StorageDriverRetrieveContext, StorageDriverStoreContext
from temporalio.worker import Replayer

from bench.common import payloads_in
from perdure.activities.models.profiles import ModelConfig
from perdure.runtime import converter
from perdure.runtime.converter import PayloadStoreConfigError, data_converter
from perdure.runtime.payload_store import DRIVER_NAME, DiskPayloadDriver, PayloadCorrupt, PayloadMissing
from perdure.runtime.plugin import PerdurePlugin
from perdure.workers.orchestrator import build_worker
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.watchdog.watchdog_workflow import WatchdogWorkflow
from tests.builders import demo_script, openai_profile, spec, write_notes
from tests.helpers import new_goal_id

REFERENCE_TYPE = b"temporal.api.sdk.v1.ExternalStorageReference"


def payload(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(text).encode())


async def store(driver: DiskPayloadDriver, *payloads: Payload) -> list[StorageDriverClaim]:
    return await driver.store(StorageDriverStoreContext(), payloads)


async def retrieve(driver: DiskPayloadDriver, *claims: StorageDriverClaim) -> list[Payload]:
    return await driver.retrieve(StorageDriverRetrieveContext(), claims)


def stored_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


# ------------------------------------------------------------------ disk driver


async def test_disk_driver_round_trips_payloads(tmp_path: Path):
    driver = DiskPayloadDriver(tmp_path)
    originals = [payload("a" * 5000), payload("b" * 7000)]
    claims = await store(driver, *originals)
    assert await retrieve(driver, *claims) == originals
    assert [set(c.claim_data) for c in claims] == [{"hash_algorithm", "hash_value"}] * 2
    assert not [p for p in tmp_path.rglob(".tmp-*")]


async def test_same_content_is_stored_once(tmp_path: Path):
    driver = DiskPayloadDriver(tmp_path)
    first = await store(driver, payload("same"), payload("same"))
    again = await store(DiskPayloadDriver(tmp_path), payload("same"))
    assert first[0] == first[1] == again[0]
    assert len(stored_files(tmp_path)) == 1


async def test_missing_file_names_the_claim_and_the_path(tmp_path: Path):
    driver = DiskPayloadDriver(tmp_path)
    [claim] = await store(driver, payload("gone soon"))
    path = driver.path_for(claim)
    path.unlink()
    with pytest.raises(PayloadMissing) as caught:
        await retrieve(driver, claim)
    assert claim.claim_data["hash_value"] in str(caught.value) and str(path) in str(caught.value)
    assert "PERDURE_PAYLOAD_STORE" in str(caught.value)


async def test_corrupt_file_fails_the_digest_check(tmp_path: Path):
    driver = DiskPayloadDriver(tmp_path)
    [claim] = await store(driver, payload("intact"))
    path = driver.path_for(claim)
    path.write_bytes(path.read_bytes().replace(b"intact", b"broken"))
    with pytest.raises(PayloadCorrupt, match="corrupt: expected sha256:" + claim.claim_data["hash_value"]) as caught:
        await retrieve(driver, claim)
    assert str(path) in str(caught.value)


async def test_a_claim_cannot_point_outside_the_store(tmp_path: Path):
    driver = DiskPayloadDriver(tmp_path / "store")
    forged = StorageDriverClaim(claim_data={"hash_algorithm": "sha256", "hash_value": "../../etc/passwd"})
    with pytest.raises(PayloadCorrupt, match="not a perdure.disk claim"):
        await retrieve(driver, forged)


# ------------------------------------------------------------------ configuration


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    monkeypatch.delenv(converter.STORE_ENV, raising=False)
    monkeypatch.delenv(converter.THRESHOLD_ENV, raising=False)
    monkeypatch.setenv("PERDURE_HOME", str(tmp_path / "home"))
    return monkeypatch


def test_default_is_disk_under_perdure_home_at_128_kib(clean_env, tmp_path: Path):
    dc = data_converter()
    storage = dc.external_storage
    assert storage is not None and storage.payload_size_threshold == 128 * 1024
    [driver] = storage.drivers
    assert isinstance(driver, DiskPayloadDriver) and driver.root == tmp_path / "home" / "payloads"
    # Still the pydantic converter underneath.
    assert issubclass(dc.payload_converter_class, pydantic_data_converter.payload_converter_class)
    assert not (tmp_path / "home").exists(), "building the converter must not create directories"


def test_disk_with_a_directory(clean_env, tmp_path: Path):
    clean_env.setenv(converter.STORE_ENV, f"disk:{tmp_path}/elsewhere")
    clean_env.setenv(converter.THRESHOLD_ENV, "2048")
    storage = data_converter().external_storage
    assert storage.drivers[0].root == tmp_path / "elsewhere" and storage.payload_size_threshold == 2048


def test_off_is_the_plain_pydantic_converter(clean_env):
    clean_env.setenv(converter.STORE_ENV, "off")
    dc = data_converter()
    assert dc.external_storage is None and dc.payload_codec is None
    assert issubclass(dc.payload_converter_class, pydantic_data_converter.payload_converter_class)


@pytest.mark.parametrize(
    ("variable", "value", "complaint"),
    [
        (converter.STORE_ENV, "disk:relative/dir", "must be an absolute path"),
        (converter.STORE_ENV, "s3://", "no bucket name"),
        (converter.STORE_ENV, "gcs://bucket", "use disk, disk:/absolute/dir, s3://bucket"),
        (converter.THRESHOLD_ENV, "128KiB", "not a whole number of bytes"),
        (converter.THRESHOLD_ENV, "-1", "out of range"),
        (converter.THRESHOLD_ENV, str(2 * 1024 * 1024), "out of range"),
    ],
)
def test_bad_values_name_the_variable(clean_env, variable: str, value: str, complaint: str):
    clean_env.setenv(variable, value)
    with pytest.raises(PayloadStoreConfigError, match=complaint) as caught:
        data_converter()
    assert f"{variable}={value!r}" in str(caught.value)
    assert isinstance(caught.value, ValueError)  # the CLI prints ValueErrors without a traceback


# ------------------------------------------------------------------ on the dev server


@pytest.mark.slow
async def test_large_goal_input_lives_outside_history(
    env, task_queue, store, workspace, scripted, monkeypatch, tmp_path
):
    payload_dir = tmp_path / "payloads"
    monkeypatch.setenv(converter.STORE_ENV, f"disk:{payload_dir}")
    monkeypatch.setenv(converter.THRESHOLD_ENV, "2048")
    client = Client(env.client.service_client, namespace=env.client.namespace, plugins=[PerdurePlugin()])

    write_notes(workspace)
    marker = "LONG-CONTEXT-7f3a"
    goal_text = "Summarise the notes into SUMMARY.md. " + f"{marker} background the planner may use. " * 150
    server = scripted(demo_script())
    config = ModelConfig(profiles={"test": openai_profile(server)})
    async with build_worker(client, task_queue=task_queue, store=store, model_config=config):
        handle = await client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, goal=goal_text)),
            id=new_goal_id("big"),
            task_queue=task_queue,
        )
        result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt

    # The raw history, as the server holds it: the start event carries a small
    # reference to the payload, not the payload.
    history = await handle.fetch_history()
    [started] = history.events[0].workflow_execution_started_event_attributes.input.payloads
    assert started.metadata["encoding"] == b"json/protobuf"
    assert started.metadata["messageType"] == REFERENCE_TYPE
    assert started.external_payloads[0].size_bytes > len(goal_text) > 2048
    assert started.ByteSize() < 300
    reference = json.loads(started.data)
    assert reference["driverName"] == DRIVER_NAME
    # The workflow's own outgoing payloads too (the planner's input carries the
    # goal); what stays inline is under the threshold, such as the report's excerpt.
    payloads = [p for event in history.events for p in payloads_in(event)]
    references = [p for p in payloads if p.metadata.get("messageType") == REFERENCE_TYPE]
    assert len(references) >= 2
    assert all(p.ByteSize() < 2048 for p in payloads)
    assert not any(goal_text.encode() in event.SerializeToString() for event in history.events)

    # Each payload itself is a file in the store; the workflow input holds the goal.
    disk = DiskPayloadDriver(payload_dir)
    paths = {disk.path_for(StorageDriverClaim(claim_data=json.loads(p.data)["claimData"])) for p in references}
    assert paths == set(stored_files(payload_dir))
    path = disk.path_for(StorageDriverClaim(claim_data=reference["claimData"]))
    assert goal_text.encode() in path.read_bytes()

    # A client without the store cannot read the result: the CLI needs the same store.
    plain = Client(env.client.service_client, namespace=env.client.namespace, data_converter=pydantic_data_converter)
    with pytest.raises(RuntimeError, match="external storage is not configured"):
        await plain.get_workflow_handle(handle.id).result()

    # Replay reads the references back through the same converter.
    replayer = Replayer(workflows=[GoalWorkflow, WatchdogWorkflow], plugins=[PerdurePlugin()])
    await replayer.replay_workflow(history)
