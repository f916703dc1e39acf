"""`perdure watchdog ask` offline: the scripted model reads the watchdog's history with a
tool, answers, and proposes a rule change, applied only when the maintainer confirms
(--yes), never with --no or without a terminal. Through the CLI; requests counted.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from perdure.activities.watchdog.watchdog_memory import load_rules, rules_path
from perdure.starters.cli import app

ANSWER = {
    "answer": "review-1 is not stuck: its agent step runs long but keeps reading new files; "
    "its 30 min stall threshold is too short for it",
    "propose": {"set": "stall_after_s=3600", "for": "goal=review-1"},
}


def ask_script() -> dict:
    return {
        "replies": [
            {"when_last": "TOOL RESULT history", "content": json.dumps(ANSWER)},
            {"when": "PERDURE-WATCHDOG-ASK", "content": json.dumps({"tool": "history"})},
        ]
    }


def ask(tmp_path, server, *flags: str):
    config = tmp_path / "config.toml"
    config.write_text(
        f'[profiles.wd]\nprovider = "openai"\nmodel = "scripted"\nbase_url = "{server.openai_base_url}"\n',
        encoding="utf-8",
    )
    env = {
        "PERDURE_HOME": str(tmp_path),
        "PERDURE_CONFIG": str(config),
        "PERDURE_TASK_QUEUE": "q",
        "PERDURE_USER": "maintainer",
        "COLUMNS": "200",
    }
    return CliRunner().invoke(app, ["watchdog", "ask", "why is review-1 slow?", "--profile", "wd", *flags], env=env)


def test_ask_reads_its_history_then_proposes_a_rule_applied_only_when_confirmed(tmp_path, scripted):
    server = scripted(ask_script())
    refused = ask(tmp_path, server, "--no")
    assert refused.exit_code == 0, refused.output
    assert (
        "watchdog reads history" in refused.output
        and "proposed: perdure watchdog set stall_after_s=3600" in refused.output
    )
    assert "not applied" in refused.output and not rules_path(tmp_path, "q").exists()
    assert len(server.requests()) == 2  # a tool call, then the answer

    unattended = ask(tmp_path, server)  # CliRunner's stdin is no terminal
    assert "nothing is applied" in unattended.output and not rules_path(tmp_path, "q").exists()

    applied = ask(tmp_path, server, "--yes")
    assert applied.exit_code == 0 and "applied: v1 goal=review-1 stall_after_s=3600" in applied.output
    book, _ = load_rules(rules_path(tmp_path, "q"))
    assert book.scopes == {"goal=review-1": {"stall_after_s": 3600.0}} and book.history[0].user == "maintainer"
    assert "Traceback" not in applied.output
    print(applied.output)


def test_ask_with_an_unknown_profile_is_one_line_exit_2(tmp_path, scripted):
    server = scripted(ask_script())
    result = CliRunner().invoke(
        app,
        ["watchdog", "ask", "why?", "--profile", "nope"],
        env={"PERDURE_HOME": str(tmp_path), "PERDURE_CONFIG": str(tmp_path / "none.toml"), "COLUMNS": "200"},
    )
    assert result.exit_code == 2 and "error: UnknownModelProfile" in result.output and "Traceback" not in result.output
    assert server.requests() == []
