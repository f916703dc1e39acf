"""Stall detection by new information: normalisation, staleness, the ladder, parked nodes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from perdure.workflows.goal.rules.stall import (
    LADDER,
    StallState,
    ask_human_message,
    describe_call,
    fingerprint,
    normalise_output,
    novelty,
    observe_step,
    remind_message,
    switch_tool_message,
)

CALL = describe_call("read_file", {"path": "src/app.py"})


def listing(i: int) -> str:
    """The same tool output as run i would print it: only volatile tokens differ."""
    return (
        f"[2024-05-0{1 + i % 9}T12:0{i % 10}:3{i % 10}.{i}Z] request {i:08x}-aaaa-4bbb-8ccc-{i:012x} "
        f"took {0.3 + i:.2f}s, pid {100000 + i}\n  src/app.py  main.py   README.md   commit 9f{i:05x}e"
    )


def fresh(i: int) -> str:
    return f"finding {i}: module {chr(97 + i % 26)}{i} exports function handler_{i} used by service_{i * 7}"


def run(state: StallState, texts: list[str], **kwargs):
    actions = []
    for text in texts:
        state, action = observe_step(state, [text], calls=[CALL], **kwargs)
        actions.append(action.kind if action else None)
    return state, actions


def test_normalisation_strips_volatile_tokens():
    assert normalise_output(listing(1)) == normalise_output(listing(7))
    assert normalise_output("  Hello\n\tWORLD  ") == "hello world"
    assert "deadbeef" in normalise_output("the deadbeef facade")
    assert normalise_output("found 3 files") != normalise_output("found 4 files")


def test_repeated_output_with_different_timestamps_and_ids_is_stale():
    first = fingerprint([listing(1)])
    assert novelty([], first) == 1.0
    assert novelty([first], fingerprint([listing(2)])) == 0.0
    assert novelty([first], fingerprint([fresh(1)])) == 1.0
    assert novelty([first], fingerprint([])) == 0.0


def test_ladder_fires_in_order_each_once_after_threshold_stale_steps():
    state, actions = run(StallState(), [listing(i) for i in range(1 + 4 * 3 + 5)])
    assert actions[0] is None  # the first run is new information
    fired = [(i, a) for i, a in enumerate(actions) if a]
    assert fired == [(3, "remind"), (6, "switch_tool"), (9, "ask_human"), (12, "abandon")]
    assert state.rung == len(LADDER)


def test_new_information_resets_the_count_but_not_the_rung():
    steps = [listing(0), listing(1), listing(2), listing(3)]  # third stale step: remind
    steps += [listing(4), listing(5), fresh(1)]  # two stale, then new information
    steps += [listing(6), listing(7)]  # two stale: not enough
    steps += [listing(8)]  # third stale since fresh: switch_tool, not remind again
    state, actions = run(StallState(), steps)
    assert [a for a in actions if a] == ["remind", "switch_tool"]
    assert actions[3] == "remind" and actions[9] == "switch_tool"


def test_window_forgets_old_output():
    state, actions = run(StallState(), [listing(0)] + [fresh(i) for i in range(1, 4)], window=2)
    assert len(state.recent) == 2
    # listing(0) has left the two-step window, so seeing it again is new.
    state, action = observe_step(state, [listing(9)], window=2)
    assert state.stale_steps == 0 and action is None


def test_parked_never_advances():
    state, _ = run(StallState(), [listing(i) for i in range(3)])
    assert state.stale_steps == 2
    for i in range(20):
        after, action = observe_step(state, [listing(i)], parked=True)
        assert action is None and after == state


def test_empty_steps_are_stale():
    state, actions = run(StallState(), ["", "", ""])
    assert actions == [None, None, "remind"]


def test_observe_does_not_modify_its_input():
    state = StallState()
    observe_step(state, [listing(0)], calls=[CALL])
    assert state == StallState()


def test_the_action_and_messages_list_what_was_tried():
    state, action = StallState(), None
    for i in range(4):
        state, action = observe_step(state, [listing(i)], calls=[CALL])
    assert action is not None and action.kind == "remind" and action.tried == [CALL] * 3
    assert "3 consecutive steps added no new information" in action.reason
    text = remind_message(action.tried, 3)
    assert 'read_file(path="src/app.py") ×3' in text and "last 3 steps added no new information" in text
    switch = switch_tool_message(action.tried, ["read_file", "search_web", "list_dir"])
    assert "Stop using read_file" in switch and "search_web, list_dir" in switch
    assert 'read_file(path="src/app.py") ×3' in ask_human_message("survey", action.tried)


def test_describe_call_is_stable_and_short():
    assert describe_call("t", {"b": 1, "a": "x"}) == describe_call("t", {"a": "x", "b": 1}) == 't(a="x", b=1)'
    assert len(describe_call("t", {"a": "x" * 500})) == 100
    assert describe_call("list_dir") == "list_dir()"


@given(outputs=st.lists(st.text(max_size=200), max_size=4))
def test_a_step_never_adds_to_itself(outputs):
    printed = fingerprint(outputs)
    assert fingerprint(outputs) == printed
    assert novelty([printed], printed) == 0.0
    assert novelty([printed], fingerprint(list(reversed(outputs)))) == 0.0


@given(
    texts=st.lists(st.sampled_from([listing(1), listing(2), fresh(1), fresh(2), "", "ok"]), max_size=40),
    parked=st.lists(st.booleans(), max_size=40),
)
def test_ladder_is_a_prefix_in_order_whatever_happens(texts, parked):
    state, fired = StallState(), []
    for i, text in enumerate(texts):
        state, action = observe_step(state, [text], parked=i < len(parked) and parked[i])
        if action:
            fired.append(action.kind)
            assert action.rung == len(fired)
    assert tuple(fired) == LADDER[: len(fired)]
    assert state.rung == len(fired)


def test_fingerprint_is_the_same_in_every_process():
    # Replay needs the same fingerprint on every worker: sha256, never Python's salted hash().
    assert fingerprint(["Hello  world, again!"]) == "06df9fe1"
    assert fingerprint(["hi"]) == "8f434346"
