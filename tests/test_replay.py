"""Determinism: every golden history under tests/histories/ replays against the
current workflow code, and a changed workflow is caught as nondeterministic.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from perdure.runtime.plugin import PerdurePlugin
from perdure.workers.worker_capabilities import CAPABILITIES_WORKFLOW
from perdure.workflows.devices.device_contracts import DEVICE_REGISTRY_WORKFLOW
from perdure.workflows.goal.contracts.goal_contracts import GOAL_WORKFLOW, Activities, GoalResult
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.offers.worker_offers import WORKER_OFFERS_WORKFLOW
from perdure.workflows.quota.quota_workflow import QUOTA_WORKFLOW
from perdure.workflows.router.router_contracts import ROUTER_WORKFLOW
from perdure.workflows.watchdog.watchdog_contracts import WATCHDOG_WORKFLOW
from tests import goldens
from tests.goldens import HISTORIES, WORKFLOWS, load


def test_there_is_a_golden_history_per_workflow_type():
    recorded = {load(p).events[0].workflow_execution_started_event_attributes.workflow_type.name for p in HISTORIES}
    types = {
        *(GOAL_WORKFLOW, WATCHDOG_WORKFLOW, CAPABILITIES_WORKFLOW, DEVICE_REGISTRY_WORKFLOW, ROUTER_WORKFLOW),
        *(WORKER_OFFERS_WORKFLOW, QUOTA_WORKFLOW),
    }
    assert types <= recorded
    # Every workflow type the worker registers, so a new one cannot go without a golden.
    assert {w.__temporal_workflow_definition.name for w in WORKFLOWS} <= recorded


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
@pytest.mark.slow
async def test_golden_history_replays(path: Path):
    await goldens.replayer().replay_workflow(load(path))


@pytest.mark.parametrize("signals_last", [True, False], ids=["signals-last", "signals-first"])
@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
@pytest.mark.slow
async def test_golden_history_replays_with_its_activations_split(path: Path, signals_last: bool):
    # As a worker that had not cached the run would see it: each job alone, the earlier ones at
    # the time of the task before (tests/test_activation_grouping.py says why this matters).
    with goldens.activations_split(signals_last=signals_last, stale_now=True):
        await goldens.replayer().replay_workflow(load(path))


@workflow.defn(name=GOAL_WORKFLOW)
class GoalWorkflowThatReportsFirst:
    """A plausible edit: someone moves the report before planning."""

    @workflow.run
    async def run(self, input: GoalInput) -> GoalResult:
        await workflow.execute_activity(Activities.WRITE_REPORT, {}, start_to_close_timeout=timedelta(seconds=5))
        raise AssertionError("unreachable in replay")


async def test_changed_workflow_is_caught_as_nondeterministic():
    golden = next(
        p
        for p in HISTORIES
        if load(p).events[0].workflow_execution_started_event_attributes.workflow_type.name == GOAL_WORKFLOW
    )
    replayer = Replayer(workflows=[GoalWorkflowThatReportsFirst], plugins=[PerdurePlugin()])
    result = await replayer.replay_workflow(load(golden), raise_on_replay_failure=False)
    assert isinstance(result.replay_failure, NondeterminismError)
