"""Scenario data shared by workflow tests and the golden-history recorder."""

from __future__ import annotations

from pathlib import Path

from workflows.contracts import GoalSpec

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


def spec(workspace: Path, **overrides) -> GoalSpec:
    fields = dict(
        goal="Summarise the notes into SUMMARY.md",
        constraints=["Do not modify notes/."],
        model_profile="test",
        workspace=str(workspace),
    )
    fields.update(overrides)
    return GoalSpec(**fields)
