"""Crash soak in real time: workers SIGKILLed every 2-5 s whatever they are doing, and goals
started with `perdure start` as a worker is killed.

Where testing/soak.py aims each kill at a chosen step, this one does not look: each
worker is SIGKILLed a seeded 2-5 s after it starts polling (or earlier, at a seeded fault
point: an effect, a receipt, a model call in flight, when one is reached first), and the
next one is started at once. So the same activity may lose any number of attempts: it is
the goal's rule for lost attempts (workflows/goal/lost_workers.py), not the aim of the
kills, that keeps a step from failing. Goals (testing/soak.py's: four emails, four ledger
entries, two commits, a model call, in a seeded order) are started through the `perdure
start` command as a user does, each as a worker is killed (0-2.5 s after the command
is run: before, during or after its check of the worker, a "start kill"), and sooner
when no goal is running. Once the kills are made, one worker is left to finish. Then
every goal must have succeeded, each effect happened once, and the model call been sent
at most once per attempt its goal says was lost. Each goal's history also says how many
activity attempts the kills cut (`attempts_cut`).

`python -m tests.soak --timed` runs it; `SoakReport.line()` (testing/soak.py) is its summary.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from perdure.activities.models.scripted import ScriptedServer
from perdure.starters.client import goal_reads
from perdure.starters.client.client_errors import EndedWithoutResult
from perdure.testing.crash import PERDURE, CrashRig, WorkerProcess
from perdure.testing.fakes import MAIL_KEY, LedgerAPI, MailAPI
from perdure.testing.repo import init_repo
from perdure.testing.soak import EFFECT_POINTS, SoakReport, SoakStep, check_goal, soak_plan_steps, soak_steps
from perdure.workflows.goal.contracts.goal_contracts import GoalResult

LIFE_S = (2.0, 5.0)
"""How long a worker lives once it polls, drawn per worker."""
START_KILL_S = (0.0, 2.5)
"""How long after `perdure start` is run the worker dies (the command takes about a second to start)."""
FAULT_SHARE = 0.4
"""The share of workers also given a fault point; the timer kills them if it is not reached first."""
FAULT_TOOLS = ("send_email", "http_request", "git_commit")
SERVICE_DELAY_S = 0.5
MODEL_REPLY_S = 4.0
"""Services answer slowly, so a kill at a random time lands in a call as often as between calls;
a worker that lives 2-5 s seldom sees the model's reply, so the model step loses attempt after
attempt (six in a row failed the step before lost attempts were told from failures)."""
START_TIMEOUT_S = 120
FINISH_TIMEOUT_S = 300
"""How long the last worker has to finish every goal once the kills are made."""


@dataclass
class SoakGoal:
    number: int
    goal_id: str
    steps: list[SoakStep]
    repo: Path
    plan_file: Path
    start: asyncio.Task | None = None
    started: bool = False
    result: GoalResult | None = None


async def run_timed_soak(
    client: Client,
    root: Path,
    *,
    kills: int,
    seed: int,
    goals: int | None = None,
    say: Callable[[str], None] = lambda text: None,
) -> SoakReport:
    """`kills` kills over `goals` goals (default: one per four kills, at least three)."""
    rng = random.Random(seed)
    report = SoakReport()
    mail = MailAPI(api_key=MAIL_KEY, respond_delay_s=SERVICE_DELAY_S).start()
    ledger = LedgerAPI(respond_delay_s=SERVICE_DELAY_S).start()
    model = ScriptedServer(
        {"replies": [{"when": "SOAK-LLM", "content": "Summary: all effects done.", "delay_s": MODEL_REPLY_S}]}
    ).start()
    rig = CrashRig(client, root / "rig", mail=mail, model=model)
    count = goals or max(3, kills // 4)
    plans = [_prepare(rig, root, seed, number, rng, ledger.base_url) for number in range(1, count + 1)]
    # The kill during whose `perdure start` each goal is started (the first at the first kill).
    start_after = sorted(rng.sample(range(1, max(kills, count) + 1), count))
    start_after[0] = 1
    try:
        await _kill_and_start(rig, rng, plans, start_after, kills, report, say)
        say(f"  {report.kills} kills made ({report.kinds_text()}); one worker finishes")
        await _finish(rig, plans, report)
    finally:
        rig.close()
        for service in (mail, ledger, model):
            service.stop()
    for goal in plans:
        report.goals += 1
        check_goal(report, goal.number, goal.steps, goal.repo, goal.result, mail, ledger, model)
        outcome = goal.result.outcome if goal.result else "no result"
        lost = goal.result.lost_attempts if goal.result else 0
        say(f"goal {goal.number} ({goal.goal_id}): {outcome}, {lost} attempt(s) lost to worker deaths")
    return report


def _prepare(rig: CrashRig, root: Path, seed: int, number: int, rng: random.Random, ledger_url: str) -> SoakGoal:
    steps = soak_steps(number, rng, ledger_url)
    repo = root / f"repo-{number}"
    init_repo(repo)
    plan_file = root / f"plan-{number}.json"
    plan_file.write_text(json.dumps({"goal": f"Soak goal {number}", "steps": soak_plan_steps(steps)}))
    goal_id = f"timed-soak-{seed}-{number}-{uuid.uuid4().hex[:6]}"
    return SoakGoal(number, goal_id, steps, repo, plan_file)


async def _kill_and_start(rig, rng, plans, start_after, kills, report, say) -> None:
    """Start, let live and kill workers until `kills` kills; start each goal when it is due,
    or sooner when no goal runs (a kill of an idle worker tests nothing)."""
    worker = rig.start_worker(_fault(rng))
    while report.kills < kills:
        due = await _due(rig, plans, start_after, report.kills + 1)
        if due:
            # The command starts as the worker polls, and the worker dies START_KILL_S into
            # it: before, during or just after the command's check of the worker.
            start = functools.partial(_start_goals, rig, due)
            ended_by = await _live(worker, rng.uniform(*START_KILL_S), at_polling=start)
        else:
            ended_by = await _live(worker, rng.uniform(*LIFE_S))
        killed, report.kills = worker, report.kills + 1
        worker = rig.start_worker(_fault(rng) if report.kills < kills else None)
        kind = "start" if due else ended_by
        report.kill_kinds[kind] += 1
        fault = f", fault {killed.fault}" if killed.fault else ""
        started = f", during `perdure start` of goal {due[0].number}" if due else ""
        say(f"  kill {report.kills} ({kind}{fault}{started})")
        await _collect_starts(plans, report, wait=False, say=say)
    await _collect_starts(plans, report, wait=True, say=say)
    # A goal whose start was due after the last kill (fewer kills than goals) starts now.
    _start_goals(rig, [goal for goal in plans if goal.start is None])
    await _collect_starts(plans, report, wait=True, say=say)


def _start_goals(rig: CrashRig, goals: list[SoakGoal]) -> None:
    for goal in goals:
        goal.start = asyncio.create_task(asyncio.to_thread(_perdure_start, rig, goal))


async def _due(rig: CrashRig, plans: list[SoakGoal], start_after: list[int], kill: int) -> list[SoakGoal]:
    """The goals to start right after kill number `kill`."""
    waiting = [g for g in plans if g.start is None]
    due = [g for g, after in zip(plans, start_after, strict=True) if g.start is None and after == kill]
    if not due and waiting and not any([await _running(rig, g) for g in plans if g.start is not None]):
        due = waiting[:1]
    return due


async def _running(rig: CrashRig, goal: SoakGoal) -> bool:
    if goal.start is not None and not goal.start.done():
        return True  # its start is still under way
    try:
        description = await rig.client.get_workflow_handle(goal.goal_id).describe()
    except RPCError:
        return False  # its start was lost (a problem the start's own check reports)
    return description.status == WorkflowExecutionStatus.RUNNING


def _fault(rng: random.Random) -> str | None:
    """A fault point for the next worker, or None (the timer alone kills it)."""
    if rng.random() >= FAULT_SHARE:
        return None
    choice = rng.randrange(len(EFFECT_POINTS) + 1)
    if choice == len(EFFECT_POINTS):
        return f"model_call:1+{rng.uniform(0.1, MODEL_REPLY_S - 0.1):.2f}"
    return f"{EFFECT_POINTS[choice]}:{rng.choice(FAULT_TOOLS)}:1"


async def _live(worker: WorkerProcess, life_s: float, at_polling: Callable[[], None] = lambda: None) -> str:
    """Let the worker poll (then call `at_polling`), then live `life_s`; SIGKILL it then,
    unless its fault point did. What ended it: 'timed' or 'fault'."""
    await worker.wait_polling(timeout_s=60)
    at_polling()
    deadline = time.monotonic() + life_s
    while worker.alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    if not worker.alive():
        if not worker.killed_by_sigkill():
            raise RuntimeError(f"worker {worker.pid} exited {worker.proc.returncode}:\n{worker.log_tail()}")
        return "fault"
    worker.kill()
    return "timed"


def attempts_cut(history) -> tuple[int, int]:
    """Activity attempts that ended without a result, as history shows them: the attempts
    before an activity's last (its started event, written as it closes, has the last one's
    number), and the last itself when it timed out. The soak's services never fail a call,
    so each is an attempt a worker's death cut. And the activities that timed out: dead
    workers used up their retries (in a goal that succeeded, each was scheduled again)."""
    cut = ran_out = 0
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            cut += event.activity_task_started_event_attributes.attempt - 1
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            cut += 1
            ran_out += 1
    return cut, ran_out


def _perdure_start(rig: CrashRig, goal: SoakGoal) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PERDURE, "start", "--plan", str(goal.plan_file), "--workspace", str(goal.repo)]
        + ["--profile", "test", "--id", goal.goal_id],
        env={**rig.worker_env(None), "NO_COLOR": "1", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )


async def _collect_starts(plans: list[SoakGoal], report: SoakReport, wait: bool, say: Callable[[str], None]) -> None:
    """Read what each finished `perdure start` said; a start that failed or printed a
    traceback is a problem (and its goal, if it exists after all, is still run)."""
    for goal in plans:
        if goal.start is None or goal.started or (not wait and not goal.start.done()):
            continue
        goal.started = True
        try:
            done = await goal.start
        except subprocess.TimeoutExpired:
            report.problems.append(f"goal {goal.number}: `perdure start` did not return in {START_TIMEOUT_S}s")
            continue
        output = done.stdout + done.stderr
        said = " / ".join(line.strip() for line in output.splitlines() if line.strip() and "UI:" not in line)
        say(f"  `perdure start` of goal {goal.number}: exit {done.returncode}: {said[:300]}")
        if done.returncode != 0 or "Traceback" in output:
            report.problems.append(f"goal {goal.number}: `perdure start` exited {done.returncode}:\n{output[-1500:]}")


async def _finish(rig: CrashRig, plans: list[SoakGoal], report: SoakReport) -> None:
    """One worker, left alone, finishes every goal that was started."""
    worker = rig.start_worker()
    await worker.wait_polling(timeout_s=60)
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    for goal in plans:
        handle: WorkflowHandle = rig.client.get_workflow_handle(goal.goal_id, result_type=GoalResult)
        try:
            goal.result = await asyncio.wait_for(goal_reads.ended(handle), max(1.0, deadline - time.monotonic()))
            cut, ran_out = attempts_cut(await handle.fetch_history())
            report.attempts_cut += cut
            report.scheduled_again += ran_out
        except TimeoutError:
            report.problems.append(f"goal {goal.number}: not finished {FINISH_TIMEOUT_S}s after the last kill")
        except RPCError as err:
            report.problems.append(f"goal {goal.number}: no goal {goal.goal_id} ({err.message}): its start was lost")
        except EndedWithoutResult as err:
            report.problems.append(f"goal {goal.number}: ended without a result: {err}")
