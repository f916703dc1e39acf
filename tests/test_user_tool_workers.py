"""A user's own tools in real `perdure worker` processes (issue 36, parts 2-3): loaded with
`--tools MODULE`, refused at start in one line when a module cannot be used, listed by
`perdure tools`, checked by `perdure start`, and run under the replay contract when the
worker running one is SIGKILLed (PERDURE_FAULT) right after the service accepted the call:
a keyed call is sent again under its key and billed once, a `once` call becomes a question
for a person. The services are the fakes of testing/fakes.py, which keep ledgers."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.tools.user.tool_modules import load_toolbox
from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI, WebhookReceiver
from perdure.workflows.goal.contracts.messages import Answer, Approve
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests import usertool_sample
from tests.builders import spec
from tests.device_rig import question_of
from tests.helpers import goal_result, running_worker, start, submit, wait_until
from tests.mcp_rig import call, status_until, stdio_server
from tests.subprocess_rig import PERDURE, perdure, stop, user_env, worker_process

REPO = str(Path(__file__).resolve().parents[1])
SAMPLE = "tests.usertool_sample"
CHARGE = {"amount_cents": 1200, "recipient": "ACME GmbH", "memo": "invoice 7"}


def tools_env(env, tmp_path: Path, task_queue: str, *services) -> dict[str, str]:
    """A user's shell whose Python finds the tool module (PYTHONPATH), with the services' variables."""
    variables = {**user_env(env, tmp_path, task_queue), "PYTHONPATH": REPO}
    for service in services:
        variables.update(service.worker_env())
    return variables


@pytest.fixture
def paying_shell(env, tmp_path: Path, task_queue: str, fake_service) -> tuple[PaymentsAPI, dict[str, str], Path]:
    """The payments API, a user's shell pointed at it (the tool module on PYTHONPATH), a workspace."""
    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return payments, tools_env(env, tmp_path, task_queue, payments), workspace


@pytest.mark.process
def test_a_worker_with_a_contradictory_or_unimportable_tool_module_does_not_start(tmp_path: Path) -> None:
    (tmp_path / "ut_pay.py").write_text(
        textwrap.dedent(
            """
            import perdure
            from pydantic import BaseModel

            class Pay(BaseModel):
                amount_cents: int

            @perdure.tool(risk="irreversible", replay="safe")
            def pay(args: Pay) -> str:
                '''Pay.'''
                return "paid"
            """
        )
    )
    (tmp_path / "ut_fails.py").write_text("import perdure\nraise OSError('no key file at /etc/pay.key')\n")
    # Nothing listens there: the tools are loaded (and refused) before the worker connects.
    variables = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")},
        "PERDURE_TEMPORAL": "127.0.0.1:1",
        "PERDURE_HOME": str(tmp_path / "home"),
        "PYTHONPATH": f"{tmp_path}:{REPO}",
        "COLUMNS": "300",
    }
    expected = {
        "ut_pay": "error: tool module ut_pay: tool pay: is irreversible but its replay is `safe`: a retry would "
        "repeat the effect",
        "ut_fails": "error: tool module ut_fails failed to import: OSError: no key file at /etc/pay.key",
        "ut_nowhere": "error: cannot import tool module ut_nowhere: no module named ut_nowhere",
    }
    for module, said in expected.items():
        started = perdure("worker", "--tools", SAMPLE, "--tools", module, env=variables, timeout=60)
        assert started.returncode == 2, started.stderr
        assert started.stderr.strip() == said, started.stderr
        assert "Traceback" not in started.stderr + started.stdout
    # A device given the same module refuses it the same way, before it connects.
    device = perdure("device", "--name", "laptop", "--root", str(tmp_path), "--tools", "ut_pay", env=variables)
    assert device.returncode == 2, device.stderr
    assert device.stderr.strip() == expected["ut_pay"], device.stderr


