"""A worker SIGKILLed while step 39 of a 100-read chain blocks in its read re-runs a handful
of steps, not the whole batch it was reading ahead (issue 39 item 2).

Counted from outside, as `make bench-peers` counts it (bench/peers_run.py): the kernel
reports every close of a step's file (inotify), whoever read it, so a step read by the
killed worker and again by the one that took over counts twice. Real `perdure worker`
processes on the session's server; the goal is taken over by a standby that was already
polling, and in the second test by a worker started after the kill, as a peer restarts.
"""

from __future__ import annotations

import pytest

from bench.peers_run import CrashRun, crash_perdure

STEPS, BLOCK_AT = 100, 39
# A read step closes its file once (the fingerprint is digested from the read's own open).
CLOSES_PER_STEP = 1
# What a kill re-runs is what was in flight: the blocked read, the reads running beside it
# (BATCH_CALLS_AT_ONCE, 4, start in order) and any read that ended but was not yet kept.
# Measured 1 to 5. The target, `rerun_steps_after_kill` <= 5, is a benchmark
# figure (`make bench-peers`: perdure_rerun_steps, perdure_restart_rerun_steps); this bound
# doubles it, for a loaded 2-core machine where a read's answer waits for the loop to keep
# it. Before the journal: 59 to 100.
MOST_RERUN = 10


async def crashed(env, tmp_path, standby: bool):
    crash = await crash_perdure(env.client, tmp_path, CrashRun(STEPS, BLOCK_AT, CLOSES_PER_STEP, 120), standby)
    print(f"rerun_steps_after_kill={len(crash.rerun)}: {crash.describe(BLOCK_AT)}")  # the measured figure (-s)
    assert crash.done_s is not None, crash.describe(BLOCK_AT)
    assert crash.ran == STEPS, crash.describe(BLOCK_AT)
    return crash


@pytest.mark.slow
@pytest.mark.process
async def test_a_standby_taking_over_a_chain_killed_at_step_39_reruns_a_handful_of_steps(env, tmp_path):
    crash = await crashed(env, tmp_path, standby=True)
    # The blocked read itself runs again (it never answered); the reads done before the
    # kill, those before it and those read ahead beside it, are not read again.
    assert BLOCK_AT in crash.rerun, crash.describe(BLOCK_AT)
    assert len(crash.rerun) <= MOST_RERUN, crash.describe(BLOCK_AT)


@pytest.mark.slow
@pytest.mark.process
async def test_a_worker_restarted_after_a_kill_at_step_39_reruns_a_handful_of_steps(env, tmp_path):
    crash = await crashed(env, tmp_path, standby=False)
    assert BLOCK_AT in crash.rerun, crash.describe(BLOCK_AT)
    assert len(crash.rerun) <= MOST_RERUN, crash.describe(BLOCK_AT)
