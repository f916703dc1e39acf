"""What the client (perdure.starters.client) raises when a goal cannot be started, steered or
read as asked: one class per reason, each with a text a person acts on. The front ends
(the CLI, `perdure ui`, `perdure mcp`) turn them into an exit code, an HTTP status or an MCP
tool error; none of them is a bug. Holds no logic.
"""

from __future__ import annotations


class GoalNotFound(LookupError):
    """No goal has this id on the server."""


class BadPlanFile(ValueError):
    """A plan (a file, or the mapping a client sent) that cannot be used; the text says why."""


class StartRefused(ValueError):
    """A start that would clash with the goal already holding the id, or an id that is not
    allowed; the text says why."""


class NotOffered(ValueError):
    """The goal names a model profile, tool or device the workers do not offer, or payload
    keys they cannot decrypt with: not started."""


class NoWorkerAnswered(RuntimeError):
    """No worker polls the task queue, or none that polls has published its offer; the message says which."""


class OffersUnreadable(RuntimeError):
    """The published offers are there but cannot be decoded here (payload keys differ)."""


class MessageRejected(ValueError):
    """The goal refused the message; the text says why."""


class GoalEnded(ValueError):
    """The goal has ended; it takes no more messages (the text says how it ended)."""


class SayRefused(ValueError):
    """The router refused the message at its door; the text says why."""


class EndedWithoutResult(Exception):
    """The goal closed with no GoalResult: terminated, timed out, cancelled, or failed outside
    the goal's own ending (which always carries its report)."""


class StillRunning(Exception):
    """The goal has not ended: its report is written when it does."""


class ResultUnreadable(Exception):
    """The goal's result is in a payload store this machine does not see, or encrypted with a key it lacks."""


class ForkRefused(ValueError):
    """The goal cannot be forked as asked (unknown node, step of an older plan, unknown premise)."""


class NoAnswer(RuntimeError):
    """No worker answered the goal's query: nothing can be read of it now. The text says what to do."""
