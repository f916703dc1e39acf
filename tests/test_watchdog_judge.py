"""The watchdog's model judgement on a real server and the scripted model server: a
goal whose steps keep settling with no new information (healthy by the rules, since
nodes settle) is judged spinning and nudged; a clear healthy goal costs no call; a
second run in the same episode makes no new call; a malformed verdict acts on nothing
and the report says so; over its own budget the watchdog judges by rules only.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta

import pytest
from typer.testing import CliRunner

from perdure.starters.cli import app
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.watchdog.watchdog_contracts import WatchdogInput, WatchdogResult, WatchdogRules
from perdure.workflows.watchdog.watchdog_workflow import WatchdogWorkflow
from tests.builders import gate, llm, openai_profile
from tests.helpers import running_worker, start, statuses, wait_until

pytestmark = pytest.mark.slow

ONE_CALL_A_DAY = WatchdogRules(judge_calls_per_day=1, judge_profile="test")
RULES_ONLY = WatchdogRules(judge_calls_per_day=0, judge_profile="test")
SPINNING = {"verdict": "spinning", "reason": "four steps reported 'step done' and nothing else", "confidence": 0.9}


def script(verdict: str) -> dict:
    return {
        "replies": [
            {"when": "PERDURE-WATCHDOG-JUDGE", "content": verdict},
            {"when": "PERDURE-STEP", "content": "step done"},
        ]
    }


def judge_requests(server) -> list[dict]:
    return [r for r in server.requests() if r["last_message"].startswith("Goal ")]


async def watchdog_run(env, task_queue: str, as_of: datetime, rules: WatchdogRules | None = None) -> WatchdogResult:
    return await env.client.execute_workflow(
        WatchdogWorkflow.run,
        WatchdogInput(task_queue=task_queue, as_of=as_of, rules=rules or WatchdogRules(judge_profile="test")),
        id=f"wd-test-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
    )


async def spinning_and_healthy(env, task_queue, workspace):
    """A goal whose four steps settle with the same output, then waits at a gate; and one just at its gate."""
    spinning = await start(env, task_queue, workspace, [*(llm(f"s{i}") for i in range(4)), gate(["s3"])])
    healthy = await start(env, task_queue, workspace, [gate()])
    shot = await wait_until(spinning, lambda s: statuses(s)["gate"] == "running")
    await wait_until(healthy, lambda s: statuses(s)["gate"] == "running")
    return spinning, healthy, shot.last_progress_at


async def test_a_goal_settling_steps_without_new_information_is_judged_spinning_and_nudged_once(
    env, task_queue, store, workspace, scripted
):
    server = scripted(script(json.dumps(SPINNING)))
    async with running_worker(env, task_queue, store, openai_profile(server)):
        spinning, healthy, t0 = await spinning_and_healthy(env, task_queue, workspace)
        rules_only = await watchdog_run(env, task_queue, t0 + timedelta(seconds=5), RULES_ONLY)
        assert rules_only.counts == {"healthy": 2} and rules_only.sent == [] and judge_requests(server) == []
        first = await watchdog_run(env, task_queue, t0 + timedelta(seconds=5))
        # Rules alone call both healthy (their nodes settle); the model, asked once, does not.
        [asked] = judge_requests(server)
        assert spinning.id in asked["last_message"]
        [verdict] = [f for f in first.findings if f.goal_id == spinning.id]
        assert verdict.kind == "spinning" and "nothing else" in verdict.detail
        assert not [f for f in first.findings if f.goal_id == healthy.id]
        [nudge] = first.sent
        assert nudge.startswith(f"wd-{spinning.id}-spinning-nudge-")
        # The same episode: no new call, no new message.
        second = await watchdog_run(env, task_queue, t0 + timedelta(seconds=65))
        assert len(judge_requests(server)) == 1 and second.sent == []
        assert [f.kind for f in second.findings if f.goal_id == spinning.id] == ["spinning"]
        inbox = await spinning.query(GoalWorkflow.inbox)
        assert [(e.request_id, e.kind) for e in inbox.entries if e.request_id.startswith("wd-")] == [(nudge, "steer")]
        home = store.root.parent
        report = CliRunner().invoke(
            app,
            ["watchdog", "report"],
            env={"PERDURE_HOME": str(home), "PERDURE_TASK_QUEUE": task_queue, "COLUMNS": "250"},
        )
        assert report.exit_code == 0, report.output
        assert "model verdicts" in report.output and "spinning" in report.output and "90%" in report.output
        print(report.output)
        for handle in (spinning, healthy):
            await handle.terminate("test over")


async def test_a_malformed_verdict_acts_on_nothing_and_over_budget_is_rules_only(
    env, task_queue, store, workspace, scripted
):
    server = scripted(script('{"verdict": "spinning", "reason": "loops"}'))
    async with running_worker(env, task_queue, store, openai_profile(server)):
        spinning, healthy, t0 = await spinning_and_healthy(env, task_queue, workspace)
        broke = await watchdog_run(env, task_queue, t0 + timedelta(seconds=5), ONE_CALL_A_DAY)
        [finding] = [f for f in broke.findings if f.goal_id == spinning.id]
        assert finding.kind == "unjudged" and "malformed, no action taken" in finding.detail
        assert broke.sent == [] and len(judge_requests(server)) == 1
        report = CliRunner().invoke(
            app,
            ["watchdog", "report"],
            env={"PERDURE_HOME": str(store.root.parent), "PERDURE_TASK_QUEUE": task_queue, "COLUMNS": "250"},
        )
        assert "malformed" in report.output and "no action" in report.output, report.output
        # A new episode (one more informative step would start it) is simulated by forgetting
        # the verdict: the budget of one call a day is spent, so it is rules only and said so.
        from perdure.activities.watchdog.watchdog_memory import load_memory, memory_path, save_memory

        path = memory_path(store.root.parent, task_queue)
        memory, _ = load_memory(path)
        memory.verdicts = {}
        save_memory(path, memory)
        again = await watchdog_run(env, task_queue, t0 + timedelta(seconds=10), ONE_CALL_A_DAY)
        assert len(judge_requests(server)) == 1 and again.sent == []
        memory, _ = load_memory(path)
        assert memory.judge_note == "the watchdog's model budget is spent: 1 of 1 calls today"
        for handle in (spinning, healthy):
            await handle.terminate("test over")


async def test_offline_the_judge_answers_that_no_model_judged_and_nothing_is_sent(
    env, task_queue, store, workspace, scripted
):
    # No judge entry: the offline policy answers the judge (the default profile with no model key).
    server = scripted({"policy": "offline", "replies": [{"when": "PERDURE-STEP", "content": "step done"}]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        spinning, healthy, t0 = await spinning_and_healthy(env, task_queue, workspace)
        judged = await watchdog_run(env, task_queue, t0 + timedelta(seconds=5))
        [finding] = [f for f in judged.findings if f.goal_id == spinning.id]
        for handle in (spinning, healthy):
            await handle.terminate("test over")
    assert len(judge_requests(server)) == 1
    assert finding.kind == "judged_healthy", finding  # the rules' healthy stands; not "malformed"
    assert "no model judged this goal" in finding.detail and "(0%)" in finding.detail, finding.detail
    assert judged.sent == []


DRIFTING = {"verdict": "drifting", "reason": "three styling steps on a database migration", "confidence": 0.8}
OFF_TOPIC = ["The logo colours match the brand guide.", "Fonts load in 40 ms.", "A favicon was added to the site."]


async def test_a_goal_whose_conclusions_share_no_term_with_its_text_is_asked_about_and_nudged_for_drift(
    env, task_queue, store, workspace, scripted
):
    """Each step brings new information (not spinning) and nothing runs long, so only the
    drift trigger can ask: the rules alone call the goal healthy, the model calls it drifting."""
    replies = [{"when": "PERDURE-WATCHDOG-JUDGE", "content": json.dumps(DRIFTING)}]
    replies += [{"when": f"Do s{i}.", "content": text} for i, text in enumerate(OFF_TOPIC)]
    server = scripted({"replies": replies})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        steps = [*(llm(f"s{i}") for i in range(3)), gate(["s2"])]
        goal = await start(env, task_queue, workspace, steps, goal="Migrate the billing service to PostgreSQL")
        shot = await wait_until(goal, lambda s: statuses(s)["gate"] == "running")
        rules_only = await watchdog_run(env, task_queue, shot.last_progress_at + timedelta(seconds=5), RULES_ONLY)
        assert rules_only.counts == {"healthy": 1}
        judged = await watchdog_run(env, task_queue, shot.last_progress_at + timedelta(seconds=5))
        [asked] = judge_requests(server)
        assert "share no term with the goal" in asked["last_message"]
        [finding] = [f for f in judged.findings if f.goal_id == goal.id]
        assert finding.kind == "drifting" and "styling steps" in finding.detail
        [nudge] = judged.sent
        assert nudge.startswith(f"wd-{goal.id}-drifting-nudge-")
        await goal.terminate("test over")
