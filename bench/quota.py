"""Many goals on one rate-limited model API wait in one line (`quota_efficiency`).

`goals` goals of `calls` independent llm steps each, all started at once, call one
profile whose quota (config `[quotas.NAME]`, workflows/quota/quota_workflow.py) is the scripted
server's own limit: `rpm` requests a minute, past which the server answers 429 with
Retry-After in the OpenAI wire format. Measured: the 429s the server sent, the
failed model attempts the goals saw (their ledgers), and the run's wall time from
the first start to the last result. The floor is goals x calls / rpm minutes (the
limit allows no faster); efficiency = floor / actual, target >= 0.9 (within 10 %).
`window_s` shortens the server's sliding window (the limit scaled to it), so a
short test meets the limit as often as the full run does.

    .venv/bin/python -m bench.quota [--goals 20] [--calls 10] [--rpm 60] [--window-s 60]
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client

from bench.common import Section, goal_spec, make_workspace, new_id, parse_options, perdure_worker, run_standalone
from bench.common import start_goal as start_bench_goal
from perdure.activities.models.profiles import ModelConfig, ModelProfile
from perdure.activities.models.scripted import ScriptedServer
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.quota.quota_workflow import STATE_QUERY, QuotaLimits, QuotaState, quota_workflow_id

KEY = "quota_efficiency"
KEYS = (KEY,)
PROFILE = "bench-quota"


@dataclass
class QuotaRun:
    seconds: float
    floor_s: float
    requests: int
    rate_limited: int
    failed_attempts: int
    outcomes: list[str]
    waited_nodes: int
    waits: list[str]
    span_s: float = 0.0
    # The quota service's reservation keys: a key ending in "/late" is a slot retaken by a
    # call that came back too late for its own (activities/quota/quota_admission.py).
    keys: list[str] = field(default_factory=list)

    @property
    def retaken(self) -> int:
        return sum(1 for key in self.keys if key.endswith("/late"))

    @property
    def efficiency(self) -> float:
        return self.floor_s / self.seconds

    @property
    def pacing(self) -> float:
        """The server's view: the limit's spacing over the first to the last request it answered
        (goal start and report left out, which a short run cannot amortise)."""
        return (self.requests - 1) / self.requests * self.floor_s / self.span_s if self.span_s else 0.0


def llm_steps(calls: int) -> list[dict]:
    return [
        {"name": f"call{i:02d}", "kind": "llm", "prompt": f"Say one line about the number {i}."} for i in range(calls)
    ]


async def run_quota(
    client: Client,
    workdir: Path,
    goals: int,
    calls: int,
    rpm: int,
    window_s: float = 60,
    quota: bool = True,
) -> QuotaRun:
    """One run: `goals` x `calls` model calls against a server limited to `rpm`; with
    `quota`, the profile declares that limit (without, each call backs off alone)."""
    workspace = make_workspace(workdir / "quota-ws", {"notes.txt": "quota bench\n"})
    task_queue = new_id("bench-quota")
    script = {"policy": "offline", "requests_per_minute": rpm, "rate_window_s": window_s}
    with ScriptedServer(script) as server:
        profile = ModelProfile(name=PROFILE, provider="openai", model="scripted-gpt", base_url=server.openai_base_url)
        quotas = {PROFILE: QuotaLimits(requests_per_minute=rpm)} if quota else {}
        config = ModelConfig(profiles={PROFILE: profile}, quotas=quotas)
        async with perdure_worker(client, task_queue, workdir / "quota-home", model_config=config):
            started = time.perf_counter()
            spec = goal_spec(workspace, llm_steps(calls), model_profile=PROFILE, label=f"quota {calls} calls")
            handles = await asyncio.gather(
                *(start_bench_goal(client, task_queue, spec, "bench-quota") for _ in range(goals))
            )
            results = await asyncio.gather(*(h.result() for h in handles))
            seconds = time.perf_counter() - started
            snapshots = await asyncio.gather(*(h.query(GoalWorkflow.progress) for h in handles))
            keys = await quota_keys(client, task_queue) if quota else []
        model_requests = [r for r in server.requests() if r["status"] != 429]
        arrived = [r["arrived"] for r in model_requests]
        return QuotaRun(
            seconds=seconds,
            floor_s=goals * calls / rpm * 60,
            requests=len(model_requests),
            rate_limited=server.rate_limited(),
            failed_attempts=sum(s.failed_attempts for s in snapshots),
            outcomes=[r.outcome for r in results],
            waited_nodes=sum(1 for s in snapshots for n in s.nodes if n.quota),
            waits=[n.quota for s in snapshots for n in s.nodes if n.quota],
            span_s=max(arrived) - min(arrived) if arrived else 0.0,
            keys=keys,
        )


async def quota_keys(client: Client, task_queue: str) -> list[str]:
    """The reservations the profile's quota service holds (the recent ones: all of a short run)."""
    handle = client.get_workflow_handle(quota_workflow_id(PROFILE, task_queue))
    state = await handle.query(STATE_QUERY, result_type=QuotaState)
    return list(state.slots)


async def measure(
    client: Client, workdir: Path, goals: int = 20, calls: int = 10, rpm: int = 60, window_s: float = 60
) -> Section:
    run = await run_quota(client, workdir, goals, calls, rpm, window_s)
    if any(outcome != "succeeded" for outcome in run.outcomes):
        raise RuntimeError(f"quota goals did not all succeed: {sorted(set(run.outcomes))}")
    notes = [
        f"quota: {goals} goals x {calls} model calls, server limited to {rpm}/min (429 + Retry-After past it): "
        f"{run.seconds:.1f} s against a floor of {run.floor_s:.0f} s -> efficiency {run.efficiency:.3f} "
        f"(server-side pacing, first to last request: {run.pacing:.3f})",
        f"  429s the server sent: {run.rate_limited}; failed model attempts the goals saw: {run.failed_attempts}; "
        f"model requests answered: {run.requests}; steps that waited for quota: {run.waited_nodes}; "
        f"slots lost by calls back too late: {run.retaken}",
    ]
    extra = {
        "quota_run_s": round(run.seconds, 1),
        "quota_floor_s": run.floor_s,
        "quota_429s_sent": run.rate_limited,
        "quota_failed_attempts_seen": run.failed_attempts,
    }
    return Section(figures={KEY: round(run.efficiency, 3)}, notes=notes, extra=extra)


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, goals=20, calls=10, rpm=60, window_s=60.0))


if __name__ == "__main__":
    main()
