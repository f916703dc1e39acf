"""Randomised crash soak: goals with ten remote effects each, workers SIGKILLed at seeded random points.

Each goal is one chain of steps in a seeded random order: four emails (mail API),
four ledger entries (`http_request` to the ledger API), two git commits (each
after a `write_file`) and one model call. Before each worker starts, the soak
picks a later step of the goal and a fault point in it (before the effect, right
after the service accepted it, after its receipt heartbeat, or while the model
call is in flight) and sets PERDURE_FAULT so the worker dies there; a goal takes
up to four kills, then a clean worker finishes it. Faults aim at steps after the
one in flight, so no activity is killed twice and the workflow's retry budget is
never what decides the outcome. After each goal the ledgers, the repository and
the model server's log are compared with the effects the plan intends.

`make soak` runs `python -m tests.soak` (its own dev server, 20 kills); the test
suite runs `run_soak` with a reduced count. `SoakReport.line()` is the summary both print:
`soak: kills=K effects=E duplicates=D missing=M completed=C/T`.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from perdure.activities.models.scripted import ScriptedServer
from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.starters.client.goal_reads import ended
from perdure.testing.crash import CrashRig
from perdure.testing.fakes import MAIL_KEY, LedgerAPI, MailAPI
from perdure.testing.repo import git, init_repo
from perdure.workflows.goal.contracts.goal_contracts import Activities, GoalSpec
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.shared.effects import effect_key_for

EFFECT_POINTS = ("before_effect", "after_effect", "after_receipt")
MODEL_KILL_AFTER_S = 0.3
MODEL_DELAY_S = 0.8
"""The scripted model answers after 0.8 s, so a kill 0.3 s into the call lands while it is in flight."""
GOAL_TIMEOUT_S = 240


@dataclass
class SoakStep:
    name: str
    kind: str  # "effect", "llm" or "local"
    step: dict


@dataclass
class SoakReport:
    kills: int = 0
    effects: int = 0
    duplicates: int = 0
    missing: int = 0
    completed: int = 0
    goals: int = 0
    model_kills: int = 0
    model_extra_requests: int = 0
    lost_attempts: int = 0
    model_requests_unexplained: int = 0
    # The timed soak's counts, from history (testing/timed_soak.py).
    attempts_cut: int = 0
    scheduled_again: int = 0
    kill_kinds: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def kinds_text(self) -> str:
        return ", ".join(f"{count} {kind}" for kind, count in sorted(self.kill_kinds.items()))

    def line(self) -> str:
        return (
            f"soak: kills={self.kills} effects={self.effects} duplicates={self.duplicates} "
            f"missing={self.missing} completed={self.completed}/{self.goals} lost_attempts={self.lost_attempts}"
        )


def soak_steps(goal: int, rng: random.Random, ledger_url: str) -> list[SoakStep]:
    units: list[list[SoakStep]] = []
    for i in range(1, 5):
        units.append(
            [
                SoakStep(
                    f"email-{i}",
                    "effect",
                    {
                        "tool": "send_email",
                        "args": {
                            "to": f"user{i}@soak{goal}.example.com",
                            "subject": f"Soak {goal}.{i}",
                            "body": f"Message {i} of goal {goal}.",
                        },
                    },
                )
            ]
        )
        units.append(
            [
                SoakStep(
                    f"entry-{i}",
                    "effect",
                    {
                        "tool": "http_request",
                        "args": {
                            "method": "POST",
                            "url": f"{ledger_url}/entries",
                            "body": {"ref": f"g{goal}-e{i}", "amount_cents": 100 * i},
                        },
                    },
                )
            ]
        )
    for i in range(1, 3):
        units.append(
            [
                SoakStep(
                    f"note-{i}",
                    "local",
                    {"tool": "write_file", "args": {"path": f"notes/{i}.md", "content": f"note {i} of goal {goal}\n"}},
                ),
                SoakStep(
                    f"commit-{i}",
                    "effect",
                    {"tool": "git_commit", "args": {"message": f"Soak {goal}: note {i}", "paths": [f"notes/{i}.md"]}},
                ),
            ]
        )
    units.append([SoakStep("summary", "llm", {"prompt": f"SOAK-LLM: summarise goal {goal}."})])
    rng.shuffle(units)
    return [step for unit in units for step in unit]


def soak_plan(steps: list[SoakStep]) -> Plan:
    return Plan.model_validate({"steps": soak_plan_steps(steps)})


def soak_plan_steps(steps: list[SoakStep]) -> list[dict]:
    """The plan's steps as a plan file has them."""
    plan_steps = []
    for index, step in enumerate(steps):
        body = {"name": step.name, "kind": "llm" if step.kind == "llm" else "tool", **step.step}
        if index:
            body["needs"] = [steps[index - 1].name]  # a chain: one activity in flight at a time
        plan_steps.append(body)
    return plan_steps


