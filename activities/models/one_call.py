"""One model call outside a goal's steps: a system prompt and one user message in, the
reply out. Owns how such a call is made the way every model call is: measured against
the profile's context window before it is sent, heartbeating while it waits, its
failure described by the attempt (what it was for, whether it was billed), its tokens
counted in perdure's metrics. The router's answers and the watchdog's judgements use it;
what the reply costs and means is the caller's business.
"""

from __future__ import annotations

from perdure.activities.heartbeat import Heartbeat
from perdure.activities.models import context_window
from perdure.activities.models.attempts import ModelAttemptState
from perdure.activities.models.profiles import ModelProfile
from perdure.activities.models.providers import ChatMessage, ChatRequest, ChatResponse, provider_for
from perdure.activities.models.usage_metrics import count_reply


async def ask_once(profile: ModelProfile, system: str, user: str, purpose: str, *, json_mode: bool) -> ChatResponse:
    """The reply to `user` under `system`; raises the attempt's ModelError when it fails."""
    attempt = ModelAttemptState(purpose, profile.name)
    request = ChatRequest(
        messages=[ChatMessage(role="system", content=system), ChatMessage(role="user", content=user)],
        json_mode=json_mode,
    )
    async with Heartbeat(attempt.details):
        try:
            context_window.ensure_fits(profile, request, attempt.what())
            response = await provider_for(profile).chat(request, attempt)
        except Exception as err:
            raise attempt.failure(err) from None
    count_reply(profile, response.input_tokens, response.output_tokens)
    return response
