"""Record golden histories from real runs: `make histories`.

Runs each scenario on a fresh local dev server with the production worker and
writes `tests/histories/<name>.json`. Names carry the release whose code recorded
them (`goal-1.0-demo`). Existing files are never overwritten. A workflow change that
breaks replay ships as a new worker deployment version (running goals stay pinned to
theirs: workflows/goal/__init__.py); its release records a fresh set under its own
prefix and the old set leaves the suite (git keeps it). tests/histories/README.md lists
what each golden exercises.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import re
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.mcp.mcp_calls import McpServers
from perdure.activities.mcp.mcp_config import servers_from
from perdure.activities.models.profiles import ModelConfig
from perdure.activities.models.scripted import ScriptedServer
from perdure.activities.tools.user.tool_modules import load_toolbox
from perdure.activities.tools.user.toolbox import Toolbox
from perdure.runtime.plugin import PerdurePlugin
from perdure.starters.client import goal_reads
from perdure.testing.fakes import MAIL_KEY, PAYMENTS_KEY, LedgerAPI, MailAPI, PaymentsAPI, WebhookReceiver
from perdure.workers.orchestrator import build_worker
from perdure.workers.worker_capabilities import CapabilitiesInput, CapabilitiesWorkflow
from perdure.workflows.devices.device_contracts import DeviceListing, RegistryQueries, registry_id
from perdure.workflows.goal.contracts.deadline_contracts import DEFAULT_QUESTION_DEADLINE
from perdure.workflows.goal.contracts.goal_contracts import Budget, GoalResult
from perdure.workflows.goal.contracts.messages import Abort, Answer, Approve, Park, Resume, Steer
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.offers.worker_offers import (
    OFFER_SIGNAL,
    OFFERS_MEMO,
    OfferAnnouncement,
    PublishedOffer,
    worker_offers_id,
)
from perdure.workflows.watchdog.watchdog_contracts import WatchdogInput, WatchdogRules
from perdure.workflows.watchdog.watchdog_workflow import WatchdogWorkflow
from tests import goldens
from tests.builders import STEP_REPLY, agent, demo_script, gate, llm, openai_profile, spec, write_notes
from tests.device_rig import InProcessDevice
from tests.helpers import command_batches, dev_server_options, statuses, submit, wait_until

HISTORIES = Path(__file__).parent / "histories"


@asynccontextmanager
async def rig(
    env: WorkflowEnvironment,
    script: dict | None = None,
    mcp: McpServers | None = None,
    user_tools: Toolbox | None = None,
) -> AsyncIterator[tuple[Path, str]]:
    """A scratch workspace and the production worker on a fresh task queue, with a
    scripted model server when the scenario calls a model, and these MCP servers and user
    tools (none unless given): (workspace, task queue)."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        workspace = Path(tmp) / "workspace"
        workspace.mkdir()
        profiles = {}
        if script is not None:
            profiles["test"] = openai_profile(stack.enter_context(ScriptedServer(script)))
        task_queue = f"record-{uuid.uuid4().hex[:8]}"
        store = DiskArtifactStore(Path(tmp) / "artifacts")
        config = ModelConfig(profiles=profiles)
        servers = mcp or McpServers({})
        async with build_worker(
            env.client,
            task_queue=task_queue,
            store=store,
            model_config=config,
            mcp_servers=servers,
            user_tools=user_tools,
        ):
            yield workspace, task_queue


def save(out: Path, history: WorkflowHistory) -> None:
    data = history.to_json().encode("utf-8")
    out.write_bytes(gzip.compress(data, mtime=0) if out.suffix == ".gz" else data)
    print(f"recorded {out} ({len(history.events)} events)")


async def record_goal_demo(env: WorkflowEnvironment, out: Path) -> None:
    async with rig(env, demo_script()) as (workspace, task_queue):
        write_notes(workspace)
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=spec(workspace)), id=out.stem, task_queue=task_queue
        )
        await handle.result()
        save(out, await handle.fetch_history())


async def record_watchdog_nudge(env: WorkflowEnvironment, out: Path) -> None:
    """A watchdog run that finds a goal stalled (judged an hour ahead) and nudges it."""
    gate = {"name": "gate", "kind": "tool", "tool": "run_command", "args": {"command": "sleep 3"}}
    async with rig(env) as (workspace, task_queue):
        goal = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan={"steps": [gate]}, stall_after_s=60)),
            id=f"{out.stem}-goal",
            task_queue=task_queue,
        )
        while not (await goal.query(GoalWorkflow.progress)).running:
            await asyncio.sleep(0.1)
        handle = await env.client.start_workflow(
            WatchdogWorkflow.run,
            WatchdogInput(task_queue=task_queue, as_of=datetime.now(UTC) + timedelta(hours=1)),
            id=out.stem,
            task_queue=task_queue,
        )
        result = await handle.result()
        assert result.sent, "the recorded run should nudge the stalled goal"
        history = await handle.fetch_history()
        await goal.terminate("recorded")
    save(out, history)


async def record_watchdog_judge(env: WorkflowEnvironment, out: Path) -> None:
    """A watchdog run that finds a goal healthy by its rules but settling steps with no
    new information, asks the model once (scripted: spinning) and nudges it."""
    verdict = '{"verdict": "spinning", "reason": "its steps repeat step done", "confidence": 0.9}'
    script = {
        "replies": [
            {"when": "PERDURE-WATCHDOG-JUDGE", "content": verdict},
            {"when": "PERDURE-STEP", "content": "step done"},
        ]
    }
    steps = [*(llm(f"s{i}") for i in range(4)), {**gate(), "needs": ["s3"]}]
    async with rig(env, script) as (workspace, task_queue):
        goal = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan={"steps": steps})),
            id=f"{out.stem}-goal",
            task_queue=task_queue,
        )
        while "gate" not in (await goal.query(GoalWorkflow.progress)).running:
            await asyncio.sleep(0.1)
        handle = await env.client.start_workflow(
            WatchdogWorkflow.run,
            WatchdogInput(task_queue=task_queue, rules=WatchdogRules(judge_profile="test")),
            id=out.stem,
            task_queue=task_queue,
        )
        result = await handle.result()
        assert any(f.kind == "spinning" for f in result.findings) and result.sent, result
        history = await handle.fetch_history()
        await goal.terminate("recorded")
    save(out, history)


async def record_goal_steered(env: WorkflowEnvironment, out: Path) -> None:
    """A goal steered while it runs: a steer and a park by update, a malformed signal
    (refused with a reason), a resume by signal, then the gate opens and it finishes."""
    steps = [gate(), llm("draft", ["gate"]), llm("polish", ["draft"])]
    async with rig(env, STEP_REPLY) as (workspace, task_queue):
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan={"steps": steps}, drift_every=0)),
            id=out.stem,
            task_queue=task_queue,
        )
        await wait_until(handle, lambda s: s.running)
        await submit(handle, Steer(request_id="st-1", text="Keep every answer under 50 words."))
        await submit(handle, Park(request_id="pk-1", reason="reviewing the draft plan"))
        await handle.signal(GoalWorkflow.message_signal, {"request_id": "bad-1", "kind": "teleport"})
        await handle.signal(GoalWorkflow.message_signal, Resume(request_id="rs-1").model_dump(mode="json"))
        await wait_until(handle, lambda s: not s.parked)
        (workspace / "GO").touch()
        await handle.result()
        save(out, await handle.fetch_history())


async def record_goal_continue_as_new(env: WorkflowEnvironment, out: Path) -> None:
    """A chain long enough to continue as new at the goal's own event limit; the first
    run (ending in ContinuedAsNew) and the last (starting from a carried state) are kept."""
    steps = [llm(f"s{i:02d}", [f"s{i - 1:02d}"] if i else []) for i in range(8)]
    async with rig(env, STEP_REPLY) as (workspace, task_queue):
        goal_spec = spec(workspace, plan={"steps": steps}, drift_every=0, continue_as_new_after_events=50)
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
        )
        await handle.signal(GoalWorkflow.message_signal, Steer(request_id="st-1", text="Be brief.").model_dump())
        await handle.result()
        first = await env.client.get_workflow_handle(out.stem, run_id=handle.result_run_id).fetch_history()
        last = await env.client.get_workflow_handle(out.stem).fetch_history()
    assert first.events[-1].HasField("workflow_execution_continued_as_new_event_attributes"), "no continue-as-new"
    save(out.with_name(f"{out.stem}-first-run.json"), first)
    save(out.with_name(f"{out.stem}-last-run.json"), last)


