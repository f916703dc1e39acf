"""A shared workspace that never overwrites a person (issue 21, section 3).

From outside, against a dev server with a scripted agent: a person edits a file between
the agent's read and its write (the scripted server holds the write until the edit is
made); the person's bytes survive, the agent's next model request carries the conflict
and what changed, and its re-applied write holds both. Branches writing different files
both land; two branches writing one file, the second gets the conflict. Fencing: a
voided run's write that comes late, after a rewind started the next run, and a zombie
attempt (its worker cut off from the server by a real partition, its activity timed
out and re-run on another worker) are refused, and the file keeps the newer work. The
check-and-write, the fence and the messages are also tested on their own, with real
files and real threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import threading
import tracemalloc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from perdure.activities.artifacts import ArtifactStore, DiskArtifactStore
from perdure.activities.models.profiles import ModelConfig
from perdure.activities.tools import sandbox, workspace_files
from perdure.activities.tools.catalogue.tool_base import LocalCall, LocalTool
from perdure.activities.tools.run_tool import ToolActivities
from perdure.activities.tools.workspace_versions import Basis, FenceToken, WorkspaceVersions, WriteRefused
from perdure.runtime.plugin import PerdurePlugin
from perdure.workers.orchestrator import build_worker
from perdure.workflows.goal.contracts.messages import Rewind
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared.contracts import ToolInput, ToolResult, WorkspaceFence
from tests.builders import agent, openai_profile
from tests.helpers import running_worker, start, statuses, submit

ORIGINAL = "# Poster notes\n- colours: blue and grey\n- title at the top\n"
PERSON = ORIGINAL + "- a person's line: make it warmer\n"
AGENT_LINE = "- the agent's line: add the date\n"


def digest(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def until(predicate: Callable[[], object], what: str, timeout_s: float = 60) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached in {timeout_s:g} s: {what}")


def hold_replies(server, *entries: int) -> dict[int, threading.Event]:
    """Make the scripted server hold its reply of each entry (by index) until the test
    sets that entry's event: the request is logged as arrived while the reply waits."""
    events = {index: threading.Event() for index in entries}
    replies = server.script.replies
    respond = server.respond

    def held(flavour, path, body):
        answer = respond(flavour, path, body)
        taken = server.last_entry()
        for index, event in events.items():
            if taken is replies[index]:
                assert event.wait(60), f"entry {index} was never released"
        return answer

    server.respond = held
    return events


def arrived(server, index: int) -> bool:
    return any(r["matched"] == index for r in server.requests())


def answered_by(server, index: int) -> dict:
    """The (first) request that entry `index` answered."""
    return next(r for r in server.requests() if r["matched"] == index)


def request_after(server, index: int) -> dict:
    """The first request answered after the one entry `index` answered."""
    requests = server.requests()
    position = next(i for i, r in enumerate(requests) if r["matched"] == index)
    return requests[position + 1]


def read(path: str) -> dict:
    return {"name": "read_file", "arguments": {"path": path}}


def write(path: str, content: str, **extra) -> dict:
    return {"name": "write_file", "arguments": {"path": path, "content": content, **extra}}


# --- the test: a person edits a file while an agent rewrites it ----------------


