"""A model call's tokens and cost as perdure_* metrics (workflows/shared/metrics.py), recorded on
the activity's metric meter so they carry its namespace, task queue and activity type.

Counts a reply once, when it arrives (a retried activity's new reply counts again: it
was paid again). Without a metrics exporter on the worker's runtime (runtime/telemetry.py)
the meter is a no-op. Records numbers and the profile's name only, never a prompt or reply.
"""

from __future__ import annotations

from temporalio import activity

from perdure.activities.models.profiles import ModelProfile
from perdure.workflows.shared.metrics import MODEL_COST, MODEL_TOKENS, PerdureMeter


def count_reply(profile: ModelProfile, input_tokens: int, output_tokens: int) -> None:
    """One reply of `profile`'s model, priced by the profile."""
    meter = PerdureMeter(activity.metric_meter())
    meter.add(MODEL_TOKENS, input_tokens, profile=profile.name, token_type="input")
    meter.add(MODEL_TOKENS, output_tokens, profile=profile.name, token_type="output")
    meter.record(MODEL_COST, profile.cost_usd(input_tokens, output_tokens), profile=profile.name)
