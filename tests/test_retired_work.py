"""Nothing that ran disappears when the plan changes: a queued follow-up whose revised
plan leaves out earlier steps keeps them (with the plan version they belonged to) in
the report, the progress query and `perdure status`, and the outcome counts them.
"""

from __future__ import annotations

import asyncio

import pytest

from perdure.activities.artifacts import ArtifactStore
from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI
from perdure.workflows.goal.contracts.messages import Queue
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, gate, llm, openai_profile
from tests.helpers import perdure_status, running_worker, start, statuses, submit, wait_until

WRITE = {"name": "save", "kind": "tool", "tool": "write_file", "args": {"path": "OUT.md", "content": "saved\n"}}
FETCH = {"name": "fetch", "kind": "tool", "tool": "read_file", "args": {"path": "missing.md"}}
USE = llm("use", ["fetch"])  # abandoned: fetch fails
# The follow-up plan keeps the gate and adds one step; the three steps above are left out.
REVISED = {"steps": [gate(), llm("extra", ["gate"])]}


@pytest.mark.slow
async def test_steps_a_follow_up_plan_leaves_out_stay_in_the_report_progress_and_outcome(
    env, task_queue, store: ArtifactStore, workspace, scripted
):
    server = scripted({"replies": [{"when": "Revise the current plan", "json": REVISED}, *STEP_REPLY["replies"]]})
    steps = [WRITE, FETCH, USE, gate()]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(
            env, task_queue, workspace, steps, allowed_tools=["write_file", "read_file", "run_command"]
        )
        await wait_until(handle, lambda s: statuses(s)["gate"] == "running" and statuses(s)["save"] == "succeeded")
        await submit(handle, Queue(request_id="q1", text="Add an extra section; the rest is no longer needed."))
        (workspace / "GO").touch()
        result = await asyncio.wait_for(handle.result(), 30)
        snapshot = await handle.query(GoalWorkflow.progress)
        status = await perdure_status(env, handle.id)

    assert (workspace / "OUT.md").read_text() == "saved\n"
    assert result.outcome == "partial"
    assert result.failed_steps == ["fetch (plan v1)", "use (plan v1)"]
    assert any(u.startswith("fetch (plan v1): read_file failed") for u in result.unfinished)
    report = store.get_text(result.report)
    earlier = report.split("## Work from earlier plan versions", 1)[1].split("\n## ", 1)[0]
    assert "| save | v1 | tool | succeeded |" in earlier
    assert "| fetch | v1 | tool | failed |" in earlier and "| use | v1 | llm | abandoned |" in earlier
    assert "### save (plan v1)" in report and "### fetch (plan v1) (failed)" in report

    assert snapshot.plan_version == 2 and statuses(snapshot) == {"gate": "succeeded", "extra": "succeeded"}
    assert [(n.name, n.status, n.plan_version) for n in snapshot.earlier] == [
        ("save", "succeeded", 1),
        ("fetch", "failed", 1),
        ("use", "abandoned", 1),
    ]
    assert "missing.md" in snapshot.earlier[1].error
    for name, state in [("save", "succeeded"), ("fetch", "failed"), ("use", "abandoned")]:
        [row] = [line for line in status.splitlines() if f" {name} (plan v1) " in line]
        assert state in row


@pytest.mark.slow
async def test_a_changed_step_keeps_its_earlier_run_and_a_good_one_does_not_spoil_success(
    env, task_queue, store, workspace, scripted
):
    changed = {"steps": [llm("first", prompt="Do first, in French."), gate()]}
    server = scripted({"replies": [{"when": "Revise the current plan", "json": changed}, *STEP_REPLY["replies"]]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, [llm("first"), gate()])
        await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
        await submit(handle, Queue(request_id="q1", text="Redo the first step in French."))
        (workspace / "GO").touch()
        result = await asyncio.wait_for(handle.result(), 30)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert [(n.name, n.status, n.plan_version) for n in snapshot.earlier] == [("first", "succeeded", 1)]
    assert statuses(snapshot) == {"first": "succeeded", "gate": "succeeded"}
    assert result.outcome == "succeeded"
    assert "| first | v1 | llm | succeeded |" in store.get_text(result.report)


@pytest.mark.slow
async def test_a_step_left_out_while_it_waits_for_a_person_closes_its_question_and_the_goal_ends(
    env, task_queue, store, workspace, scripted, fake_service
):
    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)
    pay = {"amount_cents": 700, "currency": "EUR", "recipient": "ACME GmbH", "memo": "deposit"}
    revised = {"steps": [llm("one"), llm("two", ["one"]), llm("three", ["two"])]}
    server = scripted(
        {
            "replies": [
                {"when": "PERDURE-DRIFT", "times": 1, "json": {"on_track": False, "reason": "no deposit is due"}},
                {"when": "PERDURE-DRIFT", "json": {"on_track": True, "reason": "fine"}},
                {"when": "Revise the current plan", "json": revised},
                *STEP_REPLY["replies"],
            ]
        }
    )
    steps = [{"name": "pay", "kind": "tool", "tool": "make_payment", "args": pay}, llm("one"), llm("two", ["one"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["make_payment"], drift_every=2)
        result = await asyncio.wait_for(handle.result(), 60)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert snapshot.questions == [] and payments.ledger() == []
    assert result.outcome == "partial"  # the payment was given up by the re-plan, and says so
    assert [n.name for n in snapshot.earlier] == ["pay"]
