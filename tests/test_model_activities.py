"""The model activities against a scripted server, through the real openai and anthropic clients."""

from __future__ import annotations

import json

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.models.model_activities import (
    EXAMPLE_PLAN,
    LAST_TURN_NOTE,
    MAX_TOOL_RESULT_CHARS,
    NO_FINAL_ANSWER,
    ModelActivities,
    parse_plan_reply,
)
from perdure.activities.models.profiles import ModelConfig, ModelProfile
from perdure.activities.models.scripted import ScriptedServer
from perdure.activities.tools.catalogue import DEFAULT_TOOLS
from perdure.workflows.goal.contracts.goal_contracts import (
    Activities,
    AgentTurnInput,
    GenerateInput,
    ModelContext,
    PlanInput,
)
from perdure.workflows.goal.contracts.plan import parse_plan
from perdure.workflows.shared.contracts import ToolResult

CONSTRAINT = "Never delete files; keep the README under 200 words."
GOOD_PLAN = {
    "steps": [
        {"name": "look", "kind": "tool", "tool": "list_dir", "args": {"path": "."}},
        {"name": "sum", "kind": "llm", "prompt": "Summarise.", "needs": ["look"]},
    ]
}
BAD_PLAN = {"steps": [{"name": "sum", "kind": "llm", "prompt": "Summarise.", "needs": ["ghost"]}]}


@pytest.fixture
def store(tmp_path):
    return DiskArtifactStore(tmp_path / "artifacts")


@pytest.fixture
def scripted(store):
    """Start a server for a script; returns (activities, server). Profiles: `gpt` (OpenAI wire) and `claude`."""
    servers: list[ScriptedServer] = []

    def start(replies: list[dict]) -> tuple[ModelActivities, ScriptedServer]:
        server = ScriptedServer({"replies": replies}).start()
        servers.append(server)
        config = ModelConfig(
            profiles={
                "gpt": ModelProfile(
                    name="gpt",
                    provider="openai",
                    model="gpt-test",
                    base_url=server.openai_base_url,
                    price_input_per_mtok=1.0,
                    price_output_per_mtok=2.0,
                ),
                "claude": ModelProfile(
                    name="claude", provider="anthropic", model="claude-test", base_url=server.base_url
                ),
            }
        )
        return ModelActivities(config, store), server

    yield start
    for server in servers:
        server.stop()


def context(profile: str = "gpt") -> ModelContext:
    return ModelContext(profile=profile, goal="Tidy the project docs.", constraints=[CONSTRAINT])


async def run(fn, arg):
    return await ActivityEnvironment().run(fn, arg)


def test_activity_names_are_the_contract_names(store):
    acts = ModelActivities(ModelConfig(profiles={}), store)
    names = [fn.__temporal_activity_definition.name for fn in acts.activities()]
    assert names == [Activities.PLAN, Activities.GENERATE, Activities.AGENT_TURN, Activities.DRIFT_CHECK]


# --- plan -----------------------------------------------------------------------


async def test_plan_returns_a_valid_plan_priced_from_the_profile(scripted, store):
    # `when` on the constraint text proves it reached the system prompt verbatim.
    acts, server = scripted(
        [{"when": f"- {CONSTRAINT}", "json": GOOD_PLAN, "usage": {"input_tokens": 1000, "output_tokens": 500}}]
    )
    result = await run(acts.plan, PlanInput(context=context(), allowed_tools=DEFAULT_TOOLS))
    assert result.error is None
    assert [s.name for s in result.plan.steps] == ["look", "sum"]
    assert json.loads(store.get_text(result.raw)) == GOOD_PLAN
    assert (result.usage.input_tokens, result.usage.output_tokens) == (1000, 500)
    assert result.usage.cost_usd == pytest.approx(0.002)
    assert result.model == "gpt-test"
    [logged] = server.requests()
    assert logged["json_mode"] is True
    assert logged["has_tools"] is False
    assert logged["last_message"] == "Goal:\nTidy the project docs."


async def test_plan_prompt_carries_marker_and_tool_catalogue(scripted):
    acts, server = scripted([{"when": "PERDURE-PLANNER", "when_last": "Goal:", "json": GOOD_PLAN, "times": 1}])
    await run(acts.plan, PlanInput(context=context(), allowed_tools=["list_dir"]))
    assert server.requests()[0]["matched"] == 0
    # A second, different catalogue must not match a script keyed on a tool that is no longer offered.
    acts, server = scripted([{"when": "write_file (risk: local-write)", "json": GOOD_PLAN}])
    with pytest.raises(ApplicationError, match="no reply matches"):
        await run(acts.plan, PlanInput(context=context(), allowed_tools=["list_dir"]))


async def test_invalid_plan_is_an_error_result_not_an_exception(scripted):
    acts, _ = scripted([{"when": "PERDURE-PLANNER", "json": BAD_PLAN}])
    result = await run(acts.plan, PlanInput(context=context(), allowed_tools=DEFAULT_TOOLS))
    assert result.plan is None
    assert "ghost" in result.error and "unknown step" in result.error


