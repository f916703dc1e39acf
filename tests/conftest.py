"""Shared fixtures: one real Temporal dev server per session, a fresh task queue
per test, a scripted model server speaking the real wire formats, and worker
factories wired exactly like production (same activities, same converter).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.artifacts import ArtifactStore
from activities.models.config import ModelConfig, ModelProfile
from runtime import converter
from testing.scripted import ScriptedServer
from workers.orchestrator import build_worker
from workflows.search_attributes import ALL_KEYS

BIN = Path(sys.executable).parent


@pytest.fixture(scope="session", autouse=True)
def payload_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Large payloads go to a session temp dir, never to ~/.perdure. Set in the
    environment, so workers and CLI subprocesses started by tests use the same one."""
    directory = tmp_path_factory.mktemp("payloads")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(converter.STORE_ENV, f"disk:{directory}")
        patch.delenv(converter.THRESHOLD_ENV, raising=False)
        yield directory


@pytest_asyncio.fixture(scope="session")
async def env(payload_store: Path) -> AsyncIterator[WorkflowEnvironment]:
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        search_attributes=ALL_KEYS,
        data_converter=converter.data_converter(),
        dev_server_log_level="error",
    )
    try:
        yield environment
    finally:
        await environment.shutdown()


@pytest_asyncio.fixture(scope="session")
async def ts_env(payload_store: Path) -> AsyncIterator[WorkflowEnvironment]:
    """A dev server with per-workflow time skipping (SDK v2, experimental): idle
    workflows jump straight to their next timer, and custom search attributes work."""
    environment = await WorkflowEnvironment.start_time_skipping_v2(
        dev_server_existing_path=str(BIN / "temporal"),
        search_attributes=ALL_KEYS,
        data_converter=converter.data_converter(),
        dev_server_log_level="error",
        dev_server_extra_args=["--dynamic-config-value", "frontend.WorkflowTimeSkippingEnabled=true"],
    )
    try:
        yield environment
    finally:
        await environment.shutdown()


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    root.mkdir()
    return root


@pytest.fixture
def scripted() -> Iterator:
    """Factory: start a scripted model server for a script dict; stopped after the test."""
    servers: list[ScriptedServer] = []

    def start(script: dict) -> ScriptedServer:
        server = ScriptedServer(script)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def openai_profile(server: ScriptedServer, name: str = "test") -> ModelProfile:
    return ModelProfile(
        name=name,
        provider="openai",
        model="scripted-gpt",
        base_url=server.openai_base_url,
        api_key_env=None,
        price_input_per_mtok=1.0,
        price_output_per_mtok=2.0,
    )


def anthropic_profile(server: ScriptedServer, name: str = "test") -> ModelProfile:
    return ModelProfile(
        name=name,
        provider="anthropic",
        model="scripted-claude",
        base_url=server.anthropic_base_url,
        api_key_env=None,
        price_input_per_mtok=3.0,
        price_output_per_mtok=15.0,
    )


@asynccontextmanager
async def running_worker(
    env: WorkflowEnvironment, task_queue: str, store: ArtifactStore, *profiles: ModelProfile
) -> AsyncIterator[Worker]:
    config = ModelConfig(profiles={p.name: p for p in profiles})
    worker = build_worker(env.client, task_queue=task_queue, store=store, model_config=config)
    async with worker:
        yield worker


def new_goal_id(prefix: str = "goal") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