def digest_agent(needs: list[str]) -> tuple[dict, dict]:
    """An agent step asking for two reads at once, then a write, and the script it follows."""
    step = {
        "name": "digest",
        "kind": "agent",
        "needs": needs,
        "tools": ["read_file", "write_file"],
        "prompt": "AGENT-DIGEST: read both notes, then write DIGEST.md.",
    }
    reads = [{"name": "read_file", "arguments": {"path": f"notes/{n}.md"}} for n in ("ideas", "todo")]
    write = {"name": "write_file", "arguments": {"path": "DIGEST.md", "content": "cache, pin, fix, retry\n"}}
    script = {
        "replies": [
            {"when": "AGENT-DIGEST", "times": 1, "tool_calls": reads},
            {"when": "AGENT-DIGEST", "times": 1, "tool_calls": [write]},
            {"when": "AGENT-DIGEST", "times": 1, "content": "DIGEST.md written."},
        ]
    }
    return step, script


async def record_plan_goal(env: WorkflowEnvironment, out: Path, plan: dict, script: dict) -> None:
    """A plan-file goal over the notes workspace, run to success, its history saved."""
    async with rig(env, script) as (workspace, task_queue):
        write_notes(workspace)
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan=plan, drift_every=0)),
            id=out.stem,
            task_queue=task_queue,
        )
        result = await handle.result()
        assert result.outcome == "succeeded", result.excerpt
        save(out, await handle.fetch_history())


async def record_goal_segments(env: WorkflowEnvironment, out: Path) -> None:
    """Read segments: tool reads as local activities, and an agent turn asking for two reads at once."""
    agent, script = digest_agent(["inventory"])
    plan = {"steps": [{"name": "inventory", "kind": "tool", "tool": "list_dir", "args": {"path": "notes"}}, agent]}
    await record_plan_goal(env, out, plan, script)


async def record_goal_read_batches(env: WorkflowEnvironment, out: Path) -> None:
    """Reads ready together run as one local activity (workflows/goal/read_batch.py), and
    an agent turn's two reads at once as another."""
    reads = [
        {"name": f"read-{n}", "kind": "tool", "tool": "read_file", "args": {"path": f"notes/{n}.md"}}
        for n in ("ideas", "todo")
    ]
    inventory = {"name": "inventory", "kind": "tool", "tool": "list_dir", "args": {"path": "notes"}}
    agent, script = digest_agent(["read-ideas", "read-todo", "inventory"])
    await record_plan_goal(env, out, {"steps": [*reads, inventory, agent]}, script)


async def record_goal_read_ahead(env: WorkflowEnvironment, out: Path) -> None:
    """A chain of reads run ahead of its steps in one batch, a write that ends it, and the
    chain after the write in a batch of its own."""

    def read(name: str, path: str, needs: list[str]) -> dict:
        return {"name": name, "kind": "tool", "tool": "read_file", "args": {"path": path}, "needs": needs}

    write = {"name": "mark", "kind": "tool", "tool": "write_file", "needs": ["read-3"]}
    write["args"] = {"path": "MARK.md", "content": "read\n"}
    steps = [read("read-1", "notes/ideas.md", []), read("read-2", "notes/todo.md", ["read-1"])]
    steps += [read("read-3", "notes/ideas.md", ["read-2"]), write]
    steps += [read("after-1", "MARK.md", ["mark"]), read("after-2", "notes/todo.md", ["after-1"])]
    await record_plan_goal(env, out, {"steps": steps}, {"replies": []})


async def record_goal_read_commits(env: WorkflowEnvironment, out: Path) -> None:
    """1,000 reads ready together whose results (a long path in each fingerprint) fill the
    workflow task's share of local activity results, in waves of local activities; the read
    after them then runs as an activity, which commits the task (read_batch.py)."""
    deep = Path(*[d * 195 for d in "abc"]) / "page.md"
    steps = [
        {
            "name": f"read-{i:04d}",
            "kind": "tool",
            "tool": "read_file",
            "args": {"path": deep.as_posix(), "max_bytes": 1000 + i},
        }
        for i in range(1000)
    ]
    steps.append({**steps[0], "name": "after", "needs": [s["name"] for s in steps]})
    env = await inline_payloads(env)
    async with rig(env) as (workspace, task_queue):
        (workspace / deep.parent).mkdir(parents=True)
        (workspace / deep).write_text("a page\n")
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan={"steps": steps}, allowed_tools=["read_file"], drift_every=0)),
            id=out.stem,
            task_queue=task_queue,
        )
        result = await handle.result()
        assert result.outcome == "succeeded", result.excerpt
        save(out, await handle.fetch_history())


async def inline_payloads(env: WorkflowEnvironment) -> WorkflowEnvironment:
    """The same server, every payload inline: a goal input over the payload store's threshold
    (a plan of hundreds of steps) stays in the history, which then replays without the store
    it was recorded with."""
    client = await Client.connect(
        env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        plugins=[PerdurePlugin(payload_store=False)],
    )
    return WorkflowEnvironment.from_client(client)


async def record_goal_dispatch_passes(env: WorkflowEnvironment, out: Path) -> None:
    """600 reads ready together: 500 started in the first workflow task, the other 100 in
    the next, after a 1 ms timer (STARTS_PER_TASK, workflows/goal/scheduler.py)."""
    steps = [
        {
            "name": f"read-{i:03d}",
            "kind": "tool",
            "tool": "read_file",
            "args": {"path": "notes/ideas.md", "max_bytes": 100 + i},
        }
        for i in range(600)
    ]
    await record_plan_goal(await inline_payloads(env), out, {"steps": steps}, {"replies": []})


async def record_goal_parked_then_judged(env: WorkflowEnvironment, out: Path) -> None:
    """Parked while two llm steps run: one bills $3 against a $0.10 budget while the goal is
    parked (no verdict while parked); the resume judges it and stops the other, so the goal
    ends aborted and its workflow fails with the result."""
    dear = {"when_last": "step: spend", "content": "step done", "delay_s": 1.5}
    dear["usage"] = {"input_tokens": 0, "output_tokens": 1_500_000}
    slow = {"when_last": "step: slow", "content": "step done", "delay_s": 6}
    async with rig(env, {"replies": [dear, slow]}) as (workspace, task_queue):
        goal_spec = spec(
            workspace, plan={"steps": [llm("spend"), llm("slow")]}, drift_every=0, budget=Budget(max_cost_usd=0.1)
        )
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
        )
        await wait_until(handle, lambda s: statuses(s)["spend"] == statuses(s)["slow"] == "running")
        await submit(handle, Park(request_id="p1", reason="lunch"))
        await wait_until(handle, lambda s: statuses(s)["spend"] != "running")
        await submit(handle, Resume(request_id="p2"))
        result = await goal_reads.ended(handle)
    assert result.outcome == "aborted" and "emergency stop: cost at" in (result.failure or ""), result.failure
    save(out, await handle.fetch_history())


async def record_goal_nodes_per_run(env: WorkflowEnvironment, out: Path) -> None:
    """A command (an activity), then a chain of 24 reads (read ahead in batches), with at most
    10 steps settled per run, so it continues as new twice; the first run and the last are
    kept."""
    command = {"name": "count", "kind": "tool", "tool": "run_command", "replay": "safe"}
    command["args"] = {"command": "ls notes | wc -l"}
    steps = [command] + [
        {"name": f"r{i:02d}", "kind": "tool", "tool": "read_file", "args": {"path": "notes/ideas.md"}}
        | {"needs": [f"r{i - 1:02d}" if i else "count"]}
        for i in range(24)
    ]
    async with rig(env) as (workspace, task_queue):
        write_notes(workspace)
        goal_spec = spec(
            workspace,
            plan={"steps": steps},
            allowed_tools=["read_file", "run_command"],
            drift_every=0,
            continue_as_new_after_nodes=10,
        )
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=goal_spec),
            id=out.stem,
            task_queue=task_queue,
            task_timeout=goal_spec.task_timeout(),
        )
        result = await handle.result()
        assert result.outcome == "succeeded", result.excerpt
        first = await env.client.get_workflow_handle(out.stem, run_id=handle.result_run_id).fetch_history()
        last = await env.client.get_workflow_handle(out.stem).fetch_history()
    assert first.events[-1].HasField("workflow_execution_continued_as_new_event_attributes"), "no continue-as-new"
    save(out.with_name(f"{out.stem}-first-run.json"), first)
    save(out.with_name(f"{out.stem}-last-run.json"), last)