async def test_disallowed_tool_is_reported(scripted):
    acts, _ = scripted([{"when": "PERDURE-PLANNER", "json": GOOD_PLAN}])
    result = await run(acts.plan, PlanInput(context=context(), allowed_tools=["read_file"]))
    assert result.plan is None
    assert "list_dir" in result.error and "not allowed" in result.error


async def test_prose_reply_is_reported_as_not_json(scripted):
    acts, _ = scripted([{"when": "PERDURE-PLANNER", "content": "Sure! Here is my plan: first look around."}])
    result = await run(acts.plan, PlanInput(context=context(), allowed_tools=DEFAULT_TOOLS))
    assert result.plan is None
    assert result.error.startswith("reply is not JSON")


async def test_repair_sends_the_rejected_reply_and_the_reason(scripted):
    acts, server = scripted(
        [
            # Matches only when the rejected reply (which names "ghost") is in the conversation.
            {"when": '"ghost"', "when_last": "Your plan was rejected", "json": GOOD_PLAN},
            {"when": "PERDURE-PLANNER", "json": BAD_PLAN},
        ]
    )
    first = await run(acts.plan, PlanInput(context=context(), allowed_tools=DEFAULT_TOOLS))
    assert first.plan is None
    repaired = await run(
        acts.plan,
        PlanInput(context=context(), allowed_tools=DEFAULT_TOOLS, attempt=2, rejected=first.raw, rejection=first.error),
    )
    assert repaired.error is None and repaired.plan is not None
    last = server.requests()[-1]
    assert last["matched"] == 0
    assert last["last_message"] == (
        f"Your plan was rejected: {first.error}. Reply with the corrected plan as JSON only."
    )


def test_example_plan_is_valid_and_fences_are_stripped():
    plan, error = parse_plan(EXAMPLE_PLAN, DEFAULT_TOOLS)
    assert error is None and plan is not None
    fenced = "```json\n" + json.dumps(GOOD_PLAN) + "\n```"
    assert parse_plan_reply(fenced, DEFAULT_TOOLS)[0].steps[0].name == "look"
    wrapped = "Here it is: " + json.dumps(GOOD_PLAN) + " Hope that helps."
    assert parse_plan_reply(wrapped, DEFAULT_TOOLS)[1] is None


# --- generate ---------------------------------------------------------------------


async def test_generate_sends_inputs_and_stores_the_output(scripted, store):
    long_text = "The summary. " * 50
    acts, server = scripted(
        [{"when": "PERDURE-STEP", "when_last": "--- input from step 'look' ---\nREADME.md\nsrc", "content": long_text}]
    )
    listing = store.put_text("README.md\nsrc")
    result = await run(
        acts.generate,
        GenerateInput(context=context(), step="sum", prompt="Summarise the listing.", inputs={"look": listing}),
    )
    assert store.get_text(result.output) == long_text
    assert len(result.preview) <= 200 and result.preview.startswith("The summary.")
    assert result.usage.output_tokens == len(long_text) // 4
    assert server.requests()[0]["last_message"].startswith("step: sum\n\nSummarise the listing.")


async def test_unknown_profile_is_non_retryable_and_lists_known_names(scripted):
    acts, _ = scripted([{"content": "x"}])
    with pytest.raises(ApplicationError) as caught:
        await run(acts.generate, GenerateInput(context=context("nope"), step="s", prompt="p"))
    assert (caught.value.type, caught.value.non_retryable) == ("UnknownModelProfile", True)
    assert "claude, default, gpt" in caught.value.message


async def test_provider_failure_surfaces_as_retryable_application_error(scripted):
    acts, _ = scripted([{"status": 503, "headers": {"Retry-After": "7"}}])
    with pytest.raises(ApplicationError) as caught:
        await run(acts.generate, GenerateInput(context=context(), step="s", prompt="p"))
    assert (caught.value.type, caught.value.non_retryable) == ("ModelRetryable", False)
    assert caught.value.next_retry_delay.total_seconds() == 7


# --- agent_turn -------------------------------------------------------------------

AGENT_SCRIPT = [
    {"when_last": "last turn", "tool_calls": [{"name": "read_file", "arguments": {"path": "x"}}]},
    {
        "when": "PERDURE-AGENT",
        "when_last": "step: explore",
        "tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}],
    },
    {"when_last": "ERROR: no such file", "content": "The README is missing."},
    {"when_last": "README CONTENT", "content": "The README says hello."},
]


def agent_input(profile: str = "gpt", **extra) -> AgentTurnInput:
    fields = dict(
        context=context(profile),
        step="explore",
        prompt="Find out what the README says.",
        tools=["read_file", "list_dir"],
        turn=1,
        max_turns=4,
    )
    return AgentTurnInput(**(fields | extra))


