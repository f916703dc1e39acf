"""Scratch git repositories for the git tools to commit into, and a `git` runner that reads them.

Runs git with the caller's environment minus any GIT_* variable, so a test started from
inside a git hook (or with GIT_DIR set) never touches the checkout it runs in.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=_git_env()
    ).stdout.strip()


def init_repo(repo: Path) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Test User")
    git(repo, "config", "user.email", "test@example.com")
    (repo / "README.md").write_text("# crash test repository\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "initial commit")


def _git_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