async def record_goal_read_error(env: WorkflowEnvironment, out: Path) -> None:
    """A read in a workspace the worker does not have (a local activity that fails for
    good) next to an llm step: the read's error settles its node as failed (it does not
    stay running), the llm step finishes, and the goal ends partial."""
    read = {"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md"}}
    async with rig(env, STEP_REPLY) as (workspace, task_queue):
        goal_spec = spec(workspace / "missing", plan={"steps": [read, llm("other")]}, drift_every=0)
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
        )
        result = await handle.result()
        assert result.outcome == "partial" and result.failed_steps == ["read"], result.excerpt
        save(out, await handle.fetch_history())


async def record_goal_resume_behind_park(env: WorkflowEnvironment, out: Path) -> None:
    """A park and a resume sent by signal before any worker ran: judged in their turn, the
    park applies and the resume right behind it finds the goal parked and resumes it; the
    gate then runs, and an abort by update stops it."""
    with tempfile.TemporaryDirectory() as tmp:
        workspace, task_queue = Path(tmp), f"record-{uuid.uuid4().hex[:8]}"
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan={"steps": [gate()]}, drift_every=0)),
            id=out.stem,
            task_queue=task_queue,
        )
        for message in (Park(request_id="pk-1", reason="legal"), Resume(request_id="rs-1")):
            await handle.signal(GoalWorkflow.message_signal, message.model_dump(mode="json"))
        store = DiskArtifactStore(workspace / "artifacts")
        async with build_worker(env.client, task_queue=task_queue, store=store, model_config=ModelConfig(profiles={})):
            await wait_until(handle, lambda s: "gate" in s.running)
            inbox = await handle.query(GoalWorkflow.inbox)
            assert [(e.kind, e.status) for e in inbox.entries] == [("park", "applied"), ("resume", "applied")], inbox
            await submit(handle, Abort(request_id="ab-1", reason="enough"))
            await goal_reads.ended(handle)
        save(out, await handle.fetch_history())


@contextlib.contextmanager
def services(*kinds) -> AsyncIterator:
    """Fake services for a scenario, with the variables that point the effect tools at them."""
    with contextlib.ExitStack() as stack:
        started = []
        for kind, options in kinds:
            service = kind(**options).start()
            stack.callback(service.stop)
            for name, value in service.worker_env().items():
                stack.enter_context(_env(name, value))
            started.append(service)
        yield started


@contextlib.contextmanager
def _env(name: str, value: str):
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


async def record_goal_approval_and_rollback(env: WorkflowEnvironment, out: Path) -> None:
    """An irreversible payment approved on the approvals-ahead card asked at adoption (1.1:
    1.0 code asked when the payment was due), then an abort with rollback: the payment is
    refunded by the compensation recorded before it was sent."""
    pay = {"amount_cents": 12_500, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 42"}
    steps = [{"name": "pay", "kind": "tool", "tool": "make_payment", "args": pay}, gate(["pay"])]
    with services((PaymentsAPI, {"api_key": PAYMENTS_KEY})):
        async with rig(env) as (workspace, task_queue):
            goal_spec = spec(workspace, plan={"steps": steps}, allowed_tools=["make_payment", "run_command"])
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
            )
            await wait_until(handle, lambda s: s.questions)
            await submit(handle, Approve(request_id="ok-1", question_id="q1"))
            await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
            await submit(handle, Abort(request_id="ab-1", reason="wrong invoice", rollback=True))
            result = await goal_reads.ended(handle)
            (workspace / "GO").touch()
    assert result.outcome == "aborted", result.excerpt
    save(out, await handle.fetch_history())


async def record_goal_uncertain_answered(env: WorkflowEnvironment, out: Path) -> None:
    """A once webhook that never answers definitely: the step is uncertain, a person
    answers that it happened, nothing is sent again and the goal finishes."""
    with services((WebhookReceiver, {})) as (hook,):
        hook.reply_status = 503
        notice = {"url": f"{hook.base_url}/deploys", "payload": {"release": "2.0"}}
        steps = [{"name": "notice", "kind": "tool", "tool": "notify_webhook", "args": notice}]
        async with rig(env) as (workspace, task_queue):
            goal_spec = spec(workspace, plan={"steps": steps}, allowed_tools=["notify_webhook"])
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
            )
            asked = await wait_until(handle, lambda s: s.questions, timeout_s=60)
            await submit(handle, Answer(request_id="u-1", question_id=asked.questions[0].id, choice="happened"))
            result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt
    save(out, await handle.fetch_history())


async def record_goal_drift_and_hard_gate(env: WorkflowEnvironment, out: Path) -> None:
    """A drift check that re-plans (more steps), and the hard budget gate refusing the
    steps the budget cannot cover."""
    revised = {"steps": [llm("one"), llm("two", ["one"]), *[llm(f"tail{i}", ["two"]) for i in range(6)]]}
    usage = {"input_tokens": 500, "output_tokens": 500}
    script = {
        "replies": [
            {"when": "PERDURE-DRIFT", "times": 1, "json": {"on_track": False, "reason": "it stops too early"}},
            {"when": "PERDURE-DRIFT", "json": {"on_track": True, "reason": "fine"}},
            {"when": "Revise the current plan", "json": revised},
            {**STEP_REPLY["replies"][0], "usage": usage},
        ]
    }
    async with rig(env, script) as (workspace, task_queue):
        plan = {"steps": [llm("one"), llm("two", ["one"])]}
        goal_spec = spec(workspace, plan=plan, drift_every=2, budget=Budget(max_tokens=6_000))
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
        )
        result = await handle.result()
    assert result.outcome == "partial", result.excerpt
    assert any("not started" in line for line in result.unfinished), result.unfinished
    save(out, await handle.fetch_history())


async def record_goal_own_calls_bounded(env: WorkflowEnvironment, out: Path) -> None:
    """Drift checks, each shown an outline of the plan, and the one the budget cannot afford
    (the step in flight holds its estimate) not sent."""
    script = {
        "replies": [
            {"when": "PERDURE-DRIFT", "json": {"on_track": True, "reason": "fine"}},
            {**STEP_REPLY["replies"][0], "usage": {"input_tokens": 900, "output_tokens": 100}},
        ]
    }
    async with rig(env, script) as (workspace, task_queue):
        steps = [llm("one"), llm("two", ["one"]), llm("three", ["two"])]
        goal_spec = spec(
            workspace, plan={"steps": steps}, drift_every=1, budget=Budget(max_tokens=4_500), soft_gate=1.0
        )
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
        )
        result = await handle.result()
        gate_log = (await handle.query(GoalWorkflow.progress)).gate_log
    assert result.outcome == "succeeded", result.excerpt
    assert result.own_calls["drift check"].calls == 2, result.own_calls
    assert any(line.startswith("drift check 2 not sent: its estimate of") for line in gate_log), gate_log
    save(out, await handle.fetch_history())


async def record_goal_stall_ladder(env: WorkflowEnvironment, out: Path) -> None:
    """An agent reading the same file over and over: the stall ladder reminds it, tells it
    to switch tools, then asks a person, who abandons the path."""
    loop = {"name": "read_file", "arguments": {"path": "same.txt"}}
    script = {"replies": [{"when": "PERDURE-AGENT", "tool_calls": [loop]}]}
    async with rig(env, script) as (workspace, task_queue):
        (workspace / "same.txt").write_text("the same answer every time")
        hunt = agent("hunt", "Find it.", ["read_file"], max_turns=20)
        goal_spec = spec(workspace, plan={"steps": [hunt]}, drift_every=0)
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
        )
        asked = await wait_until(handle, lambda s: s.questions, timeout_s=60)
        await submit(handle, Answer(request_id="st-1", question_id=asked.questions[0].id, choice="abandon"))
        result = await goal_reads.ended(handle)
    assert result.failed_steps == ["hunt"], result.excerpt
    save(out, await handle.fetch_history())


