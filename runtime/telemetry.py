"""OpenTelemetry traces and metrics, each off unless the standard variables ask for it.

Traces: `OTEL_TRACES_EXPORTER` (the OpenTelemetry SDK's own variable) chooses: unset or
`none` (the default), no tracing and no cost; `otlp`, spans to the OTLP endpoint of
`OTEL_EXPORTER_OTLP_ENDPOINT`, over gRPC (needs `opentelemetry-exporter-otlp-proto-grpc`)
or, when `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` is `http/protobuf`, over HTTP (its
exporter is a dependency); `console`, spans printed. `OTEL_SERVICE_NAME` names the service (default `perdure`).

When on, every client `runtime/connect.py` makes carries the SDK's `OpenTelemetryPlugin`
(temporalio.contrib.opentelemetry), and workers built on it inherit it: the CLI call that
starts a goal, the goal's workflow and its activities are one trace. The tracer provider
is the SDK's replay-safe one (`create_tracer_provider`): a workflow task replayed from
history ends no span a second time.

Metrics: `OTEL_METRICS_EXPORTER` chooses: unset or `none`, none; `prometheus`, a
`/metrics` endpoint on `OTEL_EXPORTER_PROMETHEUS_HOST`:`OTEL_EXPORTER_PROMETHEUS_PORT`
(default 0.0.0.0:9464), served by workers only (a CLI command is too short-lived to be
scraped, and must not take a worker's port); `otlp`, pushed to
`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` (gRPC, or HTTP when
`OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL` is `http/protobuf`) every
`OTEL_METRIC_EXPORT_INTERVAL` ms. Either is a Temporal `Runtime` whose telemetry exports
(one per process), given to the clients `connect` makes: its workers then export
Temporal's `temporal_*` metrics and perdure's own `perdure_*` (workflows/shared/metrics.py)
through the same meter. A worker whose Prometheus port is taken runs on without it and
says so. This module reads the environment; it must not decide what is measured.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import unquote

from temporalio.plugin import SimplePlugin
from temporalio.runtime import (
    OpenTelemetryConfig,
    OpenTelemetryMetricTemporality,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
)

from perdure.workflows.shared.metrics import HISTOGRAM_BUCKETS

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

# The OpenTelemetry modules are imported only when tracing is on: a command pays nothing.
EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
EXPORTERS = ("otlp", "console")


METRICS_ENV = "OTEL_METRICS_EXPORTER"
METRIC_EXPORTERS = ("prometheus", "otlp")
PROMETHEUS_HOST_ENV, PROMETHEUS_PORT_ENV = "OTEL_EXPORTER_PROMETHEUS_HOST", "OTEL_EXPORTER_PROMETHEUS_PORT"
# The OpenTelemetry specification's defaults for the Prometheus exporter and the metric reader.
PROMETHEUS_HOST, PROMETHEUS_PORT = "0.0.0.0", 9464
EXPORT_INTERVAL_MS = 60_000
OTLP_GRPC, OTLP_HTTP = "http://localhost:4317", "http://localhost:4318"
MetricsConfig = PrometheusConfig | OpenTelemetryConfig

log = logging.getLogger(__name__)
# One runtime per process and configuration: each has its own threads, and a Prometheus
# endpoint can be bound once.
_runtimes: dict[str, Runtime] = {}
# The tracer provider `install` made, which `flush` sends out before the process leaves.
_installed: list = []
FLUSH_TIMEOUT_MS = 3_000


class TelemetryConfigError(ValueError):
    """An OTEL_* variable names an exporter or a value perdure cannot use."""


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
        install(span_exporter(choice))
    _quiet_detach_noise()
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
    _installed.append(provider)
    _quiet_detach_noise()


class _DetachNoise(logging.Filter):
    """Drops OpenTelemetry's "Failed to detach context" when the token was made in another
    `contextvars.Context`: a goal a stopping worker evicts mid-run is closed by the garbage
    collector, and the SDK's tracing interceptor then detaches its context from another
    one. The span is already ended; nothing is lost but an ERROR traceback per goal at every
    worker stop (sdk-python issue 441; its fix, PR 1153, does not cover a closed coroutine)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != "Failed to detach context" or not record.exc_info:
            return True
        error = record.exc_info[1]
        return not (isinstance(error, ValueError) and "was created in a different Context" in str(error))


_DETACH_FILTER = _DetachNoise()


def _quiet_detach_noise() -> None:
    logging.getLogger("opentelemetry.context").addFilter(_DETACH_FILTER)  # adding it twice keeps one


def flush() -> None:
    """Send the spans still batched, waiting at most FLUSH_TIMEOUT_MS (a collector that does
    not answer must not hold the command). The CLI leaves with `os._exit` (sdk-python #300),
    which skips the provider's own flush at exit: without this a command's spans are lost."""
    for provider in _installed:
        provider.force_flush(timeout_millis=FLUSH_TIMEOUT_MS)


