"""perdure ui's page in a real browser (Debian's headless Chromium, driven through its
DevTools protocol): a running node turns succeeded without a reload and the report shows
when the goal is done, a question is answered by clicking its button and its receipt
lands in the inbox, an approvals-ahead card's ticked steps are refused (a tick survives the
card's redraw), a node is rewound by clicking it after the page said what becomes
void, older plan versions are drawn read-only, the goal list filters and puts a goal
waiting on a person first, the list and a goal's header name it by its text, a card's
"done so far" is what is done when shown, a premise is narrowed from its panel, a goal is
parked until a signal and then a file from its park panel, and a
running node's live model output follows the token events."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from urllib.parse import quote

import pytest
import uvicorn
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.routing import Mount, Route

from perdure.starters.client.goal_starts import start_goal
from perdure.starters.ui_server import build_app
from perdure.testing.browser import CHROMIUM, Browser
from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI
from perdure.workflows.goal.contracts.events import token_delta_id, token_retry_id
from perdure.workflows.goal.contracts.messages import Abort, Park
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import gate, llm, scripted_profile, spec
from tests.device_rig import write_on
from tests.helpers import free_ports, goal_result, local_activities, running_worker, start, submit, wait_until

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium (make installs it)"),
    pytest.mark.process,  # each starts Chromium
]


@contextlib.asynccontextmanager
async def served(app) -> AsyncIterator[str]:
    """An ASGI app on a free port of this machine, as the `ui` fixture serves perdure ui's."""
    (port,) = free_ports(1)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving


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
        # The panel is redrawn as the node's events arrive: its duration shows even when the
        # click came first (a loaded machine).
        detail = await page.wait_for(
            "document.getElementById('detail').textContent.includes('after · tool') && "
            "document.getElementById('detail').textContent.includes(' s\\n') && "
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


# The page's POSTs answered 2 s late, as by a slow server: whatever redraws meanwhile comes first.
SLOW_REPLIES = """window.fetch = ((fetch) => async (url, init) => {
  const response = await fetch(url, init);
  if (init?.method === "POST") await new Promise((done) => setTimeout(done, 2000));
  return response;
})(window.fetch)"""


async def test_an_approvals_ahead_card_has_a_checkbox_per_step_and_refuses_the_checked_ones(
    env, task_queue, store, workspace, ui, tmp_path, fake_service
):
    payments = fake_service(PaymentsAPI, api_key=PAYMENTS_KEY)

    def pay(name: str, **extra) -> dict:
        args = {"amount_cents": 900, "currency": "EUR", "recipient": "ACME GmbH", "memo": f"invoice {name}"}
        return {"name": name, "kind": "tool", "tool": "make_payment", "args": args, **extra}

    steps = [pay("pay-a"), pay("pay-b", needs=["pay-a"]), pay("pay-c"), gate()]
    card = "document.querySelector('[data-question=\"q1\"]')"
    box = f"{card}?.querySelector('input[data-step=\"pay-c\"]')"
    receipt = f"{card}?.querySelector('.receipt')?.textContent"
    async with running_worker(env, task_queue, store), Browser(tmp_path / "profile") as page:
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["make_payment", "run_command"])
        await page.open(f"{ui}/goals/{handle.id}")
        listed = await page.wait_for(
            f"{card}?.querySelectorAll('input[type=checkbox]').length === 3 && "
            f"[...{card}.querySelectorAll('label[data-step]')].map((l) => l.textContent)"
        )
        buttons = await page.evaluate(f"[...{card}.querySelectorAll('button')].map((b) => b.textContent)")
        # Nothing ticked: the goal refuses "approve checked" and says why on the card. The answer's
        # reply comes late (a slow server): the card is redrawn first, as the goal took the message,
        # and the receipt must land on the card shown, not on the one clicked (lost once on CI).
        await page.evaluate(SLOW_REPLIES)
        await page.evaluate(f"{card}.querySelector('button[data-option=\"approve_some\"]').click()")
        empty = await page.wait_for(f"{receipt}?.startsWith('answer: rejected') && {receipt}")
        await page.evaluate(f"{box}.click(); window.before = {card}")
        (workspace / "GO").write_text("")  # the goal moves on: the card is redrawn, the tick stays
        await page.wait_for(f"{status_of('gate')} === 'succeeded' && {card} !== window.before")
        ticked = await page.evaluate(f"{box}.checked")
        await page.evaluate(f"{card}.querySelector('button[data-option=\"refuse_some\"]').click()")
        result = await goal_result(handle)
    shown = '{"amount_cents":900,"currency":"EUR","memo":"invoice pay-X","recipient":"ACME GmbH"}'
    assert listed == [f" pay-{x} · make_payment {shown.replace('X', x)}" for x in "abc"], listed
    assert buttons == ["approve all", "approve checked", "refuse checked", "refuse all"], buttons
    assert "approve_some names the steps it is about" in empty, empty
    assert ticked is True
    assert [e["memo"] for e in payments.ledger()] == ["invoice pay-a", "invoice pay-b"]
    assert result.outcome == "partial", result.excerpt  # pay-c refused on the card
    assert page.errors == []


