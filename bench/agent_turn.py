"""What an agent turn costs on top of its model call (`agent_turn_overhead_pct`).

An agent step whose scripted model takes 1 s per reply (the scripted server's
`delay_s`) and calls one `read_file` per turn, then answers. The model speaks
the real OpenAI wire format through perdure's provider, as in production. A
turn's time is read from the 8-turn goals' histories: from one agent-turn
activity scheduled to the next (the model activity, its tool call and the
workflow between), the median over every turn of 4 goals of 10 turns run after
an untimed warm-up goal; overhead = (turn time - 1 s) / 1 s x 100. The
wall-time slope between goals of 2 and 10 turns says the same, printed as a
check: it swings by a per cent or more with the load of a shared machine, since
one goal's wall time moves by tens of ms. A raw Temporal loop of the very same
activities (bench/raw.py) gives `raw_agent_turn_overhead_pct`: what Temporal and
the activities themselves cost per turn on the same server and machine, the
floor of the goal's figure.

The goal and the raw loop run side by side, the raw loop started half a model
reply after the goal, so each turn's few tens of ms of work falls between the
other's and both meet the same machine: a shared machine's load moves a turn by
tens of ms from one minute to the next, which run one after the other showed as
a difference of a per cent either way between two equal loops.

    .venv/bin/python -m bench.agent_turn [--turns 10] [--delay-s 1.0] [--repeats 4]
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.common import (
    Section,
    event_seconds,
    goal_spec,
    make_workspace,
    median,
    new_id,
    parse_options,
    perdure_worker,
    raw_worker,
    run_chain,
    run_goal,
    run_standalone,
    slope_ms,
)
from bench.raw import RawAgentInput, RawAgentWorkflow
from perdure.activities.models.profiles import ModelConfig, ModelProfile
from perdure.activities.models.scripted import ScriptedServer
from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.workflows.goal.contracts.goal_contracts import Activities

KEYS = ("agent_turn_overhead_pct", "raw_agent_turn_overhead_pct")
PROFILE = "bench-agent"
PROMPT = "Read the files one by one as told, then say done."
KINDS = ("goal", "raw")


def marker(turns: int, k: int) -> str:
    return f"AGT{turns}-{k}-END"


def step_name(turns: int) -> str:
    """The agent step of a goal of `turns` turns; no step's name is inside another's (the
    script matches on text): agent-2turns is not in agent-12turns."""
    return f"agent-{turns}turns"


def script(turn_counts: list[int], delay_s: float) -> dict:
    """Turn 1 answers the step prompt with a read of file 1; turn k answers the
    content of file k-1 with a read of file k; the last turn answers in text.
    Entries match on the last message only, so replies do not depend on use counts."""
    replies = []
    for turns in turn_counts:
        for k in range(1, turns + 1):
            when_last = f"step: {step_name(turns)}" if k == 1 else marker(turns, k - 1)
            if k < turns:
                reply: dict = {"tool_calls": [{"name": "read_file", "arguments": {"path": f"t{turns}-{k}.txt"}}]}
            else:
                reply = {"content": f"done after {turns} turns"}
            replies.append({"when_last": when_last, "delay_s": delay_s, **reply})
    return {"replies": replies}


async def run_agent_goal(client: Client, task_queue: str, workspace: Path, turns: int):
    """One goal of a single agent step of `turns` turns: (wall seconds, its handle)."""
    steps = [
        {
            "name": step_name(turns),
            "kind": "agent",
            "prompt": PROMPT,
            "tools": ["read_file"],
            "max_turns": turns + 2,
        }
    ]
    spec = goal_spec(workspace, steps, model_profile=PROFILE, allowed_tools=["read_file"])
    result, seconds, handle = await run_goal(client, task_queue, spec, f"bench-agent-{turns}")
    if result.outcome != "succeeded":
        raise RuntimeError(f"agent goal {handle.id}: {result.outcome} {result.unfinished}")
    return seconds, handle


def turn_spans(history) -> tuple[list[float], list[float]]:
    """(turn-to-turn intervals, model activity durations) from agent-turn activity events."""
    scheduled, started, durations = [], {}, []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if e.activity_task_scheduled_event_attributes.activity_type.name == Activities.AGENT_TURN:
                scheduled.append((e.event_id, event_seconds(e)))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started[e.activity_task_started_event_attributes.scheduled_event_id] = event_seconds(e)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = e.activity_task_completed_event_attributes.scheduled_event_id
            if sid in dict(scheduled) and sid in started:
                durations.append(event_seconds(e) - started[sid])
    times = [t for _, t in scheduled]
    return [b - a for a, b in zip(times, times[1:], strict=False)], durations


async def run_raw_agent(client: Client, task_queue: str, workspace: Path, turns: int):
    """The same step as a raw Temporal agent loop (bench/raw.py): (wall seconds, its handle)."""
    workflow_id = new_id(f"raw-agent-{turns}")
    raw = RawAgentInput(
        profile=PROFILE,
        step=step_name(turns),
        prompt=PROMPT,
        tools=["read_file"],
        max_turns=turns + 2,
        workspace=str(workspace),
        tool_start_to_close_s=TOOL_SPECS["read_file"].start_to_close_s,
    )
    started = time.perf_counter()
    handle = await client.start_workflow(RawAgentWorkflow.run, raw, id=workflow_id, task_queue=task_queue)
    ran = await handle.result()
    if ran != turns:
        raise RuntimeError(f"raw agent {workflow_id}: {ran} turns, expected {turns}")
    return time.perf_counter() - started, handle


async def side_by_side(first, second, offset_s: float) -> tuple:
    """`await first()` and, `offset_s` after it started, `await second()`: both results."""
    started = asyncio.create_task(first())
    try:
        await asyncio.sleep(offset_s)
        other = await second()
    except BaseException:
        started.cancel()
        raise
    return await started, other


async def measure(client: Client, workdir: Path, turns: int = 10, delay_s: float = 1.0, repeats: int = 4) -> Section:
    home = workdir / "agent"
    sizes = (2, turns)
    files = {f"t{t}-{k}.txt": marker(t, k) + "\n" for t in sizes for k in range(1, t)}
    workspace = make_workspace(home / "ws", files)
    goal_queue, raw_queue = new_id("bench-agent"), new_id("bench-raw-agent")
    walls: dict[tuple[str, int], list[float]] = {(kind, t): [] for kind in KINDS for t in sizes}
    histories: dict[str, list] = {kind: [] for kind in KINDS}
    runners = {"goal": run_agent_goal, "raw": run_raw_agent}
    queues = {"goal": goal_queue, "raw": raw_queue}
    with ScriptedServer(script(list(sizes), delay_s)) as server:
        profile = ModelProfile(name=PROFILE, provider="openai", model="scripted-gpt", base_url=server.openai_base_url)
        config = ModelConfig(profiles={PROFILE: profile})
        async with (
            perdure_worker(client, goal_queue, home, model_config=config),
            raw_worker(client, raw_queue, home, model_config=config),
        ):
            # Warm up (sandbox imports of the workflow code, the pooled model client, schema
            # builds) before anything is timed: in the first goal they would pass for turns.
            for kind in KINDS:
                await runners[kind](client, queues[kind], workspace, sizes[0])
            for _ in range(repeats):
                for t in sizes:
                    ran = await side_by_side(
                        lambda t=t: run_agent_goal(client, goal_queue, workspace, t),
                        lambda t=t: run_raw_agent(client, raw_queue, workspace, t),
                        delay_s / 2,
                    )
                    for kind, (seconds, handle) in zip(KINDS, ran, strict=True):
                        walls[(kind, t)].append(seconds)
                        if t == turns:
                            histories[kind].append((await run_chain(client, handle))[0])
    notes, figures, turns_of = [], {}, {}
    for kind, label in (("goal", "goal"), ("raw", "raw Temporal loop of the same activities")):
        spans = [turn_spans(h) for h in histories[kind]]
        intervals = turns_of[kind] = [i for intervals, _ in spans for i in intervals]
        models = [m for _, ms in spans for m in ms]
        interval, model = median(intervals), median(models)
        figures[kind] = (interval - delay_s) / delay_s * 100
        slope = slope_overhead(walls, kind, sizes, delay_s)
        notes.append(
            f"{label}: turn start to next turn start {interval * 1000:.1f} ms (median of {len(intervals)} turns "
            f"of {len(spans)} {turns}-turn runs) -> overhead {figures[kind]:.2f}%; model activity "
            f"{model * 1000:.1f} ms, tool call and workflow between turns {(interval - model) * 1000:.1f} ms; "
            f"wall-time slope {sizes[0]} -> {sizes[1]} turns (medians of {repeats}): {slope:.1f}%"
        )
    low, high = difference_interval(turns_of["goal"], turns_of["raw"])
    notes.append(
        f"goal - raw: {figures['goal'] - figures['raw']:+.2f} percentage points; 90 % of the differences with "
        f"the turns drawn again: {low / delay_s * 100:+.2f} to {high / delay_s * 100:+.2f}"
    )
    notes.insert(
        0,
        f"agent turn (model reply delayed {delay_s:g} s, one read_file per turn, after a warm-up; "
        f"the goal and the raw loop side by side, the raw loop {delay_s / 2:g} s behind):",
    )
    return Section(
        figures={
            "agent_turn_overhead_pct": round(figures["goal"], 2),
            # Kept beside it: what Temporal and the activities themselves cost per turn, in the same run.
            "raw_agent_turn_overhead_pct": round(figures["raw"], 2),
        },
        notes=notes,
    )


def difference_interval(
    goal: list[float], raw: list[float], draws: int = 2000, confidence: float = 0.9
) -> tuple[float, float]:
    """How far the difference of the two medians (goal - raw) moves when each side's turns
    are drawn again with replacement: the `confidence` interval of `draws` such differences,
    from a fixed seed (the same turns give the same interval). Turns on a shared machine
    spread by tens of ms; the interval says whether a difference of a few ms was measured or
    is noise."""
    rng = random.Random(0)
    differences = sorted(
        median(rng.choices(goal, k=len(goal))) - median(rng.choices(raw, k=len(raw))) for _ in range(draws)
    )
    tail = (1 - confidence) / 2
    return differences[int(tail * (draws - 1))], differences[int((1 - tail) * (draws - 1))]


def slope_overhead(walls: dict, kind: str, sizes: tuple[int, int], delay_s: float) -> float:
    """Per cent of the model's delay that one more turn costs beyond it."""
    small, large = sizes
    turn_ms = slope_ms((small, median(walls[(kind, small)])), (large, median(walls[(kind, large)])))
    return (turn_ms / 1000 - delay_s) / delay_s * 100


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, turns=10, delay_s=1.0, repeats=4))


if __name__ == "__main__":
    main()
