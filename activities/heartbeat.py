"""The one background heartbeater of perdure's activities.

Owns how an activity heartbeats while it waits on something slow (a model
reply, a remote write, a shell command): a beat when the details change, and
background beats in between, so a heartbeat timeout notices a killed worker in
seconds while a slow call is still healthy, and a cancellation reaches the
activity (the SDK delivers it only through heartbeats). It must not decide
anything from a heartbeat; reading the previous attempt's details is
`perdure.workflows.shared.effects`' business.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import activity

MIN_INTERVAL_S = 0.2


class Heartbeat:
    """`async with Heartbeat(...) as beat`: beats in the background while the block runs.

    Background beats come every `every_s`, or, when that is None, every third of
    the activity's heartbeat timeout, and not at all without one. Each beat
    repeats the current details (the last `set`, else what `describe` returns
    now), because a heartbeat replaces the previous details. Outside an activity
    (a tool called directly) it does nothing.
    """

    def __init__(self, describe: Callable[[], Any] | None = None, every_s: float | None = None) -> None:
        self.details: Any = None
        self._describe = describe
        self._every_s = every_s
        self._task: asyncio.Task | None = None

    def set(self, details: Any) -> None:
        """Beat now with these details; later beats repeat them."""
        self.details = details
        if activity.in_activity() and activity.info().is_local:
            return  # a local activity has no heartbeat (the SDK warns at each): its details stay here
        activity.heartbeat(details)

    async def __aenter__(self) -> Heartbeat:
        if not activity.in_activity():
            return self
        every_s = self._every_s
        if every_s is None:
            timeout = activity.info().heartbeat_timeout
            every_s = max(MIN_INTERVAL_S, timeout.total_seconds() / 3) if timeout else None
        if every_s:
            self._task = asyncio.create_task(self._beat(every_s))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    def _current(self) -> Any:
        if self.details is not None:
            return self.details
        return self._describe() if self._describe is not None else None

    async def _beat(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            details = self._current()
            if details is not None:
                activity.heartbeat(details)
            else:
                activity.heartbeat()
