"""OpenTelemetry metrics (runtime/telemetry.py, workflows/shared/metrics.py): off by default; asked
for by the standard variables, a worker serves Temporal's runtime metrics and perdure's own
on a Prometheus endpoint (scraped here over HTTP) or pushes them over OTLP; the goal's
counts are what it did, a replayed history adds nothing, and the watchdog's scan is gauges."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client
from temporalio.runtime import MetricBuffer, OpenTelemetryConfig, PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import Replayer
from typer.testing import CliRunner

from perdure.activities.models.profiles import ModelConfig
from perdure.runtime import telemetry
from perdure.runtime.connect import connect
from perdure.runtime.plugin import PerdurePlugin
from perdure.starters.cli import app
from perdure.testing.otlp import OtlpReceiver
from perdure.workers.orchestrator import build_worker
from perdure.workflows.goal.contracts.goal_contracts import GOAL_WORKFLOW, Budget
from perdure.workflows.goal.contracts.messages import Answer
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared import metrics
from perdure.workflows.watchdog.watchdog_contracts import WatchdogInput
from perdure.workflows.watchdog.watchdog_workflow import WatchdogWorkflow
from tests.builders import agent, gate, llm, openai_profile, spec
from tests.goldens import WORKFLOWS
from tests.helpers import free_ports, goal_result, new_goal_id, statuses, submit, wait_until
from tests.subprocess_rig import perdure, user_env, worker_process

# No timing a loaded machine breaks: make test runs its process tests five at a time.
pytestmark = pytest.mark.parallel_safe

USAGE = {"input_tokens": 40, "output_tokens": 6}
SCRIPT = {"replies": [{"when": "PERDURE-STEP", "content": "step done", "usage": USAGE}]}
WRITE = {"name": "note", "kind": "tool", "tool": "write_file", "args": {"path": "out.md", "content": "x\n"}}
OTEL_VARIABLES = (
    telemetry.METRICS_ENV,
    telemetry.PROMETHEUS_HOST_ENV,
    telemetry.PROMETHEUS_PORT_ENV,
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_METRIC_EXPORT_INTERVAL",
)


@pytest.fixture
def otel_env(monkeypatch):
    """No OTEL_* variable from the shell that runs the tests."""
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition: (name, labels, value)."""
    found = []
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if match and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
            found.append((match.group(1), labels, float(match.group(3))))
    return found


