"""Goals whose workspace is on a host (`--workspace HOST:NAME`), against a dev server, the hosts
run in this process (the real device activities on their own task queues, announced to the real
registry with the workspaces they hold): which steps run on the host and which on the workers,
and a host that stays away, whose card moves the goal's workspace to another host holding it.
Hosts killed and started again as `perdure worker --host` processes are in test_hosts.py."""

from __future__ import annotations

import pytest

from perdure.workflows.goal.contracts.messages import Answer
from tests.builders import llm, openai_profile
from tests.device_rig import question_of, registry_says
from tests.helpers import goal_result, running_worker, start, statuses, submit, wait_until

pytestmark = pytest.mark.slow
SUMMARY = {"replies": [{"when": "PERDURE-STEP", "content": "Summary: the host wrote it."}]}


def host_of(devices, name: str, tmp_path, holds: dict[str, str]):
    """An in-process host: a device announcing the workspaces (name -> directory under tmp_path) it holds."""
    paths = {}
    for workspace, directory in holds.items():
        path = tmp_path / directory
        path.mkdir(exist_ok=True)
        paths[workspace] = str(path)
    return devices(name, workspaces=paths, approval={"*": "never"}, network=True)


def write_then_read(path: str = "notes.md", content: str = "from the host\n") -> list[dict]:
    return [
        {"name": "write", "kind": "tool", "tool": "write_file", "args": {"path": path, "content": content}},
        {"name": "read", "kind": "tool", "tool": "read_file", "needs": ["write"], "args": {"path": path}},
        llm("sum", needs=["read"]),
    ]


async def test_a_goal_on_a_host_runs_its_workspace_steps_there_and_the_rest_on_the_workers(
    env, task_queue, store, workspace, devices, tmp_path, scripted
):
    host = host_of(devices, "h1", tmp_path, {"repo": "h1-repo", "docs": "h1-docs"})
    profile = openai_profile(scripted(SUMMARY))
    async with running_worker(env, task_queue, store, profile):
        await host.start()
        handle = await start(env, task_queue, "h1:repo", write_then_read(), allowed_tools=["write_file", "read_file"])
        result = await goal_result(handle)
        snap = await wait_until(handle, lambda s: s.phase == "finished")
    assert result.outcome == "succeeded", result.excerpt
    assert (tmp_path / "h1-repo" / "notes.md").read_text() == "from the host\n"
    assert list((tmp_path / "h1-docs").iterdir()) == []  # only the goal's workspace on that host
    assert list(workspace.iterdir()) == []  # nothing on the workers' own workspace
    nodes = {n.name: n for n in snap.nodes}
    assert nodes["write"].placements["write_file"].startswith("host h1")
    assert nodes["read"].placements["read_file"].startswith("host h1")
    assert nodes["read"].preview.startswith("from the host")
    assert nodes["sum"].status == "succeeded"  # the model call ran on a worker: a host runs workspace calls only
    assert snap.hosts == ["h1"]


async def test_a_host_that_stays_away_is_asked_about_and_the_answer_moves_every_workspace_step(
    env, task_queue, store, workspace, devices, tmp_path, scripted
):
    first = host_of(devices, "h1", tmp_path, {"repo": "h1-repo"})
    clone = host_of(devices, "h2", tmp_path, {"repo": "h2-repo"})
    other = host_of(devices, "h3", tmp_path, {"docs": "h3-docs"})  # online, but not holding the workspace
    profile = openai_profile(scripted(SUMMARY))
    async with running_worker(env, task_queue, store, profile):
        for host in (first, clone, other):
            await host.start()
        await first.stop()
        await registry_says(env, task_queue, "h1", online=False)
        handle = await start(
            env,
            task_queue,
            "h1:repo",
            write_then_read(),
            allowed_tools=["write_file", "read_file"],
            device_wait_s=1,
        )
        # The write is on an approvals-ahead card until the goal hears h1's own rules (it asks
        # nobody), which drop it from the card: then the goal waits on the host only.
        snap = await wait_until(
            handle, lambda s: s.waiting_for_devices == {"write": "h1"} and s.phase == "awaiting_device"
        )
        assert statuses(snap)["write"] == "offline" and snap.questions == []
        card = await question_of(handle, "device_offline")
        assert card.title.startswith("Step 'write' has waited") and card.title.endswith("for host h1")
        assert [o["id"] for o in card.options] == ["wait", "device:h2", "skip"]
        assert "Move workspace repo to host h2" in [o["label"] for o in card.options]
        await submit(handle, Answer(request_id="move-1", question_id=card.id, choice="device:h2"))
        result = await goal_result(handle)
        snap = await wait_until(handle, lambda s: s.phase == "finished")
    assert result.outcome == "succeeded", result.excerpt
    assert (tmp_path / "h2-repo" / "notes.md").read_text() == "from the host\n"
    assert list((tmp_path / "h1-repo").iterdir()) == []
    nodes = {n.name: n for n in snap.nodes}
    # The later step went to the new host without waiting for h1: a second card (which nobody
    # answers here) would have held the goal, and the result above would never have come.
    assert nodes["read"].placements["read_file"].startswith("host h2")
    assert nodes["read"].preview.startswith("from the host")


async def test_writes_on_a_host_are_based_on_the_versions_its_steps_read_there(
    env, task_queue, store, workspace, devices, tmp_path
):
    host = host_of(devices, "h1", tmp_path, {"repo": "h1-repo"})
    repo = tmp_path / "h1-repo"
    (repo / "notes.md").write_text("old notes\n")
    (repo / "keep.md").write_text("not read by any step\n")
    steps = [
        {"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md"}},
        {
            "name": "edit",
            "kind": "tool",
            "tool": "write_file",
            "needs": ["read"],
            "args": {"path": "notes.md", "content": "edited notes\n"},
        },
        {"name": "blind", "kind": "tool", "tool": "write_file", "args": {"path": "keep.md", "content": "clobbered\n"}},
    ]
    async with running_worker(env, task_queue, store):
        await host.start()
        handle = await start(env, task_queue, "h1:repo", steps, allowed_tools=["write_file", "read_file"])
        await goal_result(handle)
        snap = await wait_until(handle, lambda s: s.phase in ("finished", "failed"))
    nodes = {n.name: n for n in snap.nodes}
    # The read's version came back from the host, so the edit based on it passed the host's check...
    assert nodes["edit"].status == "succeeded" and (repo / "notes.md").read_text() == "edited notes\n"
    # ...and a write of a file no step read was refused there, as on a worker.
    assert nodes["blind"].status == "failed" and "has not read it" in (nodes["blind"].error or "")
    assert (repo / "keep.md").read_text() == "not read by any step\n"


async def test_a_goal_started_on_a_workspace_no_host_offers_fails_before_any_work_saying_what_hosts_hold(
    env, task_queue, store, workspace, devices, tmp_path
):
    host = host_of(devices, "h1", tmp_path, {"repo": "h1-repo"})
    async with running_worker(env, task_queue, store):
        await host.start()
        for where, said in (
            (
                "h1:docs",
                f"workspace h1:docs: host h1 offers no workspace 'docs' (it offers: repo ({tmp_path / 'h1-repo'}))",
            ),
            ("ghost:repo", "workspace ghost:repo: no host named 'ghost' (hosts: h1 (repo))"),
        ):
            handle = await start(env, task_queue, where, write_then_read(), allowed_tools=["write_file", "read_file"])
            result = await goal_result(handle)
            assert result.outcome == "failed" and said in (result.failure or ""), result
    assert list((tmp_path / "h1-repo").iterdir()) == []