@pytest.mark.slow
async def test_a_persons_edit_made_while_the_agent_rewrites_the_file_survives_and_the_agent_rebases_on_it(
    env, task_queue, store, workspace, scripted
):
    (workspace / "poster.md").write_text(ORIGINAL)
    script = {
        "replies": [
            {"when": "EDIT-POSTER", "times": 1, "tool_calls": [read("poster.md")]},
            # 1: the agent's rewrite, based on what it read; held until the person has saved.
            {"when": "EDIT-POSTER", "times": 1, "tool_calls": [write("poster.md", ORIGINAL + AGENT_LINE)]},
            {"when": "EDIT-POSTER", "when_last": "changed since", "times": 1, "tool_calls": [read("poster.md")]},
            {
                "when": "EDIT-POSTER",
                "when_last": "a person's line",
                "times": 1,
                "tool_calls": [write("poster.md", PERSON + AGENT_LINE)],
            },
            {
                "when": "EDIT-POSTER",
                "when_last": "wrote",
                "content": "poster.md has the date now, on top of your edit.",
            },
        ]
    }
    server = scripted(script)
    release = hold_replies(server, 1)[1]
    steps = [agent("edit", "EDIT-POSTER: add the date to poster.md.", ["read_file", "write_file"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps)
        await until(lambda: arrived(server, 1), "the agent to have read the file and asked for its write")
        (workspace / "poster.md").write_bytes(PERSON.encode())  # the person saves, in their editor
        release.set()
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    conflict = request_after(server, 1)["last_message"]
    reread = request_after(server, 2)["last_message"]
    final = (workspace / "poster.md").read_bytes()
    print("\n--- what the agent's next model request carried (its write's tool result) ---")
    print(conflict)
    print("--- the file after the agent read it again and re-applied its change ---")
    print(final.decode(), end="")
    assert conflict.startswith("ERROR: write_file refused: 'poster.md' changed since this step")
    assert f"your version {digest(ORIGINAL)[:19]}…, now {digest(PERSON)[:19]}…" in conflict
    assert "+- a person's line: make it warmer\n" in conflict  # the diff from what it read to what is there
    assert "Read the file again and re-apply your change" in conflict
    assert reread == PERSON  # between the refusal and the rebased write the file held the person's bytes exactly
    assert final == (PERSON + AGENT_LINE).encode()  # both: the person's edit survived byte for byte


# --- branches ----------------------------------------------------------------------


async def test_two_branches_writing_different_files_at_once_both_succeed(env, task_queue, store, workspace, scripted):
    (workspace / "left.md").write_text("left v0\n")
    (workspace / "right.md").write_text("right v0\n")
    replies = []
    for side in ("left", "right"):
        mark = f"BRANCH-{side.upper()}"
        replies += [
            {"when": mark, "times": 1, "tool_calls": [read(f"{side}.md")]},
            {"when": mark, "times": 1, "tool_calls": [write(f"{side}.md", f"{side} v1\n")]},
            {"when": mark, "when_last": "wrote", "content": f"{side} done"},
        ]
    server = scripted({"replies": replies})
    held = hold_replies(server, 1, 4)  # both writes wait until both agents are at them
    steps = [
        agent(side, f"BRANCH-{side.upper()}: update {side}.md.", ["read_file", "write_file"])
        for side in ("left", "right")
    ]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps)
        await until(lambda: arrived(server, 1) and arrived(server, 4), "both branches to ask for their write")
        for event in held.values():
            event.set()
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    assert (workspace / "left.md").read_text() == "left v1\n"
    assert (workspace / "right.md").read_text() == "right v1\n"
    assert not any("refused" in r["last_message"] for r in server.requests())


async def test_the_same_file_from_two_branches_the_second_write_conflicts(env, task_queue, store, workspace, scripted):
    (workspace / "shared.md").write_text(ORIGINAL)
    script = {
        "replies": [
            {"when": "BRANCH-FIRST", "times": 1, "tool_calls": [read("shared.md")]},
            {
                "when": "BRANCH-FIRST",
                "times": 1,
                "tool_calls": [write("shared.md", ORIGINAL + "- from the first branch\n")],
            },
            {"when": "BRANCH-FIRST", "when_last": "wrote", "content": "first done"},
            {"when": "BRANCH-SECOND", "times": 1, "tool_calls": [read("shared.md")]},
            # 4: held until the first branch's write has landed.
            {"when": "BRANCH-SECOND", "times": 1, "tool_calls": [write("shared.md", ORIGINAL + "- from the second\n")]},
            {"when": "BRANCH-SECOND", "when_last": "changed since", "content": "left it to the first branch"},
        ]
    }
    server = scripted(script)
    release = hold_replies(server, 4)[4]
    steps = [
        agent("first", "BRANCH-FIRST: add a line to shared.md.", ["read_file", "write_file"]),
        agent("second", "BRANCH-SECOND: add a line to shared.md.", ["read_file", "write_file"]),
    ]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps)
        await until(lambda: arrived(server, 4), "the second branch to ask for its write")
        await until(lambda: "first branch" in (workspace / "shared.md").read_text(), "the first branch's write")
        release.set()
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    assert (workspace / "shared.md").read_text() == ORIGINAL + "- from the first branch\n"
    conflict = answered_by(server, 5)["last_message"]  # the second branch's request after its write
    assert conflict.startswith("ERROR: write_file refused: 'shared.md' changed since this step")
    assert "+- from the first branch\n" in conflict


