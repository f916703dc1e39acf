"""Memory in the goal (issue 21, section 2), seen from outside: what the scripted model
server received (memories attached to a step's input with their source, age and the
goal or project they belong to; a revocation told at the next turn), what the store
holds afterwards (episodic conclusions, read from the whole output, and failures;
semantic memories a person kept), the end-of-goal card (sent to the owner's router, the
goal ending at once; answered there through `perdure say --card`; a goal without an
owner sends none), and the history (every memory call a `perdure.memory.*` local
activity, the ids given in its result).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

import pytest
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from typer.testing import CliRunner

from perdure.memory.store import open_store
from perdure.starters import cli
from perdure.starters.cli import terminal
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.memory_contracts import MemorySource, NewMemory
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.router.router_contracts import RouterHandlers, RouterView, router_id
from perdure.workflows.shared.search_attributes import OWNER
from tests.builders import gate, llm, openai_profile, spec
from tests.helpers import (
    LOCAL_ACTIVITY_MARKER,
    calls_for,
    local_activities,
    new_goal_id,
    running_worker,
    wait_until,
)

NOW = datetime.now(UTC)


def note(workspace: str, text: str, days_old: float, scope: str = "project", **source) -> NewMemory:
    made = NOW - timedelta(days=days_old)
    return NewMemory(
        layer="semantic",
        kind="note",
        text=text,
        source=MemorySource(**(source or {"kind": "person"})),
        scope=scope,
        scope_key=workspace if scope == "project" else ("other-goal" if scope == "goal" else ""),
        made_at=made,
        expires_at=made + timedelta(days=365),
    )


def seed(home: Path, *memories: NewMemory) -> list[str]:
    store = open_store(home=home)
    try:
        ids, refused = store.write(list(memories))
        assert not refused
        return ids
    finally:
        store.close()


def recall_results(history) -> list[dict]:
    """The result of every recall, as the history's local activity markers hold it."""
    found = []
    for event in history.events:
        attrs = event.marker_recorded_event_attributes
        if not event.HasField("marker_recorded_event_attributes") or attrs.marker_name != LOCAL_ACTIVITY_MARKER:
            continue
        data = json.loads(attrs.details["data"].payloads[0].data)
        if data["activity_type"] == Activities.MEMORY_RECALL:
            found.append(json.loads(attrs.details["result"].payloads[0].data))
    return found


async def test_a_steps_input_carries_the_memories_of_its_goal_and_project_with_source_and_age(
    env, task_queue, store, workspace, scripted, tmp_path
):
    ws = str(workspace)
    here, elsewhere, other_goal, everywhere = seed(
        tmp_path,
        note(ws, "CSV exports for Excel need a UTF-8 byte order mark", 3),
        note("/srv/other-project", "CSV exports for Excel must use semicolons", 1),
        note(ws, "CSV exports for Excel were checked by goal other-goal", 0, scope="goal"),
        note(ws, "Excel users read CSV files in British English", 10, scope="global"),
    )
    server = scripted(
        {
            "replies": [
                {
                    "when_last": "step: export",
                    "content": "CONCLUSION: the CSV export for Excel needs a byte order mark = true\nNotes written.",
                },
                {"when": "PERDURE-STEP", "content": "step done"},
            ]
        }
    )
    steps = [
        llm("export", prompt="Write the CSV export notes for Excel users."),
        {"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "missing.txt"}},
    ]
    goal_spec = spec(workspace, plan={"steps": steps}, drift_every=0)
    goal_id = new_goal_id("memory")
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=goal_id, task_queue=task_queue
        )
        result = await handle.result()
        history = await handle.fetch_history()

    (request,) = calls_for(server, "export")
    sent = request["last_message"]
    assert f"[{here} · semantic note · project {ws} (this workspace): a convention of that project" in sent
    assert "source: a person (perdure memory) · 3.0 d old] CSV exports for Excel need a UTF-8 byte order mark" in sent
    assert f"[{everywhere} · semantic note · global: a preference that holds everywhere" in sent
    assert "10.0 d old" in sent
    assert elsewhere not in sent and other_goal not in sent  # another project's, another goal's
    # The history records the ids the step was given, in the recall's result.
    (recall,) = recall_results(history)
    assert {m["id"] for m in recall["memories"]} == {here, everywhere}
    assert any(t == Activities.MEMORY_RECALL for _, t, _, _ in local_activities(history))

    assert result.outcome == "partial"  # the read of a missing file failed
    memory = open_store(home=tmp_path, create=False)
    try:
        mine = memory.listing(goal=goal_id)
    finally:
        memory.close()
    by_kind = {(m.layer, m.kind): m for m in mine}
    episodic = by_kind[("episodic", "conclusion")]
    assert episodic.text == "the CSV export for Excel needs a byte order mark (holds)"
    assert episodic.source.node == "export" and episodic.scope_key == goal_id
    failure = by_kind[("episodic", "failure")]  # failed attempts are always kept
    assert failure.text.startswith("step 'read' (tool) failed:") and failure.source.node == "read"
    assert ("working", "attached") not in by_kind  # dropped when the step settled


