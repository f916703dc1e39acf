"""perdure's workflow modules are passed through the SDK's sandbox (runtime/plugin.py), so
the sandbox no longer stops them calling the clock, randomness, the environment or the disk
at run time. This scan does instead: no module under workflows/ (nor the capabilities
workflow) reads a source that differs between a run and its replay, or imports one."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from perdure.runtime.plugin import WORKFLOW_MODULES

ROOT = Path(__file__).resolve().parent.parent

# module -> its attributes a workflow must not call (None: none of them)
FORBIDDEN_CALLS: dict[str, set[str] | None] = {
    "datetime": {"now", "utcnow", "today", "fromtimestamp"},
    "date": {"today"},
    "time": None,
    "random": None,
    "secrets": None,
    "uuid": {"uuid1", "uuid4"},
    "os": {"getenv", "urandom", "getpid", "listdir", "stat", "scandir"},
}
FORBIDDEN_IMPORTS = {"random", "secrets", "socket", "subprocess", "threading", "time", "httpx", "requests", "urllib"}
FORBIDDEN_NAMES = {("os", "environ"), ("sys", "argv")}
FORBIDDEN_BUILTINS = {"open", "input"}


def workflow_files() -> list[Path]:
    files: list[Path] = []
    for module in WORKFLOW_MODULES:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        path = Path(spec.origin)
        files += sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    return files


def findings(source: str) -> list[str]:
    """Each call, name or import of a run-dependent source in this module's code."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [f"line {node.lineno}: imports {n}" for n in names if n.split(".")[0] in FORBIDDEN_IMPORTS]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner, attribute = node.value.id, node.attr
            banned = FORBIDDEN_CALLS.get(owner, set())
            if banned is None or attribute in (banned or ()) or (owner, attribute) in FORBIDDEN_NAMES:
                found.append(f"line {node.lineno}: {owner}.{attribute}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_BUILTINS:
            found.append(f"line {node.lineno}: {node.func.id}()")
    return found


@pytest.mark.parametrize(
    "snippet",
    [
        "from datetime import datetime\nx = datetime.now()",
        "import uuid\nx = uuid.uuid4()",
        "import os\nx = os.environ['HOME']",
        "import random",
        "from time import monotonic",
        "x = open('notes.md').read()",
    ],
)
def test_the_scan_finds_a_run_dependent_source(snippet):
    assert findings(snippet), snippet


def test_the_scan_lets_workflow_apis_and_pure_code_pass():
    assert findings("from datetime import timedelta\nfrom temporalio import workflow\nx = workflow.now()") == []


@pytest.mark.slow
def test_no_workflow_module_reads_the_clock_randomness_the_environment_or_the_disk():
    files = workflow_files()
    assert len(files) > 40, files  # the scan reaches the goal workflow's package
    report = {
        str(path.relative_to(ROOT)): found for path in files if (found := findings(path.read_text(encoding="utf-8")))
    }
    assert report == {}