async def test_a_question_cards_done_so_far_is_what_is_done_when_shown_not_when_asked(
    env, task_queue, store, workspace, ui, devices, tmp_path
):
    after = {"name": "after", "kind": "tool", "tool": "list_dir", "needs": ["gate"], "args": {}}
    tools = ["write_file", "run_command", "list_dir"]
    async with running_worker(env, task_queue, store), Browser(tmp_path / "profile") as page:
        await devices("laptop").start()
        handle = await start(env, task_queue, workspace, [write_on("laptop"), gate(), after], allowed_tools=tools)
        await page.open(f"{ui}/goals/{handle.id}")
        card = "document.querySelector('[data-question] .done-so-far')?.textContent"
        asked = await page.wait_for(card)
        (workspace / "GO").write_text("")  # two steps finish while the card waits
        await page.wait_for(f"{status_of('after')} === 'succeeded'")
        now = await page.wait_for(f"{card}?.includes('2 of 3') && {card}")
        await submit(handle, Abort(request_id="abort-1"))
        await goal_result(handle)
    assert asked == "done so far: nothing finished yet (0 of 3 steps)", asked
    assert now == "done so far: 2 of 3 steps finished: gate, after", now
    assert page.errors == []


async def test_the_goal_list_and_a_goals_header_show_its_text_not_only_its_id(
    env, task_queue, store, workspace, ui, tmp_path, monkeypatch
):
    monkeypatch.setenv("PERDURE_TASK_QUEUE", task_queue)
    text = "Tidy the release notes for the export fix"
    async with running_worker(env, task_queue, store), Browser(tmp_path / "profile") as page:
        # A router-made id says nothing: the text is what a person recognises.
        goal = spec(workspace, goal=text, plan={"steps": [gate()]})
        handle = await start_goal(env.client, goal, f"goal-{task_queue[-10:]}")
        await wait_until(handle, lambda s: "gate" in s.running)
        ours = quote(f"WorkflowId = '{handle.id}'")
        await page.open(f"{ui}/?query={ours}")
        row = await page.wait_for("document.querySelector('#goals tr[data-goal] td')?.textContent")
        await page.open(f"{ui}/goals/{handle.id}")
        header = await page.wait_for(
            "document.getElementById('summary') && document.getElementById('where').textContent"
        )
        summary = await page.wait_for("document.getElementById('summary').textContent")
        await submit(handle, Abort(request_id="abort-1"))
        await goal_result(handle)
    assert text in row and handle.id in row, row
    assert text in header, header
    assert summary.startswith(text), summary
    assert page.errors == []


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
        # v1's shape is drawn once the stream's plan event for v2 has come (it may come after the picker).
        await page.wait_for("document.querySelector('g[data-shown-node=\"read\"]') !== null")
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


async def test_a_goal_is_parked_until_a_signal_then_a_file_from_its_park_panel(
    env, task_queue, store, workspace, ui, tmp_path
):
    after = {"name": "after", "kind": "tool", "tool": "run_command", "args": {"command": "echo after"}}
    after["needs"] = ["gate"]
    panel = "document.getElementById('parking')"
    async with running_worker(env, task_queue, store), Browser(tmp_path / "profile") as page:
        handle = await start(env, task_queue, workspace, [gate(), after], allowed_tools=["run_command"])
        await page.open(f"{ui}/goals/{handle.id}")
        await page.wait_for(f"{status_of('gate')} === 'running' && document.getElementById('park') !== null")

        async def park_until(kind: str, target: str) -> str:
            await page.evaluate(f"document.getElementById('park-reason').value = 'waiting on {kind}'")
            await page.evaluate(f"document.getElementById('park-until').value = 'until_{kind}'")
            await page.evaluate(f"document.getElementById('park-target').value = '{target}'")
            await page.evaluate("document.getElementById('park').click()")
            return await page.wait_for(f"document.getElementById('resume') !== null && {panel}.textContent")

        by_signal = await park_until("signal", "ci-done")
        await page.wait_for("document.getElementById('send-signal') !== null")
        await page.evaluate("document.getElementById('send-signal').click()")
        await page.wait_for("document.getElementById('park') !== null")  # running again: the form is back
        by_file = await park_until("file", "READY")
        (workspace / "GO").write_text("")  # the gate ends; `after` waits for the park
        parked = await wait_until(
            handle, lambda s: s.parked and "gate" not in s.running and "checked 1 times" in (s.pause_reason or "")
        )
        (workspace / "READY").write_text("")
        result = await handle.result()
        gate_log = (await handle.query(GoalWorkflow.progress)).gate_log
    assert "waiting on signal (until signal ci-done)" in by_signal, by_signal
    assert "waiting on file (until file READY exists" in by_file, by_file
    assert {n.name: n.status for n in parked.nodes}["after"] not in ("running", "succeeded")
    assert result.outcome == "succeeded", result.excerpt
    ended = [entry for entry in gate_log if "park ended" in entry]
    assert len(ended) == 2 and "signal ci-done received" in ended[0] and "file READY exists" in ended[1], ended
    assert page.errors == []


