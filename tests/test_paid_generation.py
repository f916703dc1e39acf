"""The paid-generation example (examples/paid-generation/, installed beside perdure by `make
install`), run as its user runs it: `perdure worker` processes that load its tools through
its `perdure.tools` entry point (no --tools), its plan file (three variants generated side by
side, then an llm step picks one; the model is the scripted server), and the fake paid API,
whose billing ledger is the truth about money. Each variant is billed once whatever happens
to the workers (SIGKILLed after the API billed a submission and before it answered, or while
the jobs are polled), the goal's tool spend as `perdure result` prints it is the ledger's
total to the cent, and an abort with rollback refunds each job once."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
from paid_generation.fake_api import FakeGenerationAPI
from temporalio.client import WorkflowHandle

from perdure.activities.models.scripted import ScriptedServer
from perdure.starters.client.goal_specs import load_plan_file
from perdure.testing.crash import CrashRig
from perdure.workflows.goal.contracts.goal_contracts import Budget, GoalSpec
from tests.builders import spec
from tests.helpers import history_text
from tests.subprocess_rig import perdure

pytestmark = [pytest.mark.process, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
PLAN_FILE = ROOT / "examples" / "paid-generation" / "plans" / "variants.yaml"
API_KEY = "pg_live_do_not_leak_5f1c"
PICKED = "Variant 2: its beam reads best at poster size."
VARIANT_STEPS = ("variant-1", "variant-2", "variant-3")


@pytest.fixture
def model(scripted) -> ScriptedServer:
    """The model of the plan's `pick` step."""
    return scripted({"replies": [{"when": "Pick the variant", "content": PICKED}]})


@pytest.fixture
def generation_rig(crash_rig, model: ScriptedServer, tmp_path: Path) -> CrashRig:
    """A crash rig whose workers load the installed example (no --tools), poll jobs every
    0.1 s and ask `model`; a workspace at tmp_path/ws."""
    rig = crash_rig(model=model)
    rig.extra_env = {"PAIDGEN_POLL_S": "0.1"}
    (tmp_path / "ws").mkdir()
    return rig


def user_env(rig: CrashRig) -> dict[str, str]:
    """The shell a user types perdure commands in: the server, the queue and the home, but not
    the API's address or key, which only the workers hold."""
    variables = {k: v for k, v in rig.worker_env(None).items() if not k.startswith("PAIDGEN_")}
    return {**variables, "NO_COLOR": "1", "COLUMNS": "200"}


def goal_spec(workspace: Path) -> GoalSpec:
    plan, extras = load_plan_file(PLAN_FILE)
    return spec(
        workspace, goal=extras["goal"], plan=plan, allowed_tools=["generate_variant"], budget=Budget(max_cost_usd=3)
    )


async def until(condition: Callable[[], object], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.02)


def step_costs(report: str) -> dict[str, tuple[str, Decimal]]:
    """The report's table of steps as `perdure result` prints it: step -> (kind, cost in USD)."""
    rows = re.findall(r"^ *([a-z][\w-]*) +(tool|llm) +\w+ +\d+ +([\d.]+) *$", report, re.MULTILINE)
    return {name: (kind, Decimal(cost)) for name, kind, cost in rows}


def read_costs(rig: CrashRig, goal_id: str) -> tuple[Decimal, Decimal, str]:
    """(what paid tools cost the goal, its total cost, the report), as `perdure result` prints them."""
    shown = perdure("result", goal_id, env=user_env(rig), timeout=60)
    assert shown.returncode == 0, shown.stderr
    report = shown.stdout
    total = re.search(r"^ *Totals: \d+ tokens, \$([\d.]+) \(paid tools \$([\d.]+)\)", report, re.MULTILINE)
    assert total, report
    tools = Decimal(total.group(2))
    # The step rows add up to it.
    assert sum((cost for kind, cost in step_costs(report).values() if kind == "tool"), Decimal("0")) == tools
    return tools, Decimal(total.group(1)), report


def billed_once_each(api: FakeGenerationAPI) -> None:
    """One charge per variant (the job's seed is its variant number), nothing refunded."""
    seeds = Counter(api.jobs[entry["generation"]].seed for entry in api.charges())
    assert seeds == Counter({1: 1, 2: 1, 3: 1}), api.ledger()
    assert api.refunds() == []


async def finished_on_a_new_worker(rig: CrashRig, handle: WorkflowHandle, api: FakeGenerationAPI, what: str) -> None:
    """After the kill: a new worker carries the goal to success, each variant billed once,
    and the goal's tool spend is the ledger's total; prints the figures (pytest -s)."""
    await rig.after_kill(handle)
    rig.start_worker()
    result = await rig.result(handle)
    assert result.outcome == "succeeded", result.excerpt
    billed_once_each(api)
    tools, total, _ = read_costs(rig, handle.id)
    assert tools == api.total() == Decimal("1.20")
    print(
        f"\n{what}: ledger charges={len(api.charges())} refunds={len(api.refunds())} "
        f"replayed submissions={api.replays} total=${api.total()} · goal tool spend=${tools} goal cost=${total}"
    )


async def jobs_in_heartbeats(rig: CrashRig, goal_id: str) -> set[str]:
    """The jobs the goal's running tool calls last heartbeated, as the server holds them."""
    handle = rig.client.get_workflow_handle(goal_id)
    jobs = set()
    for pending in (await handle.describe()).raw_description.pending_activities:
        if not pending.heartbeat_details.payloads:
            continue
        last = (await rig.client.data_converter.decode(pending.heartbeat_details.payloads))[-1]
        progress = last.get("progress") if isinstance(last, dict) else None
        if isinstance(progress, dict) and isinstance(progress.get("job"), str):
            jobs.add(progress["job"])
    return jobs


