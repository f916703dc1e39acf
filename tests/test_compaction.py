"""Context compaction of agent prompts: the pure rules, an invariant property, and what a
scripted model actually receives from the real `agent_turn` activity."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from temporalio.testing import ActivityEnvironment

from perdure.activities.artifacts import ArtifactStore, DiskArtifactStore
from perdure.activities.models.compaction import (
    COMPACTED_HEADER,
    ERROR_PREFIX,
    KEEP_LAST_UNITS,
    compact_prompt,
    compactable,
    prompt_chars,
    render,
    work_units,
)
from perdure.activities.models.model_activities import ModelActivities, agent_tools
from perdure.activities.models.profiles import ModelConfig
from perdure.activities.models.providers import ChatMessage, ChatToolCall
from perdure.activities.models.scripted import ScriptedServer, seen_anthropic, seen_openai
from perdure.activities.tools.catalogue import COMPACTION_TOOL
from perdure.workflows.goal.contracts.goal_contracts import AgentTurnInput, AgentTurnResult, ModelContext
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.shared.canonical import sha256_digest
from perdure.workflows.shared.contracts import ToolResult
from tests.builders import anthropic_profile, openai_profile, spec
from tests.helpers import run_goal, running_worker

CONSTRAINT = "Never write outside docs/; keep every file under 200 lines."


# --- pure rules ---------------------------------------------------------------------


def head(guidance: str = "Only read files under docs/.") -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content=f"[PERDURE-AGENT]\nConstraints:\n- {CONSTRAINT}"),
        ChatMessage(role="user", content=f"step: survey\n\nRead the docs.\n\nGuidance from the user:\n- {guidance}"),
    ]


def unit(turn: int, tool: str, args: dict, output: str, ok: bool = True, said: str = "") -> list[ChatMessage]:
    call_id = f"call_{turn}"
    return [
        ChatMessage(
            role="assistant",
            content=said,
            tool_calls=[ChatToolCall(id=call_id, name=tool, arguments=json.dumps(args))],
        ),
        ChatMessage(role="tool", tool_call_id=call_id, content=output if ok else f"{ERROR_PREFIX}{output}"),
    ]


def sample() -> list[ChatMessage]:
    return [
        *head(),
        *unit(1, "read_file", {"path": "docs/missing.md"}, "no such file: docs/missing.md", ok=False),
        *unit(2, "read_file", {"path": "docs/a.md"}, "ALPHA " * 500, said="Reading the first doc."),
        ChatMessage(role="user", content="New guidance from the user (applies from now on):\n- Skip drafts."),
        *unit(3, "read_file", {"path": "docs/b.md"}, "BRAVO " * 500),
        *unit(4, "read_file", {"path": "docs/c.md"}, "CHARLIE " * 500),
        ChatMessage(role="user", content="Note from the runtime: you already read docs/a.md."),
        *unit(5, "list_dir", {"path": "docs"}, "a.md\nb.md\nc.md"),
    ]


def test_below_the_threshold_nothing_changes():
    messages = sample()
    assert compact_prompt(messages, prompt_chars(messages)) is None
    assert compact_prompt(messages, None) is None


def test_work_units_are_numbered_by_turn_and_failures_found():
    units = work_units(sample())
    assert [u.turn for u in units] == [1, 2, 3, 4, 5]
    assert [u.failed for u in units] == [True, False, False, False, False]
    assert all(u.finished for u in units)


def test_unanswered_call_makes_a_unit_unfinished():
    messages = [*head(), unit(1, "read_file", {"path": "x"}, "x")[0], *unit(2, "list_dir", {}, "y")]
    assert [u.finished for u in work_units(messages)] == [False, True]


def test_old_successful_turns_become_one_line_each():
    messages = sample()
    compacted = compact_prompt(messages, threshold=1)
    assert compacted is not None
    assert compacted.turns == [2, 3]
    sent = compacted.messages
    # Head, the failed attempt, guidance and notes stay as they were; so do the last K units.
    for kept in [*messages[:4], messages[6], *messages[9:]]:
        assert kept in sent
    texts = "\n".join(m.content for m in sent)
    assert "ALPHA ALPHA" in texts and "BRAVO BRAVO" in texts  # only inside the short previews…
    assert ("ALPHA " * 500) not in texts and ("BRAVO " * 500) not in texts  # …never in full
    [line2] = [line for line in texts.splitlines() if line.startswith("- turn 2")]
    assert 'read_file {"path": "docs/a.md"}' in line2
    assert '(said: "Reading the first doc.")' in line2
    assert sha256_digest(("ALPHA " * 500).encode()) in line2
    assert "3,000 chars" in line2
    # Turns 2 and 3 are separated by guidance, so each gets its own runtime message, in place.
    assert [m.content.startswith(COMPACTED_HEADER) for m in sent].count(True) == 2
    assert [m.content.startswith(COMPACTED_HEADER) for m in sent] == [False] * 4 + [True, False, True] + [False] * 5
    assert compacted.chars_after == prompt_chars(sent) < compacted.chars_before == prompt_chars(messages)
    assert compacted.archived == ["ALPHA " * 500, "BRAVO " * 500]


def test_only_as_many_turns_as_it_takes_to_fit_oldest_first():
    messages = sample()
    (oldest, line), _ = compactable(messages)
    just_the_oldest = prompt_chars(render(messages, {oldest.start: (oldest, line)}))
    assert compact_prompt(messages, threshold=just_the_oldest).turns == [2]
    assert compact_prompt(messages, threshold=just_the_oldest - 1).turns == [2, 3]


def test_failed_and_current_turns_are_never_compacted_even_over_the_threshold():
    messages = [
        *head(),
        *unit(1, "read_file", {"path": "a"}, "E" * 5000, ok=False),
        *unit(2, "read_file", {"path": "b"}, "B" * 5000),
        *unit(3, "read_file", {"path": "c"}, "C" * 5000),
    ]
    assert compact_prompt(messages, threshold=1) is None
    assert compact_prompt(messages, threshold=1, keep_last=1).turns == [2]


def test_a_turn_shorter_than_its_line_stays_verbatim():
    messages = [*head(), *unit(1, "list_dir", {}, "a"), *unit(2, "list_dir", {}, "b"), *unit(3, "list_dir", {}, "c")]
    assert compact_prompt(messages, threshold=1) is None


# --- the invariant ----------------------------------------------------------------------

_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_turn = st.tuples(
    st.lists(st.tuples(st.sampled_from(["read_file", "list_dir", "http_get"]), _text), min_size=1, max_size=3),
    st.lists(st.tuples(st.booleans(), _text, st.integers(0, 3000)), min_size=3, max_size=3),
    st.sampled_from(["", "thinking about it"]),
    st.lists(st.sampled_from(["guidance", "note"]), max_size=2),
    st.booleans(),  # a call left unanswered
)


@st.composite
def transcripts(draw) -> tuple[list[ChatMessage], list[str], list[list[ChatMessage]]]:
    """(messages, constraint-like texts that must survive, failed units) shaped like agent_turn builds them."""
    constraints = [f"constraint {i}: {draw(_text)}" for i in range(draw(st.integers(0, 3)))]
    messages = [
        ChatMessage(role="system", content="[PERDURE-AGENT]\n" + "\n".join(f"- {c}" for c in constraints)),
        ChatMessage(role="user", content=f"step: s\n\n{draw(_text)}"),
    ]
    must_survive = [m.content for m in messages]
    failed_units = []
    for turn, (calls, outcomes, said, extras, unanswered) in enumerate(draw(st.lists(_turn, max_size=10)), 1):
        ids = [f"call_{turn}_{i}" for i in range(len(calls))]
        unit_messages = [
            ChatMessage(
                role="assistant",
                content=said,
                tool_calls=[
                    ChatToolCall(id=i, name=n, arguments=json.dumps({"q": a}))
                    for i, (n, a) in zip(ids, calls, strict=True)
                ],
            )
        ]
        for call_id, (ok, text, size) in zip(ids, outcomes, strict=False):
            body = text + "x" * size
            unit_messages.append(
                ChatMessage(role="tool", tool_call_id=call_id, content=body if ok else f"ERROR: {body}")
            )
        if unanswered and len(unit_messages) > 2:
            unit_messages.pop()
        messages += unit_messages
        if any(m.content.startswith("ERROR:") for m in unit_messages[1:]):
            failed_units.append(unit_messages)
        for kind in extras:
            content = f"New guidance from the user:\n- {draw(_text)}" if kind == "guidance" else f"Note: {draw(_text)}"
            messages.append(ChatMessage(role="user", content=content))
            must_survive.append(content)
    return messages, must_survive, failed_units


def _contains_run(haystack: list[ChatMessage], needle: list[ChatMessage]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


@settings(max_examples=300, deadline=None)
@given(transcripts(), st.integers(0, 40_000), st.integers(1, 3))
@pytest.mark.slow
def test_constraints_and_failures_survive_and_the_prompt_never_grows(sample, threshold, keep_last):
    messages, must_survive, failed_units = sample
    compacted = compact_prompt(messages, threshold, keep_last)
    sent = compacted.messages if compacted else messages
    assert prompt_chars(sent) <= prompt_chars(messages)
    for content in must_survive:
        assert any(m.content == content for m in sent)
    for failed in failed_units:
        assert _contains_run(sent, failed)
    units = work_units(messages)
    for current in units[-keep_last:]:
        assert _contains_run(sent, messages[current.start : current.end])
    # Still a conversation providers accept: every tool result follows the call it answers.
    for i, m in enumerate(sent):
        if m.role == "tool":
            owner = next(p for p in reversed(sent[:i]) if p.role != "tool")
            assert m.tool_call_id in {c.id for c in owner.tool_calls}
    # Deterministic: the same transcript always gives the same prompt.
    assert compact_prompt(messages, threshold, keep_last) == compacted


# --- through the real activity and a scripted model ------------------------------------------


class RecordingServer(ScriptedServer):
    """Keeps every request body as it arrived, so a test can read the whole prompt the model received."""

    def __init__(self, script: dict) -> None:
        super().__init__(script)
        self.bodies: list[dict] = []

    def respond(self, flavour, path, body):
        self.bodies.append(body)
        return super().respond(flavour, path, body)


BIG = {name: f"{name.upper()}-CONTENT " + f"{name} line\n" * 300 for name in ("alpha", "bravo", "charlie")}
GUIDANCE = "Only read files under docs/."
LATE_GUIDANCE = "Prefer the newest doc."
FAILED_ERROR = "no such file: docs/missing.md"
SCRIPT = [
    {"when_last": "step: survey", "tool_calls": [{"name": "read_file", "arguments": {"path": "docs/missing.md"}}]},
    {"when_last": FAILED_ERROR, "tool_calls": [{"name": "read_file", "arguments": {"path": "docs/alpha.md"}}]},
    {"when_last": "ALPHA-CONTENT", "tool_calls": [{"name": "read_file", "arguments": {"path": "docs/bravo.md"}}]},
    {"when_last": LATE_GUIDANCE, "tool_calls": [{"name": "read_file", "arguments": {"path": "docs/charlie.md"}}]},
    {"when_last": "CHARLIE-CONTENT", "tool_calls": [{"name": "list_dir", "arguments": {"path": "docs"}}]},
    {"when_last": "alpha.md", "content": "The docs cover alpha, bravo and charlie."},
]
# What the workflow's tools would answer to each turn's call.
OUTPUTS = {2: BIG["alpha"], 3: BIG["bravo"], 4: BIG["charlie"], 5: "alpha.md\nbravo.md\ncharlie.md"}


async def drive(
    store: ArtifactStore, profile_of, threshold: int | None, degraded: bool = False
) -> tuple[RecordingServer, list[AgentTurnResult]]:
    """Six agent turns through the real activity, fed the way the agent node
    (workflows/goal/nodes/agent.py) feeds them."""
    server = RecordingServer({"replies": SCRIPT}).start()
    try:
        profile = profile_of(server)
        acts = ModelActivities(ModelConfig(profiles={profile.name: profile}), store)
        context = ModelContext(
            profile=profile.name,
            goal="Survey the docs.",
            constraints=[CONSTRAINT],
            guidance=[GUIDANCE],
            degraded=degraded,
        )
        results: list[AgentTurnResult] = []
        tool_results: list[ToolResult] = []
        for turn in range(1, 7):
            new_guidance = [LATE_GUIDANCE] if turn == 4 else []
            result = await ActivityEnvironment().run(
                acts.agent_turn,
                AgentTurnInput(
                    context=context.model_copy(update={"guidance": context.guidance + new_guidance}),
                    step="survey",
                    prompt="Read the docs and say what they cover.",
                    tools=["read_file", "list_dir"],
                    turn=turn,
                    max_turns=8,
                    transcript=results[-1].transcript if results else None,
                    tool_results=tool_results,
                    new_guidance=new_guidance,
                    compact_after_chars=threshold,
                ),
            )
            results.append(result)
            if result.final is not None:
                break
            [call] = result.tool_calls
            if turn == 1:
                tool_results = [ToolResult(call_id=call.call_id, tool=call.tool, ok=False, error=FAILED_ERROR)]
            else:
                output = store.put_text(OUTPUTS[turn])
                tool_results = [ToolResult(call_id=call.call_id, tool=call.tool, ok=True, output=output)]
        return server, results
    finally:
        server.stop()


def received_text(server: RecordingServer, request: int) -> str:
    body = server.bodies[request]
    seen = seen_anthropic(body) if "system" in body else seen_openai(body)
    return seen.all_text


@pytest.mark.parametrize("profile_of", [openai_profile, anthropic_profile], ids=["openai", "anthropic"])
async def test_the_model_receives_the_compacted_prompt(store, profile_of):
    server, results = await drive(store, profile_of, threshold=3_000)
    assert len(results) == 6 and results[-1].final is not None
    assert [s["matched"] for s in server.requests()] == [0, 1, 2, 3, 4, 5]

    # Turn 4 is over the threshold, but turn 1 failed and turns 2-3 are the current stage.
    assert [r.compaction is not None for r in results] == [False, False, False, False, True, True]
    last = results[-1].compaction
    assert last.turn == 6 and last.compacted_turns == [2, 3]
    # The current stage alone is over the threshold: compaction shortens, it never cuts the current stage.
    assert 3_000 < last.chars_after < last.chars_before
    assert results[4].compaction.compacted_turns == [2]

    text = received_text(server, 5)
    # Constraints and guidance, verbatim.
    assert f"- {CONSTRAINT}" in text
    assert f"- {GUIDANCE}" in text and f"- {LATE_GUIDANCE}" in text
    # The failed attempt, in full: the call and its error.
    assert '"docs/missing.md"' in text and f"ERROR: {FAILED_ERROR}" in text
    # Compacted turns: one line each, never their output in full.
    for turn, name in ((2, "alpha"), (3, "bravo")):
        assert BIG[name] not in text and f"{name} line\n{name} line" not in text
        [line] = [line for line in text.splitlines() if line.startswith(f"- turn {turn}: read_file")]
        assert f"docs/{name}.md" in line and f"{name.upper()}-CONTENT" in line
        assert store.put_text(BIG[name]).digest in line  # the same artifact the tool stored
    # The current stage (the last K=2 turns) as it was.
    assert BIG["charlie"] in text and OUTPUTS[5] in text

    # Only the prompt was compacted: the stored transcript has everything.
    full = json.dumps(store.get_json(results[-1].transcript))
    assert last.full_transcript == results[-1].transcript
    assert json.dumps(BIG["alpha"]) in full and json.dumps(BIG["bravo"]) in full
    sent = store.get_json(last.sent_prompt)
    assert sum(m.get("content", "").startswith(COMPACTED_HEADER) for m in sent) == 1
    assert len(sent) < len(store.get_json(results[-1].transcript))


async def test_the_sent_prompt_keeps_the_last_units_as_real_tool_messages(store):
    assert KEEP_LAST_UNITS == 2  # the layout below assumes the default current stage
    server, _ = await drive(store, openai_profile, threshold=3_000)
    messages = server.bodies[5]["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",  # step message
        "assistant",  # turn 1: the failed call …
        "tool",  # … and its error
        "user",  # turns 2 and 3, compacted
        "user",  # late guidance, in place
        "assistant",
        "tool",  # turn 4
        "assistant",
        "tool",  # turn 5, whose result is this turn's input
    ]
    assert messages[4]["content"].startswith(COMPACTED_HEADER)
    assert messages[4]["content"].count("\n- turn ") == 2
    assert messages[7]["content"] == BIG["charlie"]
    assert messages[3]["content"] == f"ERROR: {FAILED_ERROR}"


async def test_below_the_threshold_the_prompt_is_the_transcript(store):
    server, results = await drive(store, openai_profile, threshold=None)
    assert all(r.compaction is None for r in results)
    server_default, results_default = await drive(store, openai_profile, threshold=24_000)
    assert all(r.compaction is None for r in results_default)
    for srv, res in ((server, results), (server_default, results_default)):
        received = [m.get("content") or "" for m in srv.bodies[-1]["messages"]]
        transcript = store.get_json(res[-1].transcript)[:-1]  # without the final reply
        assert received == [m.get("content", "") for m in transcript]
        assert BIG["alpha"] in received and BIG["bravo"] in received


async def test_past_the_soft_budget_gate_the_threshold_drops(store):
    # Degraded (budget past the soft gate): the goal's 24,000 becomes DEGRADED_INPUT_CHARS (8,000).
    _, results = await drive(store, openai_profile, threshold=24_000, degraded=True)
    assert results[-1].compaction is not None and results[-1].compaction.chars_before < 24_000
    _, results = await drive(store, openai_profile, threshold=None, degraded=True)
    assert all(r.compaction is None for r in results)


@pytest.mark.slow
async def test_a_turn_over_the_models_context_window_is_compacted_to_fit_whatever_the_goals_threshold(store):
    """A profile whose window holds 9,000 characters of messages beside the reply and the
    tools' schemas: with no threshold of the goal's (None: never), the turns that would not fit
    are compacted to fit, and every request sent fits (issue 34)."""
    from perdure.activities.models import context_window

    fits = 9_000
    tools = context_window.tools_chars(agent_tools(["read_file", "list_dir", COMPACTION_TOOL]))
    window = 2_048 + -(-(fits + tools) // context_window.CHARS_PER_TOKEN)

    def small_window(server):
        return openai_profile(server).model_copy(update={"context_window": window})

    server, results = await drive(store, small_window, threshold=None)
    assert len(results) == 6 and results[-1].final is not None
    compacted = [r.compaction for r in results if r.compaction is not None]
    assert compacted and all(c.chars_before > fits >= c.chars_after for c in compacted)
    for body in server.bodies:
        messages = [ChatMessage(role=m["role"], content=m.get("content") or "") for m in body["messages"]]
        calls = sum(
            len(c["function"]["name"]) + len(c["function"]["arguments"])
            for m in body["messages"]
            for c in m.get("tool_calls") or []
        )
        assert prompt_chars(messages) + calls <= fits


@pytest.mark.slow
async def test_a_goals_agent_node_compacts_records_it_and_reads_a_compacted_output_back(
    env, task_queue, tmp_path, workspace
):
    """The same story through the real workflow, tools and worker: the goal's threshold
    reaches the activity, the node keeps the record, and on a compacted turn the model
    may read a shortened output in full by the digest its line shows."""
    (workspace / "docs").mkdir()
    for name, text in BIG.items():
        (workspace / f"docs/{name}.md").write_text(text)
    read = [{"name": "read_file", "arguments": {"path": f"docs/{name}.md"}} for name in ("missing", *BIG)]
    alpha = sha256_digest(BIG["alpha"].encode())
    script = [
        {"when_last": "step: survey", "times": 1, "tool_calls": [read[0]]},
        {"when_last": "ERROR:", "times": 1, "tool_calls": [read[1]]},
        {"when_last": "ALPHA-CONTENT", "times": 1, "tool_calls": [read[2]]},
        {"when_last": "BRAVO-CONTENT", "times": 1, "tool_calls": [read[3]]},
        {
            "when_last": "CHARLIE-CONTENT",
            "times": 1,
            "tool_calls": [{"name": "read_artifact", "arguments": {"digest": alpha}}],
        },
        {"when_last": "ALPHA-CONTENT", "content": "The docs cover alpha, bravo and charlie."},
    ]
    plan = {"steps": [{"name": "survey", "kind": "agent", "tools": ["read_file"], "prompt": "Read the docs."}]}
    goal_store = DiskArtifactStore(tmp_path / "artifacts")
    with RecordingServer({"replies": script}) as server:
        async with running_worker(env, task_queue, goal_store, openai_profile(server)):
            handle, result = await run_goal(
                env, task_queue, spec(workspace, plan=plan, compact_context_after_chars=3_000, drift_every=0)
            )
            snapshot = await handle.query(GoalWorkflow.progress)
    assert result.outcome == "succeeded", result.excerpt
    [node] = snapshot.nodes
    assert node.compactions == 2  # turn 5: turn 2 (alpha) compacted; 1 failed, 3-4 current; turn 6 too
    offered = [seen_openai(body).tools for body in server.bodies]
    assert ["read_artifact" in tools for tools in offered] == [False, False, False, False, True, True]
    assert f"[{alpha}]" in received_text(server, 4)  # the line names the digest it can be read back by
    assert BIG["alpha"] in seen_openai(server.bodies[5]).last_text  # read back in full
    assert node.placements["read_artifact"].startswith("local activity: read")
    text = received_text(server, 4)
    assert "Do not modify notes/." in text  # the goal's constraint
    assert '"docs/missing.md"' in text and "ERROR:" in text  # the failed attempt
    assert BIG["alpha"] not in text and BIG["charlie"] in text
