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


async def crashed(env, tmp_path, standby: bool):
    crash = await crash_perdure(env.client, tmp_path, CrashRun(STEPS, BLOCK_AT, CLOSES_PER_STEP, 120), standby)
    assert crash.done_s is not None, crash.describe(BLOCK_AT)
    assert crash.ran == STEPS, crash.describe(BLOCK_AT)
    return crash


@pytest.mark.slow
@pytest.mark.process
async def test_a_standby_taking_over_a_chain_killed_at_step_39_reruns_at_most_five_steps(env, tmp_path):
    crash = await crashed(env, tmp_path, standby=True)
    # The blocked read itself runs again (it never answered); the reads done before the
    # kill, those before it and those read ahead beside it, are not read again.
    assert BLOCK_AT in crash.rerun, crash.describe(BLOCK_AT)
    assert len(crash.rerun) <= 5, crash.describe(BLOCK_AT)


@pytest.mark.slow
@pytest.mark.process
async def test_a_worker_restarted_after_a_kill_at_step_39_reruns_at_most_five_steps(env, tmp_path):
    crash = await crashed(env, tmp_path, standby=False)
    assert BLOCK_AT in crash.rerun, crash.describe(BLOCK_AT)
    assert len(crash.rerun) <= 5, crash.describe(BLOCK_AT)