async def record_goal_agent_waits_across_runs(env: WorkflowEnvironment, out: Path) -> None:
    """An agent asks to pay; the approval stays open while a chain of reads continues
    as new twice, is given in a later run, and the agent goes on from its turn: the
    first run (the question asked) and the last (the answer acted on) are kept."""
    pay = {"amount_cents": 4_200, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 7"}
    script = {
        "replies": [
            {"when": "to ACME GmbH (payment", "content": "Paid invoice 7."},
            {"when": "PERDURE-AGENT", "tool_calls": [{"name": "make_payment", "arguments": pay}]},
        ]
    }
    read = {"kind": "tool", "tool": "read_file"}
    reads = [
        {"name": f"read-{i:02d}", **read, "args": {"path": "notes.md", "max_bytes": i + 99}}
        | ({"needs": [f"read-{i - 1:02d}"]} if i else {})
        for i in range(30)
    ]
    # Pinned where the plan puts it (`defer: false`): the risk order would otherwise hold the
    # payment back until the reads are done, and nothing would wait across runs.
    steps = [{**agent("settle", "Settle invoice 7.", ["make_payment"]), "defer": False}, *reads]
    with services((PaymentsAPI, {"api_key": PAYMENTS_KEY})):
        async with rig(env, script) as (workspace, task_queue):
            (workspace / "notes.md").write_text("a note\n")
            goal_spec = spec(
                workspace,
                plan={"steps": steps},
                allowed_tools=["make_payment", "read_file"],
                drift_every=0,
                continue_as_new_after_events=50,
                local_activities_up_to_s=0,
            )
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
            )
            done = await wait_until(handle, lambda s: statuses(s)["read-29"] == "succeeded", timeout_s=60)
            assert done.runs >= 3 and statuses(done)["settle"] == "blocked", done
            await submit(handle, Approve(request_id="ok-1", question_id="q1"))
            result = await handle.result()
            first = await env.client.get_workflow_handle(out.stem, run_id=handle.result_run_id).fetch_history()
            last = await env.client.get_workflow_handle(out.stem).fetch_history()
    assert result.outcome == "succeeded", result.excerpt
    save(out.with_name(f"{out.stem}-first-run.json"), first)
    save(out.with_name(f"{out.stem}-last-run.json"), last)


async def record_capabilities(env: WorkflowEnvironment, out: Path) -> None:
    """`perdure profiles` asking a worker what it offers: one activity, its answer."""
    async with rig(env, STEP_REPLY) as (_, task_queue):
        handle = await env.client.start_workflow(
            CapabilitiesWorkflow.run, CapabilitiesInput(), id=out.stem, task_queue=task_queue
        )
        offer = await handle.result()
    assert offer.tools and offer.default_profile, offer
    save(out, await handle.fetch_history())


async def record_worker_offers(env: WorkflowEnvironment, out: Path) -> None:
    """What workers offer, published while they run: the worker's own offer (signal-with-start
    by its publisher), a second worker's, then the first again with its config changed."""
    async with rig(env) as (_, task_queue):
        handle = env.client.get_workflow_handle(worker_offers_id(task_queue))

        async def offers(count: int) -> list[PublishedOffer]:
            for _ in range(100):
                try:
                    found = await (await handle.describe()).memo_value(OFFERS_MEMO, [], type_hint=list[PublishedOffer])
                except Exception:  # noqa: BLE001 - not started yet
                    found = []
                if len(found) >= count:
                    return found
                await asyncio.sleep(0.1)
            raise AssertionError(f"never {count} offers")

        [own] = await offers(1)
        other = OfferAnnouncement(worker="4242@elsewhere", offer=own.offer.model_copy(update={"tools": ["read_file"]}))
        await handle.signal(OFFER_SIGNAL, other)
        await offers(2)
        changed = own.offer.model_copy(update={"config_problem": "cannot read model profiles from config.toml"})
        await handle.signal(OFFER_SIGNAL, OfferAnnouncement(worker=own.worker, offer=changed))
        for _ in range(100):
            if (await offers(2))[0].offer.config_problem:
                break
            await asyncio.sleep(0.1)
    save(out, await handle.fetch_history())


async def record_devices_offline_then_back(env: WorkflowEnvironment, out: Path) -> None:
    """A goal whose device went offline before it started: a read waits as `offline`, the
    device announces itself again, the read runs there and a write on the device (on the
    approvals-ahead card at adoption, its content known only then) asks for and gets
    approval. Kept: the goal's history and the device registry's."""
    async with rig(env) as (workspace, task_queue):
        with tempfile.TemporaryDirectory() as machines:
            laptop = InProcessDevice(env, task_queue, "laptop", Path(machines) / "laptop")
            laptop.root.mkdir()
            (laptop.root / "notes.md").write_text("from the laptop\n")
            await laptop.start()
            await laptop.stop()
            registry = env.client.get_workflow_handle(registry_id(task_queue))
            while True:
                listing = await registry.query(RegistryQueries.DEVICES, result_type=DeviceListing)
                if not any(r.presence.online for r in listing.devices):
                    break
                await asyncio.sleep(0.1)
            steps = [
                {"name": "read", "kind": "tool", "tool": "read_file", "device": "laptop", "args": {"path": "notes.md"}},
                {
                    "name": "save",
                    "kind": "tool",
                    "tool": "write_file",
                    "device": "laptop",
                    "needs": ["read"],
                    "args": {"path": "copy.md", "content": "{{steps.read}}"},
                },
            ]
            goal_spec = spec(workspace, plan={"steps": steps}, allowed_tools=["read_file", "write_file"])
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal_spec), id=f"{out.stem}-goal", task_queue=task_queue
            )
            await wait_until(handle, lambda s: s.waiting_for_devices == {"read": "laptop"})
            # Since issue 38 the write is on the approvals-ahead card at adoption (q1), its
            # content "will ask when known": approved there, it is asked again when it runs.
            await submit(handle, Approve(request_id="ok-0", question_id="q1"))
            back = InProcessDevice(env, task_queue, "laptop", laptop.root)
            await back.start()
            asked = await wait_until(handle, lambda s: any(q.topic == "confirm_device_call" for q in s.questions))
            await submit(handle, Approve(request_id="ok-1", question_id=asked.questions[0].id))
            result = await handle.result()
            await back.stop()
            goal_history = await handle.fetch_history()
            registry_history = await registry.fetch_history()
    assert result.outcome == "succeeded", result.excerpt
    save(out.with_name(f"{out.stem}-goal.json"), goal_history)
    save(out.with_name(f"{out.stem}-registry.json"), registry_history)


async def record_goal_verified_after_park(env: WorkflowEnvironment, out: Path) -> None:
    """Two reads and a gate; parked, one read file edited, resumed after the goal's (short)
    verify_after_s: the check voids the read of the edited file and the gate, which run
    again (workflows/goal/verification.py)."""
    async with rig(env) as (workspace, task_queue):
        (workspace / "a.md").write_text("alpha\n")
        (workspace / "b.md").write_text("beta\n")
        steps = [
            {"name": "read-a", "kind": "tool", "tool": "read_file", "args": {"path": "a.md"}},
            {"name": "read-b", "kind": "tool", "tool": "read_file", "args": {"path": "b.md"}},
            gate(["read-a", "read-b"]),
        ]
        goal = spec(
            workspace,
            plan={"steps": steps},
            allowed_tools=["read_file", "run_command"],
            verify_after_s=1,
            drift_every=0,
        )
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal), id=out.stem, task_queue=task_queue
        )
        await wait_until(handle, lambda s: "gate" in s.running)
        await submit(handle, Park(request_id="pk-1", reason="weekend"))
        await wait_until(handle, lambda s: s.parked)
        (workspace / "a.md").write_text("alpha, edited\n")
        await asyncio.sleep(1.2)
        await submit(handle, Resume(request_id="rs-1"))
        await wait_until(handle, lambda s: s.plan_version == 2 and "gate" in s.running)
        (workspace / "GO").write_text("")
        await handle.result()
        save(out, await handle.fetch_history())


