"""What perdure's own model calls cost beside the work (`overhead_token_ratio`, issue 34).

perdure's own calls are those no step asked for: planning, repairs, re-plans, drift
checks, verification questions. Each goal here runs on a profile that speaks the real
OpenAI wire format to the scripted model server (activities/models/scripted.py), which reports
usage (chars / 4) as the real APIs do; the figures are the goal's own ledger, by kind
(GoalResult.own_calls), so they count what a provider would have billed.

- `overhead_tokens_3000_reads`: a plan file of 3,000 reads of small files with the
  default settings; its steps use no model, so every token is perdure's own (it was 52.4 M
  in 250 drift checks that each carried the whole plan). Also per node.
- `drift_check_tokens_per_call_3000_reads`: the same plan with drift checks asked for
  (`drift_every: 12`, 250 of them): what one call costs now that it is shown a bounded
  outline of the plan (it was about 210,000 tokens at the end).
- `overhead_token_ratio`: the demo goal (`make demo`: the planner plans it, an llm step and
  an agent step do the work) on the built-in scripted profile: perdure's own tokens divided
  by its steps' tokens.

    .venv/bin/python -m bench.overhead_tokens [--reads 3000]
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client

from bench.common import (
    Section,
    goal_spec,
    make_workspace,
    new_id,
    parse_options,
    perdure_worker,
    run_goal,
    run_standalone,
)
from perdure.activities.models.profiles import ModelConfig, ModelProfile, builtin_profiles
from perdure.activities.models.scripted import ScriptedServer
from perdure.starters import demo
from perdure.workflows.goal.contracts.goal_contracts import GoalResult, GoalSpec

KEYS = (
    "overhead_token_ratio",
    "overhead_tokens_3000_reads",
    "overhead_tokens_per_node_3000_reads",
    "drift_check_tokens_per_call_3000_reads",
)
PROFILE = "bench-tokens"
ON_TRACK = {"when": "PERDURE-DRIFT", "json": {"on_track": True, "reason": "the plan still serves the goal"}}


def own_tokens(result: GoalResult) -> int:
    return sum(spent.tokens for spent in result.own_calls.values())


def own_text(result: GoalResult) -> str:
    return ", ".join(f"{kind} {s.calls} call(s) {s.tokens:,} tokens" for kind, s in result.own_calls.items()) or "none"


async def read_goal(client: Client, queue: str, workspace: Path, reads: int, **settings) -> GoalResult:
    steps = [
        {"name": f"read-{i:05d}", "kind": "tool", "tool": "read_file", "args": {"path": f"f{i:05d}.txt"}}
        for i in range(reads)
    ]
    spec = goal_spec(workspace, steps, model_profile=PROFILE, allowed_tools=["read_file"], label=f"{reads} reads")
    # goal_spec turns drift checks off for timing benchmarks; here the default (or what is asked) stands.
    spec = spec.model_copy(update={"drift_every": settings.get("drift_every")})
    result, _, handle = await run_goal(client, queue, spec, "bench-tokens")
    if result.outcome != "succeeded":
        raise RuntimeError(f"{handle.id}: {result.outcome} {result.unfinished[:3]}")
    return result


async def demo_goal(client: Client, workdir: Path) -> GoalResult:
    """The demo's goal, spec and workspace as `make demo` makes them, on the scripted profile."""
    workspace = make_workspace(workdir / "demo-ws", {})
    for rel, text in demo.NOTES.items():
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text(text, encoding="utf-8")
    spec = GoalSpec(
        goal=demo.DEMO_GOAL,
        constraints=demo.DEMO_CONSTRAINTS,
        model_profile="scripted",
        allowed_tools=demo.DEMO_TOOLS,
        workspace=str(workspace),
    )
    queue = new_id("bench-tokens-demo")
    config = ModelConfig(profiles={"scripted": builtin_profiles()["scripted"]})
    async with perdure_worker(client, queue, workdir / "demo-home", model_config=config):
        result, _, handle = await run_goal(client, queue, spec, "bench-tokens-demo")
    if result.outcome != "succeeded":
        raise RuntimeError(f"demo goal {handle.id}: {result.outcome} {result.unfinished[:3]}")
    return result


async def measure(client: Client, workdir: Path, reads: int = 3_000) -> Section:
    home = workdir / "tokens"
    workspace = make_workspace(home / "ws", {f"f{i:05d}.txt": f"note {i}\n" for i in range(reads)})
    queue = new_id("bench-tokens")
    with ScriptedServer({"replies": [ON_TRACK]}) as server:
        # Priced as gpt-4o-mini; the window of the model it names is not judged (not a listed model).
        profile = ModelProfile(
            name=PROFILE,
            provider="openai",
            model="scripted-gpt",
            base_url=server.openai_base_url,
            price_input_per_mtok=0.15,
            price_output_per_mtok=0.60,
        )
        async with perdure_worker(client, queue, home, model_config=ModelConfig(profiles={PROFILE: profile})):
            plain = await read_goal(client, queue, workspace, reads)
            asked = await read_goal(client, queue, workspace, reads, drift_every=12)
    demo_result = await demo_goal(client, workdir)

    plain_tokens = own_tokens(plain)
    drift = asked.own_calls.get("drift check")
    per_call = drift.tokens / drift.calls if drift and drift.calls else 0.0
    demo_own = own_tokens(demo_result)
    demo_steps = demo_result.tokens - demo_own
    ratio = demo_own / demo_steps if demo_steps else float("inf")
    notes = [
        f"{reads} reads, default settings: perdure's own calls: {own_text(plain)} "
        f"({plain_tokens / reads:.3f} tokens per node; the steps used {plain.tokens - plain_tokens})",
        f"{reads} reads, drift checks asked every 12 nodes: {own_text(asked)}, {per_call:,.0f} tokens a call "
        f"(${asked.cost_usd:.4f} in all at gpt-4o-mini's prices)",
        f"demo goal: perdure's own {own_text(demo_result)}; steps {demo_steps:,} tokens; ratio {ratio:.2f}",
    ]
    return Section(
        figures={
            "overhead_token_ratio": round(ratio, 3),
            "overhead_tokens_3000_reads": plain_tokens,
            "overhead_tokens_per_node_3000_reads": round(plain_tokens / reads, 3),
            "drift_check_tokens_per_call_3000_reads": round(per_call, 1),
        },
        notes=notes,
    )


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, reads=3_000))


if __name__ == "__main__":
    main()
