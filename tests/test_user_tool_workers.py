"""A user's own tools in real `perdure worker` processes (issue 36, parts 2-3): loaded with
`--tools MODULE`, refused at start in one line when a module cannot be used, listed by
`perdure tools`, checked by `perdure start`, and run under the replay contract when the
worker running one is SIGKILLed (PERDURE_FAULT) right after the service accepted the call:
a keyed call is sent again under its key and billed once, a `once` call becomes a question
for a person. The services are the fakes of testing/fakes.py, which keep ledgers."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI, WebhookReceiver
from perdure.workflows.goal.contracts.messages import Answer
from perdure.workflows.goal.contracts.plan import Plan
from tests import usertool_sample
from tests.builders import spec
from tests.helpers import submit, wait_until
from tests.subprocess_rig import perdure, user_env, worker_process

REPO = str(Path(__file__).resolve().parents[1])
SAMPLE = "tests.usertool_sample"
CHARGE = {"amount_cents": 1200, "recipient": "ACME GmbH", "memo": "invoice 7"}


def tools_env(env, tmp_path: Path, task_queue: str, *services) -> dict[str, str]:
    """A user's shell whose Python finds the tool module (PYTHONPATH), with the services' variables."""
    variables = {**user_env(env, tmp_path, task_queue), "PYTHONPATH": REPO}
    for service in services:
        variables.update(service.worker_env())
    return variables


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


@pytest.mark.slow
@pytest.mark.process
def test_perdure_tools_lists_user_tools_and_start_refuses_a_plan_naming_one_no_worker_offers(
    env, tmp_path: Path, task_queue: str, fake_service
) -> None:
    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)
    variables = tools_env(env, tmp_path, task_queue, payments)
    workspace = tmp_path / "ws"
    workspace.mkdir()
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
