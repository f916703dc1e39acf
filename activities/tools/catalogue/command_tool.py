"""run_command: a shell command in the workspace, inside the sandbox, and when a run of it
may simply run again.

`once` by default (a shell command can append, POST or push), with three ways out, each
making a re-run after an interruption free: the plan step's `replay: safe`, the call's own
`replay: "safe"` argument, or a command on the short read-only allowlist
(`read_only_command`). A shell command has no key a service could deduplicate by: an
interrupted one is re-run only when it is replay-safe (`command_replay`), and is
otherwise `uncertain`, like a `once` tool.

Its sandbox (activities/tools/sandbox.py) holds the workspace and read-only system
directories, nothing of the worker's, and no network unless the goal allows it
(`allow_network`) or its plan step says `network: true`; the workflow passes that as
`ToolInput.network`, never as an argument a model could set. The run itself is in
activities/tools/command_runs.py.
"""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import Field, field_validator

from perdure.activities.tools.catalogue.tool_base import LocalCall, LocalTool
from perdure.workflows.shared.tool_specs import LONG_CALL_TIMEOUTS, ToolArgs, ToolSpec


class RunCommandArgs(ToolArgs):
    command: str = Field(
        description="Shell command, run with /bin/sh in the workspace root, inside a sandbox: only the workspace "
        "(writable, also $HOME) and the system directories (read-only) exist, /tmp is private and emptied "
        "afterwards, background processes end with the command, and there is no network unless the goal "
        "allows it."
    )
    timeout_s: float = Field(default=60, gt=0, le=600)
    replay: Literal["safe"] | None = Field(
        default=None,
        description='"safe" when running the command twice does no harm (tests, builds, linters, reads): if '
        "its run is interrupted (a lost worker), it runs again on its own. Leave it out when the command "
        "appends, sends, pushes, deletes or otherwise changes something: an interrupted run then becomes a "
        "question for a person (did it happen?) and is never repeated on its own.",
    )

    @field_validator("replay", mode="before")
    @classmethod
    def _replay_is_safe_or_absent(cls, value: object) -> object:
        if value is not None and value != "safe":
            raise ValueError(
                f'replay must be "safe" (the command may run again after an interruption) or left out; got {value!r}'
            )
        return value


class RunCommand(LocalTool):
    spec = ToolSpec(
        name="run_command",
        # Not re-run after an interruption unless declared or read-only (module
        # docstring): a shell command can reach further than the workspace.
        replay="once",
        risk="local-write",
        description="Run a shell command in the workspace root, in a sandbox (only the workspace and "
        "system directories, no network unless the goal allows it; timeout, output capped). Set "
        '"replay": "safe" for commands that may run twice (tests, builds).',
        args_model=RunCommandArgs,
        needs_workspace=True,
        on_devices=True,
        runs_commands=True,
        refused_when_superseded=True,
        **LONG_CALL_TIMEOUTS,
    )
    example = {"command": "make test", "replay": "safe"}

    async def run(self, call: LocalCall, args: RunCommandArgs) -> str:
        from perdure.activities.tools.command_runs import run_command

        return await run_command(call.root, args, network=call.network, hidden=call.hidden)


DECLARED = (RunCommand(),)


# --- when a run may simply run again -----------------------------------------------------

READ_ONLY_COMMANDS: frozenset[str] = frozenset({"ls", "cat", "pwd", "head", "tail", "wc", "grep"})
"""Commands re-run after an interruption without asking: none of them has an option
that writes (unlike `sort -o`, `find -delete`, `sed -i`)."""
READ_ONLY_GIT: frozenset[str] = frozenset({"status", "diff", "log", "show"})
"""`git SUBCOMMAND` forms that only read (`git status` may refresh the index, which is
invisible and idempotent)."""
GIT_WRITING_OPTIONS = ("--output", "--ext-diff", "--textconv")
"""git options that write a file or run a program named in the repository's config."""
COMMAND_SEPARATORS = frozenset({"|", "||", "&&", ";"})
SEPARATOR_CHARACTERS = ";|&"
# Refused anywhere in the text, even quoted: redirections, substitutions, subshells,
# backgrounding, escapes, line breaks (the shell runs each line) and globs' cousins
# that run code. A refusal only costs a question after an interruption.
UNSAFE_CHARACTERS = frozenset("<>`$(){}&\\\n\r!")


def read_only_command(command: str) -> bool:
    """True only when every part of `command` is an allowlisted read: simple commands
    joined by `|`, `||`, `&&` or `;`, no redirection, substitution, subshell or
    background job. Conservative: whatever this parse cannot vouch for is not safe."""
    if not command.strip() or any(c in UNSAFE_CHARACTERS for c in command.replace("&&", "")):
        return False
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=SEPARATOR_CHARACTERS)
        lexer.whitespace_split = True
        lexer.commenters = ""
        tokens = list(lexer)
    except ValueError:
        return False  # unbalanced quotes
    part: list[str] = []
    parts = [part]
    for token in tokens:
        if token in COMMAND_SEPARATORS:
            part = []
            parts.append(part)
        elif set(token) <= set(SEPARATOR_CHARACTERS):
            return False  # `;;`, `|&` and the like
        else:
            part.append(token)
    return all(_read_only_part(words) for words in parts)


def _read_only_part(words: list[str]) -> bool:
    if not words:
        return False  # an empty part: `ls ;` or `| cat` is not a plain command
    name, args = words[0], words[1:]
    if name in READ_ONLY_COMMANDS:
        return True
    if name == "git" and args and args[0] in READ_ONLY_GIT:
        return not any(a.startswith(GIT_WRITING_OPTIONS) for a in args[1:])
    return False


def command_replay(args: RunCommandArgs) -> str | None:
    """Why an interrupted run of this command may simply run again, or None when it
    may not (a person is asked whether it happened)."""
    if args.replay == "safe":
        return 'declared replay: "safe"'
    if read_only_command(args.command):
        return "a read-only command"
    return None


def decide_command_retry(attempt: int, args: RunCommandArgs) -> Literal["run", "uncertain"]:
    """A command's attempt after an interrupted one (the worker was lost, the attempt
    timed out) runs it again only when it is replay-safe; heartbeats cannot tell
    whether the shell got as far as the effect."""
    if attempt > 1 and command_replay(args) is None:
        return "uncertain"
    return "run"
