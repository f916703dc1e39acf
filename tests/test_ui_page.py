"""perdure ui's page in a real browser (Debian's headless Chromium, driven through its
DevTools protocol): a running node turns succeeded without a reload, a question is
answered by clicking its button, and a node is rewound by clicking it."""

from __future__ import annotations

import pytest

from testing.browser import CHROMIUM, Browser
from tests.builders import gate
from tests.device_rig import write_on
from tests.helpers import local_activities, running_worker, start, wait_until

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium (make installs it)")


def status_of(node: str) -> str:
    return f"document.querySelector('g.node[data-node=\"{node}\"]')?.dataset.status"


async def test_a_running_node_turns_succeeded_on_the_page_without_a_reload(
    env, task_queue, store, workspace, ui, tmp_path
):
    after = {"name": "after", "kind": "tool", "tool": "list_dir", "needs": ["gate"], "args": {}}
    async with running_worker(env, task_queue, store), Browser(tmp_path / "profile") as page:
        handle = await start(env, task_queue, workspace, [gate(), after], allowed_tools=["run_command", "list_dir"])
        await page.open(f"{ui}/goals/{handle.id}")
        await page.wait_for(f"{status_of('gate')} === 'running'")
        await page.evaluate("window.stillTheSamePage = true")
        (workspace / "GO").write_text("")
        await page.wait_for(f"{status_of('gate')} === 'succeeded' && {status_of('after')} === 'succeeded'")
        assert await page.evaluate("window.stillTheSamePage === true")  # updated live, never reloaded
        await page.wait_for("document.getElementById('summary')?.dataset.phase === 'finished'")


async def test_a_question_is_answered_by_clicking_its_button(env, task_queue, store, workspace, ui, devices, tmp_path):
    async with running_worker(env, task_queue, store), Browser(tmp_path / "profile") as page:
        laptop = devices("laptop")
        await laptop.start()
        handle = await start(env, task_queue, workspace, [write_on("laptop")], allowed_tools=["write_file"])
        await page.open(f"{ui}/goals/{handle.id}")
        approve = "document.querySelector('[data-question] button[data-option=\"approve\"]')"
        await page.wait_for(f"{approve} !== null")
        await page.evaluate(f"{approve}.click()")
        await page.wait_for(f"{status_of('save')} === 'succeeded'")
        result = await handle.result()
    assert result.outcome == "succeeded"
    assert (laptop.root / "out.txt").read_text() == "hello\n"


async def test_a_node_is_rewound_by_clicking_it_and_runs_again(env, task_queue, store, workspace, ui, tmp_path):
    (workspace / "notes.md").write_text("a note\n")
    read = {"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md"}}
    async with running_worker(env, task_queue, store), Browser(tmp_path / "profile") as page:
        handle = await start(
            env, task_queue, workspace, [read, gate(["read"])], allowed_tools=["read_file", "run_command"]
        )
        await page.open(f"{ui}/goals/{handle.id}")
        await page.wait_for(f"{status_of('gate')} === 'running'")
        node = "document.querySelector('g.node[data-node=\"read\"]')"
        await page.evaluate(f"{node}.dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
        await page.wait_for("document.getElementById('rewind') !== null")
        await page.evaluate("document.getElementById('rewind-why').value = 'the notes changed'")
        await page.evaluate("document.getElementById('rewind').click()")
        receipt = await page.wait_for("document.querySelector('.receipt')?.textContent")
        assert receipt.startswith("rewind: applied"), receipt
        await wait_until(handle, lambda s: "gate" in s.running)  # run again after the rewind
        (workspace / "GO").write_text("")
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.outcome == "succeeded"
    reads = [s for _, _, s, _ in local_activities(history) if s.startswith("tool read_file · read ")]
    assert len(reads) == 2, reads  # the rewound read ran a second time
