"""`make demo-crash`: a worker is killed in the middle of a remote effect; the goal still finishes with
every effect exactly once.

Runs on the embedded dev server (started if needed). Serves a mail API and a
bookkeeping ledger API locally (`perdure.testing.fakes`, both honouring
`Idempotency-Key`), starts a goal from a plan that notifies three customers
and books a credit for each, and runs it on a `perdure worker` subprocess whose
fault point (PERDURE_FAULT) SIGKILLs it right after the mail API accepted the
second notice and before the activity could report it. A second worker then
takes over; the demo prints the goal's report and both ledgers, and checks
that each notice and each credit is there exactly once.

It uses its own task queue, so a worker left running by `make demo` never
takes its activities, and stops the workers it started (by pid). The dev
server keeps running; `make server-stop` stops it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from rich.console import Console

from perdure.activities.artifacts import artifact_store
from perdure.runtime import settings
from perdure.runtime.connect import connect
from perdure.starters import devserver
from perdure.starters.client.goal_reads import ended
from perdure.testing.fakes import LedgerAPI, MailAPI
from perdure.workflows.goal.contracts.goal_contracts import GoalSpec
from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow

CUSTOMERS = [
    ("ada@example.com", "Ada", 1500),
    ("grace@example.com", "Grace", 2500),
    ("alan@example.com", "Alan", 1000),
]
FAULT = "after_effect:send_email:2"
MAIL_KEY = "re_demo_key"
SUBJECT = "Sorry about Tuesday's outage"


def demo_plan(ledger_url: str) -> Plan:
    steps: list[dict] = []
    for i, (email, name, cents) in enumerate(CUSTOMERS, start=1):
        steps.append(
            {
                "name": f"notify-{i}",
                "kind": "tool",
                "tool": "send_email",
                "args": {
                    "to": email,
                    "subject": SUBJECT,
                    "body": f"Hello {name},\n\nwe credited {cents / 100:.2f} EUR to your account for the outage.",
                },
            }
        )
        steps.append(
            {
                "name": f"credit-{i}",
                "kind": "tool",
                "tool": "http_request",
                "args": {
                    "method": "POST",
                    "url": f"{ledger_url}/entries",
                    "body": {"customer": email, "amount_cents": cents, "reason": "outage credit"},
                },
            }
        )
    for previous, step in zip(steps, steps[1:], strict=False):
        step["needs"] = [previous["name"]]  # one effect at a time, so "the second notice" is one moment
    return Plan.model_validate({"steps": steps})


def start_worker(task_queue: str, log: Path, mail: MailAPI, fault: str | None) -> subprocess.Popen:
    variables = {k: v for k, v in os.environ.items() if k != "PERDURE_FAULT"}
    variables.update(PERDURE_TASK_QUEUE=task_queue, PERDURE_MAIL_URL=mail.base_url, PERDURE_MAIL_KEY=MAIL_KEY)
    if fault:
        variables["PERDURE_FAULT"] = fault
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "perdure"), "worker"],
            env=variables,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def run_demo_crash(console: Console) -> bool:
    started = time.monotonic()
    port, ui_port = settings.dev_server_ports()
    server = devserver.start_dev_server(port=port, ui_port=ui_port)
    console.print(f"Temporal dev server {'reused' if server.reused else 'started'} at {server.address}")
    client = await connect()
    mail = MailAPI(api_key=MAIL_KEY, respond_delay_s=0.3).start()
    ledger = LedgerAPI(respond_delay_s=0.1).start()
    console.print(f"mail API   {mail.base_url}/emails   (ledger: {mail.base_url}/_ledger)")
    console.print(f"ledger API {ledger.base_url}/entries (ledger: {ledger.base_url}/_ledger)")
    workdir = Path(tempfile.mkdtemp(prefix="perdure-demo-crash-"))
    task_queue = f"perdure-demo-crash-{uuid.uuid4().hex[:8]}"
    log = workdir / "workers.log"
    workers: list[subprocess.Popen] = []
    try:
        first = start_worker(task_queue, log, mail, FAULT)
        workers.append(first)
        console.print(f"worker 1 (pid {first.pid}) started with PERDURE_FAULT={FAULT}")
        goal_id = f"demo-crash-{uuid.uuid4().hex[:8]}"
        spec = GoalSpec(
            goal="Apologise to three customers for Tuesday's outage and book their credits",
            plan=demo_plan(ledger.base_url),
            workspace=str(workdir),
            allowed_tools=["send_email", "http_request"],
            local_keyed_writes=True,  # as every start: the keyed writes run as local activities
        )
        handle = await client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec),
            id=goal_id,
            task_queue=task_queue,
            static_summary=spec.goal,
            task_timeout=spec.task_timeout(),
        )
        console.print(f"goal [bold]{goal_id}[/bold]: 3 emails + 3 ledger credits; UI: {settings.goal_ui_link(goal_id)}")

        deadline = time.monotonic() + 120
        while first.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if first.poll() != -signal.SIGKILL:
            console.print(f"[red]worker 1 was not killed by its fault point; see {log}[/red]")
            return False
        console.print(
            "\n[bold red]worker 1 killed (SIGKILL)[/bold red] right after the mail API accepted notice 2, "
            "before the activity could report it. Received so far:"
        )
        for message in mail.ledger():
            console.print(f"  mail   -> {message['to'][0]}  key {message['idempotency_key']}")

        second = start_worker(task_queue, log, mail, None)
        workers.append(second)
        console.print(
            f"\nworker 2 (pid {second.pid}) started without a fault. Temporal retries the interrupted "
            "activity once its heartbeat timeout notices worker 1 is gone; the retry sends the same "
            "Idempotency-Key, so the mail API answers from its idempotency store instead of sending again."
        )
        result = await asyncio.wait_for(ended(handle), 300)
        console.print(f"\ngoal outcome: [bold]{result.outcome}[/bold]")
        store = artifact_store()
        for name, ref in result.outputs.items():
            text = store.get_text(ref).splitlines()[0] if store.has(ref) else ref.digest
            console.print(f"  {name:9} {text}", markup=False, highlight=False)
        return print_ledgers(console, mail, ledger, result.outcome == "succeeded", started)
    finally:
        for proc in workers:
            stop(proc)
        mail.stop()
        ledger.stop()
        console.print(f"workers stopped; their log: {log}; the dev server keeps running (`make server-stop`)")


def print_ledgers(console: Console, mail: MailAPI, ledger: LedgerAPI, succeeded: bool, started: float) -> bool:
    messages = Counter(m["to"][0] for m in mail.ledger())
    credits = Counter(op["body"]["customer"] for op in ledger.ledger() if op["op"] == "create")
    console.print("\n[bold]mail API ledger[/bold] (what the outside world received)")
    for email, _, _ in CUSTOMERS:
        console.print(f"  {email:20} {messages[email]} message(s)")
    console.print(f"  requests received: {mail.requests}, answered from the idempotency store: {mail.replays}")
    console.print("[bold]ledger API[/bold]")
    for email, _, cents in CUSTOMERS:
        console.print(f"  {email:20} {credits[email]} credit(s) of {cents / 100:.2f} EUR")
    console.print(f"  requests received: {ledger.requests}, answered from the idempotency store: {ledger.replays}")
    exactly_once = all(messages[e] == 1 and credits[e] == 1 for e, _, _ in CUSTOMERS)
    exactly_once = exactly_once and sum(messages.values()) == sum(credits.values()) == len(CUSTOMERS)
    verdict = "every effect exactly once" if exactly_once else "[red]an effect is missing or repeated[/red]"
    console.print(f"\n{verdict}; goal {'finished' if succeeded else 'did not finish'}")
    console.print(f"demo-crash finished in {time.monotonic() - started:.1f} s")
    return exactly_once and succeeded


def main() -> None:
    console = Console()
    try:
        ok = asyncio.run(run_demo_crash(console))
    except Exception as err:  # the demo's user sees one line, not a traceback
        console.print(f"[red]error:[/red] {err}")
        ok = False
    sys.stdout.flush()
    os._exit(0 if ok else 1)  # see TEMPORAL_NOTES: the SDK may crash at interpreter exit


if __name__ == "__main__":
    main()
