"""Re-planning on evidence (issue 20, section 4): each trigger besides drift fires once on
a scripted scenario, as plan version v2 with source `evidence` and the trigger in its
reason, and is held off by the spacing when its condition holds again (no oscillation);
the re-plan keeps finished work (no kept step is asked again: requests counted at the
scripted server), the constraints and the rejected paths, and does with the steps in
flight what the trigger's policy says, per step: a remote write in flight is let finish
and discarded (counted at the fake ledger) while a read is cancelled. Statements are read
from the whole output, not its preview. Plus the detectors of workflows/goal/rules/evidence.py, pure.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from temporalio.api.enums.v1 import EventType

from perdure.testing.fakes import LedgerAPI
from perdure.workflows.goal.contracts.messages import Rewind
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from perdure.workflows.goal.rules import evidence
from perdure.workflows.goal.rules.evidence import EvidenceLog
from tests.builders import agent, gate, llm, openai_profile, spec
from tests.helpers import (
    calls_for,
    new_goal_id,
    running_worker,
    scheduled_activities,
    statuses,
    submit,
    wait_until,
)

CONSTRAINT = "Do not modify notes/."  # tests.builders.spec's constraint: the planner must still be told it
REVISE = "Revise the current plan"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def start_planned(env, task_queue, workspace, tools=("run_command", "read_file"), **overrides):
    """A goal the planner plans (re-planning on evidence is for those, not for plan files)."""
    goal = spec(workspace, allowed_tools=list(tools), drift_every=0, **overrides)
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


@pytest.mark.slow
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
    assert (
        "in flight: cancel (work in flight may rest on the disputed claim): gate: cancel: no effect of its own is "
        "in flight;" in note
    )
    assert "kept 2 finished step(s), 1 conclusion(s) that hold" in note
    # The gate, dropped by the new plan while it ran, was cut off; the finished steps were not asked again.
    assert [(n.name, n.status) for n in snapshot.earlier] == [("gate", "abandoned")]
    assert statuses(snapshot) == {"survey": "succeeded", "recheck": "succeeded", "confirm": "succeeded"}
    assert [len(calls_for(server, s)) for s in ("survey", "recheck", "confirm")] == [1, 1, 1]
    assert snapshot.plan_version == 2
    held = [line for line in snapshot.gate_log if line.startswith("re-plan on evidence held off")]
    assert len(held) == 1 and "step 'confirm' concluded 'The cache is STALE' holds" in held[0], snapshot.gate_log
    assert "1 of 3 steps settled" in held[0]


class HeldLedger(LedgerAPI):
    """The fake ledger, holding every answer until the test releases it: a write is
    recorded (it happened) and its reply waits, so it stays in flight; a read waits too."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.released = threading.Event()
        self.reads = 0

    def write(self, method: str, path: str, body: Any, key: str | None):
        reply = super().write(method, path, body, key)
        self.released.wait(30)
        return reply

    def read(self, path: str, query: dict[str, list[str]]):
        with self._lock:
            self.reads += 1
        self.released.wait(30)
        return super().read(path, query)


