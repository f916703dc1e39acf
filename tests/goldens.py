"""The golden histories under tests/histories/ and the workflows that replay them:
shared by the replay tests and by the tests that replay them under other settings
(encryption on). Not a test module."""

from __future__ import annotations

import gzip
from pathlib import Path

from temporalio.client import WorkflowHistory

from perdure.workers.workflow_types import ORCHESTRATOR_WORKFLOWS

# A history whose payloads repeat itself is kept gzipped (`NAME.json.gz`).
HISTORIES = sorted(p for p in (Path(__file__).parent / "histories").iterdir() if p.name.endswith((".json", ".json.gz")))
WORKFLOWS = ORCHESTRATOR_WORKFLOWS


def load(path: Path) -> WorkflowHistory:
    data = path.read_bytes()
    name = path.name.removesuffix(".gz").removesuffix(".json")
    return WorkflowHistory.from_json(name, (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8"))
