"""A worker's death is never the failure of a step's call: attempts lost to dead workers
(their activity's attempt timed out) are scheduled again while the goal's budget allows,
each model attempt charged as possibly billed, and the goal counts them; attempts the
model or tool itself failed keep their limit (workflows/goal/lost_workers.py).

Real `perdure worker` subprocesses, SIGKILLed by a fault point while the call is in
flight, a scripted model server, a fake mail API: the checks are their request logs and
what `perdure status` and the report print.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter

import pytest
from temporalio.client import WorkflowHandle

from perdure.starters.client import goal_reads
from perdure.testing.crash import PERDURE, CrashRig
from perdure.testing.fakes import MAIL_KEY, MailAPI
from perdure.workflows.goal.contracts.goal_contracts import Activities, GoalResult
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.shared.retries import MODEL_RETRY, RETRY_BY_POLICY
from tests.builders import spec
from tests.helpers import activity_outcomes

pytestmark = [pytest.mark.process, pytest.mark.slow]

# One more death than the model activity's retry policy has attempts.
KILLS = MODEL_RETRY.maximum_attempts + 1
# How long the next kill may take: a heartbeat timeout, a worker's start, the call.
KILL_WITHIN_S = 60


def summary_then_email() -> Plan:
    return Plan.model_validate(
        {
            "steps": [
                {"name": "summary", "kind": "llm", "prompt": "LOSS: summarise the week."},
                {
                    "name": "notice",
                    "kind": "tool",
                    "tool": "send_email",
                    "needs": ["summary"],
                    "args": {"to": "ada@example.com", "subject": "Weekly summary", "body": "{{steps.summary}}"},
                },
            ]
        }
    )


async def killed_then_finished(rig: CrashRig, handle: WorkflowHandle, fault: str, kills: int) -> GoalResult:
    """`kills` workers in a row die at `fault`, each followed at once by the next (up while
    the server waits out the dead one's heartbeat timeout); then one finishes the goal."""
    ended = asyncio.create_task(goal_reads.ended(handle))
    worker = rig.start_worker(fault=fault)
    for kill in range(1, kills + 1):
        deadline = time.monotonic() + KILL_WITHIN_S
        while worker.alive() and not ended.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not ended.done(), f"the goal ended after {kill - 1} kills: {ended.result().excerpt}"
        assert not worker.alive(), f"kill {kill} did not come in {KILL_WITHIN_S}s (the step is not retried?)"
        assert worker.killed_by_sigkill(), worker.log_tail()
        worker = rig.start_worker(fault=fault if kill < kills else None)
    return await asyncio.wait_for(ended, 120)


async def test_llm_step_outlives_more_worker_deaths_than_its_retries(crash_rig, scripted, fake_service, tmp_path):
    # The reply takes 3 s: a worker dies 1.5 s into each call, while it is in flight (or, on a
    # loaded machine, while the client is still being made).
    model = scripted({"replies": [{"when": "LOSS", "content": "A quiet week.", "delay_s": 3.0}]})
    mail = fake_service(MailAPI, api_key=MAIL_KEY)
    rig = crash_rig(model=model, mail=mail)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    goal = spec(workspace, goal="Send the weekly summary", plan=summary_then_email(), allowed_tools=["send_email"])

    handle = await rig.start_goal(goal, "loss-llm-1")
    result = await killed_then_finished(rig, handle, "model_call:1+1.5", KILLS)

    assert result.outcome == "succeeded", result.excerpt
    calls = [r for r in model.requests() if "LOSS" in r["last_message"]]
    # Each killed attempt sent it at most once (a loaded machine may kill one before it
    # went out), and one more answered.
    assert 1 <= len(calls) <= KILLS + 1
    assert Counter(m["to"][0] for m in mail.ledger()) == Counter({"ada@example.com": 1})
    # The first activity used up its retry policy on dead workers; the goal scheduled another.
    scheduled, completed, _ = activity_outcomes(await handle.fetch_history(), Activities.GENERATE)
    assert (scheduled, completed) == (2, 1)

    status = subprocess.run(
        [PERDURE, "status", "loss-llm-1"],
        env={**rig.worker_env(None), "NO_COLOR": "1", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert f"{KILLS} attempt(s) lost to worker deaths" in status.stdout, status.stdout
    # Each lost model attempt may have been billed: charged at the step's estimate.
    assert f"{KILLS} failed model attempt(s) charged" in status.stdout, status.stdout
    report = rig.store.get_text(result.report)
    assert f"{KILLS} attempt(s) lost to worker deaths (summary: {KILLS})" in report, report


async def test_keyed_write_outlives_more_worker_deaths_than_its_retries(crash_rig, fake_service, tmp_path):
    mail = fake_service(MailAPI, api_key=MAIL_KEY)
    rig = crash_rig(mail=mail)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    kills = RETRY_BY_POLICY["keyed"].maximum_attempts + 1
    plan = Plan.model_validate(
        {
            "steps": [
                {
                    "name": "notice",
                    "kind": "tool",
                    "tool": "send_email",
                    "args": {"to": "ada@example.com", "subject": "Maintenance", "body": "Down on Saturday."},
                }
            ]
        }
    )
    goal = spec(workspace, goal="Send the notice", plan=plan, allowed_tools=["send_email"])
    handle = await rig.start_goal(goal, "loss-write-1")
    # Each worker dies right after the mail API accepted the email (a re-send is answered
    # from the API's idempotency store).
    result = await killed_then_finished(rig, handle, "after_effect:send_email:1", kills)

    assert result.outcome == "succeeded", result.excerpt
    assert [m["to"][0] for m in mail.ledger()] == ["ada@example.com"]  # sent once, whatever the kills
    assert mail.replays >= 1
    # Dead workers used up the first activity's attempts; the goal scheduled another. A tool's
    # attempts leave no record of why each ended: the goal counts the one it knows was lost.
    scheduled, completed, _ = activity_outcomes(await handle.fetch_history(), Activities.RUN_TOOL)
    assert (scheduled, completed) == (2, 1)
    assert result.lost_by_step == {"notice": 1}