async def record_goal_replanned_on_evidence(env: WorkflowEnvironment, out: Path) -> None:
    """A goal the planner planned: a step concludes the opposite of an earlier step's
    conclusion, the goal re-plans on that evidence once (finished steps kept), and the
    new step's conclusion disputing it again is held off by the spacing."""
    survey = llm("survey", prompt="Survey the cache.")
    recheck = llm("recheck", ["survey"], prompt="Check the cache again.")
    confirm = llm("confirm", ["recheck"], prompt="Confirm the cache state.")
    script = {
        "replies": [
            {
                "when": ["Revise the current plan", "conflicting evidence"],
                "json": {"steps": [survey, recheck, confirm]},
            },
            {"when": "PERDURE-PLANNER", "times": 1, "json": {"steps": [survey, recheck]}},
            {"when_last": "step: survey", "content": "Conclusion: the cache is stale = true"},
            {"when_last": "step: recheck", "content": "Conclusion: the cache is stale = false"},
            {"when_last": "step: confirm", "content": "Conclusion: the cache is stale = true"},
        ]
    }
    async with rig(env, script) as (workspace, task_queue):
        goal_spec = spec(workspace, drift_every=0, evidence_spacing_s=3600)
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
        )
        result = await handle.result()
        snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded" and snapshot.plan_version == 2, result.excerpt
    assert any("held off" in line for line in snapshot.gate_log), snapshot.gate_log
    save(out, await handle.fetch_history())


async def record_goal_risk_order(env: WorkflowEnvironment, out: Path) -> None:
    """An email ready at once waits for the independent gate and the two local writers,
    and the second writer of one file waits for the first (workflows/goal/rules/risk_order.py)."""

    def writer(name: str) -> dict:
        line = f"echo {name} >> util.py"
        return {"name": name, "kind": "tool", "tool": "run_command", "args": {"command": line}, "writes": ["util.py"]}

    mail = {"to": "owner@example.com", "subject": "Done", "body": "All done."}
    steps = [{"name": "email", "kind": "tool", "tool": "send_email", "args": mail}, gate(), writer("fix-a")]
    steps.append(writer("fix-b"))
    with services((MailAPI, {"api_key": MAIL_KEY})) as (mail_api,):
        async with rig(env) as (workspace, task_queue):
            goal = spec(workspace, plan={"steps": steps}, allowed_tools=["send_email", "run_command"], drift_every=0)
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal), id=out.stem, task_queue=task_queue
            )
            snapshot = await wait_until(handle, lambda s: statuses(s)["fix-b"] == "succeeded")
            held = {n.name: n.held_back for n in snapshot.nodes}
            assert held["email"] and held["fix-b"] and mail_api.ledger() == [], held
            (workspace / "GO").touch()
            result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt
    save(out, await handle.fetch_history())


async def record_router_routes(env: WorkflowEnvironment, out: Path) -> None:
    """A user's router: a message bound to a goal by the file it names, one the model places,
    one it is unsure of (asked, then picked), a light request answered; it continues as new
    after three routed messages with the question still open, and the pick lands in the new
    run. Kept: the first run's history and the last's."""
    from perdure.starters.client import router_calls
    from perdure.workflows.router.router_contracts import Pick, RouterInput, Say, router_id
    from perdure.workflows.router.router_workflow import RouterWorkflow

    def choice(target: str, confidence: float = 0.9) -> str:
        return json.dumps({"target": target, "mode": "steer", "confidence": confidence, "reason": "recorded"})

    script = {
        "replies": [
            {"when": ["[PERDURE-ROUTER]", "warmer"], "content": choice("rec-poster"), "times": 1},
            {"when": ["[PERDURE-ROUTER]", "tweak"], "content": choice("rec-poster", 0.2), "times": 1},
            {"when": ["[PERDURE-ROUTER]", "a font"], "content": choice("answer"), "times": 1},
            {"when": ["[PERDURE-ROUTER-ANSWER]"], "content": "A bold sans-serif.", "times": 1},
        ]
    }
    async with rig(env, script) as (workspace, task_queue):
        steps = [
            {"name": "write", "kind": "tool", "tool": "write_file", "args": {"path": "poster.svg", "content": "<svg>"}},
            gate(["write"]),
        ]
        goal_spec = spec(workspace, plan={"steps": steps}, allowed_tools=["write_file", "run_command"])
        goal = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id="rec-poster", task_queue=task_queue
        )
        await wait_until(goal, lambda s: "gate" in s.running)
        user = "recorder-routes"  # each scenario its own router: they run on one server
        router = await env.client.start_workflow(
            RouterWorkflow.run,
            RouterInput(user=user, profile="test", continue_after=4),
            id=router_id(user),
            task_queue=task_queue,
        )
        with _env("PERDURE_TASK_QUEUE", task_queue):
            for request_id, text in [
                ("r1", "poster.svg: a bigger title"),
                ("r2", "make it a bit warmer"),
                ("r3", "tweak the colours"),
                ("r4", "what is a font for posters?"),
            ]:
                message = Say(request_id=request_id, text=text, workspace=str(workspace))
                await router_calls.say(env.client, user, message, profile="test")
            while (
                await env.client.get_workflow_handle(router_id(user)).describe()
            ).run_id == router.first_execution_run_id:
                await asyncio.sleep(0.1)  # continued as new, the question still open
            pick = Say(request_id="r5", text="pick", pick=Pick(request_id="r3", choice="rec-poster"))
            await router_calls.say(env.client, user, pick, profile="test")
        (workspace / "GO").write_text("")
        await goal.result()
        first = await env.client.get_workflow_handle(
            router_id(user), run_id=router.first_execution_run_id
        ).fetch_history()
        last = await env.client.get_workflow_handle(router_id(user)).fetch_history()
    assert first.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    save(out.with_name(f"{out.stem}-first-run.json"), first)
    save(out.with_name(f"{out.stem}-last-run.json"), last)


async def record_router_starts_a_goal(env: WorkflowEnvironment, out: Path) -> None:
    """A user's router starts a goal for a message that asks for one (`--new`), its text in
    the goal's memo, and the goal ends while the router runs."""
    from perdure.starters.client import router_calls
    from perdure.workflows.router.router_contracts import RouterInput, Say, router_id
    from perdure.workflows.router.router_workflow import RouterWorkflow

    plan = {"steps": [{"name": "look", "kind": "tool", "tool": "list_dir", "args": {}}]}
    async with rig(env, {"replies": [{"when": "PERDURE-PLANNER", "json": plan}]}) as (workspace, task_queue):
        user = "recorder-starts"
        router = await env.client.start_workflow(
            RouterWorkflow.run, RouterInput(user=user, profile="test"), id=router_id(user), task_queue=task_queue
        )
        with _env("PERDURE_TASK_QUEUE", task_queue):
            message = Say(request_id="r1", text="list what is here", workspace=str(workspace), new=True)
            routing = await router_calls.say(env.client, user, message, profile="test")
        assert routing is not None and routing.action == "new goal", routing
        result = await env.client.get_workflow_handle(routing.goal_id, result_type=GoalResult).result()
        assert result.outcome == "succeeded", result.excerpt
        while not any(
            e.HasField("child_workflow_execution_completed_event_attributes")
            for e in (await router.fetch_history()).events
        ):
            await asyncio.sleep(0.1)  # the goal's end reached the router
        save(out, await router.fetch_history())


async def record_goal_memory(env: WorkflowEnvironment, out: Path) -> None:
    """A goal using memory: a project memory recalled into a step's input, the step's
    conclusion written and recalled by the next step; the goal has no owner, so its
    end-of-goal card goes to no router and the gate log says why (the card's way to a
    router is memory-1.0-card-to-router)."""
    from perdure.memory.store import open_store
    from perdure.workflows.goal.contracts.memory_contracts import MemorySource, NewMemory

    script = {
        "replies": [
            {
                "when_last": "step: export",
                "content": "CONCLUSION: the CSV export for Excel needs a byte order mark = true",
            },
            {"when": "PERDURE-STEP", "content": "checked"},
        ]
    }
    steps = [
        llm("export", prompt="Write the CSV export notes for Excel users."),
        llm("check", ["export"], prompt="Check the CSV export notes for Excel."),
    ]
    async with rig(env, script) as (workspace, task_queue):
        seeded = open_store(home=workspace.parent)
        now = datetime.now(UTC)
        seeded.write(
            [
                NewMemory(
                    layer="semantic",
                    kind="note",
                    text="CSV exports for Excel need a UTF-8 byte order mark",
                    source=MemorySource(kind="person"),
                    scope="project",
                    scope_key=str(workspace),
                    made_at=now - timedelta(days=3),
                )
            ]
        )
        seeded.close()
        handle = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan={"steps": steps}, drift_every=0)),
            id=out.stem,
            task_queue=task_queue,
        )
        result = await handle.result()
        gate_log = (await handle.query(GoalWorkflow.progress)).gate_log
    assert result.outcome == "succeeded", result.excerpt
    assert any("candidate(s) to keep across goals not sent: the goal has no owner" in line for line in gate_log), (
        gate_log
    )
    save(out, await handle.fetch_history())


