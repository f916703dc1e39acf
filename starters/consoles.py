"""The consoles the CLI prints through (rich), and how their output is laid out: nothing
else. What is printed is decided by the commands and starters/render.py."""

from __future__ import annotations

from rich.console import Console


def cli_console(*, stderr: bool = False) -> Console:
    """Emoji codes and highlighting off: perdure styles its own words with markup only, and
    the text it quotes (goals, steps, tool output, errors) must print as written
    (`root:x:0:0`). Not on a terminal (a pipe, a file, a log) lines are not wrapped: a URL
    or a path broken across two lines can no longer be opened, copied or grepped."""
    console = Console(stderr=stderr, emoji=False, highlight=False)
    console.soft_wrap = not console.is_terminal
    return console