def poll(condition, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["tool", "agent"])
@pytest.mark.slow
async def test_a_remote_write_in_flight_at_a_replan_is_let_finish_once_and_discarded_while_a_read_is_cancelled(
    env, task_queue, store, workspace, scripted, fake_service, kind
):
    ledger = fake_service(HeldLedger)
    post = {"method": "POST", "url": f"{ledger.base_url}/entries", "body": {"ref": "publish", "open": True}}
    if kind == "tool":
        publish = {"name": "publish", "kind": "tool", "tool": "http_request", "args": post, "defer": False}
    else:
        publish = agent("publish", "Publish the entry.", ["http_request"], defer=False)
    fetch = {"name": "fetch", "kind": "tool", "tool": "http_get", "args": {"url": f"{ledger.base_url}/entries"}}
    survey = llm("survey", prompt="Survey the ledger.")
    recheck = llm("recheck", ["gate"], prompt="Check the ledger again.")
    first = [survey, {**publish, "needs": ["survey"]}, {**fetch, "needs": ["survey"]}, gate(["survey"]), recheck]
    # The new plan drops the read and publishes after the recheck: the same request, so the
    # effect the discarded step made is found recorded and not sent again.
    revised = [survey, gate(["survey"]), recheck, {**publish, "needs": ["recheck"]}, llm("conclude", ["publish"])]
    # An agent's turns: the call (each run's first turn), then its answer once the call's result is in.
    turns = [
        {"when": "HTTP 201", "content": "published"},
        {"when_last": "step: publish", "tool_calls": [{"name": "http_request", "arguments": post}]},
    ]
    server = scripted(
        {
            "replies": [
                {"when": [REVISE, "conflicting evidence", CONSTRAINT], "json": {"steps": revised}},
                {"when": "PERDURE-PLANNER", "times": 1, "json": {"steps": first}},
                {"when_last": "step: survey", "content": "Conclusion: the ledger is open = true."},
                {"when_last": "step: recheck", "content": "CONCLUSION: the ledger is open = false"},
                *(turns if kind == "agent" else []),
                DONE,
            ]
        }
    )
    tools = ("run_command", "http_request", "http_get")
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_planned(env, task_queue, workspace, tools=tools, evidence_spacing_s=3600)
        try:
            # The write has reached the ledger (its reply held) and the read is waiting on it.
            await asyncio.to_thread(poll, lambda: len(ledger.ledger()) == 1 and ledger.reads == 1)
            (workspace / "GO").touch()  # the recheck runs now, and contradicts the survey
            waiting = await wait_until(handle, lambda s: any("waits for publish to settle" in g for g in s.gate_log))
            assert waiting.plan_version == 1
            assert statuses(waiting)["publish"] == "running" and statuses(waiting)["fetch"] == "abandoned"
        finally:
            ledger.released.set()
        result = await asyncio.wait_for(handle.result(), 60)
        snapshot = await handle.query(GoalWorkflow.progress)
        history = await handle.fetch_history()

    # Sent once, by the step let finish; the new plan's publish found it recorded.
    assert Counter(entry["body"]["ref"] for entry in ledger.ledger()) == {"publish": 1}
    assert ledger.requests == 1
    writes = [s for _, _, s in scheduled_activities(history) if s.startswith("tool") and "publish" in s]
    assert len(writes) == 1, writes
    # The read's activity was asked to stop; the write's was not.
    cancelled = [
        e.activity_task_cancel_requested_event_attributes.scheduled_event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
    ]
    scheduled = {eid: summary for eid, _, summary in scheduled_activities(history)}
    assert [scheduled[eid].split(" · ")[1] for eid in cancelled] == ["fetch"]
    earlier = {(n.name, n.plan_version): n for n in snapshot.earlier}
    assert earlier[("publish", 1)].status == "invalidated" and earlier[("fetch", 1)].status == "abandoned"
    if kind == "tool":
        assert "ent_" in earlier[("publish", 1)].preview  # what it did is kept, not used
        in_air = "a remote write"
    else:
        # Stopped once its write landed: its second turn was never asked; the new plan's agent asked both.
        assert "discarded after its effects settled" in (earlier[("publish", 1)].error or "")
        matched = Counter(r["matched"] for r in server.requests())
        assert (matched[4], matched[5]) == (1, 2), matched
        in_air = "a remote write of one of its tools"
    assert statuses(snapshot) == {
        "survey": "succeeded", "gate": "succeeded", "recheck": "succeeded", "publish": "succeeded",
        "conclude": "succeeded",
    }  # fmt: skip
    assert len(revisions(server)) == 1 and snapshot.plan_version == 2
    [note] = evidence_notes(store.get_text(result.report))
    assert (
        "in flight: cancel (work in flight may rest on the disputed claim): "
        f"publish: let finish and discard: {in_air} may be in flight; "
        "fetch: cancel: no effect of its own is in flight; kept 3 finished step(s)" in note
    ), note


# --- statements read from the whole output ------------------------------------------------

FILLER = "The rebuild log, line by line, shows nothing unusual about the cache entries. " * 64


