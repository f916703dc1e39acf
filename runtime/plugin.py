"""The one wiring object: clients, workers, replayers and test environments get
perdure's data converter and workflow sandbox from `PerdurePlugin`, so what one
side writes the others read, and a replay runs workflow code as the worker did.

A `temporalio.plugin.SimplePlugin`. Given to `Client.connect` (or to `Client(...)`,
or to `WorkflowEnvironment.start_local` / `start_time_skipping*`, which connect
their client with it) it sets the client's converter; every `Worker` built on that
client applies it too, because the SDK hands a client's worker plugins to its
workers (so never pass it to `Worker` as well: it would run twice). Given to a
`Replayer` it sets the replayer's converter and sandbox. perdure has no
interceptors; ones that every side must share belong here.

Workflows and activities are not in it: `workers/orchestrator.build_worker`
registers the production set, and replay tests choose their own workflow classes.

Building one builds the converter (runtime/converter.py): it reads the
payload-store and payload-key environment (and the key file it names) and
touches neither the store nor the network.
"""

from __future__ import annotations

import dataclasses

from temporalio.plugin import SimplePlugin
from temporalio.worker import WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from perdure.runtime.converter import data_converter

PLUGIN_NAME = "perdure"

# perdure's workflow code, passed through the sandbox instead of re-imported for
# every workflow run. The SDK re-imports a workflow's own file (and whatever it
# imports without `imports_passed_through`) into a fresh sandbox per run so that
# module-level state cannot leak between runs: for the goal workflow that is
# ~90 KB more per cached run and, where no bytecode cache is written
# (PYTHONDONTWRITEBYTECODE), ~10 ms to compile workflows/goal/goal_workflow.py again
# for every run started or replayed. These modules hold no mutable module state:
# constants only, and `perdure.workflows.shared.retries.with_attempts`, a pure cache of pydantic
# classes (tests/test_sandbox_passthrough.py checks a replay of every golden
# history leaves every module's values as they were). The collaborators were
# already passed through one import at a time. Runtime restrictions on builtins
# still apply; determinism is what the golden histories check, and
# tests/test_workflow_code_sources.py scans these modules for the clock, randomness,
# the environment and the disk, which the sandbox no longer stops at run time.
# The built-in tools' declarations (perdure.activities.tools.catalogue) are workflow code
# too: the goal validates their arguments and makes their effect keys itself; each of
# their modules is pure at import (its worker-side code is imported when it runs).
WORKFLOW_MODULES = (
    "perdure.workflows",
    "perdure.workers.worker_capabilities",
    "perdure.activities.tools.catalogue",
)


def passing_workflow_modules_through(runner: WorkflowRunner | None) -> WorkflowRunner:
    """The sandboxed runner with perdure's workflow modules passed through; any other
    runner (a test's unsandboxed one) as it was."""
    if runner is None:
        runner = SandboxedWorkflowRunner()
    if not isinstance(runner, SandboxedWorkflowRunner):
        return runner
    restrictions = runner.restrictions.with_passthrough_modules(*WORKFLOW_MODULES)
    return dataclasses.replace(runner, restrictions=restrictions)


class PerdurePlugin(SimplePlugin):
    def __init__(self, *, payload_store: bool = True) -> None:
        """`payload_store=False`: a device daemon's client (runtime/converter.py)."""
        super().__init__(
            PLUGIN_NAME,
            data_converter=data_converter(payload_store=payload_store),
            workflow_runner=passing_workflow_modules_through,
        )