async def test_a_plan_steps_write_over_a_file_nobody_read_fails_the_step_and_base_version_any_replaces_it(
    env, task_queue, store, workspace, scripted
):
    (workspace / "kept.md").write_text("a person's file\n")
    (workspace / "replaced.md").write_text("to be replaced\n")
    steps = [
        {"name": "blind", "kind": "tool", "tool": "write_file", "args": {"path": "kept.md", "content": "generated\n"}},
        {
            "name": "forced",
            "kind": "tool",
            "tool": "write_file",
            "args": {"path": "replaced.md", "content": "generated\n", "base_version": "any"},
        },
        {"name": "fresh", "kind": "tool", "tool": "write_file", "args": {"path": "new/made.md", "content": "new\n"}},
    ]
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start(env, task_queue, workspace, steps)
        await handle.result()
        snapshot = await handle.query(GoalWorkflow.progress)

    assert statuses(snapshot) == {"blind": "failed", "forced": "succeeded", "fresh": "succeeded"}
    error = next(n.error for n in snapshot.nodes if n.name == "blind") or ""
    assert "write_file failed: write_file refused: 'kept.md' already exists (16 bytes" in error
    assert "this step has not read it" in error and 'base_version: "any"' in error
    assert (workspace / "kept.md").read_text() == "a person's file\n"
    assert (workspace / "replaced.md").read_text() == "generated\n"
    assert (workspace / "new/made.md").read_text() == "new\n"