@pytest.mark.slow
@pytest.mark.process
def test_perdure_tools_lists_user_tools_and_start_refuses_a_plan_naming_one_no_worker_offers(
    paying_shell, tmp_path: Path
) -> None:
    payments, variables, workspace = paying_shell
    with worker_process(variables, tmp_path / "worker.log", "--tools", SAMPLE):
        listed = perdure("tools", env=variables)
        assert listed.returncode == 0, listed.stderr
        lines = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines() if line.count("│") > 4}
        for name, risk, replay in (("charge", "remote-write", "keyed"), ("file_entry", "remote-write", "check"),
                                   ("post_note", "remote-write", "once"), ("wire", "irreversible", "keyed"),
                                   ("quote", "read", "safe"), ("read_file", "read", "safe")):  # fmt: skip
            assert name in lines and risk in lines[name] and replay in lines[name], listed.stdout
        assert SAMPLE in lines["charge"] and "undone by refund_charge" in lines["charge"]
        as_json = json.loads(perdure("tools", "--json", env=variables).stdout)
        assert {"name": "charge", "risk": "remote-write", "replay": "keyed", "source": SAMPLE}.items() <= next(
            row for row in as_json if row["name"] == "charge"
        ).items()

        typo = tmp_path / "typo.yaml"
        typo.write_text(yaml.safe_dump({"steps": [{"name": "pay", "kind": "tool", "tool": "chrage", "args": CHARGE}]}))
        refused = perdure("start", "Pay", "--plan", str(typo), "--workspace", str(workspace), "--id", "ut-typo",
                          env=variables)  # fmt: skip
        said = " ".join(refused.stderr.split())
        assert refused.returncode == 2 and "unknown tool 'chrage'" in said and "charge" in said, refused.stderr

        plan = tmp_path / "pay.yaml"
        plan.write_text(yaml.safe_dump({"steps": [{"name": "pay", "kind": "tool", "tool": "charge", "args": CHARGE}]}))
        ran = perdure("start", "Pay invoice 7", "--plan", str(plan), "--workspace", str(workspace), "--id", "ut-pay",
                      "--watch", env=variables)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert "outcome: succeeded" in ran.stdout
    assert [(e["kind"], e["amount_cents"]) for e in payments.ledger()] == [("payment", 1200)]


def charge_plan(name: str = "pay") -> Plan:
    return Plan.model_validate({"steps": [{"name": name, "kind": "tool", "tool": "charge", "args": CHARGE}]})


@pytest.mark.slow
@pytest.mark.process
async def test_a_worker_killed_after_the_service_accepted_a_keyed_call_bills_it_once(
    crash_rig, fake_service, tmp_path: Path
) -> None:
    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)
    rig = crash_rig(payments=payments)
    rig.worker_args, rig.extra_env = ("--tools", SAMPLE), {"PYTHONPATH": REPO}
    workspace = tmp_path / "ws"
    workspace.mkdir()
    worker = rig.start_worker(fault="after_effect:charge:1")
    handle = await rig.start_goal(spec(workspace, goal="Pay invoice 7", plan=charge_plan(), allowed_tools=["charge"]))
    await rig.wait_killed(worker)
    assert len(payments.ledger()) == 1, "the payments API accepted the charge before the kill"

    await rig.after_kill(handle)
    rig.start_worker()
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.excerpt
    assert len(payments.ledger()) == 1 and payments.replays == 1  # sent again under its key, billed once
    assert result.cost_usd == pytest.approx(usertool_sample.CHARGE_FEE_USD)  # the fee, charged once


@pytest.mark.slow
@pytest.mark.process
async def test_a_once_call_whose_worker_was_killed_is_a_question_and_is_never_sent_twice(
    crash_rig, fake_service, tmp_path: Path
) -> None:
    hook = fake_service(WebhookReceiver)
    rig = crash_rig()
    rig.worker_args, rig.extra_env = ("--tools", SAMPLE), {"PYTHONPATH": REPO}
    workspace = tmp_path / "ws"
    workspace.mkdir()
    plan = Plan.model_validate(
        {"steps": [{"name": "note", "kind": "tool", "tool": "post_note", "args": {"url": hook.base_url, "text": "hi"}}]}
    )
    worker = rig.start_worker(fault="after_effect:post_note:1")
    handle = await rig.start_goal(spec(workspace, goal="Post the note", plan=plan, allowed_tools=["post_note"]))
    await rig.wait_killed(worker)
    assert len(hook.ledger()) == 1

    await rig.after_kill(handle)
    rig.start_worker()
    snapshot = await wait_until(handle, lambda s: any(q.topic == "uncertain_effect" for q in s.questions), 60)
    question = next(q for q in snapshot.questions if q.topic == "uncertain_effect")
    assert "post_note" in question.stuck and "never sent twice on its own" in question.stuck
    await submit(handle, Answer(request_id="a1", question_id=question.id, choice="happened"))
    result = await rig.result(handle)

    assert result.outcome == "succeeded", result.excerpt
    assert len(hook.ledger()) == 1  # posted once, before the kill; never again


