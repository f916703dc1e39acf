"""The example's tools, loaded by every perdure worker in whose environment the package is
installed (its `perdure.tools` entry point names this module):

- `generate_variant` submits one paid generation job under the call's effect key, polls it
  to its end and returns its id and result URL. It is `keyed`: the API deduplicates the
  key, so a retry after a lost worker is billed nothing. A retry that finds the job in the
  last attempt's heartbeat (`call.progress`) polls it instead of submitting again. It reports
  the price the API answered as the call's cost, on every attempt that answers (perdure
  charges the call once, from the attempt that completes it).
- `refund_generation` undoes it on an abort with rollback: finds the job by the effect key
  and refunds it, once; no job, or one refunded already, is nothing to do.

The API's address and key are the worker's (api.py); the poll interval is PAIDGEN_POLL_S
seconds (1 by default).
"""

from __future__ import annotations

import asyncio
import hashlib
import os

import httpx
from pydantic import BaseModel, ConfigDict, Field

import perdure
from paid_generation.api import APIError, Generation, GenerationAPI, NotConfigured

POLL_ENV = "PAIDGEN_POLL_S"
DEFAULT_POLL_S = 1.0
MAX_PRICE_USD = 0.50
"""The most one job may cost (the API's price is 0.40 USD): reserved from the goal's budget
before a step submits one."""


class VariantArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=4_000, description="What to generate.")
    variant: int = Field(
        ge=1, le=100, description="Which variant of the prompt (1, 2, 3, ...): each is its own paid job and seed."
    )


def _poll_s() -> float:
    try:
        return max(0.05, float(os.environ.get(POLL_ENV, DEFAULT_POLL_S)))
    except ValueError:
        return DEFAULT_POLL_S


def _api() -> GenerationAPI:
    try:
        return GenerationAPI.from_env()
    except NotConfigured as err:
        raise perdure.ToolError(f"the generation API is not configured: {err}") from None


async def _submitted_job(api: GenerationAPI, args: VariantArgs, call: perdure.ToolCall) -> Generation:
    """The job this call is about: the one the last attempt was polling, or a submission
    under the call's key (the API answers a repeated key with the job it already has)."""
    earlier = call.progress.get("job") if isinstance(call.progress, dict) else None
    if isinstance(earlier, str):
        return await api.get(earlier)
    assert call.idempotency_key is not None  # a write always has its effect key
    try:
        return await api.submit(args.prompt, seed=args.variant, idempotency_key=call.idempotency_key)
    except APIError as err:
        if err.refused:  # a bad key, a prompt refused: nothing was billed
            raise perdure.ToolError(f"the generation API refused the job: {err}") from None
        raise perdure.OutcomeUnknown(f"the generation API did not confirm the job: {err}") from None
    except httpx.TransportError as err:
        raise perdure.OutcomeUnknown(f"the generation API did not answer: {type(err).__name__}") from None


@perdure.tool(
    risk="remote-write",
    replay="keyed",
    key_fields=["prompt", "variant"],
    compensation="refund_generation",
    network=True,
    timeout_s=300,
    max_cost_usd=MAX_PRICE_USD,
)
async def generate_variant(args: VariantArgs, call: perdure.ToolCall) -> dict:
    """Generate one variant of an image with the paid generation API (0.40 USD a job); returns
    the job's id and its result's URL."""
    async with _api() as api:
        job = await _submitted_job(api, args, call)
        # Billed at submission: what the API says the job costs, also when it answered this
        # attempt from its idempotency store or the job was found through `call.progress`.
        call.cost(float(job.price.amount))
        while not job.finished:
            call.heartbeat({"job": job.id})
            await asyncio.sleep(_poll_s())
            job = await api.get(job.id)
        if job.status != "succeeded" or job.output is None:
            raise perdure.ToolError(f"generation {job.id} ended {job.status}")
        image = await api.content(job.id)
    return {
        "job": job.id,
        "variant": args.variant,
        "url": job.output.url,
        "content_type": job.output.content_type,
        "bytes": len(image),
        "sha256": hashlib.sha256(image).hexdigest(),
    }


@perdure.tool(risk="remote-write", replay="keyed", network=True)
async def refund_generation(args: perdure.Undo, call: perdure.ToolCall) -> str:
    """Stop and refund the generation job submitted under an effect key (what undoes generate_variant)."""
    assert call.idempotency_key is not None
    async with _api() as api:
        job = await api.find(args.effect_key)
        if job is None:
            return f"nothing to refund: no generation was submitted under {args.effect_key}"
        refund = await api.refund(job.id, idempotency_key=call.idempotency_key)
    if refund is None:
        return f"generation {job.id} was refunded already"
    return f"refunded generation {job.id}: {refund.amount.amount} {refund.amount.currency.upper()} ({refund.id})"