async def test_a_wrong_typed_or_huge_base_version_is_refused_with_a_clear_message(
    env, task_queue, store, workspace, scripted
):
    (workspace / "a.md").write_text("a\n")
    script = {
        "replies": [
            {"when": "BAD-BASE", "times": 1, "tool_calls": [write("a.md", "b\n", base_version=12345)]},
            {"when": "BAD-BASE", "times": 1, "tool_calls": [write("a.md", "b\n", base_version="f" * 100_000)]},
            {"when": "BAD-BASE", "times": 1, "tool_calls": [write("a.md", "b\n", base_version="sha256:abc")]},
            {"when": "BAD-BASE", "content": "gave up"},
        ]
    }
    server = scripted(script)
    steps = [agent("bad", "BAD-BASE: write a.md.", ["write_file"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps)
        result = await handle.result()

    assert result.outcome == "succeeded", result.excerpt
    answers = [request_after(server, i)["last_message"] for i in range(3)]
    expected = 'base_version: base_version must be "any" or a file version: "sha256:" and 64 lower-case hex'
    assert all(expected in answer for answer in answers), answers
    assert "got int 12345" in answers[0]
    assert "got a string of 100000 characters" in answers[1] and "ffff" not in answers[1]
    assert "got 'sha256:abc'" in answers[2]
    assert (workspace / "a.md").read_text() == "a\n"


# --- fencing, for real: late writes from work the goal has moved past ------------------


HELD = "HELD "
"""Content starting with this makes a HeldWrites worker's write wait, as a stuck disk would."""


class HeldWrites(ToolActivities):
    """The production tool activities, but a write whose content starts with HELD waits in
    its thread (after its fence claim, before its check-and-write) until `release` is set:
    a cancelled or timed-out activity's thread goes on, which is what a zombie is."""

    made: list[HeldWrites] = []

    def __init__(self, store: ArtifactStore, **options) -> None:
        super().__init__(store, **options)
        self.waiting, self.release = threading.Event(), threading.Event()
        self.finished = threading.Event()
        real = self.tools["write_file"]
        held = self
        HeldWrites.made.append(self)

        class HeldWriteFile(LocalTool):
            spec = real.spec

            async def run(self, call: LocalCall, args):
                if not args.content.startswith(HELD):
                    return await real.run(call, args)

                def stuck() -> str:
                    held.waiting.set()
                    assert held.release.wait(120)
                    try:
                        return workspace_files._write_file_sync(call.root, args, call.file)
                    finally:
                        held.finished.set()

                return await asyncio.to_thread(stuck)

        self.tools["write_file"] = HeldWriteFile()


@contextlib.asynccontextmanager
async def held_worker(client: Client, task_queue: str, store: ArtifactStore, server) -> AsyncIterator[HeldWrites]:
    HeldWrites.made = []
    config = ModelConfig(profiles={"test": openai_profile(server)})
    with mock.patch("perdure.workers.orchestrator.ToolActivities", HeldWrites):
        worker = build_worker(client, task_queue=task_queue, store=store, model_config=config)
    (tools_of_worker,) = HeldWrites.made
    async with worker:
        try:
            yield tools_of_worker
        finally:
            tools_of_worker.release.set()  # never leave a thread waiting past the test


def fence_record(store: ArtifactStore, handle, node: str) -> dict:
    return WorkspaceVersions(store).fence_of(handle.id, handle.first_execution_run_id, node)


@pytest.mark.parametrize("local_up_to_s", [None, 0], ids=["local-activity", "regular-activity"])
@pytest.mark.slow
async def test_a_voided_runs_late_write_is_refused_once_the_rewound_run_has_started(
    env, task_queue, store, workspace, scripted, local_up_to_s
):
    (workspace / "poster.md").write_text(ORIGINAL)
    script = {
        "replies": [
            # Run 2 (its prompt carries the rewind's reason): look, and keep the file as it is.
            {"when": ["EDIT-POSTER", "KEEP-IT"], "times": 1, "tool_calls": [read("poster.md")]},
            {"when": ["EDIT-POSTER", "KEEP-IT"], "content": "the poster stays as it is"},
            # Run 1: read, then a rewrite that gets stuck on its way to the disk.
            {"when": "EDIT-POSTER", "times": 1, "tool_calls": [read("poster.md")]},
            {"when": "EDIT-POSTER", "times": 1, "tool_calls": [write("poster.md", HELD + "old run's rewrite\n")]},
        ]
    }
    server = scripted(script)
    overrides = {} if local_up_to_s is None else {"local_activities_up_to_s": local_up_to_s}
    steps = [agent("edit", "EDIT-POSTER: rewrite poster.md.", ["read_file", "write_file"])]
    async with held_worker(env.client, task_queue, store, server) as held:
        handle = await start(env, task_queue, workspace, steps, **overrides)
        await until(held.waiting.is_set, "run 1's write to be on its way")
        await submit(handle, Rewind(request_id="r1", node="edit", why="KEEP-IT: the poster is fine as it is"))
        result = await handle.result()
        assert result.outcome == "succeeded", result.excerpt
        assert fence_record(store, handle, "edit")["run"] == 2  # the new run's read presented its token
        held.release.set()  # the old run's write reaches the disk now
        await until(held.finished.is_set, "the old run's write to finish")

    assert (workspace / "poster.md").read_text() == ORIGINAL
    (refusal,) = fence_record(store, handle, "edit")["refused"]
    assert refusal["run"] == 1 and refusal["path"] == "poster.md"
    assert refusal["why"] == "the step's run 2 has started since"


class Partition:
    """A TCP proxy between one worker and the server: `cut` drops every connection and
    refuses new ones, as a network partition does; `heal` listens again on the same port."""

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.upstream_port = int(port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def heal(self) -> None:
        if self._server is not None and self._server.is_serving():
            return
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await source.read(65_536):
                    sink.write(data)
                    await sink.drain()
            sink.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}


@pytest.mark.slow
@pytest.mark.parametrize("local_up_to_s", [None, 0], ids=["local-activity", "regular-activity"])
async def test_a_zombie_attempt_whose_worker_was_cut_off_cannot_overwrite_what_the_retry_and_later_turns_wrote(
    env, task_queue, store, workspace, scripted, local_up_to_s
):
    """Worker A's write is stuck when the network cuts A off: the server times the attempt out
    (its heartbeat, or for a local activity its workflow task) and worker B makes the call
    again and goes on to the next turn. When A's write finally reaches the disk it is refused."""
    script = {
        "replies": [
            {"when": "KEEP-LOG", "times": 1, "tool_calls": [write("log.md", HELD + "first\n", base_version="any")]},
            {"when": "KEEP-LOG", "times": 1, "tool_calls": [write("log.md", "second\n", base_version="any")]},
            {"when": "KEEP-LOG", "content": "log.md says second"},
        ]
    }
    server = scripted(script)
    overrides = {} if local_up_to_s is None else {"local_activities_up_to_s": local_up_to_s}
    steps = [agent("log", "KEEP-LOG: keep log.md.", ["write_file"])]
    partition = Partition(env.client.service_client.config.target_host)
    await partition.heal()
    cut_off = await Client.connect(partition.address, namespace=env.client.namespace, plugins=[PerdurePlugin()])
    config = ModelConfig(profiles={"test": openai_profile(server)})
    async with held_worker(cut_off, task_queue, store, server) as held:
        try:
            handle = await start(env, task_queue, workspace, steps, **overrides)
            await until(held.waiting.is_set, "worker A's first write to be on its way")
            await partition.cut()
            worker_b: Worker = build_worker(env.client, task_queue=task_queue, store=store, model_config=config)
            async with worker_b:
                result = await asyncio.wait_for(handle.result(), 90)
                assert result.outcome == "succeeded", result.excerpt
                assert (workspace / "log.md").read_text() == "second\n"
                held.release.set()  # A's write reaches the disk, long after the goal moved on
                await until(held.finished.is_set, "worker A's write to finish")
        finally:
            await partition.heal()  # so worker A can shut down

    assert (workspace / "log.md").read_text() == "second\n"
    (refusal,) = fence_record(store, handle, "log")["refused"]
    assert refusal["run"] == 1 and refusal["attempt"] == 1 and refusal["call"].endswith("#turn1.0")
    assert refusal["why"].startswith("a later workflow task")


# --- the check-and-write and the fence on their own ----------------------------------


async def run_tool(store: ArtifactStore, ws: Path, tool: str, args: dict, *, attempt: int = 1, **kw) -> ToolResult:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt)
    tool_input = ToolInput(
        goal_id="g1", node_key=kw.pop("node_key", "n1"), tool=tool, workspace=str(ws), args=args, **kw
    )
    return await env.run(ToolActivities(store).run_tool, tool_input)


def output(store: ArtifactStore, result: ToolResult) -> str:
    assert result.output is not None, result
    return store.get_text(result.output)


async def test_a_reads_fingerprint_is_the_version_it_read_and_a_write_based_on_an_older_one_shows_the_diff(
    store, workspace
):
    (workspace / "n.md").write_text(ORIGINAL)
    seen = await run_tool(store, workspace, "read_file", {"path": "n.md"})
    (fingerprint,) = seen.fingerprints
    assert fingerprint.digest == digest(ORIGINAL)
    (workspace / "n.md").write_text(PERSON)

    refused = await run_tool(
        store, workspace, "write_file", {"path": "n.md", "content": "mine\n"}, based_on={"n.md": fingerprint.digest}
    )
    assert not refused.ok and refused.fingerprints == []
    assert (refused.error or "").startswith("write_file refused: 'n.md' changed since this step")
    diff = output(store, refused)
    assert diff.startswith("What changed since your version (unified diff):\n--- n.md (your version, sha256:")
    assert "\n+- a person's line: make it warmer\n" in diff
    assert (workspace / "n.md").read_text() == PERSON

    # Based on what is there now (the spelling of the path aside), the write goes through.
    ok = await run_tool(
        store, workspace, "write_file", {"path": "./n.md", "content": "mine\n"}, based_on={"n.md": digest(PERSON)}
    )
    assert ok.ok and ok.fingerprints[0].digest == digest("mine\n")
    assert (workspace / "n.md").read_text() == "mine\n"


async def test_a_write_needs_a_version_of_an_existing_file_but_not_of_a_new_one(store, workspace):
    (workspace / "old.md").write_text("old\n")
    blind = await run_tool(store, workspace, "write_file", {"path": "old.md", "content": "x"}, based_on={})
    assert not blind.ok and "already exists (4 bytes" in (blind.error or "")
    assert output(store, blind) == "This step has no version of it; the file now starts:\nold\n"
    new = await run_tool(store, workspace, "write_file", {"path": "new.md", "content": "x"}, based_on={})
    assert new.ok
    explicit = await run_tool(
        store, workspace, "write_file", {"path": "old.md", "content": "y", "base_version": digest("old\n")}, based_on={}
    )
    assert explicit.ok and (workspace / "old.md").read_text() == "y"
    # A file deleted since it was read is not silently made again.
    (workspace / "new.md").unlink()
    gone = await run_tool(
        store, workspace, "write_file", {"path": "new.md", "content": "z"}, based_on={"new.md": digest("x")}
    )
    assert not gone.ok and "was deleted since" in (gone.error or "")


async def test_a_retried_write_whose_first_attempt_landed_succeeds(store, workspace):
    (workspace / "r.md").write_text("v0")
    based_on = {"r.md": digest("v0")}
    first = await run_tool(store, workspace, "write_file", {"path": "r.md", "content": "v1"}, based_on=based_on)
    again = await run_tool(
        store, workspace, "write_file", {"path": "r.md", "content": "v1"}, based_on=based_on, attempt=2
    )
    assert first.ok and again.ok and (workspace / "r.md").read_text() == "v1"


async def test_without_a_kept_base_the_conflict_says_so_and_shows_the_files_head(store, workspace):
    (workspace / "h.md").write_text("".join(f"line {i}\n" for i in range(100)))
    refused = await run_tool(
        store, workspace, "write_file", {"path": "h.md", "content": "x"}, based_on={"h.md": digest("never kept")}
    )
    text = output(store, refused)
    assert text.startswith("The version your change was based on (sha256:")
    assert "is not kept, so there is no diff; the file now starts:\nline 0\n" in text
    assert text.endswith("line 39\n[file cut: showing 40 of 100 lines]\n")


def test_a_long_diff_is_cut_and_says_how_much(store, workspace):
    versions = WorkspaceVersions(store)
    before = "".join(f"old {i}\n" for i in range(500)).encode()
    (workspace / "d.md").write_bytes(before)
    store.put_bytes(before)
    (workspace / "d.md").write_text("".join(f"new {i}\n" for i in range(500)))
    with pytest.raises(WriteRefused) as refused:
        versions.write(
            workspace / "d.md",
            b"x",
            shown="d.md",
            basis=Basis(check=True, seen=True, digest=digest(before), why="t"),
            token=None,
        )
    detail = refused.value.detail or ""
    assert detail.endswith("[diff cut: showing 120 of 1003 lines]\n")
    assert len(detail) < 9_000


def test_two_writers_based_on_one_version_cannot_both_pass_the_check(store, workspace):
    """Eight threads, each its own open of the lock file (as processes have), all based on
    the same version: exactly one write lands; the others see it and are refused. (The
    per-file lock and the re-stat before the rename each stop most of these races; with
    neither, this fails.)"""
    versions = WorkspaceVersions(store)
    target = workspace / "race.md"
    target.write_text("v0")
    basis = Basis(check=True, seen=True, digest=digest("v0"), why="read")
    start_line = threading.Barrier(8)
    outcomes: list[str] = []

    def writer(i: int) -> None:
        start_line.wait()
        try:
            versions.write(target, f"writer {i}".encode(), shown="race.md", basis=basis, token=None)
            outcomes.append(f"wrote {i}")
        except WriteRefused:
            outcomes.append("refused")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (won,) = [o for o in outcomes if o.startswith("wrote")]
    assert outcomes.count("refused") == 7
    assert target.read_text() == f"writer {won.split()[1]}"


def token(run: int = 1, task: int = 10, attempt: int = 1, call: str = "k#turn1.0") -> FenceToken:
    return FenceToken(goal="g", chain="c", node="n", run=run, task=task, attempt=attempt, call=call)


def test_the_fence_refuses_older_runs_tasks_and_attempts_but_not_siblings_of_one_task(store, workspace):
    versions = WorkspaceVersions(store)
    assert versions.claim(token(attempt=2)) is None
    assert versions.claim(token(attempt=1)) == "attempt 2 of the same call has started since"
    assert versions.claim(token(attempt=1, call="k#turn1.1")) is None  # a sibling call of the same task
    assert versions.claim(token(task=20)) is None
    assert (
        versions.claim(token(task=10, attempt=3)) == "a later workflow task (20) of the same run has made a call since"
    )
    assert versions.claim(token(run=2, task=5)) is None  # a new run starts its own history of tasks
    assert versions.claim(token(run=1, task=99)) == "the step's run 2 has started since"

    with pytest.raises(WriteRefused) as refused:
        versions.write(workspace / "f.md", b"late", shown="f.md", basis=Basis(check=False), token=token(run=1, task=99))
    assert str(refused.value).startswith("a superseded attempt: step 'n' run 1, workflow task 99, attempt 1")
    assert not (workspace / "f.md").exists()
    assert [r["run"] for r in versions.fence_of("g", "c", "n")["refused"]] == [1]


@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.sampled_from("ab")), max_size=12))
def test_the_newest_token_is_never_refused_and_an_older_generation_always_is(tmp_path_factory, claims):
    versions = WorkspaceVersions(DiskArtifactStore(tmp_path_factory.mktemp("fence")))
    for run, task, attempt, call in claims:
        versions.claim(token(run, task, attempt, call))
    if not claims:
        return
    newest = max((run, task) for run, task, _, _ in claims)
    for call in "ab":
        attempts = [a for r, t, a, c in claims if (r, t) == newest and c == call]
        highest = max(attempts, default=1)
        assert versions.claim(token(*newest, highest, call)) is None
    if newest[1] > 1:
        assert versions.claim(token(newest[0], newest[1] - 1, 3, "a")) is not None