def total(found: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(v for n, got, v in found if n == name and labels.items() <= got.items())


def buffered(buffer: MetricBuffer) -> list[tuple[str, dict[str, str], float]]:
    return [(u.metric.name, dict(u.attributes), u.value) for u in buffer.retrieve_updates()]


# --- the variables ---------------------------------------------------------------------


def test_metrics_are_off_unless_the_standard_variable_asks(otel_env):
    assert telemetry.metrics_config(serve=True) is None and telemetry.metrics_runtime(serve=True) is None
    otel_env.setenv(telemetry.METRICS_ENV, "none")
    assert telemetry.metrics_config(serve=True) is None
    otel_env.setenv(telemetry.METRICS_ENV, "statsd")
    with pytest.raises(telemetry.TelemetryConfigError, match="'statsd': perdure exports metrics to 'prometheus'"):
        telemetry.metrics_config(serve=False)


def test_prometheus_is_served_by_workers_only_on_the_spec_s_default_address(otel_env):
    otel_env.setenv(telemetry.METRICS_ENV, "Prometheus")
    config = telemetry.metrics_config(serve=True)
    assert isinstance(config, PrometheusConfig) and config.bind_address == "0.0.0.0:9464"
    assert telemetry.metrics_config(serve=False) is None  # a command's client never takes the port
    otel_env.setenv(telemetry.PROMETHEUS_HOST_ENV, "127.0.0.1")
    otel_env.setenv(telemetry.PROMETHEUS_PORT_ENV, "9999")
    assert telemetry.metrics_config(serve=True).bind_address == "127.0.0.1:9999"
    otel_env.setenv(telemetry.PROMETHEUS_PORT_ENV, "70000")
    with pytest.raises(telemetry.TelemetryConfigError, match="OTEL_EXPORTER_PROMETHEUS_PORT=70000: a port is at most"):
        telemetry.metrics_config(serve=True)
    otel_env.setenv(telemetry.PROMETHEUS_PORT_ENV, "ninety")
    with pytest.raises(telemetry.TelemetryConfigError, match="OTEL_EXPORTER_PROMETHEUS_PORT='ninety'"):
        telemetry.metrics_config(serve=True)


def test_otlp_takes_the_metrics_endpoint_first_and_the_shared_one_over_http_with_its_path(otel_env):
    otel_env.setenv(telemetry.METRICS_ENV, "otlp")
    config = telemetry.metrics_config(serve=False)
    assert isinstance(config, OpenTelemetryConfig)
    assert (config.url, config.http, config.metric_periodicity) == (
        "http://localhost:4317",
        False,
        timedelta(seconds=60),
    )
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    otel_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    otel_env.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20abc, x-team=ops")
    otel_env.setenv("OTEL_METRIC_EXPORT_INTERVAL", "5000")
    config = telemetry.metrics_config(serve=True)
    assert (config.url, config.http, config.metric_periodicity) == (
        "http://collector:4318/v1/metrics",
        True,
        timedelta(seconds=5),
    )
    assert config.headers == {"authorization": "Bearer abc", "x-team": "ops"}
    otel_env.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://metrics:9000/in")
    assert telemetry.metrics_config(serve=True).url == "http://metrics:9000/in"
    otel_env.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")
    with pytest.raises(telemetry.TelemetryConfigError, match="'http/json': perdure sends metrics over 'grpc'"):
        telemetry.metrics_config(serve=True)


def test_an_unknown_metrics_exporter_is_a_one_line_error_of_any_command(otel_env):
    result = CliRunner().invoke(app, ["status", "some-goal"], env={telemetry.METRICS_ENV: "statsd", "COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "error: OTEL_METRICS_EXPORTER='statsd'" in result.output and "Traceback" not in result.output


def test_the_observability_page_lists_every_metric():
    page = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "observability.md").read_text()
    listed = set(re.findall(r"^\| `(perdure_\w+)`", page, flags=re.MULTILINE))
    assert listed == {m.name for m in metrics.CATALOGUE}


# --- a goal's metrics ------------------------------------------------------------------


async def test_a_goal_s_metrics_are_served_to_prometheus_with_temporal_s(
    env, task_queue, store, workspace, scripted, otel_env
):
    [port] = free_ports(1)
    otel_env.setenv(telemetry.METRICS_ENV, "prometheus")
    otel_env.setenv(telemetry.PROMETHEUS_HOST_ENV, "127.0.0.1")
    otel_env.setenv(telemetry.PROMETHEUS_PORT_ENV, str(port))
    client = await connect(env.client.service_client.config.target_host, worker=True)
    config = ModelConfig(profiles={"test": openai_profile(scripted(SCRIPT))})
    goal_spec = spec(workspace, plan={"steps": [llm("one"), llm("two", ["one"]), WRITE]}, drift_every=0)
    async with build_worker(client, task_queue=task_queue, store=store, model_config=config):
        handle = await client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=new_goal_id("metrics"), task_queue=task_queue
        )
        assert (await handle.result()).outcome == "succeeded"
        scraped = samples(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
    mine = {"task_queue": task_queue}
    assert total(scraped, "perdure_goals_started", **mine) == 1
    assert total(scraped, "perdure_goals_ended", outcome="succeeded", **mine) == 1
    assert total(scraped, "perdure_nodes_settled", kind="llm", outcome="succeeded", **mine) == 2
    assert total(scraped, "perdure_nodes_settled", kind="tool", outcome="succeeded", **mine) == 1
    assert total(scraped, "perdure_nodes_settled", **mine) == 3  # the plan's steps, nothing else
    # What the scripted model reported for each of the two calls.
    assert total(scraped, "perdure_model_tokens", profile="test", token_type="input", **mine) == 80
    assert total(scraped, "perdure_model_tokens", profile="test", token_type="output", **mine) == 12
    assert total(scraped, "perdure_model_call_cost_usd_count", profile="test", **mine) == 2
    # Temporal's own, from the same runtime.
    assert total(scraped, "temporal_workflow_completed", workflow_type=GOAL_WORKFLOW, **mine) == 1
    assert total(scraped, "temporal_request", operation="StartWorkflowExecution") >= 1
    assert {labels.get("service_name") for _, labels, _ in scraped} == {"perdure"}


@pytest.mark.slow
async def test_replaying_a_goal_s_history_adds_no_perdure_metric(env, task_queue, store, workspace, scripted):
    buffer = MetricBuffer(10_000)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    client = await Client.connect(
        env.client.service_client.config.target_host, runtime=runtime, plugins=[PerdurePlugin()]
    )
    config = ModelConfig(profiles={"test": openai_profile(scripted(SCRIPT))})
    goal_spec = spec(workspace, plan={"steps": [llm("one"), llm("two", ["one"])]}, drift_every=0)
    async with build_worker(client, task_queue=task_queue, store=store, model_config=config):
        handle = await client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=new_goal_id("metrics"), task_queue=task_queue
        )
        await handle.result()
    ran = [u for u in buffered(buffer) if u[0].startswith("perdure_")]
    assert total(ran, "perdure_nodes_settled", kind="llm", outcome="succeeded") == 2, ran
    assert total(ran, "perdure_goals_ended", outcome="succeeded") == 1, ran
    replayer = Replayer(workflows=WORKFLOWS, plugins=[PerdurePlugin()], runtime=runtime)
    await replayer.replay_workflow(await handle.fetch_history())
    assert [u for u in buffered(buffer) if u[0].startswith("perdure_")] == []


async def buffered_worker(env, task_queue, store, server):
    """A client whose runtime keeps its metrics in a buffer, and a worker on it."""
    buffer = MetricBuffer(10_000)
    client = await Client.connect(
        env.client.service_client.config.target_host,
        runtime=Runtime(telemetry=TelemetryConfig(metrics=buffer)),
        plugins=[PerdurePlugin()],
    )
    config = ModelConfig(profiles={"test": openai_profile(server)})
    return buffer, client, build_worker(client, task_queue=task_queue, store=store, model_config=config)


@pytest.mark.slow
async def test_gate_decisions_and_settled_nodes_agree_with_the_goal_s_own_progress(
    env, task_queue, store, workspace, scripted
):
    usage = {"input_tokens": 500, "output_tokens": 500}
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "done", "usage": usage}]})
    buffer, client, worker = await buffered_worker(env, task_queue, store, server)
    steps = [llm(f"n{i}") for i in range(8)]
    goal_spec = spec(workspace, plan={"steps": steps}, budget=Budget(max_tokens=6_000), drift_every=0)
    async with worker:
        handle = await client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=new_goal_id("gates"), task_queue=task_queue
        )
        assert (await handle.result()).outcome == "partial"
        snapshot = await handle.query(GoalWorkflow.progress)
    recorded = buffered(buffer)
    seen = Counter(n.status for n in snapshot.nodes)
    assert seen == {"succeeded": 6, "abandoned": 2}, (seen, [n.error for n in snapshot.nodes])
    for status, count in seen.items():
        assert total(recorded, "perdure_nodes_settled", kind="llm", outcome=status) == count, (status, recorded)
    # Each step the hard gate refused is one decision...
    refused = [n for n in snapshot.nodes if (n.error or "").startswith("not started: tokens at 100%")]
    assert len(refused) == 2, [n.error for n in snapshot.nodes]
    assert total(recorded, "perdure_budget_gate_decisions", decision="wrap_up_only") == 2, recorded
    # And each step sent past the soft gate, as the gate log says.
    degraded = [entry for entry in snapshot.gate_log if "runs degraded" in entry]
    assert degraded and total(recorded, "perdure_budget_gate_decisions", decision="degraded") == len(degraded)
    assert total(recorded, "perdure_budget_gate_decisions") == 2 + len(degraded), recorded
    assert total(recorded, "perdure_goals_ended", outcome="partial") == 1


