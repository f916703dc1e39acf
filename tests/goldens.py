"""The golden histories under tests/histories/ and the workflows that replay them:
shared by the replay tests and by the tests that replay them under other settings
(encryption on). Not a test module."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def activations_split(signals_last: bool = True, stale_now: bool = False) -> Iterator[list[int]]:
    """Replay as if every activation of several jobs had come as one activation per job,
    resolutions first and signals and updates last (or first): what Temporal's core does
    when a query answered by a worker that had not cached the run applied the events that
    arrived since the last workflow task, and the task that followed brought the rest. A
    workflow whose commands depend on that grouping fails its replay wherever its history
    was made the other way. Yields the history lengths at which an activation was split.

    `stale_now`: every part but the last sees the time of the activation before (the query's
    replay knows no later workflow task), as it was in the live run that failed; the last
    part sees the task's own time.

    Patches the SDK's private `_WorkflowInstanceImpl.activate` (the only place the
    grouping can be chosen in a replay): a rename there fails this loudly, never silently."""
    from google.protobuf.timestamp_pb2 import Timestamp
    from temporalio.bridge.proto.workflow_activation import WorkflowActivation
    from temporalio.worker import _workflow_instance

    cls = _workflow_instance._WorkflowInstanceImpl
    activate = cls.activate
    split: list[int] = []
    times: dict[int, Timestamp] = {}  # each run's last activation time (by instance)

    def one_job_at_a_time(self, act: WorkflowActivation):
        jobs = list(act.jobs)
        kinds = {job.WhichOneof("variant") for job in jobs}
        before = times.get(id(self))
        if act.HasField("timestamp"):
            times[id(self)] = act.timestamp
        if len(jobs) < 2 or kinds & {"initialize_workflow", "query_workflow", "remove_from_cache"}:
            return activate(self, act)
        messages = [j for j in jobs if j.WhichOneof("variant") in ("signal_workflow", "do_update")]
        others = [j for j in jobs if j not in messages]
        order = others + messages if signals_last else messages + others
        split.append(act.history_length)
        completion = None
        for n, job in enumerate(order):
            part = WorkflowActivation()
            part.CopyFrom(act)
            del part.jobs[:]
            part.jobs.append(job)
            if stale_now and before is not None and n < len(order) - 1:
                part.timestamp.CopyFrom(before)
            done = activate(self, part)
            if completion is None:
                completion = done
            elif done.HasField("failed"):
                return done
            else:
                completion.successful.commands.extend(done.successful.commands)
        return completion

    cls.activate = one_job_at_a_time
    try:
        yield split
    finally:
        cls.activate = activate
