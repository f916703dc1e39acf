"""Where the CLI's commands live, read from the installed package: every command is a
function in one command-group module of `perdure.starters.cli`, registered on that
module's own typer app, and the root app only adds those apps (one registration style);
no module of `perdure.starters` imports one that imports it back, at the top or inside a
function (no import cycle), so each way in loads on its own in a fresh interpreter;
and the three front ends (the CLI, `perdure ui`, `perdure mcp`) make no Temporal call on
a goal themselves: they go through the one client, `perdure.starters.client`."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

import perdure.starters

STARTERS = Path(perdure.starters.__file__).parent
# What a front end would call on a workflow handle or the Temporal client to reach a goal.
GOAL_CALLS = {
    "get_workflow_handle",
    "start_workflow",
    "execute_update",
    "start_update",
    "signal",
    "query",
    "fetch_history",
    "fetch_history_events",
    "list_workflows",
}


def group_modules() -> list:
    import perdure.starters.cli as cli

    assert hasattr(cli, "__path__"), "perdure.starters.cli is a module, not a package of command groups"
    names = [m.name for m in pkgutil.iter_modules(cli.__path__) if m.name.endswith("_commands")]
    return [importlib.import_module(f"{cli.__name__}.{name}") for name in names]


def commands_of(app: typer.Typer, module) -> list[str]:
    """The commands under `app`, each asserted to be a function of `module`; sub-apps it adds
    must be typer apps of the same module."""
    found = []
    for info in app.registered_commands:
        assert info.callback.__module__ == module.__name__, (info.callback, module.__name__)
        found.append(info.name or info.callback.__name__)
    for group in app.registered_groups:
        own = [value for value in vars(module).values() if value is group.typer_instance]
        assert own, f"{module.__name__} adds a typer app it does not define"
        found += commands_of(group.typer_instance, module)
    return found


def test_every_command_is_a_function_of_one_group_module_registered_on_that_modules_app():
    from perdure.starters.cli import app

    modules = group_modules()
    assert len(modules) >= 5, [m.__name__ for m in modules]
    assert app.registered_commands == [], "the root app registers no command itself"
    added = [group.typer_instance for group in app.registered_groups]
    by_app = {id(m.app): m for m in modules}
    assert sorted(map(id, added)) == sorted(by_app), "the root adds each group module's app, once, and nothing else"
    listed = []
    for group in added:
        listed += commands_of(group, by_app[id(group)])
    # Every command a user can type is one of those functions (nothing registered elsewhere).
    root = typer.main.get_command(app)

    def leaves(command) -> int:
        subs = getattr(command, "commands", None)
        return 1 if subs is None else sum(leaves(c) for c in subs.values())

    assert leaves(root) == len(listed) >= 40


def parsed_apart(function: str) -> Any:
    """`function()` of this module, run in a fresh interpreter: in a test process whose
    threads and finalizers other tests left running, CPython 3.11's ast.parse can fail
    spuriously ("AST constructor recursion depth mismatch", cpython issue 106905)."""
    code = f"import json, tests.test_cli_layout as layout; print(json.dumps(layout.{function}()))"
    root = Path(__file__).parent.parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def import_graph() -> dict[str, list[str]]:
    """Module of perdure.starters -> the modules of perdure.starters it imports, anywhere in
    it (inside functions too: an import put off to call time still closes a cycle)."""
    modules = {}
    for path in STARTERS.rglob("*.py"):
        parts = path.relative_to(STARTERS).with_suffix("").parts
        name = ".".join(("perdure.starters", *parts)).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                # `from package import submodule` imports the submodule; a name from a module is the module.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = sorted(edges)
    return graph


def test_no_module_of_the_starters_imports_one_that_imports_it_back():
    graph = parsed_apart("import_graph")
    assert "perdure.starters.cli" in graph
    cycles = []
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for nxt in graph[name]:
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.slow
def test_each_way_into_the_starters_imports_alone_in_a_fresh_interpreter():
    """A cycle shows as a module used half-initialised, which depends on which module is
    imported first: start from a command group (its package imports every group, in the
    root's order), from the client, from the web UI's and the MCP server's modules, and
    from the terminal renderer."""
    groups = [m.__name__ for m in group_modules()]
    others = ("client", "ui_server", "mcp_server", "render")
    firsts = [groups[0], groups[-1], *(f"perdure.starters.{name}" for name in others)]
    runs = [
        (name, subprocess.Popen([sys.executable, "-c", f"import {name}"], stderr=subprocess.PIPE, text=True))
        for name in firsts
    ]
    failed = {name: proc.communicate(timeout=120)[1][-600:] for name, proc in runs if proc.wait() != 0}
    assert failed == {}


def front_end_files() -> list[Path]:
    cli = STARTERS / "cli"
    assert cli.is_dir(), "no CLI package"
    return [*sorted(cli.glob("*.py")), STARTERS / "ui_server.py", STARTERS / "mcp_server.py", STARTERS / "render.py"]


def goal_calls_in_front_ends() -> list[str]:
    calls = []
    for path in front_end_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in GOAL_CALLS:
                calls.append(f"{path.relative_to(STARTERS)}:{node.lineno} .{node.func.attr}()")
    return calls


def test_the_cli_the_web_ui_and_the_mcp_server_reach_goals_only_through_the_one_client():
    assert parsed_apart("goal_calls_in_front_ends") == []
    # Each of the three uses the client class (not helpers of their own).
    for front in ("ui_server.py", "mcp_server.py", "cli/goal_commands.py", "cli/steering_commands.py"):
        assert "PerdureClient" in (STARTERS / front).read_text(encoding="utf-8"), front