@pytest.mark.parametrize("profile", ["gpt", "claude"])
async def test_agent_calls_a_tool_then_answers(scripted, store, profile):
    acts, server = scripted(AGENT_SCRIPT)
    first = await run(acts.agent_turn, agent_input(profile))
    assert first.final is None
    [call] = first.tool_calls
    assert call.tool == "read_file"
    assert json.loads(store.get_text(call.args)) == {"path": "README.md"}
    assert "read_file" in first.preview
    assert len(store.get_json(first.transcript)) == 3
    assert server.requests()[0]["tools"] == ["read_file", "list_dir"]
    assert server.requests()[0]["flavour"] == ("openai" if profile == "gpt" else "anthropic")

    output = store.put_text("README CONTENT: hello")
    second = await run(
        acts.agent_turn,
        agent_input(
            profile,
            turn=2,
            transcript=first.transcript,
            tool_results=[ToolResult(call_id=call.call_id, tool="read_file", ok=True, output=output)],
        ),
    )
    assert second.tool_calls == []
    assert store.get_text(second.final) == "The README says hello."
    transcript = store.get_json(second.transcript)
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool", "assistant"]
    assert transcript[3] == {"role": "tool", "content": "README CONTENT: hello", "tool_call_id": call.call_id}
    assert server.requests()[1]["matched"] == 3


@pytest.mark.parametrize("profile", ["gpt", "claude"])
async def test_failed_tool_goes_back_to_the_model_as_data(scripted, profile):
    acts, server = scripted(AGENT_SCRIPT)
    first = await run(acts.agent_turn, agent_input(profile))
    failed = ToolResult(
        call_id=first.tool_calls[0].call_id, tool="read_file", ok=False, error="no such file: README.md"
    )
    second = await run(
        acts.agent_turn, agent_input(profile, turn=2, transcript=first.transcript, tool_results=[failed])
    )
    assert second.preview == "The README is missing."
    assert server.requests()[-1]["last_message"] == "ERROR: no such file: README.md"


@pytest.mark.parametrize("profile", ["gpt", "claude"])
async def test_last_turn_offers_no_tools_and_ignores_late_calls(scripted, store, profile):
    acts, server = scripted(AGENT_SCRIPT)
    first = await run(acts.agent_turn, agent_input(profile, max_turns=2))
    result = ToolResult(call_id=first.tool_calls[0].call_id, tool="read_file", ok=True, output=store.put_text("x"))
    last = await run(
        acts.agent_turn, agent_input(profile, max_turns=2, turn=2, transcript=first.transcript, tool_results=[result])
    )
    logged = server.requests()[-1]
    assert logged["has_tools"] is False
    assert LAST_TURN_NOTE in logged["last_message"]
    # The script still answers with a tool call; on the last turn that can never run.
    assert last.tool_calls == []
    assert store.get_text(last.final) == NO_FINAL_ANSWER
    assert "tool_calls" not in store.get_json(last.transcript)[-1]


async def test_tool_results_are_capped_and_missing_results_answered(scripted, store):
    acts, _ = scripted(
        [
            {
                "when_last": "step: explore",
                "tool_calls": [
                    {"name": "read_file", "arguments": {"path": "a"}},
                    {"name": "list_dir", "arguments": {}},
                ],
            },
            {"when_last": "not run", "content": "done"},
        ]
    )
    first = await run(acts.agent_turn, agent_input())
    big = store.put_text("y" * 100_000)
    only_first = [ToolResult(call_id=first.tool_calls[0].call_id, tool="read_file", ok=True, output=big)]
    second = await run(acts.agent_turn, agent_input(turn=2, transcript=first.transcript, tool_results=only_first))
    tool_messages = [m for m in store.get_json(second.transcript) if m["role"] == "tool"]
    assert len(tool_messages) == 2
    assert MAX_TOOL_RESULT_CHARS < len(tool_messages[0]["content"]) < MAX_TOOL_RESULT_CHARS + 100
    assert "truncated" in tool_messages[0]["content"]
    assert tool_messages[1]["tool_call_id"] == first.tool_calls[1].call_id
    assert tool_messages[1]["content"].startswith("ERROR: the call was not run")


async def test_generate_with_anthropic_profile(scripted, store):
    acts, server = scripted([{"when": "PERDURE-STEP", "content": "from claude"}])
    result = await run(acts.generate, GenerateInput(context=context("claude"), step="s", prompt="p"))
    assert store.get_text(result.output) == "from claude"
    assert result.model == "claude-test"
    assert result.usage.cost_usd == 0.0
    assert server.requests()[0]["flavour"] == "anthropic"


def test_a_models_plan_is_held_to_fewer_steps_than_a_plan_file():
    steps = [{"name": f"s{i}", "kind": "tool", "tool": "list_dir", "args": {}} for i in range(65)]
    plan, error = parse_plan_reply(json.dumps({"steps": steps}), DEFAULT_TOOLS)
    assert plan is None and error == "the plan has 65 steps; at most 64: merge steps or plan a first stage"
    assert parse_plan_reply(json.dumps({"steps": steps[:64]}), DEFAULT_TOOLS)[1] is None