async def record_memory_card_to_router(env: WorkflowEnvironment, out: Path) -> None:
    """The end-of-goal memory card sent to the owner's router: the goal's step concludes
    something, the goal ends at once and, its owner having no router yet, starts one and
    signals it the card; the user keeps the conclusion for the project there. Kept: the
    goal's history and the router's (holding the card with its shelf-life timer, the
    answer promoting it)."""
    from temporalio.common import SearchAttributePair, TypedSearchAttributes

    from perdure.starters.client import router_calls
    from perdure.workflows.router.router_contracts import CardAction, RouterHandlers, RouterView, Say, router_id
    from perdure.workflows.shared.search_attributes import OWNER

    concluded = "CONCLUSION: the build step must run before the tests = true"
    script = {"replies": [{"when": "PERDURE-STEP", "content": concluded}]}
    user = "recorder-card"
    async with rig(env, script) as (workspace, task_queue):
        goal_spec = spec(workspace, plan={"steps": [llm("probe", prompt="Find out how the tests run.")]}, drift_every=0)
        goal = await env.client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=goal_spec),
            id="rec-memory-card",
            task_queue=task_queue,
            search_attributes=TypedSearchAttributes([SearchAttributePair(OWNER, user)]),
        )
        await goal.result()  # no answer: the goal's work is done, so it ends
        router = env.client.get_workflow_handle(router_id(user))
        while not (await router.query(RouterHandlers.VIEW, result_type=RouterView)).cards:
            await asyncio.sleep(0.1)
        with _env("PERDURE_TASK_QUEUE", task_queue):
            card = CardAction(goal_id="rec-memory-card", question_id="memory", choice="project")
            answer = Say(request_id="keep-1", text="answer project", card=card)
            await router_calls.say(env.client, user, answer, profile="test")
        save(out.with_name(f"{out.stem}-goal.json"), await goal.fetch_history())
        save(out.with_name(f"{out.stem}-router.json"), await router.fetch_history())


async def record_goal_wait_steps(env: WorkflowEnvironment, out: Path) -> None:
    """Two wait steps (after, until) held across a park with a wake time: they let go of
    their timers while parked and take them up on waking; a step after them reads both."""
    until = (datetime.now(UTC) + timedelta(seconds=4)).replace(microsecond=0)
    steps = [
        {"name": "soon", "kind": "wait", "after": "3s"},
        {"name": "at", "kind": "wait", "until": until.isoformat()},
        llm("then", ["soon", "at"]),
    ]
    async with rig(env, STEP_REPLY) as (workspace, task_queue):
        goal_spec = spec(workspace, plan={"steps": steps}, drift_every=0)
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
        )
        await wait_until(handle, lambda s: statuses(s).get("soon") == "parked")
        wake = datetime.now(UTC) + timedelta(seconds=1)
        await submit(handle, Park(request_id="park-1", reason="a moment", until=wake))
        await handle.result()
        save(out, await handle.fetch_history())


