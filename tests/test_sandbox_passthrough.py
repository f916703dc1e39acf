"""The workflow sandbox as PerdurePlugin sets it (runtime/plugin.py): perdure's workflow
modules are passed through, so a run uses the worker's own classes instead of a copy
re-imported for every run, and nothing a run does stays behind in those modules.
"""

from __future__ import annotations

import functools
import inspect
import sys
from types import ModuleType

import pytest
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from perdure.runtime.plugin import WORKFLOW_MODULES, PerdurePlugin, passing_workflow_modules_through
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests import goldens
from tests.goldens import HISTORIES, load


async def test_a_replayed_goal_runs_the_workers_own_workflow_class(monkeypatch):
    # A class re-imported into the run's sandbox would be a fresh copy, without this wrapper.
    constructed = []
    original = GoalWorkflow.__init__

    @functools.wraps(original)  # keeps the SDK's @workflow.init marking
    def counting_init(self, *args, **kwargs):
        constructed.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(GoalWorkflow, "__init__", counting_init)
    golden = next(p for p in HISTORIES if p.stem == "goal-1.0-demo")
    await Replayer(workflows=[GoalWorkflow], plugins=[PerdurePlugin()]).replay_workflow(load(golden))
    assert len(constructed) == 1


def test_an_unsandboxed_runner_is_left_as_it_is():
    runner = UnsandboxedWorkflowRunner()
    assert passing_workflow_modules_through(runner) is runner


def module_state() -> dict[str, str]:
    """Every data value at module level, and every class attribute that is not a function,
    of the passed-through modules, as its repr (objects without one show their identity)."""
    state = {}
    for name, module in sorted(sys.modules.items()):
        if not isinstance(module, ModuleType) or not any(
            name == m or name.startswith(m + ".") for m in WORKFLOW_MODULES
        ):
            continue
        for attr, value in vars(module).items():
            if attr.startswith("__") or inspect.ismodule(value) or callable(value) and not inspect.isclass(value):
                continue
            if inspect.isclass(value):
                if value.__module__ != name:
                    continue
                for class_attr, class_value in vars(value).items():
                    if class_attr.startswith("__") or callable(class_value) or inspect.isdatadescriptor(class_value):
                        continue
                    if isinstance(class_value, (staticmethod, classmethod, property)):
                        continue
                    state[f"{name}.{attr}.{class_attr}"] = repr(class_value)
                continue
            state[f"{name}.{attr}"] = repr(value)
    return state


@pytest.mark.slow
async def test_replaying_every_golden_history_leaves_the_passed_through_modules_as_they_were():
    # Passing a module through is only safe when no run changes what another run reads from it.
    before = module_state()
    assert any(key.startswith("perdure.workflows.goal.goal_workflow.") for key in before)
    replayer = goldens.replayer()
    for path in HISTORIES:
        await replayer.replay_workflow(load(path))
    assert module_state() == before
