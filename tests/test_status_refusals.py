"""`perdure status` shows the latest messages a goal refused at the door from its one progress
query: the snapshot carries the last few and how many there were (a second query, of the
inbox, waited for another workflow task of a busy goal)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from perdure.starters.render import print_refusals
from perdure.workflows.goal.contracts.messages import Refusal
from perdure.workflows.goal.contracts.state import GoalState
from perdure.workflows.goal.rules.progress_view import REFUSALS_SHOWN, progress_snapshot
from tests.builders import llm, spec

AT = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def test_the_snapshot_carries_the_latest_refusals_and_status_says_how_many_came_before():
    state = GoalState(spec=spec(Path("/tmp"), plan={"steps": [llm("a")]}))
    state.refused = [Refusal(request_id=f"r{n}", reason=f"bad message {n}", received_at=AT) for n in range(5)]
    snapshot = progress_snapshot(state, "g-1", 0, {}, None)
    assert [r.request_id for r in snapshot.refused] == ["r2", "r3", "r4"] and REFUSALS_SHOWN == 3
    assert snapshot.refused_count == 5
    console = Console(record=True, width=200)
    print_refusals(console, "g-1", snapshot)
    lines = console.export_text().splitlines()
    assert lines == [
        "refused r2: bad message 2",
        "refused r3: bad message 3",
        "refused r4: bad message 4",
        "2 earlier refusal(s): perdure inbox g-1",
    ], lines


def test_a_goal_that_refused_nothing_shows_no_refusal_line():
    state = GoalState(spec=spec(Path("/tmp"), plan={"steps": [llm("a")]}))
    console = Console(record=True, width=200)
    print_refusals(console, "g-1", progress_snapshot(state, "g-1", 0, {}, None))
    assert console.export_text() == ""