def _service_name() -> str:
    return os.environ.get("OTEL_SERVICE_NAME") or "perdure"


def span_exporter(choice: str) -> SpanExporter:
    if choice == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if choice == "otlp":
        protocol = _otlp_env("PROTOCOL", "TRACES") or "grpc"
        if protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

            return HttpSpanExporter()
        if protocol != "grpc":
            raise TelemetryConfigError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: perdure sends traces over 'grpc' or 'http/protobuf'"
            )
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TelemetryConfigError(
                f"{EXPORTER_ENV}=otlp over gRPC needs its exporter: pip install opentelemetry-exporter-otlp-proto-grpc "
                "(or set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)"
            ) from None
        return OTLPSpanExporter()
    raise AssertionError(choice)  # tracing_plugins refused it


# --- metrics -------------------------------------------------------------------------


def metrics_config(*, serve: bool) -> MetricsConfig | None:
    """What the environment asks the Temporal runtime to export; None when metrics are off,
    or when they are `prometheus` and this process does not `serve` (a CLI command)."""
    choice = os.environ.get(METRICS_ENV, "none").strip().lower()
    if choice in ("", "none"):
        return None
    if choice not in METRIC_EXPORTERS:
        raise TelemetryConfigError(
            f"{METRICS_ENV}={choice!r}: perdure exports metrics to 'prometheus', 'otlp' or 'none'"
        )
    if choice == "prometheus":
        if not serve:
            return None
        host = os.environ.get(PROMETHEUS_HOST_ENV) or PROMETHEUS_HOST
        port = _number(PROMETHEUS_PORT_ENV, PROMETHEUS_PORT)
        if port > 65535:
            raise TelemetryConfigError(f"{PROMETHEUS_PORT_ENV}={port}: a port is at most 65535")
        return PrometheusConfig(bind_address=f"{host}:{port}", histogram_bucket_overrides=HISTOGRAM_BUCKETS)
    return _otlp_config()


def metrics_runtime(*, serve: bool) -> Runtime | None:
    """The runtime the clients of this process should use (None: the SDK's default, exporting nothing)."""
    config = metrics_config(serve=serve)
    if config is None:
        return None
    key = repr(config)
    if key not in _runtimes:
        telemetry = TelemetryConfig(
            metrics=config, global_tags={"service_name": _service_name()}, attach_service_name=False
        )
        try:
            _runtimes[key] = Runtime(telemetry=telemetry)
        except ValueError as err:  # the SDK's words for an endpoint it cannot bind
            where = getattr(config, "bind_address", "")
            advice = f"give each worker of a host its own {PROMETHEUS_PORT_ENV}"
            log.warning(f"metrics are not exported: {err} (at {where}); {advice}")
            return None
    return _runtimes[key]


def _otlp_config() -> OpenTelemetryConfig:
    protocol = _otlp_env("PROTOCOL") or "grpc"
    if protocol not in ("grpc", "http/protobuf"):
        raise TelemetryConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: perdure sends metrics over 'grpc' or 'http/protobuf'"
        )
    http = protocol == "http/protobuf"
    # A signal's own endpoint is used as it is; the shared one gets the signal's path over HTTP.
    url = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if not url:
        base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or (OTLP_HTTP if http else OTLP_GRPC)
        url = f"{base.rstrip('/')}/v1/metrics" if http else base
    temporality = (os.environ.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE") or "cumulative").lower()
    if temporality not in ("cumulative", "delta"):
        raise TelemetryConfigError(
            f"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE={temporality!r}: 'cumulative' or 'delta'"
        )
    return OpenTelemetryConfig(
        url=url,
        headers=_headers(_otlp_env("HEADERS") or ""),
        metric_periodicity=timedelta(milliseconds=_number("OTEL_METRIC_EXPORT_INTERVAL", EXPORT_INTERVAL_MS)),
        metric_temporality=OpenTelemetryMetricTemporality[temporality.upper()],
        http=http,
        histogram_bucket_overrides=HISTOGRAM_BUCKETS,
    )


def _otlp_env(name: str, signal: str = "METRICS") -> str | None:
    """OTEL_EXPORTER_OTLP_<signal>_<name>, else the shared OTEL_EXPORTER_OTLP_<name>."""
    return os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_{name}") or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")


def _headers(text: str) -> dict[str, str]:
    """`key=value,key2=value2`, values URL-encoded, as the OTLP exporter variables give them."""
    headers = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TelemetryConfigError(f"OTEL_EXPORTER_OTLP_HEADERS: {item!r} is not key=value")
        headers[key.strip().lower()] = unquote(value.strip())
    return headers


def _number(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value <= 0:
        raise TelemetryConfigError(f"{name}={text!r}: a positive whole number, please")
    return value
