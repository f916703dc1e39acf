"""OpenTelemetry traces (runtime/telemetry.py): off by default; on, a goal started by a
traced client is one trace from the start call through its workflow and activities, and
replaying its history adds no span."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.opentelemetry import OpenTelemetryPlugin
from temporalio.worker import Replayer

from perdure.activities.models.profiles import ModelConfig
from perdure.runtime import telemetry
from perdure.runtime.plugin import PerdurePlugin
from perdure.starters.client.start_checks import published_offers
from perdure.testing.fakes import LedgerAPI
from perdure.workers.orchestrator import build_worker
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import STEP_REPLY, llm, openai_profile, spec
from tests.goldens import WORKFLOWS

EXPORTED = InMemorySpanExporter()


async def offer_published(client: Client, task_queue: str, timeout_s: float = 15.0) -> None:
    """Until the worker's offers workflow has run (its memo holds the offer)."""
    deadline = time.monotonic() + timeout_s
    while not await published_offers(client, task_queue):
        assert time.monotonic() < deadline, f"no offer published in {timeout_s}s"
        await asyncio.sleep(0.05)


def test_tracing_is_off_unless_the_standard_variable_asks(monkeypatch):
    monkeypatch.delenv(telemetry.EXPORTER_ENV, raising=False)
    assert telemetry.tracing_plugins() == []
    monkeypatch.setenv(telemetry.EXPORTER_ENV, "none")
    assert telemetry.tracing_plugins() == []
    monkeypatch.setenv(telemetry.EXPORTER_ENV, "zipkin")
    with pytest.raises(telemetry.TelemetryConfigError, match="'zipkin': perdure exports traces to 'otlp', 'console'"):
        telemetry.tracing_plugins()


async def test_a_goal_is_one_trace_from_its_start_call_and_a_replay_adds_no_span(
    env, task_queue, store, workspace, scripted
):
    telemetry.install(EXPORTED, batch=False)
    client = Client(
        **{**env.client.config(), "plugins": [PerdurePlugin(), OpenTelemetryPlugin(add_temporal_spans=True)]}
    )
    config = ModelConfig(profiles={"test": openai_profile(scripted(STEP_REPLY))})
    write = {
        "name": "note",
        "kind": "tool",
        "tool": "write_file",
        "args": {"path": "out.md", "content": "SECRET-ish\n"},
    }
    goal_spec = spec(workspace, plan={"steps": [llm("one"), llm("two", ["one"]), write]}, drift_every=0)
    EXPORTED.clear()
    async with build_worker(client, task_queue=task_queue, store=store, model_config=config):
        handle = await client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=f"otel-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
        result = await handle.result()
    assert result.outcome == "succeeded"
    spans = EXPORTED.get_finished_spans()
    names = [s.name for s in spans]
    assert "StartWorkflow:GoalWorkflow" in names and "RunWorkflow:GoalWorkflow" in names, names
    assert names.count("RunActivity:perdure.model.generate") == 2, names
    # One trace: the start call's, which the workflow and every activity continue.
    start = next(s for s in spans if s.name == "StartWorkflow:GoalWorkflow")
    goal_spans = [s for s in spans if "GoalWorkflow" in s.name or "Activity:" in s.name]
    assert {s.context.trace_id for s in goal_spans} == {start.context.trace_id}, names
    # Each model call is a GenAI span inside its activity's, with usage and no prompt or reply.
    calls = [s for s in spans if s.name.startswith("chat ")]
    runs = {s.context.span_id for s in spans if s.name == "RunActivity:perdure.model.generate"}
    assert len(calls) == 2 and all(c.parent is not None and c.parent.span_id in runs for c in calls), names
    call = dict(calls[0].attributes)
    assert call["gen_ai.operation.name"] == "chat" and call["gen_ai.system"] == "openai"
    assert call["gen_ai.usage.input_tokens"] > 0 and call["gen_ai.usage.output_tokens"] > 0, call
    assert call["gen_ai.response.finish_reasons"] == ("stop",), call
    assert not any("step done" in str(v) for v in call.values()), call
    # A tool call is a span with its name, risk and replay policy; never its arguments.
    [tool] = [s for s in spans if s.name == "tool write_file"]
    assert tool.attributes["perdure.risk"] and tool.attributes["perdure.replay"], dict(tool.attributes)
    assert not any("SECRET" in str(v) for v in tool.attributes.values()), dict(tool.attributes)
    assert tool.context.trace_id == start.context.trace_id
    before = len(spans)
    history = await handle.fetch_history()
    replayer = Replayer(workflows=WORKFLOWS, plugins=[PerdurePlugin(), OpenTelemetryPlugin(add_temporal_spans=True)])
    await replayer.replay_workflow(history)
    # Only the goal's: the worker's own offers workflow may close a span of its trace meanwhile.
    added = [
        s.name
        for s in EXPORTED.get_finished_spans()[before:]
        if s.context.trace_id == start.context.trace_id or "GoalWorkflow" in s.name
    ]
    assert added == [], added


