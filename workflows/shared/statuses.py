"""Node statuses and goal phases, and every grouping of them the code asks about.

Defined once: the scheduler, the index, invalidation, the watchdog and the CLI
all read their "is it still running / has it ended" answers from here. Pure.
"""

from __future__ import annotations

from typing import Literal

# `offline`: the node's device is offline (or was lost while the node ran); it waits with
# no task of its own and runs again when the device is back.
NodeStatus = Literal[
    "pending",
    "running",
    "blocked",
    "parked",
    "offline",
    "succeeded",
    "failed",
    "uncertain",
    "invalidated",
    "abandoned",
]
Phase = Literal[
    "planning", "running", "parked", "awaiting_human", "awaiting_device", "aborting", "reporting", "finished", "failed"
]

# A node that will not change again unless the user voids it. An uncertain node is
# settled for progress (it waits on a person, not on work) and in flight for the
# boundaries below (its effect may still be landing).
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "uncertain", "invalidated", "abandoned"})
# Work that holds the goal open: continue-as-new, an abort or a budget refusal waits for it.
IN_FLIGHT: frozenset[str] = frozenset({"running", "blocked", "parked", "offline", "uncertain"})
# A node whose work was started, including work that waits (for a person, a park, its
# device) with no activity in flight: what a rewind may act on and what invalidation judges.
STARTED: frozenset[str] = frozenset({"succeeded", "failed", "running", "uncertain", "blocked", "parked", "offline"})

# A goal in these phases takes no more messages and is not judged by the watchdog.
ENDED_PHASES: frozenset[str] = frozenset({"reporting", "finished", "failed"})
# The goal's report is written: 100 % done.
CLOSED_PHASES: frozenset[str] = frozenset({"finished", "failed"})
