"""`perdure forget` and `perdure memory …` as a person uses them: a forget that goes
through two derived summaries (made, and re-made without the forgotten source, by a
model profile that calls the scripted server: its requests are counted), the derivation
tree `memory show` prints, and the errors (unknown id, no store yet, a bad
PERDURE_MEMORY_URL, an unknown profile) as one line with exit code 2, never a traceback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from typer.testing import CliRunner

from perdure.starters import cli
from perdure.starters.cli import terminal

SUMMARY_MARK = "PERDURE-MEMORY-SUMMARY"


def perdure(home: Path, *args: str, **env: str):
    """The CLI in this process, printing to a wide console (no wrapped lines)."""
    values = {"PERDURE_HOME": str(home), "PERDURE_MEMORY_URL": "", "PERDURE_MEMORY_PROFILE": "", **env}
    with (
        mock.patch.object(terminal.console, "_width", 300),
        mock.patch.object(terminal.err_console, "_width", 300),
    ):
        return CliRunner().invoke(cli.app, list(args), env=values)


def remembered(result) -> str:
    assert result.exit_code == 0, result.output
    return re.search(r"(m-[0-9a-f]{12})", result.output).group(1)


@pytest.fixture
def summaries(scripted, tmp_path) -> tuple:
    """A scripted server that condenses facts, and a config file with a profile for it."""
    server = scripted(
        {
            "replies": [
                {"when": [SUMMARY_MARK, "blue colour scheme"], "content": "A blue poster with warm serif titles."},
                {
                    "when": [SUMMARY_MARK, "A blue poster", "matte paper"],
                    "content": "A blue poster, serif titles, printed on matte paper.",
                },
                {"when": [SUMMARY_MARK, "matte paper"], "content": "Warm serif titles, printed on matte paper."},
                {"when": SUMMARY_MARK, "content": "The poster has warm serif titles."},
            ]
        }
    )
    config = tmp_path / "config.toml"
    config.write_text(
        f'[profiles.mem]\nprovider = "openai"\nmodel = "scripted-gpt"\nbase_url = "{server.openai_base_url}"\n'
    )
    return server, config


@pytest.mark.slow
def test_a_forget_goes_through_two_derived_summaries(tmp_path, summaries):
    server, config = summaries
    home, env = tmp_path / "home", {"PERDURE_CONFIG": str(config)}
    colours = tmp_path / "colours.md"
    colours.write_text("blue\n")
    project = ("--workspace", str(tmp_path))
    blue = remembered(
        perdure(home, "memory", "add", "the poster uses a blue colour scheme", "--file", str(colours), *project)
    )
    serif = remembered(perdure(home, "memory", "add", "titles are set in a warm serif font", *project))
    matte = remembered(perdure(home, "memory", "add", "the client prefers matte paper", *project))
    first = remembered(perdure(home, "memory", "summarize", blue, serif, "--profile", "mem", **env))
    second = remembered(perdure(home, "memory", "summarize", first, matte, "--profile", "mem", **env))
    asked = len(server.requests())

    forgot = perdure(home, "forget", str(colours), **env)

    assert forgot.exit_code == 0, forgot.output
    print(forgot.output)  # the closing note quotes it
    lines = forgot.output.splitlines()
    assert lines[0] == f"forgot file {colours}"
    assert lines[1] == "revoked (1):" and lines[2].startswith(f"  {blue}  semantic note · project {tmp_path}")
    regenerated = forgot.output.split("regenerated (2):\n")[1].split("dropped")[0].splitlines()
    assert regenerated[0].startswith(f"  {first} -> ") and "(made by mem, from " + serif in regenerated[0]
    remade_first = regenerated[0].split(" -> ")[1].split()[0]
    assert regenerated[1].startswith(f"  {second} -> ") and remade_first in regenerated[1] and matte in regenerated[1]
    assert "The poster has warm serif titles." in regenerated[0]
    assert "Warm serif titles, printed on matte paper." in regenerated[1]
    assert "dropped (0): none" in forgot.output
    assert len(server.requests()) == asked + 2  # each summary re-made by one call through the profile

    remade_second = regenerated[1].split(" -> ")[1].split()[0]
    shown = perdure(home, "memory", "show", remade_second)
    assert shown.exit_code == 0, shown.output
    print(shown.output)
    tree = shown.output.split("derived from:\n")[1].split("derived into:")[0]
    assert f"  {matte} note [live]" in tree and f"  {remade_first} summary [live]" in tree
    assert f"    {serif} note [live]" in shown.output  # the tree goes down to the originals
    old = perdure(home, "memory", "show", second)
    assert f"replaced by: {remade_second}" in old.output and "regenerated without" in old.output
    listed = perdure(home, "memory", "list", "--all")
    assert "blue colour scheme" in listed.output and "revoked" in listed.output
    assert "blue" not in perdure(home, "memory", "list").output


@pytest.mark.slow
def test_errors_are_one_line_and_exit_2(tmp_path):
    home = tmp_path / "home"
    none_yet = perdure(home, "memory", "list")
    assert none_yet.exit_code == 2
    assert none_yet.output.strip() == (
        f"error: no memory store yet at {home / 'memory' / 'memory.sqlite3'} "
        "(a worker creates it when a goal first recalls or writes a memory)"
    )
    remembered(perdure(home, "memory", "add", "titles are set in a warm serif font"))
    for args in (("memory", "show", "m-000000000000"), ("forget", "m-000000000000")):
        unknown = perdure(home, *args)
        assert unknown.exit_code == 2 and unknown.output.strip().startswith("error: no memory m-000000000000 in ")
        assert len(unknown.output.strip().splitlines()) == 1
    nothing = perdure(home, "forget", "no-such-goal")
    assert nothing.exit_code == 2 and "nothing matches 'no-such-goal'" in nothing.output
    bad = perdure(home, "memory", "list", PERDURE_MEMORY_URL="mysql://db.example/memory")
    assert bad.exit_code == 2 and bad.output.strip() == (
        "error: PERDURE_MEMORY_URL=mysql://db.example/memory: not a memory store URL; "
        "use postgresql://user:password@host/database or sqlite:///path"
    )
    unreachable = perdure(home, "memory", "list", PERDURE_MEMORY_URL="postgresql://u:hunter2@127.0.0.1:1/db")
    assert unreachable.exit_code == 2 and "hunter2" not in unreachable.output
    assert unreachable.output.startswith("error: cannot open the memory store postgresql://u:***@127.0.0.1:1/db")
    profile = perdure(home, "memory", "summarize", "m-000000000000", "--profile", "nope")
    assert profile.exit_code == 2 and "nope" in profile.output
    for result in (none_yet, bad, unreachable, profile):
        assert "Traceback" not in result.output


@pytest.mark.slow
def test_the_installed_command_prints_no_traceback(tmp_path):
    env = {**os.environ, "PERDURE_HOME": str(tmp_path), "PERDURE_MEMORY_URL": "postgresql://u@127.0.0.1:1/db"}
    ran = subprocess.run(
        [str(Path(sys.executable).parent / "perdure"), "forget", "m-000000000000"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert ran.returncode == 2 and ran.stdout == ""
    assert ran.stderr.startswith("error: cannot open the memory store") and "Traceback" not in ran.stderr
