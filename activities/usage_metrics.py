"""A model call's tokens and cost as perdure_* metrics (workflows/metrics.py), recorded on
the activity's metric meter so they carry its namespace, task queue and activity type.

Counts a reply once, when it arrives (a retried activity's new reply counts again: it
was paid again). Without a metrics exporter on the worker's runtime (runtime/telemetry.py)
the meter is a no-op. Records numbers and the profile's name only, never a prompt or reply.
"""

from __future__ import annotations

from temporalio import activity

from workflows.contracts import Usage
from workflows.metrics import MODEL_COST, MODEL_TOKENS, PerdureMeter


def count_usage(profile: str, usage: Usage) -> None:
    meter = PerdureMeter(activity.metric_meter())
    meter.add(MODEL_TOKENS, usage.input_tokens, profile=profile, token_type="input")
    meter.add(MODEL_TOKENS, usage.output_tokens, profile=profile, token_type="output")
    meter.record(MODEL_COST, usage.cost_usd, profile=profile)
