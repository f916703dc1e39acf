"""The golden histories under tests/histories/ and the workflows that replay them:
shared by the replay tests and by the tests that replay them under other settings
(encryption on). Not a test module."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowHistory

from workers.capabilities import CapabilitiesWorkflow
from workflows.device_registry import DeviceRegistryWorkflow
from workflows.goal import GoalWorkflow
from workflows.router import RouterWorkflow
from workflows.watchdog import WatchdogWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
WORKFLOWS = [GoalWorkflow, WatchdogWorkflow, CapabilitiesWorkflow, DeviceRegistryWorkflow, RouterWorkflow]


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text(encoding="utf-8"))