def choose_fault(rng: random.Random, steps: list[SoakStep], current: int, goal_id: str, workspace: str) -> str | None:
    """A fault in a step after the one in flight, so the retried activity is never the target."""
    candidates = [j for j in range(current + 1, len(steps)) if steps[j].kind in ("effect", "llm")]
    if not candidates:
        return None
    target = rng.choice(candidates)
    step = steps[target]
    if step.kind == "llm":
        # Model calls are counted per process: the retried call (if the current step is
        # the model step) comes first, then each model step up to the target.
        nth = sum(1 for k in range(current + 1, target + 1) if steps[k].kind == "llm")
        nth += 1 if current >= 0 and steps[current].kind == "llm" else 0
        return f"model_call:{nth}+{MODEL_KILL_AFTER_S}"
    tool = step.step["tool"]
    args = TOOL_SPECS[tool].args_model.model_validate(step.step["args"])
    key = effect_key_for(goal_id, tool, args, workspace)
    return f"{rng.choice(EFFECT_POINTS)}:{key}:1"


async def step_in_flight(client: Client, handle: WorkflowHandle, steps: list[SoakStep]) -> int:
    """Index of the step whose activity was scheduled last (the one the dead worker held)."""
    history = await handle.fetch_history()
    for event in reversed(history.events):
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        attrs = event.activity_task_scheduled_event_attributes
        value = (await client.data_converter.decode(attrs.input.payloads))[0]
        for index, step in enumerate(steps):
            if attrs.activity_type.name == Activities.GENERATE and value.get("step") == step.name:
                return index
            if attrs.activity_type.name == Activities.RUN_TOOL and value.get("args") == step.step.get("args"):
                return index
    return -1


async def run_soak(
    client: Client,
    root: Path,
    *,
    kills: int,
    seed: int,
    max_kills_per_goal: int = 4,
    max_goals: int = 50,
    say: Callable[[str], None] = lambda text: None,
) -> SoakReport:
    rng = random.Random(seed)
    report = SoakReport()
    mail = MailAPI(api_key=MAIL_KEY, respond_delay_s=0.05).start()
    ledger = LedgerAPI(respond_delay_s=0.05).start()
    model = ScriptedServer(
        {"replies": [{"when": "SOAK-LLM", "content": "Summary: all effects done.", "delay_s": MODEL_DELAY_S}]}
    ).start()
    rig = CrashRig(client, root / "rig", mail=mail, model=model)
    try:
        while report.kills < kills and report.goals < max_goals:
            report.goals += 1
            await _one_goal(rig, report, rng, root, seed, kills, max_kills_per_goal, mail, ledger, model, say)
    finally:
        rig.close()
        for service in (mail, ledger, model):
            service.stop()
    return report