@pytest.mark.slow
async def test_each_stall_rung_fired_is_counted(env, task_queue, store, workspace, scripted):
    (workspace / "same.txt").write_text("the same answer every time")
    loop = {"name": "read_file", "arguments": {"path": "same.txt"}}
    server = scripted({"replies": [{"when": "PERDURE-AGENT", "tool_calls": [loop]}]})
    buffer, client, worker = await buffered_worker(env, task_queue, store, server)
    hunt = agent("hunt", "Find it.", ["read_file"], max_turns=20)
    goal_spec = spec(workspace, plan={"steps": [hunt]}, drift_every=0)
    async with worker:
        handle = await client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=new_goal_id("stall"), task_queue=task_queue
        )
        snapshot = await wait_until(handle, lambda s: s.questions)
        await submit(handle, Answer(request_id="x1", question_id=snapshot.questions[0].id, choice="abandon"))
        await goal_result(handle)
    recorded = buffered(buffer)
    rungs = {labels["rung"]: v for n, labels, v in recorded if n == "perdure_stall_rungs"}
    assert rungs == {"remind": 1, "switch_tool": 1, "ask_human": 1}, recorded


@pytest.mark.slow
async def test_the_watchdog_s_scan_is_gauges_of_open_goals_and_waiting_questions(
    env, task_queue, store, workspace, scripted
):
    buffer = MetricBuffer(10_000)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    client = await Client.connect(
        env.client.service_client.config.target_host, runtime=runtime, plugins=[PerdurePlugin()]
    )
    config = ModelConfig(profiles={"test": openai_profile(scripted(SCRIPT))})
    pay = {"amount_cents": 500, "currency": "EUR", "recipient": "acme"}
    paying = spec(
        workspace,
        plan={"steps": [{"name": "pay", "kind": "tool", "tool": "make_payment", "args": pay}]},
        allowed_tools=["make_payment"],
    )
    async with build_worker(client, task_queue=task_queue, store=store, model_config=config):
        stalled = await client.start_workflow(
            GoalWorkflow.run,
            GoalInput(spec=spec(workspace, plan={"steps": [gate()]}, stall_after_s=60)),
            id=new_goal_id("gate"),
            task_queue=task_queue,
        )
        asking = await client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=paying), id=new_goal_id("pay"), task_queue=task_queue
        )
        snapshot = await wait_until(stalled, lambda s: statuses(s)["gate"] == "running")
        asked = await wait_until(asking, lambda s: s.questions)
        as_of = max(snapshot.last_progress_at, asked.questions[0].asked_at) + timedelta(seconds=90)
        buffered(buffer)  # what the goals recorded so far
        await client.execute_workflow(
            WatchdogWorkflow.run,
            WatchdogInput(task_queue=task_queue, as_of=as_of),
            id=f"wd-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
        scan = buffered(buffer)
        (workspace / "GO").touch()
        await stalled.result()
        await asking.terminate("test over")
    assert total(scan, "perdure_watchdog_findings", finding="stalled") == 1, scan
    kept = {m.name for m in metrics.CATALOGUE if m.kind == "gauge"}
    gauges = {(n, labels.get("phase")): v for n, labels, v in scan if n in kept}
    assert gauges[("perdure_goals_open", "running")] == 1, gauges
    assert gauges[("perdure_goals_open", "awaiting_human")] == 1, gauges
    assert gauges[("perdure_goals_open", "parked")] == 0, gauges
    assert gauges[("perdure_questions_waiting", None)] == 1, gauges
    age = (as_of - asked.questions[0].asked_at).total_seconds()
    assert gauges[("perdure_question_oldest_age_seconds", None)] == pytest.approx(age), gauges


@pytest.mark.slow
async def test_otlp_over_http_pushes_a_goal_s_metrics_to_the_collector(
    env, task_queue, store, workspace, scripted, otel_env
):
    with OtlpReceiver() as collector:
        otel_env.setenv(telemetry.METRICS_ENV, "otlp")
        otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.base_url)
        otel_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        otel_env.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=ops")
        otel_env.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
        client = await connect(env.client.service_client.config.target_host, worker=True)
        config = ModelConfig(profiles={"test": openai_profile(scripted(SCRIPT))})
        goal_spec = spec(workspace, plan={"steps": [llm("one")]}, drift_every=0)
        async with build_worker(client, task_queue=task_queue, store=store, model_config=config):
            handle = await client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal_spec), id=new_goal_id("otlp"), task_queue=task_queue
            )
            await handle.result()
            wanted = {
                "perdure_nodes_settled",
                "perdure_model_tokens",
                "perdure_goals_ended",
                "temporal_workflow_completed",
            }
            deadline = asyncio.get_running_loop().time() + 10
            while not wanted <= collector.metric_names():
                assert asyncio.get_running_loop().time() < deadline, sorted(collector.metric_names())
                await asyncio.sleep(0.1)
        assert all(headers.get("x-team") == "ops" for _, headers, _ in collector.exports)


# --- the worker process ----------------------------------------------------------------


@pytest.mark.process
def test_a_worker_serves_prometheus_and_a_second_on_the_same_port_still_runs(env, tmp_path, task_queue):
    [port] = free_ports(1)
    variables = {
        **user_env(env, tmp_path, task_queue),
        telemetry.METRICS_ENV: "prometheus",
        telemetry.PROMETHEUS_HOST_ENV: "127.0.0.1",
        telemetry.PROMETHEUS_PORT_ENV: str(port),
    }
    with worker_process(variables, tmp_path / "first.log"):
        scraped = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
        assert total(scraped, "temporal_worker_start", task_queue=task_queue) >= 1, scraped[:20]
        with worker_process(variables, tmp_path / "second.log") as second:
            assert second.poll() is None
            log = (tmp_path / "second.log").read_text()
            assert "metrics are not exported" in log and "OTEL_EXPORTER_PROMETHEUS_PORT" in log, log
            assert "Traceback" not in log, log
        # A command with the same variables does not try to serve: it works beside the worker.
        listed = perdure("ls", env=variables)
        assert listed.returncode == 0, listed.stderr
