"""What the client (perdure.starters.client) raises when a goal cannot be started, steered or
read as asked: one class per reason, each with a text a person acts on, all under
`PerdureError` and exported as `perdure.<Name>`. The front ends (the CLI, `perdure ui`,
`perdure mcp`) turn them into an exit code, an HTTP status or an MCP tool error; none of them
is a bug. Each also keeps the built-in base it had (LookupError, ValueError, ...), so code
catching those still does. Holds no logic.
"""

from __future__ import annotations


class PerdureError(Exception):
    """Anything perdure's client refuses or cannot do, with a text that says why."""


class InvalidRequest(PerdureError, ValueError):
    """The call itself is wrong (an empty goal text, a field out of range): nothing was sent."""


class GoalNotFound(PerdureError, LookupError):
    """No goal has this id on the server."""


class BadPlanFile(InvalidRequest):
    """A plan (a file, or the mapping a client sent) that cannot be used; the text says why."""


class StartRefused(PerdureError, ValueError):
    """A start that would clash with the goal already holding the id, or an id that is not
    allowed; the text says why."""


class NotOffered(PerdureError, ValueError):
    """The goal names a model profile, tool or device the workers do not offer, or payload
    keys they cannot decrypt with: not started."""


class NoWorkerAnswered(PerdureError, RuntimeError):
    """No worker polls the task queue, or none that polls has published its offer; the message says which."""


class OffersUnreadable(PerdureError, RuntimeError):
    """The published offers are there but cannot be decoded here (payload keys differ)."""


class MessageRejected(PerdureError, ValueError):
    """The goal refused the message; the text says why."""


class GoalEnded(PerdureError, ValueError):
    """The goal has ended; it takes no more messages (the text says how it ended)."""


class SayRefused(PerdureError, ValueError):
    """The router refused the message at its door; the text says why."""


class EndedWithoutResult(PerdureError):
    """The goal closed with no GoalResult: terminated, timed out, cancelled, or failed outside
    the goal's own ending (which always carries its report)."""


class StillRunning(PerdureError):
    """The goal has not ended: its report is written when it does."""


class ResultUnreadable(PerdureError):
    """The goal's result is in a payload store this machine does not see, or encrypted with a key it lacks."""


class ForkRefused(PerdureError, ValueError):
    """The goal cannot be forked as asked (unknown node, step of an older plan, unknown premise)."""


class NoAnswer(PerdureError, RuntimeError):
    """No worker answered the goal's query: nothing can be read of it now. The text says what to do."""
