"""Memory in the goal (issue 21, section 2), seen from outside: what the scripted model
server received (memories attached to a step's input with their source, age and the
goal or project they belong to; a revocation told at the next turn), what the store
holds afterwards (episodic conclusions and failures, semantic memories a person kept),
the end-of-goal card (answered, and unanswered: closed by its timer), and the history
(every memory call a `perdure.memory.*` local activity, the ids given in its result).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

from rich.console import Console
from typer.testing import CliRunner

from memory.store import open_store
from starters import cli
from tests.builders import gate, llm, openai_profile, spec
from tests.helpers import (
    LOCAL_ACTIVITY_MARKER,
    calls_for,
    local_activities,
    new_goal_id,
    run_goal,
    running_worker,
    submit,
    wait_until,
)
from workflows.contracts import Activities
from workflows.goal import GoalWorkflow
from workflows.memory_contracts import MemorySource, NewMemory
from workflows.messages import Answer
from workflows.state import GoalInput

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
        asked = await wait_until(handle, lambda s: s.questions)
        card = asked.questions[0]
        await submit(handle, Answer(request_id="keep-1", question_id=card.id, choice="project"))
        result = await handle.result()
        history = await handle.fetch_history()

    (request,) = calls_for(server, "export")
    sent = request["last_message"]
    assert f"[{here} · semantic note · project {ws} (this workspace): a convention of that project" in sent
    assert (
        "source: a person (perdure memory) · 3.0 d old] CSV exports for Excel need a UTF-8 byte order mark" in sent
    )
    assert f"[{everywhere} · semantic note · global: a preference that holds everywhere" in sent
    assert "10.0 d old" in sent
    assert elsewhere not in sent and other_goal not in sent  # another project's, another goal's
    # The history records the ids the step was given, in the recall's result.
    (recall,) = recall_results(history)
    assert {m["id"] for m in recall["memories"]} == {here, everywhere}
    assert any(t == Activities.MEMORY_RECALL for _, t, _, _ in local_activities(history))

    # The card listed the step's verified conclusion; kept for the project, it is semantic now.
    assert card.topic == "memory_candidates" and "needs a byte order mark (holds)" in card.stuck
    assert result.outcome == "partial"  # the read of a missing file failed
    memory = open_store(home=tmp_path, create=False)
    try:
        mine = memory.listing(goal=goal_id)
    finally:
        memory.close()
    by_kind = {(m.layer, m.kind): m for m in mine}
    episodic = by_kind[("episodic", "conclusion")]
    kept = by_kind[("semantic", "convention")]
    assert kept.scope == "project" and kept.scope_key == ws and kept.derived_from == [episodic.id]
    assert episodic.source.node == "export" and episodic.scope_key == goal_id
    failure = by_kind[("episodic", "failure")]  # failed attempts are always kept
    assert failure.text.startswith("step 'read' (tool) failed:") and failure.source.node == "read"
    assert ("working", "attached") not in by_kind  # dropped when the step settled


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
        with mock.patch.object(cli, "console", Console(width=400)):
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


async def test_an_unanswered_card_closes_by_itself_and_nothing_is_kept(
    ts_env, task_queue, store, workspace, scripted, tmp_path
):
    server = scripted(
        {
            "replies": [
                {"when": "PERDURE-STEP", "content": "CONCLUSION: the build step must run before the tests = true"}
            ]
        }
    )
    goal_spec = spec(workspace, plan={"steps": [llm("probe", prompt="Find out how the tests run.")]}, drift_every=0)
    async with running_worker(ts_env, task_queue, store, openai_profile(server)):
        handle, result = await run_goal(ts_env, task_queue, goal_spec)
        history = await handle.fetch_history()

    assert result.outcome == "succeeded"
    timers = [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for e in history.events
        if e.HasField("timer_started_event_attributes")
    ]
    assert timedelta(minutes=59) < max(timers) <= timedelta(hours=1)
    memory = open_store(home=tmp_path, create=False)
    try:
        layers = {m.layer for m in memory.listing()}
    finally:
        memory.close()
    assert layers == {"episodic"}  # the conclusion stays the goal's; nothing became semantic
