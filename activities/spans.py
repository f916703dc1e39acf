"""Spans of what activities call out to, with the OpenTelemetry GenAI conventions for model
calls (runtime/telemetry.py turns tracing on; without it these cost a no-op tracer).

A model call's span says the provider, the model asked and answered, why the model stopped
(`gen_ai.response.finish_reasons`), the tokens and the cost, never the prompt or the reply
(which may hold secrets); an error is recorded by its type only, for the same reason. It
is a child of the SDK's RunActivity span, so it sits in the goal's trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from perdure.activities.models.profiles import ModelProfile

_TRACER = trace.get_tracer("perdure")


class ModelCallSpan:
    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def usage(self, response, cost_usd: float) -> None:  # noqa: ANN001 - a providers.ChatResponse
        self._span.set_attributes(
            {
                "gen_ai.response.model": response.model,
                "gen_ai.usage.input_tokens": response.input_tokens,
                "gen_ai.usage.output_tokens": response.output_tokens,
                "perdure.cost_usd": cost_usd,
                "perdure.usage_estimated": response.usage_estimated,
            }
        )
        if response.finish_reasons:  # a provider that gave none: no attribute rather than an empty one
            self._span.set_attribute("gen_ai.response.finish_reasons", response.finish_reasons)


@contextmanager
def model_call_span(profile: ModelProfile) -> Iterator[ModelCallSpan]:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": profile.provider,
        "gen_ai.request.model": profile.model,
        "perdure.profile": profile.name,
    }
    with _span(f"chat {profile.model}", SpanKind.CLIENT, attributes) as span:
        yield ModelCallSpan(span)


@contextmanager
def tool_call_span(spec) -> Iterator[trace.Span]:  # noqa: ANN001 - a ToolSpec
    """A tool call: its name, risk class and replay policy (run_effect adds an effect's key);
    never its arguments or output (a command line or a file may hold a secret)."""
    attributes = {"perdure.tool": spec.name, "perdure.risk": spec.risk, "perdure.replay": spec.replay}
    with _span(f"tool {spec.name}", SpanKind.INTERNAL, attributes) as span:
        yield span


@contextmanager
def _span(name: str, kind: SpanKind, attributes: dict) -> Iterator[trace.Span]:
    """A span whose error is recorded by its type only: an exception's message may quote
    what went in or came out."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        # Tracing is off (no provider was ever set): skip the no-op span's context switch,
        # a measurable share of what a small read costs.
        yield trace.INVALID_SPAN
        return
    with _TRACER.start_as_current_span(
        name, kind=kind, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield span
        except BaseException as err:
            span.set_status(Status(StatusCode.ERROR, type(err).__name__))
            span.set_attribute("error.type", type(err).__name__)
            raise