@pytest.mark.slow
async def test_a_goal_that_used_a_forgotten_memory_is_told_at_its_next_model_turn(
    env, task_queue, store, workspace, scripted, tmp_path, monkeypatch
):
    colours = workspace / "colours.md"
    colours.write_text("blue\n")
    (blue,) = seed(
        tmp_path,
        note(str(workspace), "the poster uses a blue colour scheme", 2, kind="file", path=str(colours)),
    )
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": "poster drafted"}]})
    steps = [
        llm("design", prompt="Design the poster colour scheme."),
        gate(["design"]),
        llm("caption", ["gate"], prompt="Write the caption under the poster."),
    ]
    goal_spec = spec(workspace, plan={"steps": steps}, drift_every=0)
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal_spec), id=new_goal_id("forget"), task_queue=task_queue
        )
        await wait_until(handle, lambda s: "gate" in s.running)
        monkeypatch.setenv("PERDURE_HOME", str(tmp_path))
        with mock.patch.object(terminal.console, "_width", 400):
            forgot = await asyncio.to_thread(CliRunner().invoke, cli.app, ["forget", str(colours)])
        assert forgot.exit_code == 0, forgot.output
        (workspace / "GO").touch()
        result = await handle.result()

    assert f"forgot file {colours}" in forgot.output and blue in forgot.output
    (design,) = calls_for(server, "design")
    (caption,) = calls_for(server, "caption")
    assert blue in design["last_message"] and "blue colour scheme" in design["last_message"]
    told = caption["last_message"]
    assert "Memories revoked since this goal used them" in told
    assert f"- {blue}: revoked" in told and f"forgotten by `perdure forget {colours}`" in told
    assert "blue colour scheme" not in told  # what was forgotten is not repeated
    assert f"memory: revoked since used: {blue}" in store.get_text(result.report)


LONG_OUTPUT = (
    "I read the Makefile, the CI workflow and the test runner's configuration, then ran the suite "
    "twice: once straight away, where every test failed to import the generated parser, and once "
    "after the build, where all of them passed. The import errors name the parser module that the "
    "build writes into the package.\n"
    "CONCLUSION: the build step must run before the tests = true"
)


def probe_spec(workspace: Path):
    return spec(workspace, plan={"steps": [llm("probe", prompt="Find out how the tests run.")]}, drift_every=0)


async def start_owned(env, task_queue: str, goal_spec, goal_id: str, owner: str | None):
    owned = TypedSearchAttributes([SearchAttributePair(OWNER, owner)] if owner else [])
    return await env.client.start_workflow(
        GoalWorkflow.run, GoalInput(spec=goal_spec), id=goal_id, task_queue=task_queue, search_attributes=owned
    )


def stored(home: Path, goal_id: str) -> dict[tuple[str, str], list]:
    memory = open_store(home=home, create=False)
    try:
        found: dict[tuple[str, str], list] = {}
        for m in memory.listing(goal=goal_id):
            found.setdefault((m.layer, m.kind), []).append(m)
        return found
    finally:
        memory.close()


def event_kinds(history) -> set[str]:
    return {event.WhichOneof("attributes") for event in history.events}


async def perdure(env, task_queue: str, user: str, *args: str) -> str:
    """The CLI run in this process against the test's server, as `user`."""
    variables = {
        "PERDURE_TEMPORAL": env.client.service_client.config.target_host,
        "PERDURE_TASK_QUEUE": task_queue,
        "PERDURE_USER": user,
        "COLUMNS": "400",
    }
    with mock.patch.object(terminal.console, "_width", 400):
        result = await asyncio.to_thread(CliRunner().invoke, cli.app, list(args), env=variables)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.slow
