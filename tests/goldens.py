"""The golden histories under tests/histories/ and the workflows that replay them:
shared by the replay tests and by the tests that replay them under other settings
(encryption on). Not a test module."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowHistory

from workers.workflow_types import ORCHESTRATOR_WORKFLOWS

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
WORKFLOWS = ORCHESTRATOR_WORKFLOWS


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text(encoding="utf-8"))