async def _reserve(env: WorkflowEnvironment, task_queue: str, key: str, limits) -> None:
    from temporalio.client import WithStartWorkflowOperation
    from temporalio.common import WorkflowIDConflictPolicy

    from perdure.workflows.quota.quota_workflow import (
        QUOTA_WORKFLOW,
        RESERVE_UPDATE,
        QuotaRequest,
        QuotaSlot,
        QuotaState,
        quota_workflow_id,
    )

    start = WithStartWorkflowOperation(
        QUOTA_WORKFLOW,
        QuotaState(resource="api"),
        id=quota_workflow_id("api", task_queue),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    await env.client.execute_update_with_start_workflow(
        RESERVE_UPDATE,
        QuotaRequest(key=key, limits=limits, tokens=500),
        start_workflow_operation=start,
        result_type=QuotaSlot,
    )


async def record_quota_slots(env: WorkflowEnvironment, out: Path) -> None:
    """A resource's quota service handing out spaced slots by requests and tokens, one key
    asking twice (the same slot)."""
    from perdure.workflows.quota.quota_workflow import QuotaLimits, quota_workflow_id

    limits = QuotaLimits(requests_per_minute=120, tokens_per_minute=60_000)
    async with rig(env) as (_, task_queue):
        for key in ("g1/1/1", "g2/1/1", "g1/1/1", "g3/2/1"):
            await _reserve(env, task_queue, key, limits)
        save(out, await env.client.get_workflow_handle(quota_workflow_id("api", task_queue)).fetch_history())


async def record_quota_places(env: WorkflowEnvironment, out: Path) -> None:
    """Concurrency places: two held, a third caller queued, a release, the queued one admitted."""
    from perdure.workflows.quota.quota_workflow import RELEASE_SIGNAL, QuotaLimits, quota_workflow_id

    limits = QuotaLimits(concurrency=2, requests_per_minute=600)
    async with rig(env) as (_, task_queue):
        handle = env.client.get_workflow_handle(quota_workflow_id("api", task_queue))
        for key in ("g1/1/1", "g2/1/1", "g3/1/1"):
            await _reserve(env, task_queue, key, limits)
        await handle.signal(RELEASE_SIGNAL, "g1/1/1")
        await _reserve(env, task_queue, "g3/1/1", limits)
        save(out, await handle.fetch_history())


async def record_goal_late_wait_cause(env: WorkflowEnvironment, out: Path) -> None:
    """A wait step whose timer fires while no worker runs: the step, acting when a worker is
    back, reads off history that the timer fired on time and no worker took the goal."""
    steps = [{"name": "soon", "kind": "wait", "after": "2s"}, llm("then", ["soon"])]
    with tempfile.TemporaryDirectory() as tmp:
        store = DiskArtifactStore(Path(tmp) / "artifacts")
        workspace = Path(tmp) / "workspace"
        workspace.mkdir()
        task_queue = f"record-{uuid.uuid4().hex[:8]}"
        with ScriptedServer(STEP_REPLY) as server:
            config = ModelConfig(profiles={"test": openai_profile(server)})
            goal_spec = spec(workspace, plan={"steps": steps}, drift_every=0)
            async with build_worker(env.client, task_queue=task_queue, store=store, model_config=config):
                handle = await env.client.start_workflow(
                    GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
                )
                await wait_until(handle, lambda s: statuses(s).get("soon") == "parked")
            await asyncio.sleep(9)  # no worker: the timer fires with nobody to act on it
            async with build_worker(env.client, task_queue=task_queue, store=store, model_config=config):
                await handle.result()
        save(out, await handle.fetch_history())


async def record_goal_mcp_tools(env: WorkflowEnvironment, out: Path) -> None:
    """A goal using the tools of an MCP server (testing/ledger_mcp_server.py): the catalogue
    listed once, a safe read called directly, then a once write through the effect rules."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["-m", "perdure.testing.ledger_mcp_server", "--ledger", str(Path(tmp) / "ledger.jsonl")]
        table = {"command": sys.executable, "args": args, "writable": [tmp]}
        table["tools"] = {"echo": {"risk": "read", "replay": "safe"}}
        servers = McpServers(servers_from({"notes": table}, "recorder"))
        echo, note = "mcp__notes__echo", "mcp__notes__add_note"
        steps = [
            {"name": "hear", "kind": "tool", "tool": echo, "args": {"text": "hello"}},
            {"name": "note", "kind": "tool", "tool": note, "args": {"title": "heard", "body": "{{steps.hear}}"}},
        ]
        steps[1]["needs"] = ["hear"]
        async with rig(env, mcp=servers) as (workspace, task_queue):
            goal_spec = spec(workspace, plan={"steps": steps}, allowed_tools=[echo, note])
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
            )
            result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt
    save(out, await handle.fetch_history())


async def record_goal_user_tools(env: WorkflowEnvironment, out: Path) -> None:
    """A user's own tools (tests/usertool_sample.py): the catalogue listed once, a paid read
    and a keyed paid charge (prepared by the local activity, its refund registered first),
    their costs charged; then an abort with rollback runs the refund."""
    charge = {"amount_cents": 1200, "recipient": "ACME GmbH", "memo": "invoice 7"}
    steps = [
        {"name": "price", "kind": "tool", "tool": "quote", "args": {"amount_cents": 1200}},
        {"name": "pay", "kind": "tool", "tool": "charge", "args": charge, "needs": ["price"]},
        gate(["pay"]),
    ]
    toolbox = load_toolbox(["tests.usertool_sample"], with_entry_points=False)
    with services((PaymentsAPI, {"api_key": PAYMENTS_KEY})) as (payments,):
        async with rig(env, user_tools=toolbox) as (workspace, task_queue):
            allowed = ["quote", "charge", "run_command"]
            goal_spec = spec(workspace, plan={"steps": steps}, allowed_tools=allowed, budget=Budget(max_cost_usd=5))
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
            )
            await wait_until(handle, lambda s: statuses(s).get("gate") == "running")
            await submit(handle, Abort(request_id="ab-1", reason="wrong invoice", rollback=True))
            result = await goal_reads.ended(handle)
            (workspace / "GO").touch()
    assert result.outcome == "aborted", result.excerpt
    assert [e["kind"] for e in payments.ledger()] == ["payment", "refund"]
    save(out, await handle.fetch_history())


async def record_goal_writes_prepared_in_workflow(env: WorkflowEnvironment, out: Path) -> None:
    """A keyed write whose arguments are all in the plan, prepared by the workflow (its
    compensation recorded before it is sent), then one whose body names the first's output,
    prepared by the local activity that reads it (effect_guard.py)."""
    with services((LedgerAPI, {})) as (ledger,):
        entries = f"{ledger.base_url}/entries"
        undo = {"method": "DELETE", "url": f"{entries}/first"}
        first = {"method": "POST", "url": entries, "body": {"n": 1}, "undo": undo}
        steps = [
            {"name": "first", "kind": "tool", "tool": "http_request", "args": first},
            {
                "name": "second",
                "kind": "tool",
                "tool": "http_request",
                "args": {"method": "POST", "url": entries, "body": {"after": "{{steps.first}}"}},
                "needs": ["first"],
            },
        ]
        async with rig(env) as (workspace, task_queue):
            goal_spec = spec(workspace, plan={"steps": steps}, allowed_tools=["http_request"], drift_every=0)
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
            )
            result = await handle.result()
        assert len(ledger.ledger()) == 2
    assert result.outcome == "succeeded", result.excerpt
    save(out, await handle.fetch_history())


async def record_goal_keyed_local_writes(env: WorkflowEnvironment, out: Path) -> None:
    """Keyed writes as local activities (GoalSpec.local_keyed_writes, issue 39): a ledger
    entry fully known at plan time runs as a local activity; one with an undo (recorded
    before it is sent) and one naming the first's output keep their activities; then a once
    webhook, which keeps its activity scheduled before the call."""
    with services((LedgerAPI, {}), (WebhookReceiver, {})) as (ledger, hook):
        entries = f"{ledger.base_url}/entries"
        first = {"method": "POST", "url": entries, "body": {"n": 1}}
        undone = {
            "method": "POST",
            "url": entries,
            "body": {"n": 2},
            "undo": {"method": "DELETE", "url": f"{entries}/2"},
        }
        second = {"method": "POST", "url": entries, "body": {"after": "{{steps.first}}"}}
        notice = {"url": f"{hook.base_url}/deploys", "payload": {"entries": 3}}
        steps = [
            {"name": "first", "kind": "tool", "tool": "http_request", "args": first},
            {"name": "undone", "kind": "tool", "tool": "http_request", "args": undone, "needs": ["first"]},
            {"name": "second", "kind": "tool", "tool": "http_request", "args": second, "needs": ["first", "undone"]},
            {"name": "notice", "kind": "tool", "tool": "notify_webhook", "args": notice, "needs": ["second"]},
        ]
        async with rig(env) as (workspace, task_queue):
            goal_spec = spec(
                workspace,
                plan={"steps": steps},
                allowed_tools=["http_request", "notify_webhook"],
                drift_every=0,
                local_keyed_writes=True,
            )
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
            )
            result = await handle.result()
        assert len(ledger.ledger()) == 3 and len(hook.ledger()) == 1
    assert result.outcome == "succeeded", result.excerpt
    save(out, await handle.fetch_history())


async def record_goal_park_until_file(env: WorkflowEnvironment, out: Path) -> None:
    """A read, then a park until a workspace file exists: two checks miss (each a
    run_command activity, a doubling timer between), the file appears, the next check sees
    it and the goal resumes by itself and reads the file (issue 38)."""
    async with rig(env) as (workspace, task_queue):
        (workspace / "a.md").write_text("alpha\n")
        steps = [
            {"name": "read-a", "kind": "tool", "tool": "read_file", "args": {"path": "a.md"}},
            {"name": "read-ready", "kind": "tool", "tool": "read_file", "args": {"path": "READY"}, "needs": ["read-a"]},
        ]
        goal = spec(workspace, plan={"steps": steps}, allowed_tools=["read_file"], drift_every=0)
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal), id=out.stem, task_queue=task_queue
        )
        park = Park(request_id="pk-1", reason="waiting for CI", until_file="READY", poll_first_s=0.5, poll_max_s=1)
        await submit(handle, park)
        await wait_until(handle, lambda s: "checked 2 times" in (s.pause_reason or ""))
        (workspace / "READY").write_text("green\n")
        await handle.result()
        save(out, await handle.fetch_history())


async def record_goal_decision_log(env: WorkflowEnvironment, out: Path) -> None:
    """A decision log past its bound (4 kept): an agent's eight reasoned turns store its
    older entries in chunks (local activities), the goal continues as new carrying the
    refs, and a second agent's turns store another chunk in the last run (issue 38)."""

    def turns(marker: str, count: int) -> list[dict]:
        said = [
            {
                "when": marker,
                "times": 1,
                "content": f"I look in d{i} next.",
                "tool_calls": [{"name": "list_dir", "arguments": {"path": f"d{i}"}}],
            }
            for i in range(count)
        ]
        return [*said, {"when": marker, "times": 1, "content": f"{marker}: done."}]

    script = {"replies": [*turns("AGENT-EXPLORE", 8), *turns("AGENT-MORE", 4), *STEP_REPLY["replies"]]}
    steps = [
        agent("explore", "AGENT-EXPLORE: find the owner.", ["list_dir"], max_turns=12),
        agent("more", "AGENT-MORE: look again.", ["list_dir"], ["explore"], max_turns=8),
    ]
    async with rig(env, script) as (workspace, task_queue):
        for i in range(8):
            (workspace / f"d{i}").mkdir()
            (workspace / f"d{i}" / f"note-{i}.md").write_text(f"note {i}\n")
        goal_spec = spec(
            workspace,
            plan={"steps": steps},
            allowed_tools=["list_dir"],
            drift_every=0,
            decisions_kept=4,
            continue_as_new_after_events=50,
        )
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
        )
        result = await handle.result()
        first = await env.client.get_workflow_handle(out.stem, run_id=handle.result_run_id).fetch_history()
        last = await env.client.get_workflow_handle(out.stem).fetch_history()
    assert result.outcome == "succeeded", result.excerpt
    assert first.events[-1].HasField("workflow_execution_continued_as_new_event_attributes"), "no continue-as-new"
    assert len(result.decisions.chunks) >= 4, result.decisions
    save(out.with_name(f"{out.stem}-first-run.json"), first)
    save(out.with_name(f"{out.stem}-last-run.json"), last)


