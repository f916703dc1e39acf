"""The Python client page's example program (docs/examples/pay_invoice.py, which
docs/guide/python-client.md shows) run as a user runs it: its own process, from a folder
outside the checkout, with only `perdure.Client` and `perdure.Plan` of perdure, against the
session's dev server and a `perdure worker` process. Its plan pays an invoice through the
fake payments API, an irreversible call: the goal asks first, the program approves and reads
the report; run again, it finds the same goal and nothing is paid twice."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI
from tests.helpers import new_goal_id
from tests.subprocess_rig import user_env, worker_process

# No timing a loaded machine breaks: make test runs its process tests five at a time.
pytestmark = pytest.mark.parallel_safe

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "pay_invoice.py"
PAGE = ROOT / "docs" / "guide" / "python-client.md"


def run_program(program: Path, goal_id: str, variables: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(program), goal_id],
        cwd=program.parent,
        env=variables,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.process
@pytest.mark.slow
def test_the_documented_program_starts_a_goal_approves_its_payment_and_reads_its_report(
    env, tmp_path, task_queue, fake_service
):
    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)
    variables = user_env(env, tmp_path, task_queue)
    assert PAYMENTS_KEY not in variables.values()  # the worker holds the key, the program never does
    program = tmp_path / "elsewhere" / "pay_invoice.py"
    program.parent.mkdir()
    shutil.copy(EXAMPLE, program)
    goal_id = new_goal_id("pay-invoice")
    with worker_process({**variables, **payments.worker_env()}, tmp_path / "worker.log"):
        first = run_program(program, goal_id, variables)
        again = run_program(program, goal_id, variables)
    for run in (first, again):
        assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
        assert "Traceback" not in run.stderr
    out = first.stdout
    assert f"goal {goal_id} started" in out
    asked = re.search(r"^question (\S+): (.+) \[(.+)\]$", out, flags=re.MULTILINE)
    assert asked is not None, out
    assert "approve" in asked.group(3).split(", ")
    assert re.search(r"^approval py-[0-9a-f]{12}: (applied|pending)$", out, flags=re.MULTILINE), out
    assert "step pay: succeeded" in out
    assert re.search(r"^outcome: succeeded, tokens: \d+, cost: \$\d+\.\d{4}$", out, flags=re.MULTILINE), out
    assert "# " in out.split("outcome: succeeded", 1)[1]  # the report (markdown) follows
    # Run again: the same goal, already finished; no question, no second payment.
    assert f"goal {goal_id} has finished" in again.stdout and "nothing new started" in again.stdout
    assert not re.search(r"^(question|approval) ", again.stdout, flags=re.MULTILINE)
    assert "outcome: succeeded" in again.stdout
    assert [(e["kind"], e["amount_cents"], e["currency"]) for e in payments.ledger()] == [("payment", 12_500, "EUR")]


# A program whose last act is one call: the shape that died in the interpreter's teardown.
ONE_CALL = """
import asyncio
import perdure
from temporalio.service import RPCError

async def main():
    client = await perdure.connect()
    try:
        await client.get_workflow_handle("no-such-goal").describe()
    except RPCError as err:
        print("answered:", err.status.name)

asyncio.run(main())
"""


@pytest.mark.process
@pytest.mark.slow
def test_a_short_program_that_connected_exits_cleanly_however_loaded_the_machine_is(env, tmp_path, task_queue):
    """sdk-python issue 300: without perdure's wait at exit, about one run in four of this
    program aborted (SIGABRT or SIGSEGV after its output) with four running at once here."""
    program = tmp_path / "one_call.py"
    program.write_text(ONE_CALL)
    variables = user_env(env, tmp_path, task_queue)
    runs = []
    for _ in range(4):  # four at a time: the load under which the teardown raced
        batch = [
            subprocess.Popen(
                [sys.executable, str(program)], env=variables, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(4)
        ]
        runs += [(proc.wait(60), *proc.communicate()) for proc in batch]
    assert [code for code, _, _ in runs] == [0] * 16, [err[-300:] for code, _, err in runs if code]
    assert all(out == "answered: NOT_FOUND\n" for _, out, _ in runs)


def test_the_example_uses_only_perdure_s_public_names():
    tree = ast.parse(EXAMPLE.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported == {"__future__", "asyncio", "sys", "perdure"}
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "perdure"
    }
    assert used == {"Client", "Plan"}


def test_the_python_client_page_shows_the_tested_example():
    page = PAGE.read_text()
    assert f'--8<-- "{EXAMPLE.relative_to(ROOT)}"' in page


def test_every_public_name_loads():
    import perdure

    loaded = {name: getattr(perdure, name) for name in perdure.__all__}
    assert {"Client", "Plan", "GoalSpec", "GoalResult", "GoalNotFound", "InvalidRequest"} <= set(loaded)
    errors = [v for v in loaded.values() if isinstance(v, type) and issubclass(v, Exception)]
    # What a tool of yours raises (or a declaration that cannot be used) is not the client's.
    not_the_clients = (
        perdure.ServerUnavailable,
        perdure.ToolError,
        perdure.OutcomeUnknown,
        perdure.ToolDeclarationError,
    )
    assert all(issubclass(e, perdure.PerdureError) for e in errors if e not in not_the_clients)


def test_the_generated_reference_shows_every_public_method_and_error():
    import importlib.util

    import perdure

    spec = importlib.util.spec_from_file_location(
        "gen_client_reference", ROOT / "docs" / "hooks" / "gen_client_reference.py"
    )
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.page()
    methods = {name for name in dir(perdure.Client) if not name.startswith("_")}
    assert len(methods) > 30
    assert {name for name in methods if f"### `{name}`" not in page} == set()
    errors = {name for name in perdure.__all__ if isinstance(getattr(perdure, name), type)}
    errors = {name for name in errors if issubclass(getattr(perdure, name), perdure.PerdureError)}
    assert len(errors) >= 12 and {name for name in errors if f"### `{name}`" not in page} == set()
    assert "reference/python-client.md" in (ROOT / "mkdocs.yml").read_text()
