"""Every workflow type the orchestrator's queue runs: the worker registers these
(workers/orchestrator.py) and the replay tests replay golden histories of each
(tests/goldens.py). Imports workflow modules only (no activities), so a module a
workflow sandbox imports may import it."""

from __future__ import annotations

from workers.capabilities import CapabilitiesWorkflow
from workflows.device_registry import DeviceRegistryWorkflow
from workflows.goal import GoalWorkflow
from workflows.quota import QuotaWorkflow
from workflows.router import RouterWorkflow
from workflows.watchdog import WatchdogWorkflow
from workflows.worker_offers import WorkerOffersWorkflow

ORCHESTRATOR_WORKFLOWS = [
    GoalWorkflow,
    WatchdogWorkflow,
    CapabilitiesWorkflow,
    DeviceRegistryWorkflow,
    RouterWorkflow,
    QuotaWorkflow,
    WorkerOffersWorkflow,
]
