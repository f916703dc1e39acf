"""The Temporal UI explains a goal at a glance (issue 17): every activity a goal schedules,
local ones included, carries a summary naming its step and tool; every UI link perdure
prints opens a page of the real UI, not its error page; the UI's default list and the
goals view leave the watchdog's runs out; a goal's page shows its text and its steps. The browser tests run
headless Chromium against a dev server with its UI.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from unittest import mock
from urllib.parse import quote

import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.models.profiles import ModelConfig
from perdure.activities.models.scripted import ScriptedServer
from perdure.runtime import settings
from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.starters.client.goal_starts import start_goal
from perdure.workers import plumbing, watchdog_schedule
from perdure.workers.orchestrator import build_worker
from perdure.workflows.goal.contracts.goal_contracts import GOAL_WORKFLOW
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.offers.worker_offers import worker_offers_id
from perdure.workflows.quota.quota_workflow import QUOTA_WORKFLOW
from perdure.workflows.watchdog.watchdog_contracts import WATCHDOG_WORKFLOW
from tests.builders import DEMO_PLAN, demo_script, openai_profile, spec, write_notes
from tests.goldens import HISTORIES, load
from tests.helpers import (
    CHROMIUM,
    chromium,
    dev_server_options,
    free_ports,
    local_activities,
    new_goal_id,
    scheduled_activities,
)

GOAL_TEXT = "Summarise the notes into SUMMARY.md for the UI"
# What the Temporal UI (2.x) shows instead of a page it could not load: a workflow it could
# not fetch ("/history" without a run id: 400), a schedule that is not there.
UI_ERRORS = ("We are having technical difficulties", "Bad Request", "Error Message")


def ui_error(dom: str) -> str | None:
    main = dom[dom.find("<main") :] if "<main" in dom else dom
    return next((marker for marker in UI_ERRORS if marker in main), None)


def links_in(output: str) -> list[str]:
    found = re.findall(r"https?://\S+", output)
    assert found, output
    return found


# ------------------------------------------------------------------ summaries (no browser)


def workflow_type(history) -> str:
    return history.events[0].workflow_execution_started_event_attributes.workflow_type.name


def test_every_activity_and_local_activity_in_the_golden_histories_has_a_summary():
    """Summaries are user metadata, not commands: recording them changed no replay. Every
    golden history already carries one on each activity and each local-activity marker."""
    assert any(scheduled_activities(load(path)) for path in HISTORIES)
    for path in HISTORIES:
        history = load(path)
        scheduled = scheduled_activities(history)
        marked = local_activities(history)
        if workflow_type(history) == QUOTA_WORKFLOW:
            assert not scheduled and not marked, path.name  # the quota service runs no activities
            continue
        # Every goal runs steps; a router that only starts and watches goals runs none.
        if workflow_type(history) == GOAL_WORKFLOW:
            assert scheduled or marked, path.name
        assert [(t, s) for _, t, s in scheduled if not s] == [], path.name
        assert [(t, s) for _, t, s, _ in marked if not s] == [], path.name


@pytest.mark.slow
async def test_a_goals_activities_name_their_step_and_tool_local_reads_included(
    env, task_queue, workspace, scripted, store
):
    write_notes(workspace)
    config = ModelConfig(profiles={"test": openai_profile(scripted(demo_script()))})
    async with build_worker(env.client, task_queue=task_queue, store=store, model_config=config):
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=spec(workspace)), id=new_goal_id("ui"), task_queue=task_queue
        )
        await handle.result()
    history = await handle.fetch_history()
    summaries = {s for _, _, s in scheduled_activities(history)} | {s for _, _, s, _ in local_activities(history)}
    local = [(t, s) for _, t, s, _ in local_activities(history)]
    assert local, "the demo's reads run as local activities"
    for step in DEMO_PLAN["steps"]:
        named = [s for s in summaries if f" · {step['name']}" in s]
        assert named, f"no activity summary names step {step['name']}: {sorted(summaries)}"
        if step["kind"] == "tool":
            assert all(s.startswith(f"tool {step['tool']} · ") for s in named), named
    assert all(s.startswith("tool ") and " · " in s for t, s in local if t == "perdure.tool.run"), local


# ------------------------------------------------------------------ the UI in Chromium


@dataclass
class UiGoal:
    client: Client
    ui: str
    goal_id: str
    run_id: str
    watchdog_run: str
    watchdog_printed: str  # what `perdure watchdog run-now` printed
    cli_env: dict[str, str]
    tmp: Path
    # (url, chromium args) -> the DOM: the goal and the watchdog run are finished, so a page
    # reads the same each time it is loaded; each is loaded once per module.
    loaded: dict[tuple[str, tuple[str, ...]], str] = field(default_factory=dict)
    profiles: Iterator[int] = field(default_factory=itertools.count)


@pytest_asyncio.fixture(scope="module")
async def ui_goal(tmp_path_factory, payload_store) -> AsyncIterator[UiGoal]:
    """A dev server with its UI, a demo goal run to its end and one watchdog run, both finished
    (a finished workflow's page settles under Chromium's virtual time; a running one keeps
    fetching and never does)."""
    tmp = tmp_path_factory.mktemp("ui")
    workspace = tmp / "workspace"
    workspace.mkdir()
    write_notes(workspace)
    task_queue = f"tq-ui-{os.getpid()}"
    (ui_port,) = free_ports(1)
    ui = f"http://127.0.0.1:{ui_port}"
    server = ScriptedServer(demo_script()).start()
    config = ModelConfig(profiles={"test": openai_profile(server)})
    try:
        async with await WorkflowEnvironment.start_local(**dev_server_options(), ui=True, ui_port=ui_port) as env:
            cli_env = {
                "PERDURE_TEMPORAL": env.client.service_client.config.target_host,
                "PERDURE_UI": ui,
                "PERDURE_TASK_QUEUE": task_queue,
                "PERDURE_HOME": str(tmp / "home"),
            }
            with mock.patch.dict(os.environ, cli_env):
                store = DiskArtifactStore(tmp / "home" / "artifacts")
                async with build_worker(env.client, task_queue=task_queue, store=store, model_config=config):
                    handle = await start_goal(env.client, spec(workspace, goal=GOAL_TEXT), new_goal_id("ui"))
                    result = await handle.result()
                    assert result.outcome == "succeeded", result.excerpt
                    await watchdog_schedule.ensure_watchdog_schedule(env.client, timedelta(hours=1), task_queue)
                    ran = await perdure(cli_env, "watchdog", "run-now")
                    watchdog_run = re.search(r"watchdog run (\S+) started", ran).group(1)
                desc = await handle.describe()
                yield UiGoal(env.client, ui, handle.id, desc.run_id, watchdog_run, ran, cli_env, tmp)
    finally:
        server.stop()


async def perdure(variables: dict[str, str], *args: str) -> str:
    """What `perdure ARGS` prints, run in this process, on a console wide enough for a URL."""
    with mock.patch.object(terminal.console, "_width", 400):
        result = await asyncio.to_thread(CliRunner().invoke, cli.app, list(args), env=variables)
    assert result.exit_code == 0, result.output
    return result.output


async def page(ui_goal: UiGoal, url: str, *args: str) -> str:
    """The DOM Chromium dumps for `url` (after any screenshot `args` ask for: one load for both)."""
    key = (url, args)
    if key not in ui_goal.loaded:
        profile = ui_goal.tmp / f"profile-{next(ui_goal.profiles)}"
        ui_goal.loaded[key] = await asyncio.to_thread(_chromium_in_turn, url, profile, *args, "--dump-dom")
    return ui_goal.loaded[key]


# At most three Chromiums at once: more only share the same two cores, and the process
# tier's other worker runs timing-sensitive kills beside this module.
_CHROMIUM_SLOTS = threading.BoundedSemaphore(3)


def _chromium_in_turn(url: str, profile: Path, *args: str) -> str:
    with _CHROMIUM_SLOTS:
        return chromium(url, profile, *args)


async def pages(ui_goal: UiGoal, *urls: str) -> list[str]:
    """The DOMs of `urls`, each distinct one loaded once, side by side (a Chromium spends about
    half of a load waiting on the UI's fetches)."""
    distinct = list(dict.fromkeys(urls))
    doms = dict(zip(distinct, await asyncio.gather(*(page(ui_goal, url) for url in distinct)), strict=True))
    return [doms[url] for url in urls]


@pytest.mark.process
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium (make installs it)")
async def test_every_ui_link_perdure_prints_opens_its_page_not_the_uis_error(ui_goal: UiGoal):
    with mock.patch.dict(os.environ, ui_goal.cli_env):
        status = links_in(await perdure(ui_goal.cli_env, "status", ui_goal.goal_id))
        printed = {
            **{f"perdure status ({i + 1})": link for i, link in enumerate(status)},
            "perdure watchdog status": links_in(await perdure(ui_goal.cli_env, "watchdog", "status"))[0],
            "perdure watchdog run-now": re.search(r"started · UI: (\S+)", ui_goal.watchdog_printed).group(1),
            "a goal's history": settings.goal_ui_link(ui_goal.goal_id, ui_goal.run_id),
            "the goals view": settings.goals_ui_link(),
        }
        broken = settings.goal_ui_link(ui_goal.goal_id) + "/history"
    assert all(url.startswith(ui_goal.ui) for url in printed.values()), printed
    *doms, broken_dom = await pages(ui_goal, *printed.values(), broken)
    for (what, url), dom in zip(printed.items(), doms, strict=True):
        assert ui_error(dom) is None, f"{what} prints {url}: the UI shows {ui_error(dom)!r}"
    # The page name without the run id is read as a run id: the error the check above would catch.
    assert ui_error(broken_dom) is not None
    dom = await page(ui_goal, printed["a goal's history"])
    assert ui_goal.goal_id in dom and ui_goal.run_id in dom


@pytest.mark.process
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium (make installs it)")
async def test_the_default_list_and_the_goals_view_show_the_goal_and_leave_perdures_own_workflows_out(
    ui_goal: UiGoal,
):
    namespace = ui_goal.client.namespace
    with mock.patch.dict(os.environ, ui_goal.cli_env):
        view = settings.goals_ui_link()
    ours = f"{ui_goal.ui}/namespaces/{namespace}/workflows?query={quote(plumbing.PLUMBING_QUERY, safe='')}"
    offers = worker_offers_id(ui_goal.cli_env["PERDURE_TASK_QUEUE"])
    shot = ui_goal.tmp / "ui-goals.png"
    everything, goals_only, plumbing_only = await asyncio.gather(
        page(ui_goal, f"{ui_goal.ui}/namespaces/{namespace}/workflows"),
        page(ui_goal, view, "--hide-scrollbars", "--window-size=1400,700", f"--screenshot={shot}"),
        page(ui_goal, ours),
    )
    # The UI's own list (no query) shows the user's goal, not the watchdog's run nor the offers workflow.
    assert ui_goal.goal_id in everything
    assert ui_goal.watchdog_run not in everything and offers not in everything
    # They are a query away.
    assert ui_goal.watchdog_run in plumbing_only and offers in plumbing_only and ui_goal.goal_id not in plumbing_only
    assert ui_goal.goal_id in goals_only and ui_goal.watchdog_run not in goals_only
    assert GOAL_WORKFLOW in goals_only and WATCHDOG_WORKFLOW not in goals_only
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20_000


@pytest.mark.process
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium (make installs it)")
async def test_a_goals_history_page_shows_its_text_and_each_steps_summary(ui_goal: UiGoal):
    with mock.patch.dict(os.environ, ui_goal.cli_env):
        latest, history = settings.goal_ui_link(ui_goal.goal_id), settings.goal_ui_link(ui_goal.goal_id, ui_goal.run_id)
    # The timeline (the page the link without a run id opens) is the at-a-glance one: each
    # activity by its summary. Local activities show their type only there (UI 2.54): their
    # summaries, on the markers, are in the history below.
    shot = ui_goal.tmp / "ui-goal.png"
    timeline, dom = await asyncio.gather(
        page(ui_goal, latest, "--hide-scrollbars", "--window-size=1400,1250", f"--screenshot={shot}"),
        page(ui_goal, history),
    )
    assert GOAL_TEXT in timeline
    assert GOAL_TEXT in dom  # the static summary, at the top
    # Activities and local activities by step and tool: the three reads ready together ran as
    # one batch (workflows/goal/read_batch.py), whose summary names the steps.
    for summary in ("3 reads at once · inventory, read-ideas, read-todo", "llm · summarize · "):
        assert summary in dom, summary
    assert "agent turn 1/" in dom and "tool write_file · write-summary turn 1 · " in dom
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20_000
    if os.environ.get("PERDURE_UI_SCREENSHOT"):
        shutil.copy(shot, os.environ["PERDURE_UI_SCREENSHOT"])
