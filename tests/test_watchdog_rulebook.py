"""The watchdog's rule book: rules a maintainer sets with `perdure watchdog set` are
durable state (a file beside its memory), versioned with who and when, and no worker
start resets them; the next run judges by them. Through the CLI and a real server.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from typer.testing import CliRunner

from perdure.activities.watchdog.watchdog_memory import load_rules, rules_path
from perdure.starters.cli import app
from perdure.workers import watchdog_schedule
from perdure.workflows.watchdog.watchdog_contracts import WatchdogInput, WatchdogResult, WatchdogRules
from perdure.workflows.watchdog.watchdog_rules import effective_rules
from perdure.workflows.watchdog.watchdog_workflow import WatchdogWorkflow
from tests.builders import STEP_REPLY, gate, openai_profile
from tests.helpers import running_worker, start, statuses, wait_until


def cli(home, queue: str, *args: str, user: str = "alice"):
    env = {"PERDURE_HOME": str(home), "PERDURE_TASK_QUEUE": queue, "PERDURE_USER": user, "COLUMNS": "200"}
    return CliRunner().invoke(app, ["watchdog", *args], env=env)


async def watchdog_run(env, task_queue: str, as_of: datetime) -> WatchdogResult:
    # The schedule's own input: default rules, as every worker start writes it.
    return await env.client.execute_workflow(
        WatchdogWorkflow.run,
        WatchdogInput(task_queue=task_queue, as_of=as_of),
        id=f"wd-test-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
    )


@pytest.mark.parametrize(
    ("assignment", "said"),
    [
        (["bogus=1"], "unknown rule 'bogus'"),
        (["stall_after_s=soon"], "stall_after_s=soon: input should be a valid number"),
        (["failing_attempts=1"], "failing_attempts=1: input should be greater than or equal to 2"),
        (["looping_rung=2.5"], "looping_rung=2.5: input should be a valid integer"),
        (["stall_after_s"], "expected rule=value"),
        (["stall_after_s=60", "--for", "team=x"], "--for takes tag=NAME or goal=ID"),
    ],
)
def test_a_bad_rule_change_is_one_line_exit_2_and_changes_nothing(tmp_path, assignment, said):
    result = cli(tmp_path, "q", "set", *assignment)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and said in result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1
    assert not rules_path(tmp_path, "q").exists()


def test_rules_are_versioned_with_who_changed_what_and_when(tmp_path):
    assert cli(tmp_path, "q", "set", "stall_after_s=3600", "--for", "tag=nightly").exit_code == 0
    changed = cli(tmp_path, "q", "set", "failing_attempts=4", "escalate_after=1", user="bob")
    assert changed.exit_code == 0
    assert "v2 · all · failing_attempts: default -> 4 · by bob" in changed.output
    assert cli(tmp_path, "q", "set", "stall_after_s=default", "--for", "tag=nightly").exit_code == 0
    book, note = load_rules(rules_path(tmp_path, "q"))
    assert note is None and book.version == 4
    assert [(c.version, c.user, c.scope, c.rule, c.old, c.new) for c in book.history] == [
        (1, "alice", "tag=nightly", "stall_after_s", None, 3600.0),
        (2, "bob", "all", "failing_attempts", None, 4),
        (3, "bob", "all", "escalate_after", None, 1.0),
        (4, "alice", "tag=nightly", "stall_after_s", 3600.0, None),
    ]
    assert book.scopes == {"all": {"failing_attempts": 4, "escalate_after": 1.0}}
    listed = cli(tmp_path, "q", "rules")
    assert listed.exit_code == 0 and "version 4" in listed.output
    assert "│ 2       │" in listed.output and "bob" in listed.output and "tag=nightly" in listed.output


def test_a_goals_rules_overlay_all_then_its_tag_then_its_own(tmp_path):
    for args in (
        ["stall_after_s=600"],
        ["stall_after_s=3600", "--for", "tag=nightly"],
        ["stall_after_s=60", "--for", "goal=nightly-7"],
    ):
        assert cli(tmp_path, "q", "set", *args).exit_code == 0
    book, _ = load_rules(rules_path(tmp_path, "q"))
    base = WatchdogRules()
    assert effective_rules(base, book, "review-1").stall_after_s == 600
    assert effective_rules(base, book, "nightly-3").stall_after_s == 3600
    assert effective_rules(base, book, "nightly-7").stall_after_s == 60
    assert effective_rules(base, book, "nightlyx").stall_after_s == 600


@pytest.mark.slow
async def test_a_rule_set_by_a_maintainer_survives_a_worker_restart_and_judges_the_next_run(
    env, task_queue, store, workspace, scripted, tmp_path
):
    server = scripted(STEP_REPLY)
    home = store.root.parent
    async with running_worker(env, task_queue, store, openai_profile(server)):
        # Replay-safe: the gate cut by the restart runs again on the next worker instead of asking
        # a person whether it ran (which, since lost workers are noticed in ~2 s, could come
        # before the second judgement, and a goal waiting on a person is not stalled).
        handle = await start(env, task_queue, workspace, [{**gate(), "replay": "safe"}])  # stall threshold: 30 min
        snapshot = await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
        t0 = snapshot.last_progress_at
        before = await watchdog_run(env, task_queue, t0 + timedelta(seconds=61))
        assert before.counts == {"healthy": 1} and before.sent == []

    assert cli(home, task_queue, "set", "stall_after_s=60", "--for", f"goal={handle.id}").exit_code == 0
    # A worker starting again writes the schedule with its default input, and a new worker judges.
    ensured = await watchdog_schedule.ensure_watchdog_schedule(env.client, timedelta(hours=1), task_queue)
    schedule = env.client.get_schedule_handle(ensured.schedule_id)
    await schedule.pause(note="this test runs the watchdog itself")
    try:
        async with running_worker(env, task_queue, store, openai_profile(server)):
            after = await watchdog_run(env, task_queue, t0 + timedelta(seconds=61))
            [finding] = [f for f in after.findings if f.kind == "stalled"]
            assert finding.goal_id == handle.id, after.findings
            [nudge] = after.sent
            assert nudge.startswith(f"wd-{handle.id}-stalled-nudge-")
            assert "(threshold 60 s)" in finding.detail
    finally:
        await schedule.delete()
        await handle.terminate("test over")  # how it ends is not the point
    assert load_rules(rules_path(home, task_queue))[0].scopes == {f"goal={handle.id}": {"stall_after_s": 60.0}}