@pytest.mark.parametrize("kind", ["llm", "agent"])
@pytest.mark.slow
async def test_a_conclusion_at_the_end_of_a_long_output_contradicts_an_earlier_one_and_replans(
    env, task_queue, store, workspace, scripted, kind
):
    late = FILLER + "\nCONCLUSION: the cache is stale = false"
    assert len(late) > 5000
    recheck = RECHECK if kind == "llm" else agent("recheck", "Check the cache again.", ["read_file"], ["survey"])
    server = scripted(
        {
            "replies": [
                {"when": [REVISE, "conflicting evidence"], "json": {"steps": [SURVEY, recheck, CONFIRM]}},
                {"when": "PERDURE-PLANNER", "times": 1, "json": {"steps": [SURVEY, recheck]}},
                {"when_last": "step: survey", "content": "Conclusion: the cache is stale = true."},
                {"when_last": "step: recheck", "content": late},
                {"when_last": "step: confirm", "content": "step done"},
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start_planned(env, task_queue, workspace, evidence_spacing_s=3600)
        snapshot = await wait_until(handle, lambda s: statuses(s).get("confirm") == "succeeded")
        await handle.result()  # the goal ends at once: its memory card goes to the router

    # The preview the goal keeps holds no statement; the whole output's last line did.
    assert "CONCLUSION" not in {n.name: n for n in snapshot.nodes}["recheck"].preview
    [revision] = revisions(server)
    assert (
        "step 'recheck' concluded 'the cache is stale' does not hold, step 'survey' had concluded it holds"
        in revision["last_message"]
    )
    assert snapshot.plan_version == 2
    [replanned] = [g for g in snapshot.gate_log if g.startswith("re-planned on evidence")]
    assert replanned.startswith("re-planned on evidence as plan v2: conflicting evidence: step 'recheck' concluded")


# --- isomorphic results ----------------------------------------------------------------


def fetch(i: int) -> dict:
    return {"name": f"fetch-{i}", "kind": "tool", "tool": "read_file", "args": {"path": f"data/part-{i}.csv"}}


@pytest.mark.slow
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
    assert "in flight: cancel (work in flight is likely to end the same way): nothing was in flight;" in note
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


@pytest.mark.slow
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


statement_text = st.lists(
    st.one_of(
        st.sampled_from(["Conclusion: ", "CONCLUSION:", "root cause: ", "ROOT-CAUSE: ", " = true", "=false", ". "]),
        st.sampled_from(["; ", "\n", "{", "} ", '"', "the cache", " is stale", "x.y", "  ", "TRUE", "trueish"]),
        st.text(alphabet="abcdefgh =.;:\n", max_size=12),
    ),
    max_size=24,
).map("".join)


@given(text=statement_text)
def test_the_statement_lines_of_an_output_state_what_the_output_states(text):
    lines = evidence.statement_lines(text)
    conclusions, cause = evidence.read_statements(text)
    assert evidence.read_statement_lines(lines) == (conclusions[: evidence.MAX_STATEMENTS - bool(cause)], cause)
    assert len(lines) <= evidence.MAX_STATEMENTS
    assert all(len(line) <= evidence.MAX_STATEMENT_CHARS and "\n" not in line for line in lines)


@given(
    conclusions=st.lists(
        st.tuples(st.text(alphabet='ab =.;:"\n{}', max_size=150), st.booleans()), max_size=evidence.MAX_STATEMENTS - 1
    ),
    cause=st.one_of(st.none(), st.text(alphabet='ab =.;:"\n', max_size=150)),
)
def test_the_statement_lines_of_a_json_output_state_what_it_states(conclusions, cause):
    data = {"conclusions": [{"claim": claim, "holds": holds} for claim, holds in conclusions], "root_cause": cause}
    text = json.dumps(data)
    assert evidence.read_statement_lines(evidence.statement_lines(text)) == evidence.read_statements(text)


def test_statement_lines_are_bounded_and_read_a_json_output_whole():
    many = " ".join(f"Conclusion: claim {i} = true." for i in range(30)) + " Root cause: " + "a long cause " * 60
    lines = evidence.statement_lines(many)
    assert len(lines) == evidence.MAX_STATEMENTS and lines[0].startswith("ROOT CAUSE: a long cause")
    assert len(lines[0]) == evidence.MAX_STATEMENT_CHARS and lines[1] == "CONCLUSION: claim 0 = true"
    # The cut cause keys as the whole one does: its first 160 characters.
    assert evidence.read_statement_lines(lines)[1] == evidence.read_statements(many)[1]
    # A JSON output longer than any preview, a claim holding "=", a cause over two lines.
    data = {"notes": "x" * 3000, "conclusions": [{"claim": "a = b", "holds": True}], "root_cause": "Stale\ncache"}
    lines = evidence.statement_lines(json.dumps(data))
    assert evidence.read_statement_lines(lines) == ([("a = b", True)], "stale cache")
    assert evidence.statement_lines("no statements here") == []


def test_a_step_with_statement_lines_is_read_from_them_and_one_without_from_its_preview():
    log = EvidenceLog()
    settle(log, "a", "Conclusion: x = true")  # a result recorded before statement lines: its preview
    assert [(c.node, c.holds) for c in log.conclusions] == [("a", True)]
    evidence.record_settled(
        log,
        node="b",
        node_key="key-b",
        status="succeeded",
        text="A long answer, its preview cut before its last line…",
        states_findings=True,
        at=T0,
        plan_version=1,
        is_current=lambda _name, _key: True,
        statements=["CONCLUSION: x = false"],
    )
    assert [(c.node, c.holds) for c in log.unresolved] == [("b", False)]
    found = evidence.trigger(log, 3, 0.0)
    assert found is not None and found.kind == "conflicting evidence"
    # Lines returned, and none of them a statement: the preview is not read.
    settle_quiet = dict(node_key="key-c", status="succeeded", at=T0, plan_version=1, states_findings=True)
    evidence.record_settled(
        log, node="c", text="Conclusion: y = true", is_current=lambda _n, _k: True, statements=[], **settle_quiet
    )
    assert all(c.node != "c" for c in log.conclusions)


def test_each_step_in_flight_at_a_cancelling_replan_gets_its_own_choice():
    assert evidence.in_flight_choice(changed=False, effect_in_air="a remote write")[0] == "go on"
    assert evidence.in_flight_choice(changed=True, effect_in_air=None)[0] == "cancel"
    choice, why = evidence.in_flight_choice(changed=True, effect_in_air="a remote write")
    assert (choice, why) == ("let finish and discard", "a remote write may be in flight")
