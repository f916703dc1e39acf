"""What the tests of checking finished work share: a read step, how often a step ran, how
many checks a goal made, what it said about them, a long park. Not a test module."""

from __future__ import annotations

import asyncio

from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.messages import Park, Resume
from tests.helpers import local_activities, scheduled_activities, submit, wait_until


def read(name: str, path: str) -> dict:
    return {"name": name, "kind": "tool", "tool": "read_file", "args": {"path": path}}


def runs_of(history, step: str) -> int:
    return sum(1 for _, _, summary, _ in local_activities(history) if f"· {step} " in summary + " ")


def checks_made(history) -> int:
    """Checks of finished work (the check is a regular activity; the goal's looks around
    its command steps use the same activity, run locally)."""
    return sum(kind == Activities.VERIFY_NODES for _, kind, _ in scheduled_activities(history))


def checked(snapshot) -> str:
    """What the goal said about its check of finished work (its gate log)."""
    return next(entry for entry in reversed(snapshot.gate_log) if "re-verif" in entry)


async def park_then_resume(handle, change, park_s: float = 1.2) -> None:
    await submit(handle, Park(request_id="park-1", reason="off for the weekend"))
    await wait_until(handle, lambda s: s.parked)
    change()
    await asyncio.sleep(park_s)  # longer than verify_after_s: the park was long
    await submit(handle, Resume(request_id="resume-1"))
