"""Plan validation: every rejection says what was wrong, in words a model can act on."""

from __future__ import annotations

from perdure.workflows.goal.contracts.plan import parse_plan

TOOLS = ["read_file", "write_file", "list_dir"]


def step(name, **fields):
    fields.setdefault("kind", "llm")
    if fields["kind"] in ("llm", "agent"):
        fields.setdefault("prompt", "p")
    return {"name": name, **fields}


def test_valid_plan_parses():
    plan, problem = parse_plan(
        {"steps": [step("a"), step("b", kind="tool", tool="read_file", args={"path": "{{steps.a}}"}, needs=["a"])]},
        TOOLS,
    )
    assert problem is None and [s.name for s in plan.steps] == ["a", "b"]


def test_rejections_name_the_problem():
    cases = {
        "steps: List should have at least 1 item": {"steps": []},
        "unique; repeated: a": {"steps": [step("a"), step("a")]},
        "needs unknown step(s): zz": {"steps": [step("a", needs=["zz"])]},
        "depends on itself": {"steps": [step("a", needs=["a"])]},
        "cycle: a -> b -> a": {"steps": [step("a", needs=["b"]), step("b", needs=["a"])]},
        "unknown tool 'rm'": {"steps": [step("a", kind="tool", tool="rm")]},
        "tool 'http_get' is not allowed": {
            "steps": [step("a", kind="tool", tool="http_get", args={"url": "http://x"})]
        },
        "bad arguments for read_file: path: Field required": {"steps": [step("a", kind="tool", tool="read_file")]},
        "does not list 'a' in needs": {
            "steps": [step("a"), step("b", kind="tool", tool="read_file", args={"path": "{{steps.a}}"})]
        },
        "steps.0.llm.name: String should match pattern": {"steps": [step("Bad Name")]},
        "Input tag 'shell' found using 'kind' does not match": {"steps": [step("a", kind="shell")]},
    }
    for expected, data in cases.items():
        plan, problem = parse_plan(data, TOOLS)
        assert plan is None, expected
        assert expected in problem, (expected, problem)


def test_agent_tools_must_be_allowed():
    plan, problem = parse_plan({"steps": [step("a", kind="agent", tools=["run_command"])]}, TOOLS)
    assert plan is None and "step 'a': tool 'run_command' is not allowed" in problem


def test_not_a_mapping_is_rejected():
    plan, problem = parse_plan(["not", "a", "plan"], TOOLS)
    assert plan is None and problem


def test_a_plan_file_may_have_thousands_of_steps_but_not_unbounded():
    chain = [
        {"name": f"s{i}", "kind": "tool", "tool": "list_dir", "needs": [f"s{i - 1}"] if i else []} for i in range(2000)
    ]
    plan, error = parse_plan({"steps": chain}, ["list_dir"])
    assert error is None and len(plan.steps) == 2000
    too_many = [{"name": f"s{i}", "kind": "tool", "tool": "list_dir"} for i in range(100_001)]
    plan, error = parse_plan({"steps": too_many}, ["list_dir"])
    assert plan is None and "100000" in error


def test_a_long_chain_listed_last_step_first_is_checked_without_recursion():
    chain = [
        {"name": f"s{i}", "kind": "tool", "tool": "list_dir", "needs": [f"s{i - 1}"] if i else []} for i in range(5000)
    ]
    plan, error = parse_plan({"steps": list(reversed(chain))}, ["list_dir"])
    assert error is None and len(plan.steps) == 5000
    chain[0]["needs"] = ["s4999"]
    plan, error = parse_plan({"steps": list(reversed(chain))}, ["list_dir"])
    assert plan is None and "cycle" in error


def test_a_plan_declaring_replay_safe_on_a_tool_with_its_own_policy_is_refused_with_the_reason():
    hook = {"url": "https://hooks.example.com/x", "payload": {}}
    step = {"name": "notice", "kind": "tool", "tool": "notify_webhook", "args": hook, "replay": "safe"}
    plan, reason = parse_plan({"steps": [step]}, ["notify_webhook"])
    assert plan is None
    assert "`replay: safe` is only for run_command" in reason and "keeps its own replay policy 'once'" in reason


def test_a_plan_giving_the_network_to_a_step_that_is_not_a_command_is_refused_with_the_reason():
    step = {"name": "page", "kind": "tool", "tool": "http_get", "args": {"url": "https://example.com"}}
    plan, reason = parse_plan({"steps": [step | {"network": True}]}, ["http_get"])
    assert plan is None and "`network: true` is only for run_command" in reason