def test_an_unknown_exporter_is_a_one_line_error_of_any_command(monkeypatch):
    from typer.testing import CliRunner

    from perdure.starters.cli import app

    result = CliRunner().invoke(app, ["status", "some-goal"], env={telemetry.EXPORTER_ENV: "zipkin", "COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "error: OTEL_TRACES_EXPORTER='zipkin'" in result.output and "Traceback" not in result.output


def test_otlp_over_http_sends_spans_to_the_collector_s_traces_path(monkeypatch):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from perdure.testing.otlp import OtlpReceiver

    with OtlpReceiver() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.base_url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(telemetry.span_exporter("otlp")))
        with provider.get_tracer("test").start_as_current_span("chat scripted"):
            pass
        provider.shutdown()
        assert collector.span_names() == ["chat scripted"]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(telemetry.TelemetryConfigError, match="'http/json': perdure sends traces over 'grpc'"):
        telemetry.span_exporter("otlp")


async def test_a_remote_write_s_span_names_the_effect_key_the_service_received(env, task_queue, store, workspace):
    telemetry.install(EXPORTED, batch=False)
    client = Client(
        **{**env.client.config(), "plugins": [PerdurePlugin(), OpenTelemetryPlugin(add_temporal_spans=True)]}
    )
    with LedgerAPI() as ledger:
        post = {"method": "POST", "url": f"{ledger.base_url}/entries", "body": {"ref": "inv-9", "amount": 1}}
        step = {"name": "book", "kind": "tool", "tool": "http_request", "args": post}
        goal_spec = spec(workspace, plan={"steps": [step]}, allowed_tools=["http_request"], drift_every=0)
        EXPORTED.clear()
        async with build_worker(client, task_queue=task_queue, store=store, model_config=ModelConfig(profiles={})):
            handle = await client.start_workflow(
                GoalWorkflow.run, GoalInput(spec=goal_spec), id=f"otel-{uuid.uuid4().hex[:8]}", task_queue=task_queue
            )
            result = await handle.result()
        [created] = ledger.ledger()
    assert result.outcome == "succeeded", result.excerpt
    [span] = [s for s in EXPORTED.get_finished_spans() if s.name == "tool http_request"]
    attributes = dict(span.attributes)
    assert attributes["perdure.risk"] == "remote-write" and attributes["perdure.replay"] == "keyed", attributes
    assert attributes["perdure.effect_key"] == created["idempotency_key"], (attributes, created)
    assert not any("inv-9" in str(v) for v in attributes.values()), attributes  # never the arguments


async def test_a_traced_worker_stops_without_a_traceback_for_the_workflows_it_evicts(env, task_queue, store, caplog):
    """A stopping worker evicts its long-running workflows (its own offers workflow here);
    the garbage collector closes them and the SDK's tracing interceptor detaches their
    context from another one: OpenTelemetry logged an ERROR traceback for each."""
    telemetry.install(EXPORTED, batch=False)
    client = Client(
        **{**env.client.config(), "plugins": [PerdurePlugin(), OpenTelemetryPlugin(add_temporal_spans=True)]}
    )
    async with build_worker(client, task_queue=task_queue, store=store):
        await offer_published(client, task_queue)
    gc.collect()
    assert "Traceback" not in caplog.text and "Failed to detach context" not in caplog.text, caplog.text
