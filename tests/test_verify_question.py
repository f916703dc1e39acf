"""Verify before resuming, the semantic and the remote parts (issue 20, section 3): a step's
`verify: {question}` asked of a model after a long park (one call per step, counted at the
scripted server and charged to the goal), whose answer HOLDS keeps it, VOID voids it with
its downstream as a rewind would, and anything else keeps it and says so; and the URLs a
step fetched (http_get), re-fetched at the fake service under the tool's own rule (the goal
may call http_get; `allow_network` is about commands): a body changed during the park
voids the step, an unchanged one keeps it, an unreachable one keeps it with the reason.
Against a dev server with the production worker; `verify_after_s` is short so a park of
seconds counts as long. Plus the answer parser, property-tested, and the scripted server's
offline policy, which answers a question HOLDS."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.goal.recheck import VerificationActivities, parse_verdict, question_system_prompt, shown_url
from perdure.activities.models.scripted import offline_reply
from perdure.activities.tools.catalogue.http_tools import HttpGetArgs
from perdure.activities.tools.fingerprints import fingerprints_of, url_digest
from perdure.activities.tools.http_calls import http_get
from perdure.testing.fakes import FakeService
from perdure.workflows.goal.contracts.state import GoalInput
from perdure.workflows.goal.contracts.verify_contracts import NodeCheck, VerifyInput
from perdure.workflows.goal.goal_workflow import GoalWorkflow
from tests.builders import gate, llm, openai_profile, spec
from tests.helpers import new_goal_id, running_worker, scheduled_activities, start, statuses, wait_until
from tests.verify_rig import checked, park_then_resume, read, runs_of

VERIFY = "[PERDURE-VERIFY]"


def kinds(server) -> list[str]:
    """What each model request was, in order: `Goal:` (the planner), `step: X`, `verify: X`."""
    return [r["last_message"].split("\n", 1)[0] for r in server.requests()]


async def gate_passed(handle):
    """The snapshot once the gate, run again after the check, has passed: all this file's
    goals prove is done by then (how a goal ends is not what they are about)."""
    return await wait_until(handle, lambda s: statuses(s).get("gate") == "succeeded")


def asked(server, step: str) -> list[str]:
    """The question prompts about `step` the scripted server received."""
    return [r["last_message"] for r in server.requests() if r["last_message"].startswith(f"verify: {step}\n")]


# --- the model question ----------------------------------------------------------------


@pytest.mark.slow
async def test_a_question_answered_void_after_a_long_park_runs_its_step_and_the_downstream_again(
    env, task_queue, store, workspace, scripted
):
    claim = llm("claim", prompt="Say what the API returns.", verify={"question": "Does the API still return XML?"})
    later = llm("later", ["claim"], prompt="Check the versioning.")
    server = scripted(
        {
            "replies": [
                {"when": VERIFY, "content": "VOID: the changelog says the API returns JSON now\nDetails follow."},
                {"when": "PERDURE-PLANNER", "times": 1, "json": {"steps": [claim, later, gate(["later"])]}},
                {"when_last": "step: claim", "content": "The API returns XML."},
                {"when_last": "step: later", "content": "CONCLUSION: the api is versioned = true"},
            ]
        }
    )
    goal = spec(
        workspace, allowed_tools=["run_command"], drift_every=0, evidence_window=0, verify_after_s=1
    )  # planned, so its conclusions are recorded (state.evidence); no re-plan on them
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await env.client.start_workflow(
            GoalWorkflow.run, GoalInput(spec=goal), id=new_goal_id("question"), task_queue=task_queue
        )
        await wait_until(handle, lambda s: "gate" in s.running)
        await park_then_resume(handle, lambda: None)
        snapshot = await wait_until(handle, lambda s: s.plan_version == 2 and "gate" in s.running)
        (workspace / "GO").write_text("")
        final = await gate_passed(handle)

    # The question first, then the voided step and its downstream, paid again.
    assert kinds(server) == ["Goal:", "step: claim", "step: later", "verify: claim", "step: claim", "step: later"]
    assert final.model_calls == len(server.requests())  # the question was charged like any call
    [prompt] = asked(server, "claim")
    assert "Does the API still return XML?" in prompt and "The API returns XML." in prompt  # its output, read
    assert "- the api is versioned: holds (step 'later')" in prompt  # a conclusion newer than the step
    said = checked(snapshot)
    assert said.startswith("resumed after ")
    assert (
        "re-verified: 0 kept, 3 void (claim: the model judged its conclusion no longer holds: "
        "the changelog says the API returns JSON now)" in said
    ), said


@pytest.mark.slow
async def test_holds_keeps_a_step_and_an_answer_that_does_not_parse_keeps_it_and_says_so(
    env, task_queue, store, workspace, scripted
):
    (workspace / "a.md").write_text("alpha\n")
    question = {"question": "Is this still right?"}
    steps = [
        read("read-a", "a.md"),
        llm("derived", ["read-a"], verify=question),  # downstream of a changed read: voided, never asked
        llm("steady", verify=question),
        llm("vague", verify=question),
        gate(["derived", "steady", "vague"]),
    ]
    server = scripted(
        {
            "replies": [
                {"when": [VERIFY, "verify: steady"], "content": "\n  HOLDS  \nNothing it rests on changed."},
                {"when": [VERIFY, "verify: vague"], "content": "Holds, I think: void of any change."},
                {"when_last": "step: ", "content": "A finding."},
            ]
        }
    )
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(
            env, task_queue, workspace, steps, allowed_tools=["read_file", "run_command"], verify_after_s=1
        )
        await wait_until(handle, lambda s: "gate" in s.running)
        await park_then_resume(handle, lambda: (workspace / "a.md").write_text("alpha, edited\n"))
        snapshot = await wait_until(handle, lambda s: s.plan_version == 2 and "gate" in s.running)
        (workspace / "GO").write_text("")
        await gate_passed(handle)
        history = await handle.fetch_history()

    # One call per question step, in plan order; only `derived` ran again (with its read).
    assert sorted(kinds(server)[:3]) == ["step: derived", "step: steady", "step: vague"]
    after_park = kinds(server)[3:]
    assert after_park == ["verify: steady", "verify: vague", "step: derived"], after_park
    assert runs_of(history, "read-a") == 2
    [prompt] = asked(server, "steady")
    assert "- a.md changed since it was read (by step 'read-a')" in prompt  # what the goal read that changed
    said = checked(snapshot)
    assert "re-verified: 2 kept, 3 void (read-a: a.md changed since it was read)" in said, said
    assert (
        "; kept without a full check: vague: its question could not be judged "
        "(its answer did not parse: 'Holds, I think: void of any change.')" in said
    ), said


@pytest.mark.slow
async def test_an_offline_run_of_a_plan_with_a_question_keeps_its_work_after_a_long_park(
    env, task_queue, store, workspace, scripted
):
    server = scripted({"policy": "offline"})  # no entry: the offline policy answers every call
    steps = [llm("claim", verify={"question": "Does it still hold?"}), gate(["claim"])]
    async with running_worker(env, task_queue, store, openai_profile(server)):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["run_command"], verify_after_s=1)
        await wait_until(handle, lambda s: "gate" in s.running)
        await park_then_resume(handle, lambda: None)
        snapshot = await wait_until(handle, lambda s: any("re-verif" in entry for entry in s.gate_log))
        (workspace / "GO").write_text("")
        await gate_passed(handle)
    assert kinds(server) == ["step: claim", "verify: claim"]  # asked once, not run again
    said = checked(snapshot)
    assert said.endswith("re-verified: 2 kept, 0 void"), said  # and nothing kept unjudged


def test_the_offline_policy_answers_a_verify_question_with_holds():
    body = {
        "messages": [
            {"role": "system", "content": question_system_prompt(["Do not modify notes/."])},
            {"role": "user", "content": "verify: claim\n\nGoal: tidy the notes"},
        ]
    }
    reply = offline_reply(body, {})
    assert reply is not None and parse_verdict(reply.content or "")[0] == "holds"


@given(st.text())
def test_no_text_makes_the_parser_raise_and_only_the_exact_forms_decide(text):
    verdict, reason = parse_verdict(text)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if verdict == "holds":
        assert first == "HOLDS"
    elif verdict == "void":
        assert first.startswith("VOID:") and reason and reason in first
    else:
        assert verdict == "unjudged" and first != "HOLDS" and not (first.startswith("VOID:") and first[5:].strip())


@given(st.text(alphabet=st.characters(blacklist_categories=["Cc", "Zl", "Zp"]), min_size=1), st.text())
def test_void_with_a_reason_on_the_first_line_voids_with_that_reason(reason, rest):
    assume(reason.strip())
    verdict, said = parse_verdict(f"\n VOID: {reason}\n{rest}")
    assert (verdict, said) == ("void", reason.strip()[:300])


def test_near_misses_are_unjudged():
    for text in ["", "holds", "HOLDS.", "Void: stale", "VOID:", "VOID:   ", "VOID stale", "**HOLDS**", "I'd say HOLDS"]:
        assert parse_verdict(text)[0] == "unjudged", text
    assert parse_verdict("HOLDS\nVOID: no")[0] == "holds"


# --- URLs re-fetched -----------------------------------------------------------------


class PageService(FakeService):
    """Pages by path, served without keep-alive (a stopped service is unreachable at once),
    counting the fetches of each."""

    name = "pages"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pages: dict[str, str] = {}
        self.fetches: dict[str, int] = {}

    def read(self, path: str, query: dict[str, list[str]]):
        with self._lock:
            self.fetches[path] = self.fetches.get(path, 0) + 1
        if path not in self.pages:
            return self.error(404, "not_found", f"no page {path}")
        return 200, {"text": self.pages[path]}, {"Connection": "close"}


def fetch(name: str, url: str) -> dict:
    return {"name": name, "kind": "tool", "tool": "http_get", "args": {"url": url}}


@pytest.mark.slow
async def test_a_page_changed_during_the_park_voids_its_step_an_unchanged_or_unreachable_one_is_kept(
    env, task_queue, store, workspace, fake_service
):
    """A goal with the default `allow_network` (false): http_get runs without it, so its
    pages are re-fetched without it too."""
    site, mirror = fake_service(PageService), fake_service(PageService)
    site.pages.update({"/news": "old news", "/docs": "the docs"})
    mirror.pages["/docs"] = "the docs, mirrored"
    steps = [
        fetch("news", f"{site.base_url}/news?token=s3cret"),
        fetch("docs", f"{site.base_url}/docs"),
        fetch("mirror", f"{mirror.base_url}/docs"),
        gate(["news", "docs", "mirror"]),
    ]

    def change() -> None:
        site.pages["/news"] = "fresh news"
        mirror.stop()

    async with running_worker(env, task_queue, store):
        handle = await start(
            env,
            task_queue,
            workspace,
            steps,
            allowed_tools=["http_get", "run_command"],
            verify_after_s=1,
        )
        await wait_until(handle, lambda s: "gate" in s.running)
        await park_then_resume(handle, change)
        snapshot = await wait_until(handle, lambda s: s.plan_version == 2 and "gate" in s.running)
        (workspace / "GO").write_text("")
        final = await gate_passed(handle)
        history = await handle.fetch_history()

    assert '"fresh news"' in store.get_text(final.results["news"])
    fetched = [summary for _, _, summary in scheduled_activities(history)]  # http_get: a regular activity
    assert [sum(f"· {s} ·" in x for x in fetched) for s in ("news", "docs", "mirror")] == [2, 1, 1]
    # Each page re-fetched once by the check; the news page once more by its step run again.
    assert site.fetches == {"/news": 3, "/docs": 2} and mirror.fetches == {"/docs": 1}
    said = checked(snapshot)
    assert (
        f"re-verified: 2 kept, 2 void (news: {site.base_url}/news?… returns another body than when it was fetched)"
        in said
    ), said
    assert f"kept without a full check: mirror: {mirror.base_url}/docs could not be re-fetched (GET " in said
    assert "s3cret" not in " ".join(snapshot.gate_log)  # a query's token is not copied into the record


async def test_urls_are_not_re_fetched_when_the_goal_may_not_call_http_get_and_the_record_says_so(
    tmp_path, fake_service
):
    site = fake_service(PageService)
    site.pages["/news"] = "old news"
    args = HttpGetArgs(url=f"{site.base_url}/news")
    [print_] = fingerprints_of("http_get", tmp_path, args, '{"text": "old news"}')
    assert print_.source == f"url:{site.base_url}/news" and print_.digest == url_digest('{"text": "old news"}')
    site.pages["/news"] = "fresh news"
    checks = [NodeCheck(node="news", depth="fingerprint", fingerprints=[print_])]
    verify = VerificationActivities(DiskArtifactStore(tmp_path / "artifacts"))

    no_tool = VerifyInput(workspace=str(tmp_path), network=True, refetch=False, checks=checks)
    offline = await verify.verify_nodes(no_tool)
    assert offline.void == {} and site.fetches == {}
    assert offline.unchecked == {"news": f"{site.base_url}/news not re-fetched (the goal does not allow http_get)"}
    online = await verify.verify_nodes(VerifyInput(workspace=str(tmp_path), network=False, refetch=True, checks=checks))
    assert online.void == {"news": f"{site.base_url}/news returns another body than when it was fetched"}
    opted_out = [checks[0].model_copy(update={"depth": "existence"})]
    kept = await verify.verify_nodes(VerifyInput(workspace=str(tmp_path), refetch=True, checks=opted_out))
    assert kept.void == {} and kept.unchecked == {} and site.fetches == {"/news": 1}
    # An input from before the two were told apart re-fetches as its `network` said.
    earlier = await verify.verify_nodes(VerifyInput(workspace=str(tmp_path), network=True, checks=checks))
    assert list(earlier.void) == ["news"] and site.fetches == {"/news": 2}


async def test_a_step_that_read_a_page_under_a_cap_is_kept_when_only_what_is_past_the_cap_changed(
    tmp_path, fake_service
):
    site = fake_service(PageService)
    site.pages["/news"] = "old news"
    args = HttpGetArgs(url=f"{site.base_url}/news", max_bytes=12)
    seen = await http_get(tmp_path, args)  # the tool, as the step ran it: '{"text": "ol' and a note
    [print_] = fingerprints_of("http_get", tmp_path, args, seen)
    checks = [NodeCheck(node="news", depth="fingerprint", fingerprints=[print_])]
    verify = VerificationActivities(DiskArtifactStore(tmp_path / "artifacts"))
    site.pages["/news"] = "older news"  # its first 12 bytes are what the step saw
    assert (await verify.verify_nodes(VerifyInput(workspace=str(tmp_path), refetch=True, checks=checks))).void == {}
    site.pages["/news"] = "new news"
    changed = await verify.verify_nodes(VerifyInput(workspace=str(tmp_path), refetch=True, checks=checks))
    assert list(changed.void) == ["news"] and site.fetches == {"/news": 3}


def test_reasons_show_a_url_without_its_query_or_credentials():
    assert shown_url("url:https://me:pw@example.com:8443/a/b?token=x#frag") == "https://example.com:8443/a/b?…"
    assert shown_url("http://[::1]:9/p") == "http://[::1]:9/p"
