"""The agent-turn benchmark (bench/agent_turn.py) at a tiny size, on the db-file server that
`make bench` runs: the goal and the raw Temporal loop run side by side, so both meet the same
machine, and any number of turns is scripted unambiguously."""

from __future__ import annotations

import os

import pytest
from temporalio.client import WorkflowExecutionStatus

from bench import agent_turn
from bench.common import start_server, use_home


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(300)
async def test_the_goal_and_the_raw_loop_run_side_by_side_for_any_number_of_turns(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "environ", dict(os.environ))
    use_home(tmp_path / "home")
    server = await start_server(tmp_path)
    try:
        section = await agent_turn.measure(server.client, tmp_path, turns=12, delay_s=0.2, repeats=1)
        runs = {"GoalWorkflow": [], "bench.RawAgent": []}
        async for execution in server.client.list_workflows():
            assert execution.status == WorkflowExecutionStatus.COMPLETED
            runs[execution.workflow_type].append((execution.start_time, execution.close_time))
    finally:
        server.stop()
    assert set(section.figures) == set(agent_turn.KEYS)
    # A warm-up each (one after the other), then each size once: three of each, and each
    # timed goal overlaps a raw loop in time.
    assert len(runs["GoalWorkflow"]) == len(runs["bench.RawAgent"]) == 3
    warm_up, *timed = sorted(runs["GoalWorkflow"])
    for start, close in timed:
        assert any(start < raw_close and raw_start < close for raw_start, raw_close in runs["bench.RawAgent"])