async def test_the_goal_list_puts_a_parked_goal_first_and_a_premise_is_narrowed_from_its_panel(
    env, task_queue, store, workspace, ui, tmp_path
):
    (workspace / "notes.md").write_text("a note\n")
    read = {
        "name": "read",
        "kind": "tool",
        "tool": "read_file",
        "args": {"path": "notes.md"},
        "premises": {"scope": ["all"]},
    }
    tools = ["read_file", "run_command"]
    async with running_worker(env, task_queue, store), Browser(tmp_path / "profile") as page:
        older = await start(
            env, task_queue, workspace, [read, gate(["read"])], allowed_tools=tools, premises={"scope": "all"}
        )
        await wait_until(older, lambda s: "gate" in s.running)
        await submit(older, Park(request_id="park-1", reason="ask the owner"))
        newer = await start(env, task_queue, workspace, [gate()], allowed_tools=["run_command"])
        await wait_until(newer, lambda s: "gate" in s.running)
        ours = quote(f"WorkflowId = '{older.id}' OR WorkflowId = '{newer.id}'")
        rows = (
            "[...document.querySelectorAll('#goals tr[data-goal]')]"
            ".map(r => r.dataset.goal + ':' + r.cells[1].textContent)"
        )
        listing = None
        for _ in range(50):  # visibility lags the goal's search attributes a little
            await page.open(f"{ui}/?query={ours}")
            listing = await page.wait_for(f"document.getElementById('filters') && {rows}")
            if listing == [f"{older.id}:parked", f"{newer.id}:"]:
                break
        # The filter form, as a person uses it: tick "parked" and submit.
        await page.evaluate("document.querySelector('#filters input[name=parked]').checked = true")
        await page.evaluate("document.querySelector('#filters button').click()")
        filtered = await page.wait_for(f"location.search.includes('parked=1') && {rows}.length === 1 && {rows}")
        await page.open(f"{ui}/goals/{older.id}")
        parked = await page.wait_for("document.getElementById('parked')?.textContent")
        premise = "document.querySelector('#premises [data-premise=\"scope\"]')"
        await page.wait_for(f"{premise} !== null")
        await page.evaluate(f"{premise}.querySelector('input').value = 'module_a'")
        await page.evaluate(f"{premise}.querySelector('button').click()")
        # The narrow is an update the page's server waits on; under a loaded 2-core CI run it
        # once took over 30 s to come back (alone: well under a second).
        receipt = await page.wait_for("document.querySelector('.narrow-receipt')?.textContent", timeout_s=90)
        narrowed = await page.wait_for(f"{premise}?.dataset.value === 'module_a'")
        await page.wait_for("document.getElementById('plan-version').options.length === 2")
        for handle in (older, newer):
            await submit(handle, Abort(request_id="abort-1"))
            await goal_result(handle)
    assert listing == [f"{older.id}:parked", f"{newer.id}:"], listing  # older, and first: it waits on a person
    assert filtered == [f"{older.id}:parked"]
    assert "ask the owner" in parked
    assert receipt.startswith("narrow: applied"), receipt
    assert narrowed
    assert page.errors == []


def _scripted_events() -> list[dict]:
    """What the goal's stream would carry for a model node streaming its output."""
    at = datetime.now(UTC).isoformat()

    def tokens(attempt: int, seq: int, text: str) -> dict:
        return {
            "type": "tokens",
            "id": token_delta_id("gate", 0, attempt, seq),
            "at": at,
            "node": "gate",
            "turn": 0,
            "attempt": attempt,
            "seq": seq,
            "text": text,
        }

    return [
        tokens(1, 0, "Hello "),
        tokens(1, 1, "wor"),
        {"type": "retry", "id": token_retry_id("gate", 0, 2), "at": at, "node": "gate", "turn": 0, "attempt": 2},
        tokens(2, 0, "Fresh "),
        tokens(1, 2, "LATE"),  # from the retried attempt, arriving late: dropped
        tokens(2, 1, "start"),
        tokens(2, 1, "start"),  # published twice (a retried publish): counted once
    ]


