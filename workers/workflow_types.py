"""Every workflow type the orchestrator's queue runs: the worker registers these
(workers/orchestrator.py) and the replay tests replay golden histories of each
(tests/goldens.py). Imports workflow modules only (no activities), so a module a
workflow sandbox imports may import it."""

from __future__ import annotations

from perdure.workers.worker_capabilities import CapabilitiesWorkflow
from perdure.workflows.devices.device_registry import DeviceRegistryWorkflow
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.offers.worker_offers import WorkerOffersWorkflow
from perdure.workflows.quota.quota_workflow import QuotaWorkflow
from perdure.workflows.router.router_workflow import RouterWorkflow
from perdure.workflows.watchdog.watchdog_workflow import WatchdogWorkflow

ORCHESTRATOR_WORKFLOWS = [
    GoalWorkflow,
    WatchdogWorkflow,
    CapabilitiesWorkflow,
    DeviceRegistryWorkflow,
    RouterWorkflow,
    QuotaWorkflow,
    WorkerOffersWorkflow,
]
