"""perdure ui's page shows a goal's decision log in a real browser (Debian's headless
Chromium, driven through its DevTools protocol): the plan it adopted as it opens, an answer
given by clicking a card's button with who gave it, and how the goal ended."""

from __future__ import annotations

import pytest

from perdure.testing.browser import CHROMIUM, Browser
from perdure.workflows.goal.contracts.messages import Escalate
from tests.builders import gate
from tests.helpers import running_worker, start, submit, wait_until

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium (make installs it)"),
    pytest.mark.process,  # it starts Chromium
]


def row_text(kind: str) -> str:
    return f"document.querySelector('#decisions tr[data-kind=\"{kind}\"]')?.textContent"


async def test_the_decisions_panel_shows_the_plan_an_answer_with_who_gave_it_and_the_end(
    env, task_queue, store, workspace, ui, tmp_path, monkeypatch
):
    monkeypatch.setenv("PERDURE_USER", "bob")  # whom the page's server sends messages as
    after = {"name": "after", "kind": "tool", "tool": "list_dir", "needs": ["gate"], "args": {}}
    async with running_worker(env, task_queue, store), Browser(tmp_path / "profile") as page:
        handle = await start(env, task_queue, workspace, [gate(), after], allowed_tools=["run_command", "list_dir"])
        await page.open(f"{ui}/goals/{handle.id}")
        plan = await page.wait_for(row_text("plan"))
        await submit(
            handle, Escalate(request_id="wd-1", finding="slow", detail="nothing settled lately", by="watchdog")
        )
        await wait_until(handle, lambda s: s.questions)
        button = "document.querySelector('[data-question] button[data-option=\"continue\"]')"
        await page.wait_for(f"{button} !== null")
        await page.evaluate(f"{button}.click()")
        answer = await page.wait_for(row_text("answer"))
        (workspace / "GO").write_text("")
        await page.wait_for("document.getElementById('summary')?.dataset.phase === 'finished'")
        end = await page.wait_for(row_text("end"))
        title = await page.evaluate("document.querySelector('#decisions h3').textContent")
        await handle.result()
    assert "plan v1 adopted" in plan and "gate, after" in plan and "plan file" in plan
    assert "bob" in answer and "continue" in answer and "The watchdog found this goal slow" in answer
    assert "the goal ended succeeded" in end
    assert title.startswith("decisions · ")
    assert page.errors == []
