"""Shared fixtures, and only fixtures: one real Temporal dev server per session (and one
with time skipping), a fresh task queue, artifact store and workspace per test, and
factories for the doubles in `testing/` (scripted model servers, fake services, crash
rigs) that stop what they started after the test. Helpers are in helpers.py, test
data in builders.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import pytest_asyncio
import structlog
import uvicorn
from hypothesis import settings
from temporalio.testing import WorkflowEnvironment

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.models.scripted import ScriptedServer
from perdure.runtime import converter
from perdure.runtime import settings as settings_
from perdure.runtime.s3_client import S3Location
from perdure.starters.ui_server import build_app
from perdure.testing.crash import CrashRig
from perdure.testing.fakes import PAYMENTS_KEY, FakeService, PaymentsAPI
from perdure.testing.s3_server import S3Server
from tests.device_rig import InProcessDevice
from tests.helpers import dev_server_options, free_ports

Service = TypeVar("Service", bound=FakeService)


# Property tests check what holds, not how fast: on a loaded 2-core machine (CI, make
# test-fast's parallel workers) an example can take longer than hypothesis's 200 ms
# default deadline, which would fail a test that found nothing wrong.
settings.register_profile("perdure", deadline=None)
# `make test-fast` explores fewer examples per property (make test runs the full hundred).
settings.register_profile("fast", parent=settings.get_profile("perdure"), max_examples=20)
settings.load_profile(os.environ.get("PERDURE_HYPOTHESIS_PROFILE", "perdure"))


@pytest.fixture(scope="session", autouse=True)
def payload_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Large payloads go to a session temp dir, never to ~/.perdure. Set in the
    environment, so workers and CLI subprocesses started by tests use the same one."""
    directory = tmp_path_factory.mktemp("payloads")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(converter.STORE_ENV, f"disk:{directory}")
        patch.delenv(converter.THRESHOLD_ENV, raising=False)
        yield directory


@pytest.fixture(autouse=True)
def logging_as_it_was() -> Iterator[None]:
    """A command run in-process (`perdure device` under CliRunner) sets up the worker's
    logging for the whole process; later tests' commands would print its records (httpx's
    INFO lines) into their output. Put it back after each test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    if root.handlers != handlers or root.level != level:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.reset_defaults()


@pytest_asyncio.fixture(scope="session")
async def env(payload_store: Path) -> AsyncIterator[WorkflowEnvironment]:
    async with await WorkflowEnvironment.start_local(**dev_server_options()) as environment:
        yield environment


@pytest_asyncio.fixture(scope="session")
async def ts_env(payload_store: Path) -> AsyncIterator[WorkflowEnvironment]:
    """A dev server with per-workflow time skipping (SDK v2, experimental): idle
    workflows jump straight to their next timer, and custom search attributes work."""
    options = dev_server_options("--dynamic-config-value", "frontend.WorkflowTimeSkippingEnabled=true")
    async with await WorkflowEnvironment.start_time_skipping_v2(**options) as environment:
        yield environment


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(tmp_path: Path) -> DiskArtifactStore:
    return DiskArtifactStore(tmp_path / "artifacts")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3-compatible server (moto's, a subprocess), one per test process."""
    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log").start()
    yield server
    server.stop()


@pytest.fixture
def s3_artifacts(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Location:
    """PERDURE_ARTIFACT_STORE on a fresh bucket of `s3_server`, with the AWS variables that reach
    it, set for the test (in-process workers and the subprocesses that inherit them); a
    PERDURE_HOME of its own, so nothing is found on a shared disk by chance."""
    location = S3Location(s3_server.bucket(), "perdure/artifacts")
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(settings_.ARTIFACT_STORE_ENV, location.url)
    monkeypatch.setenv("PERDURE_HOME", str(tmp_path / "s3-home"))
    return location


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    root.mkdir()
    return root


@pytest.fixture
def scripted() -> Iterator[Callable[[dict], ScriptedServer]]:
    """Factory: start a scripted model server for a script dict; stopped after the test."""
    servers: list[ScriptedServer] = []

    def start(script: dict) -> ScriptedServer:
        server = ScriptedServer(script).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def fake_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeService]]:
    """Factory: `fake_service(MailAPI, api_key=..., respond_delay_s=...)` starts a fake service
    for this test and stops it after. The variables that point the effect tools at it
    (`worker_env()`: PERDURE_MAIL_URL, ...) are set for the test, so in-process workers and
    activities, and worker subprocesses that inherit the environment, use it."""
    services: list[FakeService] = []

    def start(kind: type[Service], **options) -> Service:
        service = kind(**options).start()
        services.append(service)
        for name, value in service.worker_env().items():
            monkeypatch.setenv(name, value)
        return service

    yield start
    for service in services:
        service.stop()


@pytest.fixture
def payments(fake_service) -> PaymentsAPI:
    """The fake payments API (its real format) for this test, its key set for the worker."""
    return fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)


@pytest.fixture
def crash_rig(env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Callable[..., CrashRig]]:
    """Factory: `crash_rig(mail=..., model=...)` is a `CrashRig` on the session's server (its
    own task queue and PERDURE_HOME); every worker process it started is killed after the test."""
    rigs: list[CrashRig] = []

    def make(**services) -> CrashRig:
        rig = CrashRig(env.client, tmp_path / f"rig{len(rigs)}", **services)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


@pytest_asyncio.fixture
async def devices(env, task_queue, tmp_path) -> AsyncIterator[Callable[..., InProcessDevice]]:
    """Factory: `devices(name, **announced)` is an in-process device on this test's queue,
    its root tmp_path/machine-NAME (the same root when asked again); stopped after the test."""
    made: list[InProcessDevice] = []

    def make(name: str, **announced) -> InProcessDevice:
        root = tmp_path / f"machine-{name}"
        root.mkdir(exist_ok=True)
        device = InProcessDevice(env, task_queue, name, root, **announced)
        made.append(device)
        return device

    yield make
    for device in made:
        await device.stop()


@pytest_asyncio.fixture
async def ui(env) -> AsyncIterator[str]:
    """`perdure ui`'s app served by uvicorn on a free port of this machine: its base URL."""
    (port,) = free_ports(1)
    server = uvicorn.Server(uvicorn.Config(build_app(env.client), host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    with contextlib.suppress(asyncio.CancelledError):
        await serving