async def _one_goal(rig, report, rng, root, seed, kills, max_kills_per_goal, mail, ledger, model, say) -> None:
    number = report.goals
    steps = soak_steps(number, rng, ledger.base_url)
    repo = root / f"repo-{number}"
    init_repo(repo)
    goal_id = f"soak-{seed}-{number}-{uuid.uuid4().hex[:6]}"
    spec = GoalSpec(
        goal=f"Soak goal {number}",
        plan=soak_plan(steps),
        model_profile="test",
        workspace=str(repo),
        allowed_tools=["send_email", "http_request", "write_file", "git_commit"],
        local_keyed_writes=True,  # as every start: its keyed and checked writes run as local activities
    )
    handle = await rig.start_goal(spec, goal_id)
    result_task = asyncio.create_task(ended(handle))
    deadline = time.monotonic() + GOAL_TIMEOUT_S
    current, kills_here = -1, 0
    result = None
    try:
        while True:
            fault = None
            if report.kills < kills and kills_here < max_kills_per_goal:
                fault = choose_fault(rng, steps, current, goal_id, str(repo))
            worker = rig.start_worker(fault)
            while worker.alive() and not result_task.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if result_task.done():
                worker.kill()
                result = result_task.result()
                break
            if time.monotonic() >= deadline:
                report.problems.append(f"goal {number}: not finished in {GOAL_TIMEOUT_S}s")
                break
            if not worker.killed_by_sigkill():
                report.problems.append(f"goal {number}: worker exited {worker.proc.returncode}:\n{worker.log_tail()}")
                break
            report.kills += 1
            kills_here += 1
            await rig.after_kill(handle)
            current = await step_in_flight(rig.client, handle, steps)
            if steps[current].kind == "llm" and (fault or "").startswith("model_call"):
                report.model_kills += 1
            say(f"  goal {number}: kill {report.kills} at {fault} (step in flight: {steps[current].name})")
    finally:
        if not result_task.done():
            result_task.cancel()
    check_goal(report, number, steps, repo, result, mail, ledger, model)
    finished = "succeeded" if result and result.outcome == "succeeded" else "NOT completed"
    say(f"goal {number}: {finished}; {report.line()}")


def check_goal(report, number, steps, repo, result, mail, ledger, model) -> None:
    """Compare what the services, the repository and the model saw with goal `number`'s plan."""
    if result is not None:
        report.lost_attempts += result.lost_attempts
    if result is not None and result.outcome == "succeeded":
        report.completed += 1
    elif result is not None:
        report.problems.append(f"goal {number}: outcome {result.outcome}: {result.excerpt[:500]}")
    sent = Counter(
        (m["to"][0], m["subject"]) for m in mail.ledger() if m["to"][0].endswith(f"@soak{number}.example.com")
    )
    entries = Counter(
        op["body"]["ref"]
        for op in ledger.ledger()
        if op["op"] == "create" and str(op["body"].get("ref", "")).startswith(f"g{number}-")
    )
    subjects = Counter(git(repo, "log", "--format=%s").splitlines())
    for step in steps:
        if step.kind != "effect":
            continue
        args = step.step["args"]
        if step.step["tool"] == "send_email":
            count = sent.pop((args["to"], args["subject"]), 0)
        elif step.step["tool"] == "http_request":
            count = entries.pop(args["body"]["ref"], 0)
        else:
            count = subjects.pop(args["message"], 0)
        report.effects += 1
        if count == 0:
            report.missing += 1
            report.problems.append(f"goal {number}: {step.name} missing")
        elif count > 1:
            report.duplicates += count - 1
            report.problems.append(f"goal {number}: {step.name} happened {count} times")
    for unexpected in (sent, entries):
        for what, count in unexpected.items():
            report.duplicates += count
            report.problems.append(f"goal {number}: unintended effect {what} x{count}")
    calls = sum(
        1
        for r in model.requests()
        if r["last_message"].startswith("step: summary") and f"summarise goal {number}." in r["last_message"]
    )
    report.model_extra_requests += max(0, calls - 1)
    lost = result.lost_by_step.get("summary", 0) if result is not None else 0
    if calls > 1 + lost:
        # Each attempt sends the request once: one more per attempt lost, never more.
        report.model_requests_unexplained += calls - 1 - lost
        report.problems.append(f"goal {number}: the model call was sent {calls} times, {lost} attempt(s) lost")
