"""The pure rules around devices: which calls wait for a person, which plans can run on the
devices there are, and what a step's device does to its node key."""

from __future__ import annotations

import pytest

from perdure.activities.tools.catalogue import DEVICE_TOOLS
from perdure.workflows.devices.device_contracts import call_risk, needs_approval
from perdure.workflows.goal.contracts.plan import Plan, ToolStep, check_plan, devices_named, parse_plan
from perdure.workflows.shared.canonical import digest_of
from perdure.workflows.shared.graph import node_key

ALL = list(DEVICE_TOOLS) + ["http_get"]


@pytest.mark.parametrize(
    ("tool", "args", "asks"),
    [
        ("read_file", {"path": "a"}, False),
        ("list_dir", {}, False),
        ("write_file", {"path": "a", "content": "x"}, True),
        ("run_command", {"command": "git status"}, False),
        ("run_command", {"command": "ls -la | grep x"}, False),
        ("run_command", {"command": "rm -rf build"}, True),
        ("run_command", {"command": "cat a > b"}, True),
        ("git_commit", {"message": "m"}, True),
    ],
)
def test_by_default_a_device_call_waits_for_a_person_when_it_can_change_something(tool, args, asks):
    assert needs_approval(tool, args, {}, {}) is asks


def test_a_read_only_command_counts_as_a_read_and_any_other_command_as_a_local_write():
    assert call_risk("run_command", {"command": "git log --oneline"}) == "read"
    assert call_risk("run_command", {"command": "make"}) == "local-write"
    assert call_risk("no_such_tool", {}) is None


def test_the_devices_own_rule_wins_over_the_goals_and_star_covers_every_tool():
    write = ("write_file", {"path": "a", "content": "x"})
    assert needs_approval(*write, {"write_file": "never"}, {"write_file": "always"}) is False
    assert needs_approval(*write, {"*": "always"}, {"write_file": "never"}) is True
    assert needs_approval(*write, {}, {"write_file": "never"}) is False
    assert needs_approval(*write, {}, {"*": "never"}) is False
    assert needs_approval("read_file", {"path": "a"}, {"read_file": "always"}, {}) is True
    assert needs_approval(*write, {"read_file": "never"}, {}) is True  # a rule for another tool does not apply


def _plan(*steps: dict) -> Plan:
    return Plan.model_validate({"steps": list(steps)})


READ_ON_A = {"name": "read", "kind": "tool", "tool": "read_file", "device": "a", "args": {"path": "x"}}


def test_a_step_on_a_device_that_never_announced_itself_is_refused_with_the_devices_there_are():
    problems = check_plan(_plan({**READ_ON_A, "device": "ghost"}), ALL, {"a": ["read_file"], "b": []})
    assert problems == ["step 'read': no device named 'ghost' (devices: a (read_file), b (no tools))"]
    assert check_plan(_plan(READ_ON_A), ALL, {}) == ["step 'read': no device named 'a' (devices: none yet)"]


def test_a_step_needing_a_tool_its_device_does_not_offer_is_refused():
    step = {"name": "save", "kind": "tool", "tool": "write_file", "device": "a", "args": {"path": "x", "content": ""}}
    assert check_plan(_plan(step), ALL, {"a": ["read_file", "list_dir"]}) == [
        "step 'save': device 'a' does not offer write_file (it offers: read_file, list_dir)"
    ]
    assert check_plan(_plan(step), ALL, {"a": list(DEVICE_TOOLS)}) == []


def test_a_tool_a_device_cannot_run_is_refused_even_when_no_registry_was_asked():
    fetch = {"name": "fetch", "kind": "agent", "prompt": "p", "tools": ["http_get", "read_file"], "device": "a"}
    problems = check_plan(_plan(fetch), ALL, None)
    assert len(problems) == 1 and problems[0].startswith("step 'fetch': http_get cannot run on a device")


def test_a_device_name_that_is_not_a_queue_name_is_refused_when_the_plan_is_read():
    plan, problem = parse_plan({"steps": [{**READ_ON_A, "device": "My Laptop"}]}, ALL)
    assert plan is None and "device" in (problem or "") and "pattern" in (problem or "")


def test_devices_named_lists_each_device_once():
    plan = _plan(READ_ON_A, {**READ_ON_A, "name": "again"}, {**READ_ON_A, "name": "b-read", "device": "b"})
    assert devices_named(plan) == ["a", "b"]
    assert devices_named(_plan({**READ_ON_A, "device": None})) == []


def test_a_step_without_a_device_keeps_the_key_it_had_before_devices_existed_and_a_device_changes_it():
    step = ToolStep.model_validate({k: v for k, v in READ_ON_A.items() if k != "device"})
    before = {"kind": "tool", "input": {"kind": "tool", "tool": "read_file", "args": {"path": "x"}}, "deps": {}}
    assert node_key(step, {}) == "node:" + digest_of(before).removeprefix("sha256:")
    on_a, on_b = (ToolStep.model_validate({**READ_ON_A, "device": d}) for d in ("a", "b"))
    assert len({node_key(step, {}), node_key(on_a, {}), node_key(on_b, {})}) == 3
    waits_longer = ToolStep.model_validate({**READ_ON_A, "device_wait_s": 60})
    assert node_key(waits_longer, {}) == node_key(on_a, {})  # how long it waits is not what it computes
