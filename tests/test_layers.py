"""The package layers hold: each package imports only the ones below it, so the
deterministic core never reaches I/O and the runtime never reaches the CLI; and no
test module imports another (shared code lives in helpers, builders, testing/)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Package -> the packages of ours it may import. Bottom first.
ALLOWED = {
    "workflows": set(),
    "runtime": {"workflows"},
    "activities": {"workflows", "runtime"},
    "workers": {"workflows", "runtime", "activities"},
    "starters": {"workflows", "runtime", "activities", "workers", "testing"},
    "testing": {"workflows", "runtime", "activities", "workers", "starters"},
}
# The `scripted` model profile (offline runs, `perdure demo`) serves its replies
# through the scripted server, the one double a shipped package starts.
EXCEPTIONS = {("activities/models/scripted.py", "testing")}
OURS = set(ALLOWED) | {"bench", "tests"}
# The built-in tools' declarations are read by the goal workflow (it validates their
# arguments and makes their effect keys itself), so they belong to the workflows' layer:
# pure at import, scanned with the workflow code (activities/tools/catalogue/__init__.py).
WORKFLOW_LAYER_IN_ACTIVITIES = "activities.tools.catalogue"


def layer_of(module: str) -> str:
    """The layer a module of ours is in: its folder (perdure.X is the folder X/)."""
    name = module.removeprefix("perdure.")
    if name == WORKFLOW_LAYER_IN_ACTIVITIES or name.startswith(WORKFLOW_LAYER_IN_ACTIVITIES + "."):
        return "workflows"
    return name.split(".")[0]


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_layers_below_it(package: str):
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for module in imported_packages(path):
            top = layer_of(module)
            if top in OURS and top != package and top not in ALLOWED[package]:
                if (relative, top) not in EXCEPTIONS:
                    wrong.append(f"{relative} imports {module}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.slow
def test_no_test_module_imports_another_test_module():
    wrong = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for module in imported_packages(path):
            name = module.removeprefix("tests.")
            if module.startswith("tests.") and (name.startswith("test_") or name == "conftest"):
                wrong.append(f"tests/{path.name} imports {module}")
    assert not wrong, "\n".join(wrong)
