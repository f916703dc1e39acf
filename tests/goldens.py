"""The golden histories under tests/histories/ and the workflows that replay them:
shared by the replay tests and by the tests that replay them under other settings
(encryption on). Not a test module."""

from __future__ import annotations

import gzip
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from perdure.workers.workflow_types import ORCHESTRATOR_WORKFLOWS

# A history whose payloads repeat itself is kept gzipped (`NAME.json.gz`).
HISTORIES = sorted(p for p in (Path(__file__).parent / "histories").iterdir() if p.name.endswith((".json", ".json.gz")))
WORKFLOWS = ORCHESTRATOR_WORKFLOWS


def load(path: Path) -> WorkflowHistory:
    data = path.read_bytes()
    name = path.name.removesuffix(".gz").removesuffix(".json")
    return WorkflowHistory.from_json(name, (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8"))


def replayer(**options) -> Replayer:
    """A Replayer of perdure's workflows (PerdurePlugin unless `plugins` says otherwise) with
    the SDK's 2 s deadlock check off (`debug_mode`): a replay test asks whether the code makes
    the recorded commands, not how fast. On a loaded 2-core machine a cold sandbox's first
    activation of a long golden passed 2 s though the history replays, and the replay's
    eviction then retried forever and hung the test session's teardown for 300 s."""
    from perdure.runtime.plugin import PerdurePlugin

    return Replayer(**{"workflows": WORKFLOWS, "plugins": [PerdurePlugin()], "debug_mode": True, **options})
