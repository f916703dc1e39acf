"""Test data builders: goal specs, plan steps, model scripts, workspaces and model profiles.

Plain functions returning fresh values; nothing here talks to a server (that is
helpers.py) or is a fixture (conftest.py). The golden-history recorder builds its
scenarios from these too, so a change here can change a recorded scenario.
"""

from __future__ import annotations

from pathlib import Path

from perdure.activities.models.profiles import ModelProfile
from perdure.activities.models.scripted import ScriptedServer
from perdure.workflows.goal.contracts.goal_contracts import GoalSpec

# --- goals -------------------------------------------------------------------------


def spec(workspace: Path, **overrides) -> GoalSpec:
    fields = dict(
        goal="Summarise the notes into SUMMARY.md",
        constraints=["Do not modify notes/."],
        model_profile="test",
        workspace=str(workspace),
    )
    fields.update(overrides)
    return GoalSpec(**fields)


def llm(name: str, needs: list[str] | None = None, **extra) -> dict:
    return {"name": name, "kind": "llm", "prompt": f"Do {name}.", "needs": needs or [], **extra}


def agent(name: str, prompt: str, tools: list[str], needs: list[str] | None = None, **extra) -> dict:
    return {"name": name, "kind": "agent", "prompt": prompt, "tools": tools, "needs": needs or [], **extra}


def gate(needs: list[str] | None = None) -> dict:
    """A step that waits until the test creates GO in the workspace: keeps the goal running."""
    command = "while [ ! -f GO ]; do sleep 0.05; done; echo gate open"
    return {"name": "gate", "kind": "tool", "tool": "run_command", "args": {"command": command}, "needs": needs or []}


def chain(n: int) -> list[dict]:
    """n llm steps, each needing the one before: s00 -> s01 -> ..."""
    return [llm(f"s{i:02d}", [f"s{i - 1:02d}"] if i else []) for i in range(n)]


# --- the demo goal -----------------------------------------------------------------

DEMO_PLAN = {
    "steps": [
        {"name": "inventory", "kind": "tool", "tool": "list_dir", "args": {"path": "notes"}},
        {"name": "read-ideas", "kind": "tool", "tool": "read_file", "args": {"path": "notes/ideas.md"}},
        {"name": "read-todo", "kind": "tool", "tool": "read_file", "args": {"path": "notes/todo.md"}},
        {
            "name": "summarize",
            "kind": "llm",
            "needs": ["inventory", "read-ideas", "read-todo"],
            "prompt": "Pick the three most important next steps.",
        },
        {
            "name": "write-summary",
            "kind": "agent",
            "needs": ["summarize"],
            "tools": ["write_file", "run_command"],
            "prompt": "AGENT-WRITE: write SUMMARY.md from the summary, then count its words.",
        },
    ]
}
SUMMARY_TEXT = "1. Fix the CSV parser.\n2. Retry uploads.\n3. Cache the export.\n"


def demo_script(plan: dict | None = None) -> dict:
    return {
        "replies": [
            {"when": "PERDURE-PLANNER", "json": plan or DEMO_PLAN},
            {
                "when": "AGENT-WRITE",
                "times": 1,
                "tool_calls": [{"name": "write_file", "arguments": {"path": "SUMMARY.md", "content": SUMMARY_TEXT}}],
            },
            {
                "when": "AGENT-WRITE",
                "times": 1,
                "tool_calls": [{"name": "run_command", "arguments": {"command": "wc -w SUMMARY.md"}}],
            },
            {"when": "AGENT-WRITE", "times": 1, "content": "SUMMARY.md written; it has 12 words."},
            {"when": "PERDURE-STEP", "content": "Top three: fix the CSV parser, retry uploads, cache the export."},
        ]
    }


def write_notes(workspace: Path) -> None:
    (workspace / "notes").mkdir()
    (workspace / "notes/ideas.md").write_text("- cache the export\n- pin reports\n")
    (workspace / "notes/todo.md").write_text("- [ ] fix the CSV parser\n- [ ] retry uploads\n")


# --- model scripts and profiles ----------------------------------------------------

STEP_REPLY = {"replies": [{"when": "PERDURE-STEP", "content": "step done"}]}
"""A script answering every llm step with "step done"."""


def tool_then_answer(tool: str, arguments: dict, *, when: str, answer: str) -> dict:
    """A script for an agent step that calls `tool` with `arguments`, then answers `answer`
    once a message contains `when` (what the tool's result, or a refusal, puts in the prompt)."""
    return {
        "replies": [
            {"when": when, "content": answer},
            {"when": "PERDURE-AGENT", "tool_calls": [{"name": tool, "arguments": arguments}]},
        ]
    }


# provider -> (model, price per million input tokens, per million output tokens)
_SCRIPTED_MODELS = {"openai": ("scripted-gpt", 1.0, 2.0), "anthropic": ("scripted-claude", 3.0, 15.0)}


def scripted_profile(server: ScriptedServer, provider: str = "openai", name: str = "test") -> ModelProfile:
    """A priced profile that sends `provider`'s wire format to a scripted server."""
    model, price_in, price_out = _SCRIPTED_MODELS[provider]
    return ModelProfile(
        name=name,
        provider=provider,
        model=model,
        base_url=server.openai_base_url if provider == "openai" else server.anthropic_base_url,
        api_key_env=None,
        price_input_per_mtok=price_in,
        price_output_per_mtok=price_out,
    )


def openai_profile(server: ScriptedServer, name: str = "test") -> ModelProfile:
    return scripted_profile(server, "openai", name)


def anthropic_profile(server: ScriptedServer, name: str = "test") -> ModelProfile:
    return scripted_profile(server, "anthropic", name)
