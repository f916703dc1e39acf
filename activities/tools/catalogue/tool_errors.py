"""Exceptions a tool raises to say how it failed; the tool activity turns them into results.

Part of every tool's contract (activities/tools/catalogue/tool_base.py): a tool module
imports them at module level, so they stay plain exceptions, pure at import.
"""

from __future__ import annotations


class ToolError(Exception):
    """A failure the model can act on; nothing was done (or the service refused it).

    `output`, when set, is stored next to the error (a failing command's log).
    """

    def __init__(self, message: str, *, output: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.output = output


class NotSent(Exception):
    """The request never reached the service, or the service refused it before acting (429, busy key)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OutcomeUnknown(Exception):
    """The request may have reached the service, and no answer says whether it acted (timeout, 5xx)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