async def record_goal_question_expired(env: WorkflowEnvironment, out: Path) -> None:
    """A payment's confirmation (on the approvals-ahead card, with its step's deadline) with a 6 s
    deadline, reminding 4 s before it, denied on expiry
    (issue 38): the reminder and the deadline on one durable timer each, the payment never
    sent, the read that needs it dropped, the independent read done; the goal's own default
    deadline (48 h) beside the step's."""
    pay = {"amount_cents": 4_200, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 38"}
    deadline = {"after": "6s", "remind_before": "4s", "on_expiry": "deny"}
    steps = [
        {"name": "pay", "kind": "tool", "tool": "make_payment", "args": pay, "question_deadline": deadline},
        {"name": "receipt", "kind": "tool", "tool": "read_file", "args": {"path": "a.md"}, "needs": ["pay"]},
        {"name": "notes", "kind": "tool", "tool": "read_file", "args": {"path": "a.md", "max_bytes": 100}},
    ]
    with services((PaymentsAPI, {"api_key": PAYMENTS_KEY})) as (payments,):
        async with rig(env) as (workspace, task_queue):
            (workspace / "a.md").write_text("alpha\n")
            goal_spec = spec(
                workspace,
                plan={"steps": steps},
                allowed_tools=["make_payment", "read_file"],
                drift_every=0,
                question_deadline=DEFAULT_QUESTION_DEADLINE,
            )
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal_spec), id=out.stem, task_queue=task_queue
            )
            result = await handle.result()
        assert payments.ledger() == []
    assert result.outcome == "partial", result.excerpt
    save(out, await handle.fetch_history())


async def record_goal_approvals_ahead(env: WorkflowEnvironment, out: Path) -> None:
    """Approvals collected ahead (issue 38): at adoption one card lists the two payments
    (the second needs the first) with their arguments, and a third whose memo waits on a
    command's output as "will ask when known"; approved once while the command runs, the
    two run last with no second card, the third is confirmed when its arguments are known."""
    pay = {"amount_cents": 12_500, "currency": "EUR", "recipient": "ACME GmbH"}
    steps = [
        {"name": "pay-a", "kind": "tool", "tool": "make_payment", "args": {**pay, "memo": "invoice 42"}},
        {
            "name": "pay-b",
            "kind": "tool",
            "tool": "make_payment",
            "args": {**pay, "memo": "invoice 43"},
            "needs": ["pay-a"],
        },
        {"name": "build", "kind": "tool", "tool": "run_command", "args": {"command": "sleep 1; echo build 7"}},
        {
            "name": "pay-c",
            "kind": "tool",
            "tool": "make_payment",
            "args": {**pay, "memo": "{{steps.build}}"},
            "needs": ["build"],
        },
    ]
    with services((PaymentsAPI, {"api_key": PAYMENTS_KEY})) as (payments,):
        async with rig(env) as (workspace, task_queue):
            allowed = ["make_payment", "run_command"]
            goal = spec(workspace, plan={"steps": steps}, allowed_tools=allowed, drift_every=0)
            handle = await env.client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal), id=out.stem, task_queue=task_queue
            )
            card = (await wait_until(handle, lambda s: s.questions)).questions[0]
            assert [a.step for a in card.ahead] == ["pay-a", "pay-b", "pay-c"], card
            await submit(handle, Answer(request_id="ok-1", question_id=card.id, choice="approve"))
            known = await wait_until(handle, lambda s: any(q.id != card.id for q in s.questions))
            await submit(handle, Approve(request_id="ok-2", question_id=known.questions[0].id))
            result = await handle.result()
    assert result.outcome == "succeeded", result.excerpt
    assert len(payments.ledger()) == 3, payments.ledger()
    save(out, await handle.fetch_history())


SCENARIOS = {
    "goal-1.0-demo": record_goal_demo,
    "goal-1.1-steered": record_goal_steered,
    "goal-1.0-continue-as-new": record_goal_continue_as_new,
    "goal-1.0-read-segments": record_goal_segments,
    "goal-1.0-read-batches": record_goal_read_batches,
    "goal-1.0-read-ahead": record_goal_read_ahead,
    "goal-1.0-read-commits": record_goal_read_commits,
    "goal-1.0-dispatch-passes": record_goal_dispatch_passes,
    "goal-1.0-read-error": record_goal_read_error,
    "goal-1.0-resume-behind-park": record_goal_resume_behind_park,
    "goal-1.1-approval-and-rollback": record_goal_approval_and_rollback,
    "goal-1.0-uncertain-answered": record_goal_uncertain_answered,
    "goal-1.0-writes-prepared-in-workflow": record_goal_writes_prepared_in_workflow,
    "goal-1.0-drift-and-hard-gate": record_goal_drift_and_hard_gate,
    "goal-1.0-own-calls-bounded": record_goal_own_calls_bounded,
    "goal-1.1-parked-then-judged": record_goal_parked_then_judged,
    "goal-1.0-stall-ladder": record_goal_stall_ladder,
    "goal-1.0-agent-waits-across-runs": record_goal_agent_waits_across_runs,
    "goal-1.0-nodes-per-run": record_goal_nodes_per_run,
    "goal-1.1-verified-after-park": record_goal_verified_after_park,
    "goal-1.0-risk-order": record_goal_risk_order,
    "goal-1.0-replanned-on-evidence": record_goal_replanned_on_evidence,
    "goal-1.1-wait-steps": record_goal_wait_steps,
    "goal-1.0-late-wait-cause": record_goal_late_wait_cause,
    "goal-1.0-mcp-tools": record_goal_mcp_tools,
    "goal-1.1-user-tools": record_goal_user_tools,
    "goal-1.1-park-until-file": record_goal_park_until_file,
    "goal-1.1-decision-log": record_goal_decision_log,
    "goal-1.1-question-expired": record_goal_question_expired,
    "goal-1.1-approvals-ahead": record_goal_approvals_ahead,
    "goal-1.1-keyed-local-writes": record_goal_keyed_local_writes,
    "goal-1.0-memory": record_goal_memory,
    "memory-1.0-card-to-router": record_memory_card_to_router,
    "devices-1.1-offline-then-back": record_devices_offline_then_back,
    "router-1.0-routes": record_router_routes,
    "router-1.0-starts-a-goal": record_router_starts_a_goal,
    "watchdog-1.0-nudge": record_watchdog_nudge,
    "watchdog-1.0-judge": record_watchdog_judge,
    "quota-1.0-slots": record_quota_slots,
    "quota-1.0-places": record_quota_places,
    "capabilities-1.0": record_capabilities,
    "worker-offers-1.0": record_worker_offers,
}


# Kept gzipped: the 1,000 results of this one repeat one long path.
GZIPPED = {"goal-1.0-read-commits", "goal-1.0-dispatch-passes"}


async def main(into: Path = HISTORIES) -> None:
    """Record the scenarios that have no golden history in `into` yet (every one, into
    an empty directory: `python -m tests.record_histories DIR` checks the recorder)."""
    todo = {name: fn for name, fn in SCENARIOS.items() if not list(into.glob(f"{name}*.json*"))}
    if not todo:
        print("every scenario already has a golden history; nothing to record")
        return
    async with await WorkflowEnvironment.start_local(**dev_server_options()) as env:
        for name, record in todo.items():
            await record(env, into / f"{name}{'.json.gz' if name in GZIPPED else '.json'}")


def compare(before: Path, after: Path) -> int:
    """Recordings of the same scenarios by two versions of the code (`--compare DIR DIR`):
    the same command batches per workflow task, or the first difference. A refactor of
    workflow code records before and after into scratch directories and compares them."""
    differ = 0
    for old in sorted(before.glob("*.json*")):
        new = after / old.name
        if not new.exists():
            print(f"{old.name}: not recorded in {after}")
            differ += 1
            continue
        a = command_batches(goldens.load(old))
        b = command_batches(goldens.load(new))
        a, b = _unrandomised(a), _unrandomised(b)
        if a == b:
            print(f"{old.name}: same ({len(a)} workflow tasks)")
            continue
        differ += 1
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        print(f"{old.name}: differs at workflow task {first + 1} of {len(a)} / {len(b)}")
        print(f"  before: {a[first] if first < len(a) else '(none)'}")
        print(f"  after:  {b[first] if first < len(b) else '(none)'}")
    return 1 if differ else 0


def _unrandomised(batches: list) -> list:
    # Each recording runs on its own random task queue, which some summaries name.
    return [tuple((t, s, re.sub(r"record-[0-9a-f]{8}", "record-*", m)) for t, s, m in b) for b in batches]


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HISTORIES))
