"""An OTLP/HTTP receiver: takes what exporters POST to /v1/traces and /v1/metrics, as an
OpenTelemetry Collector would, and keeps it decoded (opentelemetry-proto's messages).

The stand-in for the Collector docker-compose.yml runs, where no container can run: the
exporters under test (the Python SDK's span exporter, Temporal Core's metric exporter)
speak their real wire format to it. It answers every export with success and forwards
nothing.
"""

from __future__ import annotations

import threading

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from perdure.testing.http import BackgroundHTTPServer, JSONHandler

SIGNALS = {
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
}


class OtlpReceiver(BackgroundHTTPServer):
    thread_name = "otlp-receiver"

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.exports: list[tuple[str, dict[str, str], object]] = []

    def received(self, path: str) -> list:
        """The decoded export requests posted to `path` so far."""
        with self._lock:
            return [message for at, _, message in self.exports if at == path]

    def metric_names(self) -> set[str]:
        return {
            metric.name
            for request in self.received("/v1/metrics")
            for resource in request.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }

    def span_names(self) -> list[str]:
        return [
            span.name
            for request in self.received("/v1/traces")
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]

    class handler(JSONHandler):  # noqa: N801 (the attribute BackgroundHTTPServer serves)
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            body = self.read_body()
            kinds = SIGNALS.get(self.path)
            if kinds is None:
                self.send_json(404, {"error": f"no OTLP signal at {self.path}"})
                return
            request_type, response_type = kinds
            message = request_type()
            message.ParseFromString(body)
            owner: OtlpReceiver = self.server.owner  # type: ignore[attr-defined]
            with owner._lock:
                owner.exports.append((self.path, {k.lower(): v for k, v in self.headers.items()}, message))
            reply = response_type().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