def device_process(variables: dict[str, str], tmp_path: Path, *options: str) -> tuple[subprocess.Popen, Path]:
    """`perdure device --name laptop` as its owner starts it, once it is online: (process, log)."""
    root = tmp_path / "laptop"
    root.mkdir(exist_ok=True)
    log_path = tmp_path / "device.log"
    argv = [PERDURE, "device", "--name", "laptop", "--root", str(root), "--scratch", str(tmp_path / "scratch")]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*argv, *options], env=variables, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while "device laptop online" not in log_path.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
        time.sleep(0.1)
    return proc, log_path


@pytest.mark.slow
@pytest.mark.process
async def test_a_device_that_offers_a_user_tool_runs_its_steps_there_after_its_owner_approves(
    env, paying_shell, tmp_path: Path, task_queue: str
) -> None:
    payments, variables, workspace = paying_shell
    refused = perdure("device", "--name", "laptop", "--root", str(workspace), "--tools", SAMPLE, env=variables)
    # Its charge calls a service: a device offers it only with the network.
    assert refused.returncode == 1 and "tool charge reaches the network" in refused.stderr, refused.stderr

    steps = [{"name": "pay", "kind": "tool", "tool": "charge", "args": CHARGE, "device": "laptop"}]
    with worker_process(variables, tmp_path / "worker.log", "--tools", SAMPLE):
        device, log = device_process(variables, tmp_path, "--tools", f"read_file,{SAMPLE}", "--network")
        try:
            online = log.read_text()
            # The module's tools declared for devices, and the built-in one named.
            assert "tools charge, read_file, refund_charge · network" in online, online
            handle = await start(env, task_queue, workspace, steps, allowed_tools=["charge"])
            # On the approvals-ahead card at adoption (issue 38), with the device it runs on.
            card = await question_of(handle, "approvals_ahead")
            assert [(a.step, a.on) for a in card.ahead] == [("pay", "laptop")] and payments.ledger() == []
            await submit(handle, Approve(request_id="ok-1", question_id=card.id))
            result = await goal_result(handle)
            snapshot = await handle.query(GoalWorkflow.progress)
        finally:
            stop(device)

    assert result.outcome == "succeeded", result.excerpt
    [payment] = payments.ledger()
    assert payment["amount_cents"] == 1200 and payment["idempotency_key"].startswith("fx-")
    [node] = snapshot.nodes
    assert node.placements == {"charge": "device laptop: the step runs there"}
    assert result.cost_usd == pytest.approx(usertool_sample.CHARGE_FEE_USD)  # reported on the device, charged here


@pytest.mark.slow
@pytest.mark.process
async def test_an_mcp_client_starts_a_goal_of_user_tools_approves_the_irreversible_one_and_reads_the_report(
    env, task_queue: str, tmp_path: Path, workspace: Path, fake_service
) -> None:
    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)
    toolbox = load_toolbox([SAMPLE], with_entry_points=False)
    plan = {
        "goal": "Pay invoice 7 and wire the deposit",
        "steps": [
            {"name": "pay", "kind": "tool", "tool": "charge", "args": CHARGE},
            {
                "name": "deposit",
                "kind": "tool",
                "tool": "wire",
                "args": {**CHARGE, "memo": "deposit"},
                "needs": ["pay"],
            },
        ],
    }
    store = DiskArtifactStore(tmp_path / "home" / "artifacts")  # where `perdure mcp` reads reports
    async with (
        running_worker(env, task_queue, store, user_tools=toolbox),
        stdio_server(env, tmp_path, task_queue) as client,
    ):
        started = await call(
            client, "start_goal", plan=plan, workspace=str(workspace), request_id=f"invoice-7-{uuid.uuid4().hex[:8]}"
        )
        assert started["started"] is True and not started["warnings"], started
        goal_id = started["goal_id"]
        # The wire is on the approvals-ahead card at adoption (issue 38); it waits for it after the charge.
        deposit_waits = lambda s: any(n["name"] == "deposit" and n["status"] == "blocked" for n in s["nodes"])  # noqa: E731
        snapshot = await status_until(client, goal_id, deposit_waits)
        question = snapshot["questions"][0]
        assert question["title"] == "Approve ahead: 'deposit'"
        assert len(payments.ledger()) == 1  # the charge; the wire waits for the person
        await call(client, "approve", goal_id=goal_id, question_id=question["id"], request_id="ok-7")
        await status_until(client, goal_id, lambda s: s["phase"] in ("finished", "failed", "aborted"))
        report = await call(client, "goal_report", goal_id=goal_id)

    assert report["outcome"] == "succeeded", report
    assert [p["memo"] for p in payments.ledger()] == ["invoice 7", "deposit"]
    for payment in payments.ledger():
        assert payment["id"] in report["report"]
