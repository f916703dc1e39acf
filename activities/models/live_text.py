"""A running model call's text, sent to its goal's event stream while it is written.

Owns batching and sending: the text a streamed reply has produced since the last send
goes, every `live_every_s`, as one TokenDelta on the goal's Workflow Stream (topic
TOKENS_TOPIC, through the SDK's WorkflowStreamClient: a signal deduplicated by
publisher and sequence). A reply done within the first interval sends nothing (the node
settles with its output at once, so a short call adds no history), and a single call's
last piece is not sent either (its node settles with the whole output a moment later);
an agent's turn sends its last piece, so the turn's text stays whole while its tools
run. A retried attempt first sends a TokenRetry, so a consumer drops what the attempts
before it showed.

Only for showing: the node's output is the activity's result, never this text. Sending
is best effort and never fails or slows the call: a send that fails is logged and the
rest of this attempt's text is not sent.
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime, timedelta
from types import TracebackType

from temporalio import activity
from temporalio.contrib.workflow_streams import WorkflowStreamClient

from perdure.workflows.goal.contracts.events import (
    MAX_TOKEN_DELTA_CHARS,
    TOKENS_TOPIC,
    TokenDelta,
    TokenRetry,
    token_delta_id,
    token_retry_id,
)

# The longest one send may take (the last one holds up the activity's result).
LAST_SEND_S = 5.0
# How long a failed send is retried by the SDK client before it gives up on it.
SEND_RETRY = timedelta(seconds=30)


class LiveText:
    """`async with LiveText(node, turn, every_s) as live:` then `live.add(text)` per chunk;
    `turn` is None for a single call (llm steps), an agent step's turn otherwise."""

    def __init__(self, node: str, turn: int | None, every_s: float) -> None:
        self.node = node
        self.turn = turn or 0
        self.finish = turn is not None
        self.every_s = every_s
        info = activity.info()
        self.attempt = info.attempt
        # The same node's next run starts its turns, attempts and deltas again: the ids name this activity.
        self._call = hashlib.sha256(f"{info.workflow_run_id}:{info.activity_id}".encode()).hexdigest()[:8]
        self._pending = ""
        self._seq = 0
        self._broken = False
        self._task: asyncio.Task[None] | None = None
        self._client = WorkflowStreamClient.from_within_activity(max_retry_duration=SEND_RETRY)
        self._topic = self._client.topic(TOKENS_TOPIC)

    async def __aenter__(self) -> LiveText:
        if self.attempt > 1:
            marker = TokenRetry(
                id=token_retry_id(self.node, self.turn, self.attempt, self._call),
                at=datetime.now(UTC),
                node=self.node,
                turn=self.turn,
                attempt=self.attempt,
            )
            self._topic.publish(marker)
            await self._send()
        self._task = asyncio.create_task(self._every_interval())
        return self

    def add(self, text: str) -> None:
        self._pending += text

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._task is not None:
            # Not awaited to its end: a send in flight must never hold up the call's result.
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=0.1)
        if self.finish and self._seq and kind is not asyncio.CancelledError:
            await self._flush_pending()

    async def _every_interval(self) -> None:
        while not self._broken:
            await asyncio.sleep(self.every_s)
            await self._flush_pending()

    async def _flush_pending(self) -> None:
        text, self._pending = self._pending, ""
        for start in range(0, len(text), MAX_TOKEN_DELTA_CHARS):
            self._topic.publish(
                TokenDelta(
                    id=token_delta_id(self.node, self.turn, self.attempt, self._seq, self._call),
                    at=datetime.now(UTC),
                    node=self.node,
                    turn=self.turn,
                    attempt=self.attempt,
                    seq=self._seq,
                    text=text[start : start + MAX_TOKEN_DELTA_CHARS],
                )
            )
            self._seq += 1
        if text:
            await self._send()

    async def _send(self) -> None:
        if self._broken:
            return
        # asyncio.wait, not wait_for: a send that does not come back in time is left to
        # finish on its own (wait_for would wait for its cancellation, which an RPC in
        # flight may not honour promptly) and nothing more is sent.
        send = asyncio.ensure_future(self._client.flush())
        done, _ = await asyncio.wait({send}, timeout=LAST_SEND_S)
        error = send.exception() if done else TimeoutError(f"no answer in {LAST_SEND_S:g} s")
        if error is not None:
            self._broken = True
            reason = f"{type(error).__name__}: {error}"[:300]
            activity.logger.info("live model output not sent", extra={"error": reason})
