"""perdure ui's page in a real browser (Debian's headless Chromium, driven through its
DevTools protocol): a running node turns succeeded without a reload and the report shows
when the goal is done, a question is answered by clicking its button and its receipt
lands in the inbox, a node is rewound by clicking it after the page said what becomes
void, older plan versions are drawn read-only, the goal list filters and puts a goal
waiting on a person first, a premise is narrowed from its panel, and a running node's
live model output follows the token events."""

from __future__ import annotations

import pytest

from testing.browser import CHROMIUM, Browser
from tests.builders import gate
from tests.device_rig import write_on
from tests.helpers import local_activities, running_worker, start, wait_until

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium (make installs it)")


def node_of(node: str) -> str:
    return f"document.querySelector('g.node[data-node=\"{node}\"]')"


def status_of(node: str) -> str:
    return f"{node_of(node)}?.dataset.status"


def click(node: str) -> str:
    return f"{node_of(node)}.dispatchEvent(new MouseEvent('click', {{bubbles: true}}))"


async def test_a_running_node_turns_succeeded_on_the_page_without_a_reload(
    env, task_queue, store, workspace, ui, tmp_path, monkeypatch
):
    monkeypatch.setenv("PERDURE_HOME", str(tmp_path))  # the server reads the report the worker wrote
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
        report = await page.wait_for("document.getElementById('report-text')?.textContent")
        await page.evaluate(f"{node_of('after')}.dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
        detail = await page.wait_for(
            "document.getElementById('detail').textContent.includes('after · tool') && "
            "document.getElementById('detail').textContent"
        )
    result = await handle.result()
    assert report == store.get_text(result.report)  # the goal's full report, as `perdure result` prints it
    assert "list_dir" in detail and " s\n" in detail, detail  # where it ran, and how long it took
    assert page.errors == []


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
        # The page's answer is not noted by the click: its row comes from the goal's receipt event.
        row = await page.wait_for("document.querySelector('#inbox tr[data-status=\"applied\"]')?.textContent")
        result = await handle.result()
    assert result.outcome == "succeeded"
    assert row.startswith("answerapplied") and "ui-" in row, row  # kind, status, note, the page's request id
    assert page.errors == []
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
        await page.evaluate(click("read"))
        await page.wait_for("document.getElementById('rewind') !== null")
        # Before anything is sent, the page says what the rewind makes void: read and what needs it.
        preview = await page.evaluate("document.getElementById('rewind-preview').dataset.void")
        marked = await page.evaluate("[...document.querySelectorAll('g.would-void')].map(g => g.dataset.node)")
        await page.evaluate("document.getElementById('rewind-why').value = 'the notes changed'")
        await page.evaluate("document.getElementById('rewind').click()")
        receipt = await page.wait_for("document.querySelector('.receipt')?.textContent")
        assert receipt.startswith("rewind: applied"), receipt
        await wait_until(handle, lambda s: "gate" in s.running)  # run again after the rewind
        # The rewind is plan v2; v1 is drawn read-only, its steps as shapes (they lived on into v2).
        await page.wait_for("document.getElementById('plan-version').options.length === 2")
        await page.evaluate(
            "(() => { const p = document.getElementById('plan-version'); p.value = '1';"
            " p.dispatchEvent(new Event('change')); })()"
        )
        older = await page.evaluate(
            "[document.getElementById('graph').dataset.readonly,"
            " [...document.querySelectorAll('g[data-shown-node]')].map(g => g.dataset.shownNode).sort().join(' '),"
            " document.querySelectorAll('g.node[data-node]').length]"
        )
        shown_read = "document.querySelector('g[data-shown-node=\"read\"]')"
        await page.evaluate(f"{shown_read}.dispatchEvent(new MouseEvent('click'))")
        rewind_offered = await page.evaluate("document.getElementById('rewind') !== null")
        (workspace / "GO").write_text("")
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.outcome == "succeeded"
    reads = [s for _, _, s, _ in local_activities(history) if s.startswith("tool read_file · read ")]
    assert len(reads) == 2, reads  # the rewound read ran a second time
    assert preview == "read gate" and sorted(marked) == ["gate", "read"]
    assert older == ["true", "gate read", 0], older
    assert rewind_offered is False  # an older version is read-only
    assert page.errors == []
