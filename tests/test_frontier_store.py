"""A large goal's past when the artifact store misbehaves, and at its run boundaries: a store
that fails keeps the steps in the carried state, a chunk that cannot be read parks the goal
saying what to do (a resume tries again), an update that arrives while the run stores its
steps at a boundary gets its receipt, and a report never tells a step twice. Measured from
outside: the goal's result, its status, its receipts and its history."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError

from perdure.activities.artifacts import DiskArtifactStore
from perdure.starters.client.plan_upload import with_stored_plan
from perdure.workflows.goal import past as past_module
from perdure.workflows.goal.contracts.messages import Abort, Answer, Resume, Rewind
from perdure.workflows.goal.contracts.past_chunks import PastChunk
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.rules import frontier
from perdure.workflows.shared.contracts import ArtifactRef
from tests.builders import gate, spec
from tests.frontier_rig import (
    WIDTH,
    carried_inputs,
    chains,
    gated_reads,
    reads_goal,
    rewind_a_stored_read_and_finish,
    start_large,
    until_the_gate_waits,
)
from tests.helpers import goal_result, run_goal, running_worker, submit, wait_until


class FlakyStore(DiskArtifactStore):
    """The disk store, with chunks of settled steps written slowly (`write_delay_s`) or not at
    all (`refuse_writes`), as a slow or full disk would."""

    write_delay_s = 0.0
    refuse_writes = False

    def put_text(self, text: str, media_type: str = "text/plain") -> ArtifactRef:
        if media_type == "application/json" and text.startswith('{"nodes":'):
            if self.refuse_writes:
                raise OSError(28, "No space left on device")
            time.sleep(self.write_delay_s)
        return super().put_text(text, media_type)

    def move_aside(self, refs: list[ArtifactRef], aside: Path) -> None:
        aside.mkdir(exist_ok=True)
        for ref in refs:
            shutil.move(self._location(ref.digest), aside / ref.digest)

    def put_back(self, refs: list[ArtifactRef], aside: Path) -> None:
        for ref in refs:
            shutil.move(aside / ref.digest, self._location(ref.digest))


@pytest.fixture
def flaky(tmp_path: Path) -> FlakyStore:
    return FlakyStore(tmp_path / "artifacts")


@pytest.fixture
def quick_backoff(monkeypatch):
    """A chunk read is tried again after a tenth of a second, twice, then the goal parks."""
    backoff = (timedelta(milliseconds=100), timedelta(milliseconds=100))
    # raising=False: the code before this fix had no READ_BACKOFF (a run on it shows what it did).
    monkeypatch.setattr(past_module, "READ_BACKOFF", backoff, raising=False)


def stored_steps(store: DiskArtifactStore, result) -> list:
    return [n for ref in result.past for n in PastChunk.model_validate_json(store.get_text(ref)).nodes]


@pytest.mark.slow
async def test_a_store_that_fails_keeps_the_settled_steps_in_the_carried_state_and_the_goal_goes_on(
    env, task_queue, flaky, workspace
):
    """1,200 reads, a new run every 300 settled; the artifact store refuses every chunk of
    steps (a full disk). Each boundary's store fails: the steps are carried as they are and
    the goal finishes with every output (before: the failed store failed the workflow, with
    no report)."""
    flaky.refuse_writes = True
    goal = reads_goal(workspace, 120, continue_as_new_after_nodes=300)
    async with running_worker(env, task_queue, flaky):
        handle, result = await run_goal(env, task_queue, goal, as_started=True)
    assert result.outcome == "succeeded", result.excerpt
    assert result.past == [] and len(result.outputs) == WIDTH * 120
    carried = await carried_inputs(handle)
    assert len(carried) >= 3
    assert all(json.loads(c.state or "{}").get("past") is None for c in carried)
    said = [d.text for d in result.decisions.recent if "stay in the goal's state" in d.text]
    assert said and "the artifact store did not take the chunk: [Errno 28] No space left on device" in said[0], said


@pytest.mark.slow
async def test_a_plan_whose_chunk_is_missing_parks_the_goal_saying_what_to_do_and_a_resume_runs_it(
    env, task_queue, flaky, workspace, tmp_path, quick_backoff
):
    """A plan file of 1,100 reads started by reference; its chunk files are moved out of the
    artifact store before the goal starts. The goal reads them again twice, then parks saying
    which chunk could not be read and what to do; put back and resumed, it runs to the end."""
    started = await with_stored_plan(reads_goal(workspace, 110), flaky)
    chunk_refs = started.stored_plan.chunks
    flaky.move_aside(chunk_refs, tmp_path / "aside")
    async with running_worker(env, task_queue, flaky):
        handle, _ = await start_large(env, task_queue, started)
        parked = await wait_until(handle, lambda snap: snap.parked, timeout_s=60)
        reason = parked.pause_reason or ""
        assert "the goal's plan could not be read: chunk 1 of 1" in reason, reason
        assert "is not in the artifact store" in reason and "(ChunkMissing)" in reason, reason
        assert "then resume the goal (`perdure resume`)" in reason, reason
        flaky.put_back(chunk_refs, tmp_path / "aside")
        receipt = await submit(handle, Resume(request_id="r1"))
        assert receipt.status == "applied", receipt
        result = await goal_result(handle)
    assert result.outcome == "succeeded", result.excerpt
    assert len(result.outputs) + len(stored_steps(flaky, result)) == WIDTH * 110


@pytest.mark.slow
async def test_an_abort_with_rollback_while_parked_on_an_unreadable_plan_ends_the_goal_aborted_with_nothing_run(
    env, task_queue, flaky, workspace, tmp_path, quick_backoff
):
    """The plan's chunks are gone when the goal starts: it parks; an abort asking for a
    rollback ends it at once, aborted, the abort achieved with nothing running or to undo,
    nothing of the plan run. (The rollback of an earlier run's effects on this path is not
    exercised here: that needs a write, a run boundary and then the chunks gone.)"""
    started = await with_stored_plan(reads_goal(workspace, 110), flaky)
    flaky.move_aside(started.stored_plan.chunks, tmp_path / "aside")
    async with running_worker(env, task_queue, flaky):
        handle, _ = await start_large(env, task_queue, started)
        await wait_until(handle, lambda snap: snap.parked, timeout_s=60)
        receipt = await submit(handle, Abort(request_id="a1", reason="wrong plan", rollback=True))
        assert receipt.status == "applied", receipt
        result = await asyncio.wait_for(goal_result(handle), timeout=60)
        snap = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "aborted", result.excerpt
    assert result.outputs == {} and result.past == []
    assert snap.abort is not None and snap.abort.stage == "achieved" and snap.abort.rollback
    assert snap.abort.running == [] and snap.abort.to_undo == [] and snap.abort.undone == []


@pytest.mark.slow
async def test_stored_steps_that_cannot_be_read_back_park_the_goal_and_the_rewind_is_refused_saying_why(
    env, task_queue, flaky, workspace, tmp_path, quick_backoff
):
    """1,200 reads and a gate, a new run every 300 settled: most reads are stored when the gate
    waits. Their chunks are moved out of the store; a rewind of a stored step needs them back:
    the goal reads them again twice, parks saying why, and the rewind's receipt says it was not
    applied. Chunks back, resumed, the rewind sent again applies and the goal finishes."""
    depth = 120
    async with running_worker(env, task_queue, flaky):
        handle, latest = await start_large(env, task_queue, gated_reads(workspace, depth))
        await until_the_gate_waits(latest)
        carried = (await carried_inputs(handle))[-1]
        chunk_refs = [ArtifactRef.model_validate(r) for r in json.loads(carried.state or "{}")["past"]["chunks"]]
        flaky.move_aside(chunk_refs, tmp_path / "aside")
        refused = await submit(latest, Rewind(request_id="w1", node="c3-0010", why="read it again"))
        assert refused.status == "rejected", refused
        assert "not applied: the goal's stored steps could not be read" in refused.note, refused.note
        snap = await latest.query(GoalWorkflow.progress)
        assert snap.parked and "Put the chunk back in the artifact store" in (snap.pause_reason or "")
        flaky.put_back(chunk_refs, tmp_path / "aside")
        assert (await submit(latest, Resume(request_id="r1"))).status == "applied"
        result = await rewind_a_stored_read_and_finish(handle, latest, workspace, depth, "w2")
    assert result.outcome == "succeeded", result.excerpt


@pytest.mark.slow
async def test_an_update_that_arrives_while_a_run_stores_its_steps_at_the_boundary_gets_its_receipt(
    env, task_queue, flaky, workspace, monkeypatch
):
    """1,200 reads and a gate after them, a new run every 400 settled, chunks of 100 steps
    written slowly (1 s each): each boundary stores its steps over seconds, in workflow tasks
    of their own. A message is sent every 0.1 s until the reads are done (an answer to no
    question: rejected at its turn). Every one gets a receipt (before: one that arrived while
    the boundary stored steps was cut off by the new run, its handler never finished)."""
    monkeypatch.setattr(frontier, "PAST_CHUNK_NODES", 100)
    flaky.write_delay_s = 1.0
    depth = 120
    goal = spec(
        workspace,
        plan={"steps": [*chains(workspace, WIDTH, depth), gate([f"c{c}-{depth - 1:04d}" for c in range(WIDTH)])]},
        drift_every=0,
        allowed_tools=["read_file", "run_command"],
        continue_as_new_after_nodes=400,
    )
    async with running_worker(env, task_queue, flaky):
        handle, latest = await start_large(env, task_queue, goal)
        receipts, failures = [], []

        async def one(i: int) -> None:
            try:
                message = Answer(request_id=f"a{i}", question_id="q-none", choice="yes")
                receipts.append(await asyncio.wait_for(submit(latest, message), 60))
            except (WorkflowUpdateFailedError, RPCError, TimeoutError) as err:
                failures.append(f"a{i}: {type(err).__name__}: {err}: {getattr(err, 'cause', None)}")

        sent: list[asyncio.Future] = []
        reads_done = asyncio.Event()

        async def keep_sending() -> None:
            while not reads_done.is_set():
                # Temporal takes at most 10 updates in flight per workflow: 4 here.
                if sum(not f.done() for f in sent) < 4:
                    sent.append(asyncio.ensure_future(one(len(sent))))
                await asyncio.sleep(0.1)

        sender = asyncio.ensure_future(keep_sending())
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:  # a query that reaches a run as it continues as new is refused: asked again
                if (await latest.query(GoalWorkflow.progress)).counts.get("succeeded", 0) >= WIDTH * depth:
                    break
            except RPCError:
                pass
            await asyncio.sleep(0.2)
        reads_done.set()
        await sender
        await asyncio.gather(*sent)
        (workspace / "GO").write_text("go\n")
        result = await goal_result(handle)
    assert result.outcome == "succeeded", result.excerpt
    assert not failures, failures[:5]
    assert len(receipts) == len(sent) >= 10
    assert all(r.status == "rejected" for r in receipts)
    assert len(await carried_inputs(handle)) >= 2


@pytest.mark.slow
async def test_a_store_pass_in_flight_when_the_goal_ends_is_finished_before_the_report(
    env, task_queue, flaky, workspace, monkeypatch
):
    """1,100 reads in one run, chunks of 100 written slowly (1 s each): when the last read
    settles a store pass is still writing. The report waits for it: no step is both in the
    result's outputs and in a stored chunk, and no name is repeated in failed_steps."""
    monkeypatch.setattr(frontier, "PAST_CHUNK_NODES", 100)
    flaky.write_delay_s = 1.0
    goal = reads_goal(workspace, 110, continue_as_new_after_nodes=5_000)
    async with running_worker(env, task_queue, flaky):
        _, result = await run_goal(env, task_queue, goal, as_started=True)
    assert result.outcome == "succeeded", result.excerpt
    stored = stored_steps(flaky, result)
    assert stored, "nothing was stored: the test did not reach its point"
    assert {n.name for n in stored}.isdisjoint(result.outputs)
    assert len(stored) + len(result.outputs) == WIDTH * 110
