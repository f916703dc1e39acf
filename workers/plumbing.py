"""Keeping perdure's own workflows out of the Temporal UI's default workflow list, so that the
list shows the user's goals: the watchdog's scheduled runs (workers/watchdog_schedule.py)
and the offers workflow (workers/offer_publisher.py).

How: the server lists only workflows whose `TemporalNamespaceDivision` search attribute is
unset, unless a query names that attribute; it is how the server keeps its own scheduler
workflows out of user lists. The attribute is predefined (nothing to register, on an existing
database too) and a client may set it when it starts a workflow or a schedule's action;
perdure sets it to `perdure`. Checked on Temporal Server 1.32 with UI 2.54 (the UI's list,
`/api/v1/namespaces/NS/workflows`, and `temporal workflow list` leave these workflows out;
the query `TemporalNamespaceDivision = 'perdure'` lists them). They stay ordinary workflows
otherwise: open one by its id, and the watchdog is still a Temporal Schedule. A server that
refuses the attribute gets the workflow without it (listed, as before), with a warning.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

DIVISION = SearchAttributeKey.for_keyword("TemporalNamespaceDivision")
PLUMBING = "perdure"
PLUMBING_QUERY = f"{DIVISION.name} = '{PLUMBING}'"
"""The visibility query that lists perdure's own workflows (type it in the UI's search box)."""


def hidden() -> TypedSearchAttributes:
    """The search attributes of a workflow perdure starts for itself."""
    return TypedSearchAttributes([SearchAttributePair(DIVISION, PLUMBING)])


def division_refused(err: RPCError) -> bool:
    """The server does not let a client set the division (then start the workflow without it)."""
    return err.status == RPCStatusCode.INVALID_ARGUMENT and DIVISION.name in err.message
