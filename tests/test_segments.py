"""The segmentation rule: where each tool call runs, decided in one place from the tool's
risk class, replay policy and expected duration."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.activities.tools.catalogue.file_tools import ReadFileArgs
from perdure.workflows.goal.rules.segments import DEFAULT_LOCAL_UP_TO_S, batches, may_run_locally, place, place_tool
from perdure.workflows.shared.contracts import ArtifactRef, ToolInput
from perdure.workflows.shared.tool_specs import ToolSpec


def tool(risk: str, replay: str = "safe", expected_s: float | None = 0.1) -> ToolSpec:
    return ToolSpec(name="t", risk=risk, replay=replay, description="", args_model=ReadFileArgs, expected_s=expected_s)


def test_a_short_read_runs_in_a_segment():
    placement = place(tool("read"))
    assert placement.local
    assert placement.describe().startswith("local activity: read, safe to re-run")


def test_a_short_workspace_write_that_is_safe_to_repeat_runs_in_a_segment():
    assert place(tool("local-write")).local


def test_every_outside_effect_is_its_own_activity_whatever_its_duration():
    for risk in ("remote-write", "irreversible"):
        for replay in ("safe", "keyed", "check", "once"):
            placement = place(tool(risk, replay, expected_s=0.01))
            assert placement.where == "activity"
            assert placement.why.startswith(f"{risk}: a side effect gets its own checkpoint")


def call(args: dict | None = None, args_ref: bool = False) -> ToolInput:
    ref = ArtifactRef(digest="sha256:" + "0" * 64, size=2) if args_ref else None
    return ToolInput(goal_id="g", node_key="n", tool="t", workspace="/ws", args=args, args_ref=ref)


FIXED = call({"method": "POST", "url": "https://ledger.example/entries", "body": {"n": 1}})


def test_with_local_keyed_writes_a_write_whose_rerun_is_harmless_runs_alone_as_a_local_activity():
    for risk, replay in (("remote-write", "keyed"), ("remote-write", "check"), ("local-write", "check")):
        for expected_s in (None, 0.5):
            placement = place(tool(risk, replay, expected_s), keyed_writes=True, call=FIXED)
            assert placement.local and placement.alone and not placement.in_segment, (risk, replay)
            assert placement.why.startswith(f"{risk}, a re-run ")
    # Never a once or an irreversible call: its activity is the intent recorded before the call.
    for risk, replay in (("remote-write", "once"), ("irreversible", "keyed"), ("irreversible", "check")):
        assert place(tool(risk, replay), keyed_writes=True, call=FIXED).where == "activity", (risk, replay)
    # Nor a long one, nor in a goal that turned local activities off.
    assert place(tool("remote-write", "keyed", expected_s=30), keyed_writes=True, call=FIXED).where == "activity"
    assert place(tool("remote-write", "keyed"), local_up_to_s=0, keyed_writes=True, call=FIXED).where == "activity"


def test_a_harmless_write_keeps_its_activity_unless_it_is_fixed_at_plan_time_and_has_nothing_to_undo():
    # A local activity records nothing before it runs: a rollback, rewind or narrowing
    # applied by the worker taking over could stop the step before its effect is recorded.
    keyed = tool("remote-write", "keyed")
    undone = place(keyed, keyed_writes=True, call=FIXED, undoable=True)
    assert undone.where == "activity" and "undo" in undone.why
    templated = call({"method": "POST", "url": "https://l.example/e", "body": {"after": "{{steps.first}}"}})
    assert place(keyed, keyed_writes=True, call=templated).where == "activity"
    assert "other steps' outputs" in place(keyed, keyed_writes=True, call=templated).why
    assert "a model's" in place(keyed, keyed_writes=True, call=call(args_ref=True)).why
    assert place(keyed, keyed_writes=True).where == "activity"  # no call: not known yet
    assert place(keyed, keyed_writes=True, call=FIXED).local


@given(
    st.sampled_from(["read", "local-write", "remote-write", "irreversible"]),
    st.sampled_from(["safe", "keyed", "check", "once"]),
    st.booleans(),
    st.sampled_from(["fixed", "templated", "model"]),
)
def test_a_local_write_is_always_fixed_and_without_undo(risk, replay, undoable, args):
    made = {"fixed": FIXED, "templated": call({"body": "{{steps.a}}"}), "model": call(args_ref=True)}[args]
    placement = place(tool(risk, replay), keyed_writes=True, call=made, undoable=undoable)
    if placement.local and risk != "read" and replay != "safe":
        assert placement.alone and args == "fixed" and not undoable
    # What the goal places locally, a worker agrees may run locally (run_tool checks its own declaration).
    if placement.local:
        assert may_run_locally(tool(risk, replay))
    # Reads stay in segments; one that is not free to repeat (a paid read) stays an activity.
    assert place(tool("read"), keyed_writes=True).in_segment
    assert place(tool("read", "keyed"), keyed_writes=True).where == "activity"


def test_a_call_that_is_not_free_to_repeat_is_an_activity():
    for replay in ("keyed", "check", "once"):
        placement = place(tool("read", replay))
        assert placement.where == "activity" and f"'{replay}'" in placement.why


def test_long_or_unpredictable_calls_are_activities_that_heartbeat():
    assert "expected 5 s > 2 s" in place(tool("read", expected_s=5)).why
    assert not place(tool("read", expected_s=None)).local
    assert not place(tool("read", expected_s=0.1), local_up_to_s=0).local
    assert place(tool("read", expected_s=5), local_up_to_s=10).local


def test_unknown_tools_are_activities():
    assert place_tool("no_such_tool").where == "activity"


def test_the_catalogue_places_reads_locally_and_every_effect_remotely():
    where = {name: place_tool(name).where for name in TOOL_SPECS}
    assert where["read_file"] == where["list_dir"] == where["write_file"] == "local"
    # A command or a network fetch takes as long as something outside the worker decides.
    assert where["run_command"] == where["http_get"] == "activity"
    for name, spec in TOOL_SPECS.items():
        if spec.risk in ("remote-write", "irreversible"):
            assert where[name] == "activity", name


@given(
    st.sampled_from(["read", "local-write", "remote-write", "irreversible"]),
    st.sampled_from(["safe", "keyed", "check", "once"]),
    st.one_of(st.none(), st.floats(min_value=0.001, max_value=1e4)),
    st.floats(min_value=0, max_value=1e4),
)
def test_only_short_replay_safe_calls_without_outside_effects_are_ever_local(risk, replay, expected, limit):
    placement = place(tool(risk, replay, expected), limit)
    eligible = risk in ("read", "local-write") and replay == "safe" and expected is not None
    assert placement.local == (eligible and 0 < limit and expected <= limit)
    assert placement.why


@given(st.lists(st.booleans(), max_size=30))
def test_batches_keep_the_models_order_and_never_group_an_activity(local):
    groups = batches(local)
    assert [i for group in groups for i in group] == list(range(len(local)))
    for group in groups:
        assert len(group) == 1 or all(local[i] for i in group)
    # Neighbouring local calls are never split.
    for left, right in zip(groups, groups[1:], strict=False):
        assert not (local[left[-1]] and local[right[0]])


def test_default_limit_is_the_goal_specs_default():
    from perdure.workflows.goal.contracts.goal_contracts import GoalSpec

    assert GoalSpec(goal="g", workspace="/w").local_activities_up_to_s == DEFAULT_LOCAL_UP_TO_S
