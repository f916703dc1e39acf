"""Secrets that tools need (issue 16, section 3): a step names a credential declared on
the worker, the worker adds it to the request and sends it only to the credential's
hosts; the secret is in no plan, history or result, even when the service echoes it;
a literal Authorization header in a plan is refused and says what to write instead.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from perdure.activities.tools.catalogue.http_tools import HttpRequestArgs
from perdure.testing.fakes import FakeService, Reply
from perdure.workflows.goal.contracts.plan import parse_plan
from tests.builders import STEP_REPLY, openai_profile
from tests.helpers import goal_result, running_worker, start

CANARY = "canary-7d1c0f9e2b"


class EchoAPI(FakeService):
    """Records the Authorization header it got and, like some services, echoes it back."""

    name = "echo"

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str], body: Any) -> Reply:
        if method == "GET" and path == "/_ledger":
            return 200, self.snapshot(), {}
        self.record(
            {"path": path, "authorization": headers.get("authorization"), "key": headers.get("idempotency-key")}
        )
        status = 401 if path == "/denied" else 200
        return status, {"id": "r-1", "seen": headers.get("authorization")}, {}


@pytest.fixture
def echo(fake_service) -> EchoAPI:
    return fake_service(EchoAPI)


@pytest.fixture
def declared(tmp_path, monkeypatch):
    """A worker config declaring CI_TOKEN for the local host only, and the secret in its environment."""
    config = tmp_path / "config.toml"
    config.write_text('[credentials.CI_TOKEN]\nhosts = ["127.0.0.1"]\n')
    monkeypatch.setenv("PERDURE_CONFIG", str(config))
    monkeypatch.setenv("CI_TOKEN", CANARY)


def post(url: str, name: str = "call", **args) -> dict:
    return {"name": name, "kind": "tool", "tool": "http_request", "args": {"method": "POST", "url": url, **args}}


def test_a_plan_with_a_literal_authorization_header_is_refused_and_told_to_name_a_credential():
    step = post("https://api.example.com/x", headers={"Authorization": "Bearer sk-123"})
    plan, reason = parse_plan({"steps": [step]}, ["http_request"])
    assert plan is None
    assert "a credential may not be written into the arguments (header Authorization)" in reason
    assert "`auth: GITHUB_TOKEN`" in reason and "sk-123" not in reason
    with pytest.raises(ValidationError, match="header X-Api-Key"):
        HttpRequestArgs.model_validate({"method": "POST", "url": "https://x.test/", "headers": {"X-Api-Key": "k"}})


async def test_a_named_credential_reaches_its_host_and_nothing_the_goal_keeps_holds_it(
    env, task_queue, store, workspace, scripted, echo, declared
):
    steps = [post(f"{echo.base_url}/items", auth="CI_TOKEN", body={"n": 1})]
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["http_request"], drift_every=0)
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.outcome == "succeeded", result.excerpt
    sent = echo.ledger()
    assert sent and {e["authorization"] for e in sent} == {f"Bearer {CANARY}"}
    # One effect: a retry on a loaded machine (a late heartbeat) re-sends it under the same key.
    assert len({e["key"] for e in sent}) == 1 and sent[0]["key"], sent
    # The service echoed it: the step's output has it redacted, and no payload in history holds it.
    report = store.get_text(result.report)
    assert "[redacted]" in report and CANARY not in report
    assert CANARY not in history.to_json()


async def test_an_undeclared_credential_or_another_host_fails_the_step_with_the_reason_and_sends_nothing(
    env, task_queue, store, workspace, scripted, echo, declared
):
    steps = [
        post(f"{echo.base_url}/items", name="undeclared", auth="DEPLOY_KEY"),
        post(echo.base_url.replace("127.0.0.1", "localhost") + "/items", name="elsewhere", auth="CI_TOKEN"),
    ]
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["http_request"], drift_every=0)
        result = await goal_result(handle)

    assert echo.ledger() == []
    unfinished = " ".join(result.unfinished)
    assert "no credential 'DEPLOY_KEY' is declared on this worker (declared: CI_TOKEN)" in unfinished
    assert "credential 'CI_TOKEN' may not be sent to localhost (its hosts: 127.0.0.1)" in unfinished
    assert CANARY not in unfinished


async def test_an_error_answer_that_echoes_the_credential_is_redacted(
    env, task_queue, store, workspace, scripted, echo, declared
):
    steps = [post(f"{echo.base_url}/denied", auth="CI_TOKEN")]
    async with running_worker(env, task_queue, store, openai_profile(scripted(STEP_REPLY))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["http_request"], drift_every=0)
        result = await goal_result(handle)
        history = await handle.fetch_history()

    assert result.outcome == "failed" or result.failed_steps == ["call"], result.excerpt
    assert "HTTP 401" in " ".join(result.unfinished) and "[redacted]" in " ".join(result.unfinished)
    assert CANARY not in history.to_json()


def test_an_error_answer_of_a_service_echoing_the_workers_key_is_redacted(monkeypatch):
    import httpx

    from perdure.activities.tools.catalogue.tool_errors import ToolError
    from perdure.activities.tools.http_calls import check_status

    monkeypatch.setenv("PERDURE_PAYMENTS_KEY", CANARY)
    echoed = httpx.Response(403, json={"error": f"bad key Bearer {CANARY}"})
    with pytest.raises(ToolError) as refused:
        check_status(echoed, "the payments API")
    assert "HTTP 403" in refused.value.message and CANARY not in refused.value.message