async def test_a_superseded_command_is_not_started(store, workspace):
    fence = WorkspaceFence(chain="c", node="n", run=2, task=7)
    later = await run_tool(store, workspace, "read_file", {"path": "."}, fence=fence)
    assert not later.ok  # a directory; what matters is the token it presented
    older = WorkspaceFence(chain="c", node="n", run=1, task=50)
    command = await run_tool(store, workspace, "run_command", {"command": "touch ran"}, fence=older)
    assert not command.ok and (command.error or "").startswith("run_command refused: a superseded attempt")
    assert not (workspace / "ran").exists()


async def test_an_agents_command_cannot_reach_the_fence_store_even_inside_the_workspace(workspace):
    """The store lives in the artifact store, which every command's sandbox masks wherever
    it lies; here the artifact store is inside the workspace, the hardest case."""
    if sandbox.find_bwrap() is None:
        pytest.skip("needs bwrap (make system-packages)")
    store = DiskArtifactStore(workspace / ".perdure" / "artifacts")
    versions = WorkspaceVersions(store)
    assert versions.claim(token()) is None
    fence = versions.fence_path("g", "c", "n")
    assert fence.is_file() and fence.is_relative_to(workspace)
    shown = fence.relative_to(workspace).as_posix()
    command = f"cat {shown} || echo unreadable; echo '{{}}' > {shown} || echo unwritable"
    result = await run_tool(store, workspace, "run_command", {"command": command})
    assert "unreadable" in output(store, result) and "unwritable" in output(store, result)
    assert versions.fence_of("g", "c", "n")["calls"] == {"k#turn1.0": 1}


def test_reading_a_small_file_allocates_little_more_than_the_file(store, workspace):
    """A read of a 6-byte file allocated 1 MiB at a time (twice: `read(n)` reserves n bytes
    before it knows the size): 100 goals reading at once held tens of megabytes of the
    worker's peak (bench/rss.py)."""
    versions = WorkspaceVersions(store)
    (workspace / "a.txt").write_text("alpha\n")
    tracemalloc.start()
    try:
        head, version = versions.read(workspace / "a.txt", head_bytes=4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert head == b"alpha\n" and version.size == 6
    assert peak < 128 * 1024