@pytest.mark.parallel_safe  # waits on the fake's gates, races no kill
async def test_the_plan_bills_each_variant_once_and_the_goal_s_tool_spend_is_the_ledger_s_total(
    generation_rig: CrashRig, model: ScriptedServer, fake_service, tmp_path: Path
) -> None:
    api = fake_service(FakeGenerationAPI, api_key=API_KEY)
    rig = generation_rig
    worker = rig.start_worker()
    await rig.wait_polling()
    shell = user_env(rig)

    listed = perdure("tools", "--json", env=shell)
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    # The worker was given no --tools: the installed example's entry point loaded them.
    assert rig.worker_args == ()
    assert {
        "risk": "remote-write",
        "replay": "keyed",
        "source": "paid_generation.tools",
        "compensation": "refund_generation",
        "network": True,
        "max_cost_usd": 0.5,
    }.items() <= rows["generate_variant"].items(), rows["generate_variant"]
    assert rows["refund_generation"]["replay"] == "keyed"

    goal_id = f"paidgen-{uuid.uuid4().hex[:8]}"
    ran = perdure("start", "--plan", str(PLAN_FILE), "--workspace", str(tmp_path / "ws"), "--profile", "test",
                  "--max-cost", "3", "--id", goal_id, "--watch", env=shell, timeout=120)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "outcome: succeeded" in ran.stdout, ran.stdout

    billed_once_each(api)
    assert api.replays == 0  # nothing was sent twice
    tools, total, report = read_costs(rig, goal_id)
    status = perdure("status", goal_id, env=shell)
    assert f"${total:.4f} (paid tools ${tools:.4f})" in status.stdout, status.stdout
    costs = step_costs(report)
    assert {name: costs[name][1] for name in VARIANT_STEPS} == {name: Decimal("0.4000") for name in VARIANT_STEPS}
    assert tools == api.total() == Decimal("1.20")  # to the cent
    # Besides, the pick's model call (each figure rounded to 1/100 of a cent).
    assert costs["pick"][1] > 0 and abs(total - tools - costs["pick"][1]) <= Decimal("0.0001")
    assert PICKED in report
    [pick] = [r for r in model.requests() if "Pick the variant" in json.dumps(r)]
    for job in api.jobs:  # the model was given the three variants' outputs
        assert job in json.dumps(pick), pick

    # The API key stays on the worker: not in the goal's history, its report or the worker's log.
    history = history_text(await rig.client.get_workflow_handle(goal_id).fetch_history())
    for where, text in (("history", history), ("report", report), ("worker log", worker.log_text())):
        assert API_KEY not in text, f"the API key is in the {where}"


async def test_a_worker_killed_after_the_api_billed_a_submission_and_before_it_answered_bills_it_once(
    generation_rig: CrashRig, fake_service, tmp_path: Path
) -> None:
    api = fake_service(FakeGenerationAPI, api_key=API_KEY)
    api.hold_answers()  # the API bills a submission and answers when the test lets it
    rig = generation_rig
    worker = rig.start_worker()
    handle = await rig.start_goal(goal_spec(tmp_path / "ws"))
    await until(api.charges, "a submission billed")
    worker.kill()
    billed_at_kill = len(api.charges())
    api.release()

    await finished_on_a_new_worker(rig, handle, api, "killed after a billed submission")
    # What was billed before the kill was sent again under its key and answered from the
    # API's idempotency store, billed nothing.
    assert api.replays >= billed_at_kill >= 1


async def test_a_worker_killed_while_it_polls_the_jobs_resumes_them_on_a_new_worker_and_bills_each_once(
    generation_rig: CrashRig, fake_service, tmp_path: Path
) -> None:
    api = fake_service(FakeGenerationAPI, api_key=API_KEY)
    api.hold()  # the jobs run until the test lets them finish
    rig = generation_rig
    worker = rig.start_worker()
    handle = await rig.start_goal(goal_spec(tmp_path / "ws"))
    await until(lambda: len(api.polls()) == 3 and min(api.polls().values()) >= 2, "three jobs polled")
    # Kill once the server holds each call's job (its heartbeat), as the next attempt reads it.
    deadline = time.monotonic() + 30
    while await jobs_in_heartbeats(rig, handle.id) != set(api.jobs):
        assert time.monotonic() < deadline, "the jobs never reached the server in a heartbeat"
        await asyncio.sleep(0.05)
    worker.kill()
    polled_before = api.polls()
    api.release()

    await finished_on_a_new_worker(rig, handle, api, "killed while polling")
    assert api.replays == 0  # no job was submitted again: each retry polled the job it was given
    assert all(api.polls()[job] > polled_before[job] for job in api.jobs)


@pytest.mark.parallel_safe  # waits on the fake's gates, races no kill
async def test_an_abort_with_rollback_while_the_jobs_run_refunds_each_once(
    generation_rig: CrashRig, fake_service, tmp_path: Path
) -> None:
    api = fake_service(FakeGenerationAPI, api_key=API_KEY)
    api.hold()
    rig = generation_rig
    rig.start_worker()
    handle = await rig.start_goal(goal_spec(tmp_path / "ws"))
    await until(lambda: len(api.charges()) == 3, "the three jobs billed")

    aborted = perdure("abort", handle.id, "--rollback", "--reason", "wrong poster", env=user_env(rig))
    assert aborted.returncode == 0, aborted.stderr
    api.release()  # the calls in flight settle, then the rollback refunds what they billed
    result = await rig.result(handle)

    assert result.outcome == "aborted", result.excerpt
    assert sorted(e["generation"] for e in api.refunds()) == sorted(e["generation"] for e in api.charges())
    assert len(api.charges()) == 3 and api.total() == 0
    _, _, report = read_costs(rig, handle.id)
    assert report.count("undo by refund_generation done") == 3, report
