"""`make demo`: one real goal end to end on the embedded Temporal server.

Starts the dev server and a background worker when they are not running (a
server on its port that perdure did not start is refused unless PERDURE_DEMO_ATTACH=1),
creates a scratch workspace with a few notes, starts a goal that plans and runs
several nodes (tools, an llm node, an agent node), shows progress and prints
the report. Offline it uses the scripted model; with a model key or an
OpenAI-compatible base URL in the environment the same goal runs on that model.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from perdure.activities.models.profiles import default_provider_from_env
from perdure.runtime import settings
from perdure.runtime.connect import connect
from perdure.starters import devserver, render
from perdure.starters.background import ensure_ui, ensure_worker
from perdure.starters.client import PerdureClient
from perdure.starters.client.goal_specs import new_goal_id
from perdure.starters.client.goal_starts import start_goal
from perdure.workflows.goal.contracts.goal_contracts import Budget, GoalSpec

DEMO_GOAL = (
    "Read the project notes in this workspace (notes/ideas.md and notes/todo.md) and write SUMMARY.md "
    "with the three most important next steps, then check that SUMMARY.md exists and count its words."
)
DEMO_CONSTRAINTS = [
    "Do not modify anything under notes/.",
    "SUMMARY.md stays under 200 words.",
]
DEMO_TOOLS = ["list_dir", "read_file", "write_file", "run_command"]
# The demo attaches to a Temporal server it did not start only when told to: it would
# register search attributes and a schedule there.
ATTACH_ENV = "PERDURE_DEMO_ATTACH"
# The port of the `perdure ui` the demo starts beside the worker.
UI_PORT_ENV = "PERDURE_UI_PORT"
DEFAULT_UI_PORT = 8234

NOTES = {
    "notes/ideas.md": (
        "# Ideas\n\n"
        "- Cache the nightly export so the dashboard loads in under a second.\n"
        "- Let users pin a report to their home page.\n"
        "- Replace the hand-written CSV parser with the standard library's csv module.\n"
    ),
    "notes/todo.md": (
        "# To do\n\n"
        "- [ ] The nightly export fails when a customer name contains a comma (parser bug).\n"
        "- [ ] Add a retry to the upload step; it fails about once a week.\n"
        "- [x] Move the docs to the new site.\n"
    ),
    "README.md": "# Demo project\n\nA small project whose notes the demo goal summarises.\n",
}


def make_workspace() -> Path:
    root = Path(tempfile.mkdtemp(prefix="perdure-demo-"))
    for rel, text in NOTES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def show_new_files(console: Console, workspace: Path) -> None:
    """What the goal left in the workspace besides the seeded notes."""
    created = sorted(p for p in workspace.rglob("*") if p.is_file() and str(p.relative_to(workspace)) not in NOTES)
    for path in created:
        console.rule(f"{path.relative_to(workspace)} (written by the goal)")
        console.print(path.read_text(encoding="utf-8", errors="replace")[:4000], markup=False, highlight=False)


def cli_path() -> Path:
    """This venv's `perdure`, as a path this shell can type: relative when below the current
    directory (`make demo` runs from the checkout: .venv/bin/perdure), else absolute."""
    # Not resolved: the venv's python is a symlink to the interpreter it was made from.
    script = Path(sys.executable).absolute().parent / "perdure"
    try:
        return script.relative_to(Path.cwd())
    except ValueError:
        return script


def cli_command() -> str:
    """How to call this CLI from here: `perdure` when PATH finds this very one (an activated
    venv), else its path."""
    found = shutil.which("perdure")
    if found is not None and Path(found).resolve() == cli_path().resolve():
        return "perdure"
    path = str(cli_path())
    return shlex.quote(path if "/" in path else f"./{path}")  # a bare name would be looked up on PATH


def page_port() -> int:
    """The port of the demo's `perdure ui`, from PERDURE_UI_PORT (checked before anything starts)."""
    text = os.environ.get(UI_PORT_ENV, str(DEFAULT_UI_PORT)).strip()
    if not (text.isascii() and text.isdigit() and 0 < int(text) < 65536):
        raise ValueError(f"{UI_PORT_ENV} must be a port number (1-65535), got {text!r}")
    return int(text)


async def run_demo(console: Console) -> None:
    started = time.monotonic()
    page = page_port()
    port, ui_port = settings.dev_server_ports()
    try:
        server = devserver.start_dev_server(
            port=port, ui_port=ui_port, attach_foreign=os.environ.get(ATTACH_ENV, "") == "1"
        )
    except devserver.ForeignServer as err:
        other, other_ui = port + 10, ui_port + 10
        raise RuntimeError(
            f"{err}. Run the demo on other ports: PERDURE_TEMPORAL=127.0.0.1:{other} "
            f"PERDURE_UI=http://localhost:{other_ui} make demo; or, to use that server anyway, "
            f"{ATTACH_ENV}=1 make demo"
        ) from None
    console.print(
        f"Temporal dev server {'reused' if server.reused else 'started'} at {server.address}; UI {server.ui_url}"
    )
    client = PerdureClient(await connect())
    pid, reused = ensure_worker(devserver.dev_dir() / "data")
    console.print(
        f"worker {'reused' if reused else 'started'} (pid {pid}, log {devserver.dev_dir() / 'data' / 'worker.log'})"
    )
    ui_pid, ui_reused = ensure_ui(devserver.dev_dir() / "data", page)
    console.print(f"perdure ui {'reused' if ui_reused else 'started'} (pid {ui_pid}) on http://127.0.0.1:{page}/")
    # What `default` means here, by name, so the demo can say which model the goal runs on.
    profile = default_provider_from_env()
    workspace = make_workspace()
    spec = GoalSpec(
        goal=DEMO_GOAL,
        constraints=DEMO_CONSTRAINTS,
        model_profile=profile,
        allowed_tools=DEMO_TOOLS,
        workspace=str(workspace),
        budget=Budget().with_default_tokens(),  # as `perdure start` gives a goal with no budget
        local_keyed_writes=True,  # as every start
    )
    goal_id = new_goal_id("demo")
    await start_goal(client.temporal, spec, goal_id)
    console.print(f"goal [bold]{goal_id}[/bold] on model profile '{profile}', workspace {workspace}")
    console.print(f"UI: {settings.goal_ui_link(goal_id)}")
    console.print(f"its task graph, live: http://127.0.0.1:{page}/goals/{goal_id}")
    result = await render.watch(client, goal_id, console)
    elapsed = time.monotonic() - started
    show_new_files(console, workspace)
    console.print(f"\ndemo finished in {elapsed:.1f} s")
    console.print(f"see it in the UI: {settings.goal_ui_link(goal_id)}")
    console.print(f"or: {cli_path().parent / 'temporal'} workflow list --address {server.address}")
    perdure = cli_command()
    console.print(f"the CLI is {perdure}{'' if perdure == 'perdure' else ' (or activate the venv first)'}; try:")
    for command in (f"status {goal_id}", f"result {goal_id}", "ls"):
        console.print(f"  {perdure} {command}", markup=False)
    console.print("the server and worker keep running; stop both with `make server-stop`")
    if result is None or result.outcome != "succeeded":
        raise RuntimeError(f"the demo goal did not succeed ({result.outcome if result else 'no result'})")
