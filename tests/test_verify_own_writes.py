"""The goal's own writes are not a change from outside: a step that read a file the goal
itself changed later (a write_file step, a command step, a new file in a directory it
listed) is kept when the goal checks its work after a long park, so nothing after it
runs twice; an edit from outside is still found, also when a command of the goal ran
after it. Against a dev server with the production worker (`verify_after_s` short, so a
park of seconds counts as long); the rule itself (workflows/goal/verification.py's
expected digest) property-tested over timelines."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.verification import expected_digest, timeline
from perdure.workflows.shared.contracts import Fingerprint
from tests.builders import gate, llm, openai_profile
from tests.helpers import running_worker, scheduled_activities, start, wait_until
from tests.verify_rig import checked, park_then_resume, read, runs_of

TOOLS = ["read_file", "list_dir", "write_file", "run_command"]


def command(name: str, line: str, needs: list[str]) -> dict:
    return {"name": name, "kind": "tool", "tool": "run_command", "args": {"command": line}, "needs": needs}


def commands_run(history, step: str) -> int:
    """Runs of a command step (a regular activity, not a local one)."""
    return sum(f"· {step} ·" in summary for _, _, summary in scheduled_activities(history))


async def through_a_long_park(handle, workspace, change=lambda: None):
    """Park the goal, `change` the workspace, resume after more than verify_after_s: the
    snapshot once its check of finished work is logged, and the history once it is done."""
    await wait_until(handle, lambda s: "gate" in s.running)
    await park_then_resume(handle, change)
    snapshot = await wait_until(handle, lambda s: any("re-verif" in entry for entry in s.gate_log))
    (workspace / "GO").write_text("")
    result = await asyncio.wait_for(handle.result(), 30)
    assert result.outcome == "succeeded"
    return snapshot, await handle.fetch_history()


@pytest.mark.slow
async def test_a_file_the_goal_rewrote_itself_voids_nothing_after_a_long_park(env, task_queue, store, workspace):
    (workspace / "a.md").write_text("alpha\n")
    steps = [
        read("read-a", "a.md"),
        {
            "name": "write-a",
            "kind": "tool",
            "tool": "write_file",
            "args": {"path": "a.md", "content": "alpha, by the goal\n"},
            "needs": ["read-a"],
        },
        gate(["write-a"]),
    ]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=TOOLS, verify_after_s=1)
        snapshot, history = await through_a_long_park(handle, workspace)
    assert runs_of(history, "read-a") == 1 and runs_of(history, "write-a") == 1
    assert "re-verified: 3 kept, 0 void" in checked(snapshot)


@pytest.mark.slow
async def test_a_file_a_command_step_of_the_goal_rewrote_voids_nothing_after_a_long_park(
    env, task_queue, store, workspace
):
    (workspace / "a.md").write_text("alpha\n")
    steps = [
        read("read-a", "a.md"),
        command("format", "printf 'alpha, formatted\\n' > a.md", ["read-a"]),
        gate(["format"]),
    ]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=TOOLS, verify_after_s=1)
        snapshot, history = await through_a_long_park(handle, workspace)
    assert (workspace / "a.md").read_text() == "alpha, formatted\n"
    assert runs_of(history, "read-a") == 1 and commands_run(history, "format") == 1
    assert "re-verified: 3 kept, 0 void" in checked(snapshot)


@pytest.mark.slow
async def test_a_new_file_the_goal_wrote_into_a_directory_it_listed_voids_nothing_after_a_long_park(
    env, task_queue, store, workspace
):
    (workspace / "notes").mkdir()
    (workspace / "notes" / "a.md").write_text("alpha\n")
    steps = [
        {"name": "list-notes", "kind": "tool", "tool": "list_dir", "args": {"path": "notes"}},
        {
            "name": "add-note",
            "kind": "tool",
            "tool": "write_file",
            "args": {"path": "notes/b.md", "content": "beta\n"},
            "needs": ["list-notes"],
        },
        gate(["add-note"]),
    ]
    async with running_worker(env, task_queue, store):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=TOOLS, verify_after_s=1)
        snapshot, history = await through_a_long_park(handle, workspace)
    assert runs_of(history, "list-notes") == 1 and runs_of(history, "add-note") == 1
    assert "re-verified: 3 kept, 0 void" in checked(snapshot)


@pytest.mark.slow
async def test_an_edit_from_outside_before_a_command_of_the_goal_changed_the_file_still_voids_its_reader(
    env, task_queue, store, workspace, scripted
):
    (workspace / "a.md").write_text("alpha\n")
    steps = [
        read("read-a", "a.md"),
        llm("think", ["read-a"]),  # its reply is held back: the window in which a person edits a.md
        command("append", "printf 'more\\n' >> a.md", ["think"]),
        gate(["append"]),
    ]
    server = scripted({"replies": [{"when_last": "step: think", "content": "Thought.", "delay_s": 3}]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=TOOLS, verify_after_s=1)
        await wait_until(handle, lambda s: server.requests())  # think's call is at the server
        (workspace / "a.md").write_text("alpha, edited by a person\n")
        snapshot, history = await through_a_long_park(handle, workspace)
    # The command's change is the goal's own, the person's edit before it is not.
    said = checked(snapshot)
    assert "re-verified: 0 kept, 4 void (read-a: a.md changed since it was read)" in said, said
    assert runs_of(history, "read-a") == 2 and commands_run(history, "append") == 2


# --- the rule, over timelines ------------------------------------------------------------

T0 = datetime(2026, 12, 1, tzinfo=UTC)
DIGESTS = st.sampled_from(["sha256:a", "sha256:b", "sha256:c", None])


def fingerprint(kind: str, digest: str | None, minute: int, path: str = "a.md") -> Fingerprint:
    return Fingerprint(kind=kind, source=f"file:{path}", digest=digest, at=T0 + timedelta(minutes=minute))


def goal_of(*prints: Fingerprint) -> list[Node]:
    """A node per fingerprint (which node holds one plays no part in the rule)."""
    return [Node(name=f"s{i}", kind="tool", fingerprints=[p]) for i, p in enumerate(prints)]


def test_a_step_read_is_expected_as_the_goals_later_writes_left_it_and_a_read_of_another_version_is_outside():
    reader = fingerprint("read", "sha256:a", 0)
    wrote, read_again = fingerprint("wrote", "sha256:b", 1, "./a.md"), fingerprint("read", "sha256:b", 2)
    assert expected_digest(reader, timeline(goal_of(reader, wrote, read_again))) == "sha256:b"
    # Another step read a version the goal did not write: someone else changed the file,
    # so only what the step itself read still holds.
    outside = fingerprint("read", "sha256:c", 2)
    assert expected_digest(reader, timeline(goal_of(reader, wrote, outside))) == "sha256:a"
    # What happened before the step read it, or to another file, plays no part.
    earlier, other = fingerprint("wrote", "sha256:z", -1), fingerprint("wrote", "sha256:z", 3, "b.md")
    assert expected_digest(reader, timeline(goal_of(earlier, reader, other))) == "sha256:a"


# A goal's own history of a file: a write (or a command's change) to a digest, or a look
# (a read by another step, a look before a command) at whatever the file holds then.
OWN_EVENTS = st.lists(st.one_of(st.tuples(st.sampled_from(["wrote", "changed"]), DIGESTS), st.just(("look", None))))


def played(first: str | None, events: list[tuple[str, str | None]], kinds: st.DataObject) -> list[Fingerprint]:
    prints, holds = [], first
    for minute, (kind, digest) in enumerate(events, start=1):
        if kind == "look":
            kind, digest = kinds.draw(st.sampled_from(["read", "seen"])), holds
        holds = digest
        prints.append(fingerprint(kind, digest, minute))
    return prints


@given(DIGESTS, OWN_EVENTS, st.data())
def test_only_the_goals_own_changes_the_file_is_expected_as_they_left_it(first, events, data):
    reader = fingerprint("read", first, 0)
    later = played(first, events, data)
    holds_now = later[-1].digest if later else first
    assert expected_digest(reader, timeline(goal_of(reader, *later))) == holds_now


@given(DIGESTS, OWN_EVENTS, st.data())
def test_a_version_the_goal_did_not_make_seen_anywhere_after_the_read_expects_what_the_step_read(first, events, data):
    reader = fingerprint("read", first, 0)
    later = played(first, events, data)
    at = data.draw(st.integers(0, len(later)))
    holds = later[at - 1].digest if at else first
    edited = data.draw(DIGESTS.filter(lambda d: d != holds))
    seen = fingerprint(data.draw(st.sampled_from(["read", "seen"])), edited, at)  # after the first `at` events
    seen = seen.model_copy(update={"at": seen.at + timedelta(seconds=30)})
    assert expected_digest(reader, timeline(goal_of(reader, *later, seen))) == first
