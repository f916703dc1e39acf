"""The web UI's screenshots in docs/: `python -m perdure.testing.screenshots` (add `--out DIR` to
write them elsewhere). Not a test, and not run by one: the pictures change only when
someone means them to.

It starts what a user would have: a dev server, a worker, `perdure ui`'s app, and a few
goals in the states worth showing (one waiting on a question with messages in its inbox
and a premise, one parked, one finished), then photographs the page in headless
Chromium (testing/browser.py): docs/ui-goal-view.png and docs/ui-goal-list.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import uuid
from pathlib import Path

import httpx
import uvicorn

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.models.profiles import ModelConfig
from perdure.runtime import converter
from perdure.testing.browser import Browser
from perdure.testing.servers import dev_server_options, free_ports

DOCS = Path(__file__).resolve().parent.parent / "docs"
GATE = "while [ ! -f GO ]; do sleep 0.05; done; echo gate open"


def _steps() -> list[dict]:
    return [
        {"name": "inventory", "kind": "tool", "tool": "list_dir", "args": {"path": "."}},
        {"name": "read_notes", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md"},
         "needs": ["inventory"], "premises": {"scope": ["all_modules"]}},
        {"name": "check_links", "kind": "tool", "tool": "read_file", "args": {"path": "links.md"},
         "needs": ["inventory"]},
        {"name": "review", "kind": "tool", "tool": "run_command", "args": {"command": GATE},
         "needs": ["read_notes", "check_links"]},
        {"name": "publish", "kind": "tool", "tool": "list_dir", "args": {"path": "."}, "needs": ["review"]},
    ]  # fmt: skip


async def _shoot(out: Path) -> list[tuple[Path, int]]:
    from temporalio.testing import WorkflowEnvironment

    from perdure.starters.ui_server import build_app
    from perdure.workers.orchestrator import build_worker

    scratch = Path(tempfile.mkdtemp(prefix="perdure-shots-"))
    os.environ["PERDURE_HOME"] = str(scratch)
    os.environ[converter.STORE_ENV] = f"disk:{scratch / 'payloads'}"
    queue = f"tq-shots-{uuid.uuid4().hex[:6]}"
    os.environ["PERDURE_TASK_QUEUE"] = queue
    workspace = scratch / "workspace"
    workspace.mkdir()
    (workspace / "notes.md").write_text("# notes\nThe release needs a changelog.\n")
    (workspace / "links.md").write_text("- https://example.org\n")
    shots = []
    async with await WorkflowEnvironment.start_local(**dev_server_options()) as env:
        worker = build_worker(
            env.client,
            task_queue=queue,
            store=DiskArtifactStore(scratch / "artifacts"),
            model_config=ModelConfig(profiles={}),
        )
        (port,) = free_ports(1)
        server = uvicorn.Server(uvicorn.Config(build_app(env.client), host="127.0.0.1", port=port, log_level="warning"))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        base = f"http://127.0.0.1:{port}"
        async with worker, httpx.AsyncClient(base_url=base, timeout=30) as http, Browser(scratch / "chromium") as page:
            common = {"workspace": str(workspace), "tools": ["list_dir", "read_file", "run_command"]}
            starts = [
                {"goal": "List the workspace", "id": "list-workspace", "plan": {"steps": [_steps()[0]]}},
                {"goal": "Tidy the links", "id": "tidy-links", "plan": {"steps": [{**_steps()[3], "needs": []}]}},
                {
                    "goal": "Review the release notes",
                    "id": "review-release-notes",
                    "plan": {"steps": _steps()},
                    "premises": {"scope": "all_modules"},
                },
            ]
            done, parked, shown = [(await http.post("/api/goals", json={**common, **s})).json() for s in starts]
            assert all("goal_id" in answer for answer in (done, parked, shown)), (done, parked, shown)
            await env.client.get_workflow_handle(done["goal_id"]).result()
            goal = f"/api/goals/{shown['goal_id']}"
            await _until(http, goal, lambda s: "review" in s["running"])
            await http.post(goal + "/messages", json={"kind": "steer", "text": "Keep the review to one page."})
            await http.post(goal + "/messages", json={"kind": "queue", "text": "Then draft the announcement."})
            question = {"kind": "escalate", "finding": "scope", "detail": "Should the review cover archived modules?"}
            await http.post(goal + "/messages", json=question)
            await _until(http, goal, lambda s: s["questions"])
            tidy = f"/api/goals/{parked['goal_id']}"
            await _until(http, tidy, lambda s: s["running"])
            await http.post(tidy + "/messages", json={"kind": "park", "reason": "waiting for the link owner"})

            await page.open(f"{base}/goals/{shown['goal_id']}")
            await page.wait_for("document.querySelector('[data-question] button') && "
                                "document.querySelectorAll('#inbox tr[data-request]').length >= 2")  # fmt: skip
            await page.evaluate(
                "document.querySelector('g.node[data-node=\"read_notes\"]')"
                ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
            )
            await page.wait_for("document.getElementById('rewind-preview') !== null")
            shots.append(await _save(page, out / "ui-goal-view.png", 1400, 760))
            for _ in range(50):  # the list reads visibility, which follows the goals a moment later
                await page.open(f"{base}/")
                await page.wait_for("document.getElementById('filters')")
                if await page.evaluate("document.querySelectorAll('#goals tr.waiting').length === 2"):
                    break
            shots.append(await _save(page, out / "ui-goal-list.png", 1100, 360))
            for gid in (shown["goal_id"], parked["goal_id"]):
                await http.post(f"/api/goals/{gid}/messages", json={"kind": "abort", "reason": "screenshots taken"})
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    return shots


async def _until(http: httpx.AsyncClient, url: str, holds, timeout_s: float = 30) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        snapshot = (await http.get(url)).json()
        if holds(snapshot):
            return snapshot
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{url}: the goal never got there; last: {snapshot}")
        await asyncio.sleep(0.1)


async def _save(page: Browser, path: Path, width: int, height: int) -> tuple[Path, int]:
    await page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")  # painted
    return path, await page.screenshot(path, width, height)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS, help="Directory to write the PNGs to (default: docs/).")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for path, size in asyncio.run(_shoot(args.out)):
        print(f"wrote {path} ({size // 1024} KB)")


if __name__ == "__main__":
    main()
