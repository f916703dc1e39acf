"""What an agent turn costs on top of its model call (`agent_turn_overhead_pct`).

An agent step whose scripted model takes 1 s per reply (the scripted server's
`delay_s`) and calls one `read_file` per turn, then answers. A turn's wall time
is the slope between a goal of 2 turns and one of 8 (medians of 3, after an
untimed warm-up goal), so goal start and report cancel out; overhead = (turn
wall time - 1 s) / 1 s x 100. The model speaks the real OpenAI wire format
through perdure's provider, as in production. The 8-turn goals' histories give
the same per turn from event times (the median turn-to-turn interval), split
into the model activity and everything else.

    .venv/bin/python -m bench.agent_turn [--turns 8] [--delay-s 1.0] [--repeats 3]
"""

from __future__ import annotations

from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from activities.models.config import ModelConfig, ModelProfile
from bench.common import (
    Section,
    event_seconds,
    goal_spec,
    make_workspace,
    median,
    new_id,
    parse_options,
    perdure_worker,
    run_chain,
    run_goal,
    run_standalone,
    slope_ms,
)
from testing.scripted import ScriptedServer
from workflows.contracts import Activities

KEYS = ("agent_turn_overhead_pct",)
PROFILE = "bench-agent"


def marker(turns: int, k: int) -> str:
    return f"AGT{turns}-{k}-END"


def script(turn_counts: list[int], delay_s: float) -> dict:
    """Turn 1 answers the step prompt with a read of file 1; turn k answers the
    content of file k-1 with a read of file k; the last turn answers in text.
    Entries match on the last message only, so replies do not depend on use counts."""
    replies = []
    for turns in turn_counts:
        for k in range(1, turns + 1):
            when_last = f"step: agent-t{turns}" if k == 1 else marker(turns, k - 1)
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
            "name": f"agent-t{turns}",
            "kind": "agent",
            "prompt": "Read the files one by one as told, then say done.",
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


async def measure(client: Client, workdir: Path, turns: int = 8, delay_s: float = 1.0, repeats: int = 3) -> Section:
    home = workdir / "agent"
    sizes = (2, turns)
    files = {f"t{t}-{k}.txt": marker(t, k) + "\n" for t in sizes for k in range(1, t)}
    workspace = make_workspace(home / "ws", files)
    task_queue = new_id("bench-agent")
    walls: dict[int, list[float]] = {t: [] for t in sizes}
    with ScriptedServer(script(list(sizes), delay_s)) as server:
        profile = ModelProfile(name=PROFILE, provider="openai", model="scripted-gpt", base_url=server.openai_base_url)
        config = ModelConfig(profiles={PROFILE: profile})
        async with perdure_worker(client, task_queue, home, model_config=config):
            # Warm up (sandbox imports of the workflow code, the pooled model client, schema
            # builds) before anything is timed: in the first goal they would pass for turns.
            await run_agent_goal(client, task_queue, workspace, sizes[0])
            histories = []
            for _ in range(repeats):
                for t in sizes:
                    seconds, handle = await run_agent_goal(client, task_queue, workspace, t)
                    walls[t].append(seconds)
                    if t == turns:
                        histories.append((await run_chain(client, handle))[0])
    turn_ms = slope_ms((sizes[0], median(walls[sizes[0]])), (sizes[1], median(walls[sizes[1]])))
    overhead = (turn_ms / 1000 - delay_s) / delay_s * 100
    spans = [turn_spans(h) for h in histories]
    intervals = [i for intervals, _ in spans for i in intervals]
    models = [m for _, ms in spans for m in ms]
    notes = [
        f"agent turn (model reply delayed {delay_s:g} s, one read_file per turn; slope {sizes[0]} -> {sizes[1]} turns, "
        f"median of {repeats} after a warm-up goal): goals {median(walls[sizes[0]]):.2f} s and "
        f"{median(walls[sizes[1]]):.2f} s -> {turn_ms:.0f} ms per turn, overhead {overhead:.1f}%",
    ]
    if intervals and models:
        interval, model = median(intervals), median(models)
        notes.append(
            f"  from the {turns}-turn goals' histories (medians of {len(intervals)} turns): turn start to next turn "
            f"start {interval * 1000:.1f} ms (overhead {(interval - delay_s) / delay_s * 100:.1f}%): model activity "
            f"{model * 1000:.1f} ms of which {delay_s * 1000:.0f} ms is the model's delay; tool call and workflow "
            f"between turns {(interval - model) * 1000:.1f} ms"
        )
    return Section(figures={"agent_turn_overhead_pct": round(overhead, 2)}, notes=notes)


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, turns=8, delay_s=1.0, repeats=3))


if __name__ == "__main__":
    main()
