"""Crash tests: a real `perdure worker` subprocess is SIGKILLed mid-effect or mid-model-call, a new
worker takes over, and the outside world (fake services' ledgers, a real git repository, the scripted
model server's request log) must show every intended effect exactly once.

Each goal is a plan file (no planner). Timings depend on the workflow giving remote-write tool and
model activities a heartbeat timeout (see testing/crash.py): the harness fails at once, with the
reason, when it does not.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter

import pytest

from perdure.testing.fakes import MAIL_KEY, MailAPI
from perdure.testing.repo import git, init_repo
from perdure.testing.soak import run_soak
from perdure.testing.timed_soak import run_timed_soak
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.plan import Plan
from tests.builders import spec
from tests.helpers import activity_outcomes

pytestmark = pytest.mark.process

RECIPIENTS = ["ada@example.com", "grace@example.com", "alan@example.com", "edsger@example.com", "barbara@example.com"]


@pytest.fixture
def mail(fake_service) -> MailAPI:
    # The delay after recording widens the window between "accepted" and "activity completed".
    return fake_service(MailAPI, api_key=MAIL_KEY, respond_delay_s=0.2)


def five_notices_plan() -> Plan:
    steps = []
    for i, to in enumerate(RECIPIENTS, start=1):
        step = {
            "name": f"notice-{i}",
            "kind": "tool",
            "tool": "send_email",
            "args": {
                "to": to,
                "subject": "Scheduled maintenance on Saturday",
                "body": f"Hello {to.split('@')[0].title()},\n\nThe service is down for maintenance on Saturday.",
            },
        }
        if i > 1:
            step["needs"] = [f"notice-{i - 1}"]  # one at a time, so "the fourth" is well defined
        steps.append(step)
    return Plan.model_validate({"steps": steps})


async def test_five_notices_killed_after_the_fourth_was_accepted(crash_rig, mail, tmp_path):
    rig = crash_rig(mail=mail)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    worker = rig.start_worker(fault="after_effect:send_email:4")
    handle = await rig.start_goal(
        spec(workspace, goal="Send the maintenance notice", plan=five_notices_plan(), allowed_tools=["send_email"])
    )

    await rig.wait_killed(worker)
    assert "perdure fault: SIGKILL at after_effect:send_email:4" in worker.log_tail()
    accepted = [m["to"][0] for m in mail.ledger()]
    assert accepted == RECIPIENTS[:4], "the mail API accepted the fourth before the kill"

    await rig.after_kill(handle)
    rig.start_worker()
    result = await rig.result(handle)

    ledger = mail.ledger()
    assert Counter(m["to"][0] for m in ledger) == Counter(RECIPIENTS), ledger  # five, one each
    assert len({m["message_id_header"] for m in ledger}) == 5
    assert result.outcome == "succeeded", result.excerpt
    report = rig.store.get_text(result.report)
    for i, to in enumerate(RECIPIENTS, start=1):
        assert f"| notice-{i} | tool | succeeded |" in report
        assert f"sent 'Scheduled maintenance on Saturday' to {to}" in report
    # The fourth was re-sent under the same key and the API answered from its idempotency store
    # (or its receipt heartbeat had arrived and nothing was sent); never a second message.
    assert mail.requests in (5, 6) and mail.replays == mail.requests - 5
    scheduled, completed, attempts = activity_outcomes(await handle.fetch_history(), Activities.RUN_TOOL)
    assert (scheduled, completed) == (5, 5) and sorted(attempts) == [1, 1, 1, 1, 2]


async def test_git_commit_killed_after_the_commit_commits_once(crash_rig, tmp_path):
    rig = crash_rig()
    repo = tmp_path / "repo"
    init_repo(repo)
    plan = Plan.model_validate(
        {
            "steps": [
                {"name": "write", "kind": "tool", "tool": "write_file", "args": {"path": "CHANGES", "content": "v2"}},
                {
                    "name": "commit",
                    "kind": "tool",
                    "tool": "git_commit",
                    "needs": ["write"],
                    "args": {"message": "Add the change log", "paths": ["CHANGES"]},
                },
            ]
        }
    )
    worker = rig.start_worker(fault="after_effect:git_commit:1")
    handle = await rig.start_goal(
        spec(repo, goal="Commit the change log", plan=plan, allowed_tools=["write_file", "git_commit"])
    )
    await rig.wait_killed(worker)
    assert git(repo, "log", "-1", "--format=%s") == "Add the change log"  # committed before the kill

    await rig.after_kill(handle)
    rig.start_worker()
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.excerpt
    assert git(repo, "log", "--format=%s").splitlines() == ["Add the change log", "initial commit"]
    trailers = git(repo, "log", "--format=%(trailers:key=Effect-Key,valueonly)").split()
    assert len(trailers) == 1 and trailers[0].startswith("fx-")
    output = rig.store.get_text(result.outputs["commit"])
    assert "found by its Effect-Key trailer" in output  # the retry looked before writing
    assert git(repo, "status", "--porcelain") == ""


async def test_model_call_killed_mid_flight_is_made_at_most_once_more(crash_rig, scripted, tmp_path):
    model = scripted(
        {
            "replies": [
                # The first request hangs long enough for the worker to die while it is in flight.
                {"when": "MIDFLIGHT", "times": 1, "content": "never delivered", "delay_s": 30},
                {"when": "MIDFLIGHT", "content": "Saturday's maintenance is announced."},
            ]
        }
    )
    rig = crash_rig(model=model)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    plan = Plan.model_validate(
        {"steps": [{"name": "announce", "kind": "llm", "prompt": "MIDFLIGHT: announce the maintenance."}]}
    )
    worker = rig.start_worker()
    handle = await rig.start_goal(spec(workspace, goal="Announce", plan=plan))

    deadline = time.monotonic() + 60
    while not any("MIDFLIGHT" in r["last_message"] for r in model.requests()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert model.requests(), f"the model call never arrived; log:\n{worker.log_tail()}"
    os.kill(worker.pid, signal.SIGKILL)  # mid-flight: the server is still holding the first request
    worker.proc.wait(timeout=10)

    await rig.after_kill(handle)
    rig.start_worker()
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.excerpt
    assert rig.store.get_text(result.outputs["announce"]) == "Saturday's maintenance is announced."
    requests = [r for r in model.requests() if "MIDFLIGHT" in r["last_message"]]
    assert len(requests) == 2  # the interrupted call, and exactly one more
    scheduled, completed, attempts = activity_outcomes(await handle.fetch_history(), Activities.GENERATE)
    assert (scheduled, completed, attempts) == (1, 1, [2])  # one completed result, from the second attempt


async def test_reduced_soak(env, tmp_path):
    """A few seeded random kills; `make soak` runs the full count."""
    started = time.monotonic()
    report = await run_soak(env.client, tmp_path, kills=3, seed=7)
    print(report.line())
    assert report.kills >= 3
    assert (report.duplicates, report.missing) == (0, 0), report.problems
    assert report.completed == report.goals
    assert report.model_extra_requests <= report.model_kills  # an interrupted call is made at most once more
    assert report.effects >= 10 * report.goals
    assert time.monotonic() - started < 120


async def test_reduced_timed_soak(env, tmp_path):
    """A goal started with `perdure start` right after a kill, its workers killed every 2-5 s;
    `make soak` runs the full count over several seeds."""
    started = time.monotonic()
    report = await run_timed_soak(env.client, tmp_path, kills=3, seed=11, goals=1)
    print(report.line(), report.kinds_text())
    assert report.kills == 3 and report.kill_kinds["start"] == 1
    assert report.problems == []  # the start among them
    assert (report.duplicates, report.missing, report.completed, report.effects) == (0, 0, 1, 10)
    assert report.model_requests_unexplained == 0
    assert time.monotonic() - started < 180