async def test_a_running_nodes_live_output_follows_its_token_events(env, task_queue, store, workspace, tmp_path):
    """The page side of live tokens. Model activities do not publish them yet, so the
    events endpoint is scripted (the only fake: the SSE boundary); the snapshot, the
    page and the goal are real."""
    release = asyncio.Event()

    async def scripted_events(request):
        events = _scripted_events()

        async def stream():
            for offset, event in enumerate(events):
                yield {"id": str(offset), "event": event["type"], "data": json.dumps(event)}
            await release.wait()
            settled = {
                "type": "node",
                "id": "node:gate:done",
                "at": events[0]["at"],
                "node": "gate",
                "kind": "llm",
                "status": "succeeded",
            }
            yield {"id": str(len(events)), "event": "node", "data": json.dumps(settled)}
            await asyncio.Event().wait()  # held open, as a goal's stream is

        return EventSourceResponse(stream())

    app = Starlette(
        routes=[Route("/api/goals/{goal_id}/events", scripted_events), Mount("/", app=build_app(env.client))]
    )
    async with served(app) as base, running_worker(env, task_queue, store), Browser(tmp_path / "profile") as page:
        handle = await start(env, task_queue, workspace, [gate()], allowed_tools=["run_command"])
        await wait_until(handle, lambda s: "gate" in s.running)
        await page.open(f"{base}/goals/{handle.id}")
        await page.wait_for(f"{node_of('gate')} !== null")
        await page.evaluate(click("gate"))
        live = await page.wait_for(
            "document.getElementById('live')?.textContent === 'Fresh start' && "
            "[document.getElementById('live').dataset.turn, "
            f"{node_of('gate')}.querySelector('text.tail').textContent]"
        )
        release.set()
        await page.wait_for(f"{status_of('gate')} === 'succeeded'")
        after = await page.evaluate(
            f"[document.getElementById('live').textContent, {node_of('gate')}.querySelector('text.tail').textContent]"
        )
        await submit(handle, Abort(request_id="abort-live"))
        await goal_result(handle)
    assert live == ["0.2", "Fresh start"], live  # the latest attempt's text only, once
    assert after == ["", ""]  # a settled node's output is its result now, not the stream's
    assert page.errors == []


async def test_a_slow_model_reply_is_seen_on_its_running_node_before_it_succeeds(
    env, task_queue, store, workspace, ui, scripted, tmp_path
):
    words = " ".join(f"word{i}" for i in range(30))
    server = scripted({"replies": [{"when": "Do talk", "content": words, "chunk_delay_s": 0.1}]})
    profile = scripted_profile(server).model_copy(update={"live_every_s": 0.3})
    async with running_worker(env, task_queue, store, profile), Browser(tmp_path / "profile") as page:
        handle = await start(env, task_queue, workspace, [llm("talk")])
        await page.open(f"{ui}/goals/{handle.id}")
        tail = f"{node_of('talk')}?.querySelector('text.tail')?.textContent"
        # Text on the node while it still runs: the tokens arrived before its output.
        seen = await page.wait_for(f"{status_of('talk')} === 'running' && {tail}")
        await page.wait_for(f"{status_of('talk')} === 'succeeded'")
        after = await page.evaluate(f"{tail}")
        result = await handle.result()
    assert result.outcome == "succeeded" and store.get_text(result.outputs["talk"]) == words
    assert seen.strip() and seen.strip().removeprefix("…") in words, seen
    assert not after, "a settled node shows its output, not live text"
    assert page.errors == []


async def test_a_cards_deadline_and_reminder_show_on_the_page(env, task_queue, store, workspace, ui, tmp_path):
    """A confirmation with a 40 s deadline reminding 34 s before it: the card says when it
    expires and what it decides then, and says it was reminded once the reminder went out.
    Nothing is sent before a person approves, so no payments service is needed."""
    pay = {"amount_cents": 100, "currency": "EUR", "recipient": "ACME", "memo": "m"}
    deadline = {"after": "40s", "remind_before": "34s"}
    step = {"name": "pay", "kind": "tool", "tool": "make_payment", "args": pay, "question_deadline": deadline}
    async with running_worker(env, task_queue, store), Browser(tmp_path / "profile") as page:
        handle = await start(env, task_queue, workspace, [step], allowed_tools=["make_payment"])
        await page.open(f"{ui}/goals/{handle.id}")
        line = "document.querySelector('[data-question] .deadline')?.textContent"
        asked = await page.wait_for(line)
        reminded = await page.wait_for(f"{line}?.includes('reminded') && {line}", timeout_s=30)
        await submit(handle, Abort(request_id="abort-1"))
        await goal_result(handle)
    assert asked.startswith("deadline 20") and asked.endswith("· on expiry: deny"), asked
    assert "· on expiry: deny · reminded 20" in reminded, reminded
    assert page.errors == []
