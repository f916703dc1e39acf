"""OpenTelemetry traces, off unless the standard variables ask for them.

`OTEL_TRACES_EXPORTER` (the OpenTelemetry SDK's own variable) chooses: unset or `none`
(the default), no tracing and no cost; `otlp`, spans to the OTLP endpoint of
`OTEL_EXPORTER_OTLP_ENDPOINT` (needs `opentelemetry-exporter-otlp`); `console`, spans
printed. `OTEL_SERVICE_NAME` names the service (default `perdure`).

When on, every client `runtime/connect.py` makes carries the SDK's `OpenTelemetryPlugin`
(temporalio.contrib.opentelemetry), and workers built on it inherit it: the CLI call that
starts a goal, the goal's workflow and its activities are one trace. The tracer provider
is the SDK's replay-safe one (`create_tracer_provider`): a workflow task replayed from
history ends no span a second time.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from temporalio.plugin import SimplePlugin

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

# The OpenTelemetry modules are imported only when tracing is on: a command pays nothing.
EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
EXPORTERS = ("otlp", "console")


class TelemetryConfigError(ValueError):
    """OTEL_TRACES_EXPORTER names an exporter perdure cannot use."""


def tracing_plugins() -> list[SimplePlugin]:
    """The plugins a client needs for the tracing the environment asks for ([] when off)."""
    choice = os.environ.get(EXPORTER_ENV, "none").strip().lower()
    if choice in ("", "none"):
        return []
    if choice not in EXPORTERS:
        raise TelemetryConfigError(f"{EXPORTER_ENV}={choice!r}: perdure exports traces to 'otlp', 'console' or 'none'")
    from opentelemetry import trace
    from temporalio.contrib.opentelemetry import OpenTelemetryPlugin, ReplaySafeTracerProvider

    if not isinstance(trace.get_tracer_provider(), ReplaySafeTracerProvider):
        install(_exporter(choice))
    return [OpenTelemetryPlugin(add_temporal_spans=True)]


def install(exporter: SpanExporter, *, batch: bool = True) -> None:
    """Make a replay-safe tracer provider sending to `exporter` the global one."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from temporalio.contrib.opentelemetry import create_tracer_provider

    provider = create_tracer_provider(resource=Resource.create({"service.name": _service_name()}))
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def _service_name() -> str:
    return os.environ.get("OTEL_SERVICE_NAME") or "perdure"


def _exporter(choice: str) -> SpanExporter:
    if choice == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if choice == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TelemetryConfigError(
                f"{EXPORTER_ENV}=otlp needs the OTLP exporter: pip install opentelemetry-exporter-otlp"
            ) from None
        return OTLPSpanExporter()
    raise AssertionError(choice)  # tracing_plugins refused it
