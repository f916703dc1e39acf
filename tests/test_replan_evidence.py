"""Re-planning on evidence (issue 20, section 4): each trigger besides drift fires once on
a scripted scenario, as plan version v2 with source `evidence` and the trigger in its
reason, and is held off by the spacing when its condition holds again (no oscillation);
the re-plan keeps finished work (no kept step is asked again: requests counted at the
scripted server), the constraints and the rejected paths, and does with the steps in
flight what the trigger's policy says. Plus the detectors of workflows/evidence.py, pure.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from tests.builders import agent, gate, llm, openai_profile, spec
from tests.helpers import calls_for, new_goal_id, running_worker, statuses, submit, wait_until
from workflows import evidence
from workflows.evidence import EvidenceLog
from workflows.goal import GoalWorkflow
from workflows.messages import Rewind
from workflows.state import GoalInput

CONSTRAINT = "Do not modify notes/."  # tests.builders.spec's constraint: the planner must still be told it
REVISE = "Revise the current plan"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def start_planned(env, task_queue, workspace, **overrides):
    """A goal the planner plans (re-planning on evidence is for those, not for plan files)."""
    goal = spec(workspace, allowed_tools=["run_command", "read_file"], drift_every=0, **overrides)
    return await env.client.start_workflow(
        GoalWorkflow.run, GoalInput(spec=goal), id=new_goal_id("evidence"), task_queue=task_queue
    )


def revisions(server) -> list[dict]:
    return [r for r in server.requests() if REVISE in r["last_message"]]


def evidence_notes(report: str) -> list[str]:
    return [line.removeprefix("- ") for line in report.splitlines() if "(evidence):" in line]


# --- conflicting evidence ------------------------------------------------------------

SURVEY = llm("survey", prompt="Survey the cache.")
RECHECK = llm("recheck", ["survey"], prompt="Check the cache again.")
CONFIRM = llm("confirm", ["recheck"], prompt="Confirm the cache state.")


async def test_a_contradicted_conclusion_replans_once_cancels_what_is_dropped_and_keeps_finished_work(
    env, task_queue, store, workspace, scripted
):
    server = scripted(
        {
            "replies": [
                {"when": [REVISE, "conflicting evidence", CONSTRAINT], "json": {"steps": [SURVEY, RECHECK, CONFIRM]}},
                {"when": "PERDURE-PLANNER", "times": 1, "json": {"steps": [SURVEY, RECHECK, gate()]}},
                {"when_last": "step: survey", "content": "Conclusion: the cache is stale = true. Built a week ago."},
                {
                    "when_last": "step: recheck",
                    "content": "CONCLUSION: the cache is stale = false; rebuilt last night.",
                },
                # The same claim again, the other way round: the condition holds again.
                {"when_last": "step: confirm", "content": "Conclusion: The cache is STALE = true"},
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_planned(env, task_queue, workspace, evidence_spacing_s=3600)
        try:
            result = await asyncio.wait_for(handle.result(), 60)
        finally:
            (workspace / "GO").touch()
        snapshot = await handle.query(GoalWorkflow.progress)

    [revision] = revisions(server)
    assert (
        "re-plan on evidence (conflicting evidence): step 'recheck' concluded 'the cache is stale' does not hold, "
        "step 'survey' had concluded it holds" in revision["last_message"]
    )
    assert "- the cache is stale: does not hold (step 'recheck')" in revision["last_message"]
    assert "the cache is stale: holds per step 'survey', disputed by step 'recheck'" in revision["last_message"]
    [note] = evidence_notes(store.get_text(result.report))
    assert note.startswith("plan v2 (evidence): conflicting evidence: step 'recheck' concluded")
    assert "in flight: cancel (work in flight may rest on the disputed claim): cancelled gate;" in note
    assert "kept 2 finished step(s), 1 conclusion(s) that hold" in note
    # The gate, dropped by the new plan while it ran, was cut off; the finished steps were not asked again.
    assert [(n.name, n.status) for n in snapshot.earlier] == [("gate", "abandoned")]
    assert statuses(snapshot) == {"survey": "succeeded", "recheck": "succeeded", "confirm": "succeeded"}
    assert [len(calls_for(server, s)) for s in ("survey", "recheck", "confirm")] == [1, 1, 1]
    assert snapshot.plan_version == 2
    held = [line for line in snapshot.gate_log if line.startswith("re-plan on evidence held off")]
    assert len(held) == 1 and "step 'confirm' concluded 'The cache is STALE' holds" in held[0], snapshot.gate_log
    assert "1 of 3 steps settled" in held[0]


# --- isomorphic results ----------------------------------------------------------------


def fetch(i: int) -> dict:
    return {"name": f"fetch-{i}", "kind": "tool", "tool": "read_file", "args": {"path": f"data/part-{i}.csv"}}


async def test_repeated_errors_of_one_class_replan_once_keeping_finished_work_and_rejected_paths(
    env, task_queue, store, workspace, scripted
):
    first = [SURVEY, gate(), *[{**fetch(i), "needs": ["gate"]} for i in (1, 2, 3)]]
    revised = [*first, *[fetch(i) for i in (4, 5, 6)]]
    server = scripted(
        {
            "replies": [
                {
                    "when": [REVISE, "isomorphic results", CONSTRAINT, "step 'survey' was rejected: wrong cache"],
                    "json": {"steps": revised},
                },
                {"when": "PERDURE-PLANNER", "times": 1, "json": {"steps": first}},
                {"when_last": "step: survey", "content": "The cache holds 40 entries."},
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_planned(env, task_queue, workspace, evidence_spacing_s=3600)
        await wait_until(handle, lambda s: statuses(s).get("survey") == "succeeded" and "gate" in s.running)
        await submit(handle, Rewind(request_id="rw-1", node="survey", why="wrong cache"))
        await wait_until(handle, lambda s: s.plan_version == 2 and statuses(s)["survey"] == "succeeded")
        (workspace / "GO").touch()
        result = await asyncio.wait_for(handle.result(), 60)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert len(revisions(server)) == 1
    [note] = evidence_notes(store.get_text(result.report))
    # They ran side by side: the note names them in the order they settled.
    head = "plan v3 (evidence): isomorphic results: the last 3 settled steps ("
    assert note.startswith(head), note
    named, rest = note.removeprefix(head).split(")", 1)
    assert sorted(named.split(", ")) == ["fetch-1", "fetch-2", "fetch-3"]
    assert rest.startswith(" all ended in error: read_file failed: <q> does not exist in the workspace;"), rest
    assert "in flight: cancel (work in flight is likely to end the same way): nothing cancelled;" in note
    assert "kept 2 finished step(s), 0 conclusion(s) that hold, 1 rejected path(s)" in note
    assert "rejected path: step 'survey' was rejected: wrong cache" in store.get_text(result.report)
    # survey ran twice (the rewind), never a third time for the re-plan.
    assert len(calls_for(server, "survey")) == 2
    assert [statuses(snapshot)[f"fetch-{i}"] for i in range(1, 7)] == ["failed"] * 6
    held = [line for line in snapshot.gate_log if line.startswith("re-plan on evidence held off")]
    assert len(held) == 1 and "isomorphic results: the last 3 settled steps (fetch-" in held[0], snapshot.gate_log
    assert "s of 3600 s passed" in held[0]


# --- declining marginal value ----------------------------------------------------------

DONE = {"when": "PERDURE-STEP", "content": "step done"}
CHAIN = [llm("s1"), llm("s2", ["s1"]), llm("s3", ["s2"]), llm("s4", ["s3"])]
# An agent that waits for the gate's file through run_command, then says nothing new.
WATCH = agent("watch", "Watch the build.", ["run_command"])
WAIT_FOR_GO = {"command": "while [ ! -f GO ]; do sleep 0.05; done; echo build finished"}


async def test_declining_new_information_waits_for_the_work_in_flight_then_replans_once(
    env, task_queue, store, workspace, scripted
):
    first = [*CHAIN, WATCH, llm("s5", ["s4"])]
    revised = [*first, llm("t1", ["s5"]), llm("t2", ["t1"]), llm("t3", ["t2"])]
    server = scripted(
        {
            "replies": [
                {"when": [REVISE, "declining value", CONSTRAINT], "json": {"steps": revised}},
                {"when": "PERDURE-PLANNER", "times": 1, "json": {"steps": first}},
                {"when": "build finished", "content": "step done"},
                {"when": "PERDURE-AGENT", "tool_calls": [{"name": "run_command", "arguments": WAIT_FOR_GO}]},
                DONE,
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_planned(env, task_queue, workspace, evidence_spacing_s=3600)
        try:
            waiting = await wait_until(
                handle, lambda s: any("waits for the steps in flight: watch" in g for g in s.gate_log)
            )
            # s5 is ready (s4 finished) but not started while the re-plan waits.
            assert statuses(waiting)["s5"] == "pending" and waiting.plan_version == 1
            assert revisions(server) == []
        finally:
            (workspace / "GO").touch()
        result = await asyncio.wait_for(handle.result(), 60)
        snapshot = await handle.query(GoalWorkflow.progress)

    assert len(revisions(server)) == 1
    [note] = evidence_notes(store.get_text(result.report))
    assert note.startswith(
        "plan v2 (evidence): declining value: the last 3 finished steps (s3, s4, watch) added 0% new information"
    ), note
    assert (
        "in flight: wait (nothing in flight is wrong, and cutting paid work off would waste it): waited for watch"
        in note
    )
    assert "kept 5 finished step(s)" in note
    assert [len(calls_for(server, s)) for s in ("s1", "s2", "s3", "s4", "s5", "t1")] == [1, 1, 1, 1, 1, 1]
    # The agent's two turns, each asked once: it was waited for, not run again.
    assert [sum(r["matched"] == i for r in server.requests()) for i in (2, 3)] == [1, 1]
    assert result.outcome == "succeeded"
    held = [line for line in snapshot.gate_log if line.startswith("re-plan on evidence held off")]
    assert held and all("declining value" in line for line in held), snapshot.gate_log
    assert snapshot.plan_version == 2


async def test_a_plan_file_is_not_replanned_on_evidence(env, task_queue, store, workspace, scripted):
    server = scripted({"replies": [DONE]})
    async with running_worker(env, task_queue, store, openai_profile(server)):
        goal = spec(workspace, plan={"steps": [*CHAIN, llm("s5", ["s4"])]}, drift_every=0)
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal), id=new_goal_id("evidence"), task_queue=task_queue
        )
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.outcome == "succeeded"
    assert len(server.requests()) == 5 and revisions(server) == []


# --- the detectors, pure -------------------------------------------------------------


def settle(log: EvidenceLog, node: str, text: str, *, failed: bool = False, version: int = 1, at=T0, current=None):
    evidence.record_settled(
        log,
        node=node,
        node_key=f"key-{node}",
        status="failed" if failed else "succeeded",
        text=text,
        states_findings=True,
        at=at,
        plan_version=version,
        is_current=current or (lambda _name, _key: True),
    )


def test_statements_are_read_from_lines_and_from_a_json_output():
    text = "Conclusion: the build is green = true. ROOT CAUSE: clock skew on the runner; conclusion: tests pass = FALSE"
    assert evidence.read_statements(text) == (
        [("the build is green", True), ("tests pass", False)],
        "clock skew on the runner",
    )
    as_json = '{"conclusions": [{"claim": "API is v2", "holds": false}, {"claim": 3}], "root_cause": "Stale cache"}'
    assert evidence.read_statements(as_json) == ([("API is v2", False)], "stale cache")
    # A preview cut off mid-statement states nothing.
    assert evidence.read_statements("Conclusion: the build is green = tr…") == ([], None)


@given(
    claim=st.text(alphabet="abcdefgh ", min_size=1, max_size=30).filter(lambda c: c.strip()),
    upper=st.booleans(),
    pad=st.sampled_from(["", " ", "  "]),
)
def test_a_claim_is_the_same_claim_whatever_its_case_and_spacing(claim, upper, pad):
    variant = pad + (claim.upper() if upper else claim).replace(" ", "  ") + pad
    assert evidence.claim_key(variant) == evidence.claim_key(claim)


@given(holds=st.lists(st.booleans(), min_size=1, max_size=8))
def test_a_contradiction_is_found_exactly_when_a_step_says_the_opposite_of_a_standing_conclusion(holds):
    log = EvidenceLog()
    for i, value in enumerate(holds):
        settle(log, f"n{i}", f"Conclusion: the cache is stale = {str(value).lower()}")
    # Each change of value disputes the conclusions standing the other way.
    changes = sum(1 for a, b in zip(holds, holds[1:], strict=False) if a != b)
    assert bool(log.unresolved) == (changes > 0)
    standing = evidence.standing(log, lambda _n, _k: True)
    assert {c.holds for c in standing} == {holds[-1]}
    found = evidence.trigger(log, 3, 0.0)
    assert (found is not None and found.kind == "conflicting evidence") == (changes > 0)


def test_a_step_run_again_or_voided_does_not_contradict_itself():
    log = EvidenceLog()
    settle(log, "a", "Conclusion: x = true")
    settle(log, "a", "Conclusion: x = false")  # the same step, run again: replaces its own
    assert log.unresolved == [] and [(c.node, c.holds) for c in log.conclusions] == [("a", False)]
    settle(log, "b", "Conclusion: x = true", current=lambda name, _key: name != "a")  # a was voided since
    assert log.unresolved == [] and [(c.node, c.holds) for c in log.conclusions] == [("b", True)]


@given(
    paths=st.lists(st.from_regex(r"[a-z]{1,8}/[a-z]{1,8}\.(py|md|csv)", fullmatch=True), min_size=2, max_size=2),
    numbers=st.lists(st.integers(0, 10**6), min_size=2, max_size=2),
)
def test_errors_differing_only_in_paths_names_and_numbers_are_one_class(paths, numbers):
    a = f"read_file failed: [Errno {numbers[0]}] No such file: {paths[0]} (step 'x-{numbers[0]}')"
    b = f"read_file failed: [Errno {numbers[1]}] No such file: {paths[1]} (step 'y')"
    assert evidence.error_class(a) == evidence.error_class(b)
    assert evidence.error_class(a) != evidence.error_class("write_file failed: permission denied")


def test_isomorphic_results_need_n_consecutive_outcomes_of_one_class():
    log = EvidenceLog()
    settle(log, "f1", "run_command failed: exit 1 in src/a.py", failed=True)
    settle(log, "ok", "all fine")
    settle(log, "f2", "run_command failed: exit 2 in src/b.py", failed=True)
    settle(log, "f3", "run_command failed: exit 1 in lib/c.py", failed=True)
    assert evidence.trigger(log, 3, 0.0) is None  # the success in between breaks the run
    settle(log, "f4", "run_command failed: exit 7 in d.py", failed=True)
    found = evidence.trigger(log, 3, 0.0)
    assert found is not None and found.kind == "isomorphic results" and found.in_flight == "cancel"
    assert "(f2, f3, f4)" in found.evidence
    # The same root cause, named by steps that finished, is isomorphic too.
    log = EvidenceLog()
    for name in ("fix-a", "fix-b", "fix-c"):
        settle(log, name, f"Patched {name}. Root cause: the clock is skewed. Moving on.")
    found = evidence.trigger(log, 3, 0.0)
    assert found is not None and found.evidence.endswith("all ended in root cause: the clock is skewed")


def test_declining_value_is_the_mean_new_information_of_the_last_n_finished_steps():
    log = EvidenceLog()
    settle(log, "a", "the parser drops quoted commas in field three")
    settle(log, "b", "uploads retry three times then give up silently")
    settle(log, "c", "the parser drops quoted commas in field three")
    assert evidence.trigger(log, 3, 0.5) is None  # (1 + 1 + 0) / 3 is not under 50%
    settle(log, "d", "uploads retry three times then give up silently")
    found = evidence.trigger(log, 3, 0.5)
    assert found is not None and found.kind == "declining value" and found.in_flight == "wait"
    assert "(b, c, d) added 33% new information on average, under 50%" in found.evidence
    assert evidence.trigger(log, 3, 0.0) is None  # threshold 0: not judged


def test_a_new_plan_version_starts_the_window_afresh():
    log = EvidenceLog()
    for i in range(3):
        settle(log, f"f{i}", "boom at 1", failed=True)
    assert evidence.trigger(log, 3, 0.0) is not None
    settle(log, "g", "boom at 2", failed=True, version=2)
    assert evidence.trigger(log, 3, 0.0) is None


@given(
    steps_after=st.integers(0, 6),
    seconds_after=st.integers(0, 2000),
    window=st.integers(1, 5),
    spacing=st.integers(0, 1000),
)
def test_after_a_replan_the_next_waits_for_both_the_steps_and_the_seconds(steps_after, seconds_after, window, spacing):
    log = EvidenceLog()
    for i in range(3):
        settle(log, f"f{i}", "boom", failed=True)
    evidence.note_replanned(log, T0, plan_version=2)
    assert log.unresolved == [] and log.recent == []
    for i in range(steps_after):
        settle(log, f"g{i}", "boom", failed=True, version=2)
    left = evidence.spacing_left(log, window, spacing, T0 + timedelta(seconds=seconds_after))
    assert (left is None) == (steps_after >= window and seconds_after >= spacing)