async def test_a_goal_with_candidates_ends_at_once_and_perdure_say_card_keeps_them_from_the_router(
    env, task_queue, store, workspace, scripted, tmp_path
):
    """No answer is ever sent to the goal: its result arrives, its card is in the owner's
    router (which the goal started, the user having none yet), and the user's answer there
    makes the conclusion a semantic memory of the project, with its source."""
    user = f"u{uuid.uuid4().hex[:8]}"
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": LONG_OUTPUT}]})
    goal_id = new_goal_id("card")
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_owned(env, task_queue, probe_spec(workspace), goal_id, user)
        result = await handle.result()
        history = await handle.fetch_history()
        router = env.client.get_workflow_handle(router_id(user))
        held = await router.query(RouterHandlers.VIEW, result_type=RouterView)
        inbox = await perdure(env, task_queue, user, "inbox", "--router")
        said = await perdure(env, task_queue, user, "say", "--card", f"{goal_id}:memory=project")
        after = await router.query(RouterHandlers.VIEW, result_type=RouterView)
        parent = (await router.describe()).raw_description.workflow_execution_info.parent_execution

    assert result.outcome == "succeeded"
    report = store.get_text(result.report)
    assert "memory: 1 conclusions offered for keeping: see perdure inbox --router" in report
    # Nothing waited for a person: no timer, no question; the card went by signal.
    kinds = event_kinds(history)
    assert "timer_started_event_attributes" not in kinds
    assert "signal_external_workflow_execution_initiated_event_attributes" in kinds
    assert parent.workflow_id == goal_id  # no router yet: the goal started it (and abandoned it)
    (episodic,) = stored(tmp_path, goal_id)[("episodic", "conclusion")]
    (card,) = held.cards
    assert (card.goal_id, card.workspace) == (goal_id, str(workspace))
    assert [(c.id, c.text) for c in card.candidates] == [(episodic.id, episodic.text)]
    assert card.choices == ["project", "global", "skip", "choose"]
    assert card.expires_at == episodic.expires_at
    assert f"memory card of goal {goal_id}" in inbox
    assert "1. the build step must run before the tests (holds) (step 'probe')" in inbox
    assert f"perdure say --card {goal_id}:memory=project|global|skip|choose" in inbox

    said = said.replace("\n", "")  # `perdure say` prints on the console made at import, which wraps
    assert f"→ kept {goal_id} (by card): kept 1 of 1 conclusion(s) of goal {goal_id} for project {workspace}" in said
    (kept,) = stored(tmp_path, goal_id)[("semantic", "convention")]
    assert kept.scope == "project" and kept.scope_key == str(workspace) and kept.derived_from == [episodic.id]
    assert kept.source.label() == f"goal {goal_id}, step 'probe'"
    assert after.cards == [] and [(k.goal_id, k.promoted) for k in after.kept] == [(goal_id, {episodic.id: kept.id})]


async def test_a_conclusion_at_the_end_of_a_long_output_becomes_a_memory(
    env, task_queue, store, workspace, scripted, tmp_path
):
    """The step's preview (its first 200 characters) holds no conclusion: it is read from
    the statement lines the model activity took from the whole output."""
    assert len(LONG_OUTPUT.split("CONCLUSION")[0]) > 200
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": LONG_OUTPUT}]})
    goal_id = new_goal_id("long")
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_owned(env, task_queue, probe_spec(workspace), goal_id, None)
        await handle.result()
    (episodic,) = stored(tmp_path, goal_id)[("episodic", "conclusion")]
    assert episodic.text == "the build step must run before the tests (holds)"
    assert episodic.source.node == "probe"


async def test_a_goal_without_an_owner_sends_no_card_and_ends_saying_where_its_candidates_are(
    env, task_queue, store, workspace, scripted, tmp_path
):
    server = scripted({"replies": [{"when": "PERDURE-STEP", "content": LONG_OUTPUT}]})
    goal_id = new_goal_id("ownerless")
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_owned(env, task_queue, probe_spec(workspace), goal_id, None)
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.outcome == "succeeded"
    kinds = event_kinds(history)
    assert not {k for k in kinds if "signal_external" in k or "child_workflow" in k}
    assert "timer_started_event_attributes" not in kinds
    report = store.get_text(result.report)
    assert (
        "memory: 1 verified conclusions were not offered for keeping (the goal has no owner (PerdureOwner) whose "
        f"router could hold them); they stay this goal's episodic memories: perdure memory list --goal {goal_id}"
    ) in report
    assert ("semantic", "convention") not in stored(tmp_path, goal_id)
