"""notify_webhook: POST a JSON payload to a webhook that cannot deduplicate.

A `once` remote write: never sent twice on its own. An attempt interrupted after the
request may have gone out is `uncertain`, and a person decides whether it happened.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from perdure.activities.tools.catalogue.tool_base import EffectCall, EffectTool, how_confirmed
from perdure.activities.tools.catalogue.tool_errors import NotSent, OutcomeUnknown, ToolError
from perdure.workflows.shared.tool_specs import HTTP_URL, ONCE_TIMEOUTS, Effect, ToolArgs, ToolSpec


class NotifyWebhookArgs(ToolArgs):
    url: str = Field(pattern=HTTP_URL)
    payload: dict[str, Any] = Field(description="JSON object POSTed to the webhook.")


class NotifyWebhook(EffectTool):
    spec = ToolSpec(
        name="notify_webhook",
        risk="remote-write",
        replay="once",
        description="POST a JSON payload to a webhook that cannot deduplicate; never sent twice.",
        args_model=NotifyWebhookArgs,
        # A notice nobody confirmed is better lost than sent twice: unanswered, it counts as delivered.
        safe_on_expiry=("happened",),
        **ONCE_TIMEOUTS,
    )
    example = {"url": "https://hooks.example/deploys", "payload": {"release": "2.0"}}

    def effect(self, args: NotifyWebhookArgs, workspace: str) -> Effect:
        return Effect(args.url, "POST", args.payload)

    def target(self, args: NotifyWebhookArgs) -> str:
        return args.url

    async def send(self, call: EffectCall, args: NotifyWebhookArgs) -> dict:
        from perdure.activities.tools import http_calls as http

        # The key travels for the receiver's logs; this receiver is assumed not to deduplicate.
        response = await http.http_call("POST", args.url, body=args.payload, headers={"X-Perdure-Effect-Key": call.key})
        status = response.status_code
        if 200 <= status < 300:
            return {"status": status}
        shown = http.excerpt(response)
        if status == 429:
            raise NotSent(f"the webhook answered HTTP 429 (rate-limited): {shown}")
        if status == 408 or status >= 500:
            raise OutcomeUnknown(f"the webhook answered HTTP {status}: {shown}")
        raise ToolError(f"the webhook refused the payload with HTTP {status}: {shown}")

    def describe(self, call: EffectCall, args: NotifyWebhookArgs, receipt: dict) -> str:
        return f"delivered to {args.url} (HTTP {receipt.get('status')}{how_confirmed(receipt)})"


DECLARED = (NotifyWebhook(),)
