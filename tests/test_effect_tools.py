"""Remote-write tools against the fake services, a real git repository and real HTTP, including
retries simulated through the activity's attempt number and heartbeat details."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from perdure.activities.artifacts import ArtifactStore
from perdure.activities.tools.run_tool import ToolActivities
from perdure.testing.fakes import LedgerAPI, MailAPI, PaymentsAPI, WebhookReceiver
from perdure.testing.repo import git, init_repo
from perdure.workflows.shared.contracts import ToolInput, ToolResult
from perdure.workflows.shared.effects import done_details, intent_details

NOTICE = {"to": "ada@example.com", "subject": "Maintenance", "body": "Down on Saturday."}
PAYMENT = {"amount_cents": 1250, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 7"}


@dataclasses.dataclass
class Services:
    mail: MailAPI
    payments: PaymentsAPI
    ledger: LedgerAPI
    webhook: WebhookReceiver


@pytest.fixture
def services(fake_service, monkeypatch) -> Services:
    monkeypatch.setenv("PERDURE_MAIL_FROM", "Ops <ops@example.org>")
    return Services(
        fake_service(MailAPI, api_key="mk"),
        fake_service(PaymentsAPI, api_key="pk"),
        fake_service(LedgerAPI),
        fake_service(WebhookReceiver),
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    init_repo(root)
    return root


class Beats(list):
    """The heartbeat details an ActivityEnvironment saw."""

    def phases(self) -> list[str]:
        return [d[0]["phase"] for d in self if d and isinstance(d[0], dict)]


def attempt_env(
    attempt: int = 1,
    details: list | None = None,
    heartbeat_timeout: timedelta | None = None,
    max_attempts: int | None = None,
) -> tuple[ActivityEnvironment, Beats]:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        attempt=attempt,
        heartbeat_details=details or [],
        heartbeat_timeout=heartbeat_timeout,
        retry_policy=RetryPolicy(maximum_attempts=max_attempts) if max_attempts else None,
    )
    beats = Beats()
    env.on_heartbeat = lambda *d: beats.append(d)
    return env, beats


async def call(
    store: ArtifactStore,
    workspace: Path,
    tool: str,
    args: dict,
    env: ActivityEnvironment | None = None,
    confirmed: bool = False,
    goal_id: str = "goal-1",
) -> ToolResult:
    tool_input = ToolInput(
        goal_id=goal_id, node_key="n1", tool=tool, workspace=str(workspace), args=args, confirmed=confirmed
    )
    return await (env or attempt_env()[0]).run(ToolActivities(store).run_tool, tool_input)


def text(store: ArtifactStore, result: ToolResult) -> str:
    assert result.output is not None, result
    return store.get_text(result.output)


# --- send_email -------------------------------------------------------------------------


async def test_send_email_sends_once_with_key_as_idempotency_key_and_message_id(services, store, tmp_path):
    env, beats = attempt_env()
    result = await call(store, tmp_path, "send_email", NOTICE, env)
    assert result.ok and result.risk == "remote-write" and not result.uncertain
    key = result.effect_key
    assert key and key.startswith("fx-")
    [message] = services.mail.ledger()
    assert message["to"] == ["ada@example.com"] and message["from"] == "Ops <ops@example.org>"
    assert message["idempotency_key"] == key and message["message_id_header"] == f"<{key}@example.org>"
    assert result.receipt == {"message_id": message["id"], "to": "ada@example.com"}
    assert text(store, result) == f"sent 'Maintenance' to ada@example.com (message id {message['id']})"
    assert beats.phases() == ["intent", "done"]
    assert beats[0][0] == intent_details(key) and beats[1][0] == done_details(key, result.receipt)
    assert result.compensation is None  # an email cannot be unsent


async def test_send_email_retry_resends_the_same_key_and_the_api_deduplicates(services, store, tmp_path):
    first = await call(store, tmp_path, "send_email", NOTICE)
    # The first attempt's worker died before completing; its heartbeat never arrived.
    env, _ = attempt_env(attempt=2)
    retry = await call(store, tmp_path, "send_email", NOTICE, env)
    assert retry.ok and retry.effect_key == first.effect_key
    assert retry.receipt["message_id"] == first.receipt["message_id"] and retry.receipt["replayed"] is True
    assert "the service recognised the effect key" in text(store, retry)
    assert len(services.mail.ledger()) == 1 and (services.mail.requests, services.mail.replays) == (2, 1)


async def test_send_email_retry_with_a_receipt_heartbeat_sends_nothing(services, store, tmp_path):
    first = await call(store, tmp_path, "send_email", NOTICE)
    env, _ = attempt_env(attempt=2, details=[done_details(first.effect_key, first.receipt)])
    retry = await call(store, tmp_path, "send_email", NOTICE, env)
    assert retry.ok and retry.receipt["message_id"] == first.receipt["message_id"]
    assert "confirmed by an earlier attempt's receipt, not sent again" in text(store, retry)
    assert services.mail.requests == 1


async def test_send_email_changed_body_is_a_new_effect(services, store, tmp_path):
    first = await call(store, tmp_path, "send_email", NOTICE)
    second = await call(store, tmp_path, "send_email", {**NOTICE, "body": "Down on Sunday."})
    assert second.ok and second.effect_key != first.effect_key
    assert len(services.mail.ledger()) == 2


async def test_send_email_not_configured(store, tmp_path, monkeypatch):
    monkeypatch.delenv("PERDURE_MAIL_URL", raising=False)
    result = await call(store, tmp_path, "send_email", NOTICE)
    assert not result.ok and not result.uncertain
    assert (
        result.error == "send_email is not configured on this worker: set PERDURE_MAIL_URL to the mail API's base URL"
    )


async def test_send_email_wrong_key_is_data_for_the_model(services, store, tmp_path, monkeypatch):
    monkeypatch.setenv("PERDURE_MAIL_KEY", "wrong")
    result = await call(store, tmp_path, "send_email", NOTICE)
    assert not result.ok and "answered HTTP 401" in result.error and "Missing or invalid API key" in result.error
    assert services.mail.ledger() == []


async def test_idempotency_key_reused_with_another_body_is_refused(services, store, tmp_path, monkeypatch):
    first = await call(store, tmp_path, "send_email", NOTICE)
    # The worker's sender address changed between two attempts: same key, different request.
    monkeypatch.setenv("PERDURE_MAIL_FROM", "Other <other@example.org>")
    env, _ = attempt_env(attempt=2)
    refused = await call(store, tmp_path, "send_email", NOTICE, env)
    assert refused.effect_key == first.effect_key
    assert not refused.ok and not refused.uncertain
    assert "refused the Idempotency-Key: it was used before with a different request (HTTP 422" in refused.error
    assert len(services.mail.ledger()) == 1


async def test_mail_api_down_retries_then_reports_what_is_known(store, tmp_path, monkeypatch):
    monkeypatch.setenv("PERDURE_MAIL_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    env, _ = attempt_env(attempt=1, max_attempts=3)
    with pytest.raises(ApplicationError) as err:
        await call(store, tmp_path, "send_email", NOTICE, env)
    assert err.value.type == "EffectNotConfirmed" and not err.value.non_retryable
    assert "cannot connect" in err.value.message
    only, _ = attempt_env(attempt=1, max_attempts=1)
    never_sent = await call(store, tmp_path, "send_email", NOTICE, only)
    assert not never_sent.ok and not never_sent.uncertain and "was not sent" in never_sent.error
    last, _ = attempt_env(attempt=3, max_attempts=3)
    unknown = await call(store, tmp_path, "send_email", NOTICE, last)
    assert unknown.uncertain and not unknown.ok
    assert "an earlier attempt may have got through" in unknown.error and unknown.effect_key in unknown.error


async def test_server_error_after_sending_is_retried_under_the_same_key(services, store, tmp_path, monkeypatch):
    monkeypatch.setattr(services.mail, "write", lambda *a: (500, {"name": "internal_server_error"}, {}))
    env, _ = attempt_env(attempt=1, max_attempts=3)
    with pytest.raises(ApplicationError, match="answered HTTP 500") as err:
        await call(store, tmp_path, "send_email", NOTICE, env)
    assert err.value.details[0]["effect_key"].startswith("fx-")


# --- http_request ---------------------------------------------------------------------------


async def test_http_request_sends_the_effect_key_and_registers_its_undo(services, store, tmp_path):
    url = f"{services.ledger.base_url}/entries"
    args = {
        "method": "POST",
        "url": url,
        "body": {"ref": "inv-7", "amount": 1250},
        "headers": {"Idempotency-Key": "mine", "X-Team": "ops"},
        "undo": {"method": "DELETE", "url": f"{url}/by-ref/inv-7"},
    }
    result = await call(store, tmp_path, "http_request", args)
    assert result.ok and result.receipt["status"] == 201
    [created] = services.ledger.ledger()
    assert created["idempotency_key"] == result.effect_key  # ours replaces a caller's
    assert result.receipt["id"] == created["id"]
    assert text(store, result).startswith(f"POST {url} -> HTTP 201 (id {created['id']})\n{{")
    assert result.compensation.tool == "http_request"
    assert result.compensation.args == {"method": "DELETE", "url": f"{url}/by-ref/inv-7"}
    env, _ = attempt_env(attempt=2, details=[intent_details(result.effect_key)])
    retry = await call(store, tmp_path, "http_request", args, env)
    assert retry.ok and retry.receipt["id"] == created["id"] and len(services.ledger.ledger()) == 1


async def test_http_request_client_error_is_data(services, store, tmp_path):
    result = await call(
        store, tmp_path, "http_request", {"method": "DELETE", "url": f"{services.ledger.base_url}/entries/nope"}
    )
    assert not result.ok and not result.uncertain and "answered HTTP 404" in result.error


# --- notify_webhook (once) ----------------------------------------------------------------


async def test_webhook_sends_once_and_never_again_after_an_interrupted_attempt(services, store, tmp_path):
    args = {"url": f"{services.webhook.base_url}/deploys", "payload": {"version": "1.4.2"}}
    first = await call(store, tmp_path, "notify_webhook", args)
    assert first.ok and text(store, first) == f"delivered to {args['url']} (HTTP 200)"
    assert services.webhook.ledger()[0]["effect_key"] == first.effect_key
    for details in ([], [intent_details(first.effect_key)]):
        env, _ = attempt_env(attempt=2, details=details)
        retry = await call(store, tmp_path, "notify_webhook", args, env)
        assert retry.uncertain and not retry.ok and retry.output is None
        assert "whether" in retry.error and "received it is unknown" in retry.error
        assert retry.effect_key == first.effect_key
    env, _ = attempt_env(attempt=2, details=[done_details(first.effect_key, first.receipt)])
    reused = await call(store, tmp_path, "notify_webhook", args, env)
    assert reused.ok and not reused.uncertain
    assert len(services.webhook.ledger()) == 1  # never delivered twice


async def test_webhook_failures(services, store, tmp_path):
    services.webhook.reply_status = 503
    args = {"url": f"{services.webhook.base_url}/deploys", "payload": {"v": 1}}
    env, _ = attempt_env(attempt=1, max_attempts=3)
    unknown = await call(store, tmp_path, "notify_webhook", args, env)  # no retry for a once tool
    assert unknown.uncertain and "may have reached" in unknown.error
    down = await call(store, tmp_path, "notify_webhook", {**args, "url": "http://127.0.0.1:9/x"})
    assert not down.ok and not down.uncertain and "was not delivered" in down.error
    services.webhook.reply_status = 400
    refused = await call(store, tmp_path, "notify_webhook", args)
    assert not refused.ok and not refused.uncertain and "refused the payload with HTTP 400" in refused.error


# --- git_commit / git_revert (check) -------------------------------------------------------


async def test_git_commit_carries_the_trailer_and_a_second_call_finds_it(store, repo):
    (repo / "notes.md").write_text("first\n")
    env, beats = attempt_env()
    result = await call(store, repo, "git_commit", {"message": "Add notes", "paths": ["notes.md"]}, env)
    assert result.ok, result.error
    sha = git(repo, "rev-parse", "HEAD")
    assert result.receipt == {"commit": sha}
    assert git(repo, "log", "-1", "--format=%(trailers:key=Effect-Key,valueonly)") == result.effect_key
    assert git(repo, "log", "-1", "--format=%an") == "Test User"  # the repository's identity
    assert beats.phases() == ["intent", "done"]
    assert result.compensation.tool == "git_revert" and result.compensation.args == {"effect_key": result.effect_key}

    (repo / "notes.md").write_text("changed after the commit\n")
    again = await call(store, repo, "git_commit", {"message": "Add notes", "paths": ["notes.md"]})
    assert again.ok and again.receipt["commit"] == sha and again.effect_key == result.effect_key
    assert "found by its Effect-Key trailer, not done again" in text(store, again)
    assert git(repo, "rev-list", "--count", "HEAD") == "2"


async def test_git_commit_all_changes_by_default_and_only_given_paths_otherwise(store, repo):
    (repo / "a.txt").write_text("a")
    (repo / "b.txt").write_text("b")
    only_a = await call(store, repo, "git_commit", {"message": "Only a", "paths": ["a.txt"]})
    assert only_a.ok
    assert git(repo, "show", "--name-only", "--format=", "HEAD") == "a.txt"
    rest = await call(store, repo, "git_commit", {"message": "The rest"})
    assert rest.ok and git(repo, "show", "--name-only", "--format=", "HEAD") == "b.txt"
    assert git(repo, "status", "--porcelain") == ""


async def test_git_commit_runs_no_hook_or_monitor_the_workspace_planted(store, repo):
    # The model can write .git through run_command; what it plants there must not run on
    # the worker, outside the command sandbox, where the worker's keys are readable.
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text('#!/bin/sh\ntouch "$(git rev-parse --show-toplevel)/HOOK-RAN"\n')
    hook.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(hook))
    (repo / "notes.md").write_text("first\n")
    result = await call(store, repo, "git_commit", {"message": "Add notes", "paths": ["notes.md"]})
    assert result.ok, result.error
    assert not (repo / "HOOK-RAN").exists()


async def test_git_commit_refuses_a_repository_whose_config_names_a_program(store, repo):
    git(repo, "config", "filter.leak.clean", "sh -c 'cat /proc/*/environ > STOLEN; cat'")
    (repo / ".gitattributes").write_text("*.md filter=leak\n")
    (repo / "notes.md").write_text("first\n")
    result = await call(store, repo, "git_commit", {"message": "Add notes"})
    assert not result.ok and "names programs git would run on the worker (filter.leak.clean)" in result.error
    assert not (repo / "STOLEN").exists()


async def test_parallel_commits_in_one_repository_both_land(store, repo):
    for name in ("x", "y", "z"):
        (repo / name).write_text(name)
    results = await asyncio.gather(
        *(call(store, repo, "git_commit", {"message": f"Add {n}", "paths": [n]}) for n in ("x", "y", "z"))
    )
    assert all(r.ok for r in results), [r.error for r in results]
    assert sorted(git(repo, "log", "--format=%s").splitlines()) == ["Add x", "Add y", "Add z", "initial commit"]


async def test_git_commit_refusals_are_data(store, repo, tmp_path):
    nothing = await call(store, repo, "git_commit", {"message": "Empty"})
    assert not nothing.ok and nothing.error == "nothing to commit in the workspace"
    escape = await call(store, repo, "git_commit", {"message": "Out", "paths": ["../x"]})
    assert not escape.ok and "contains '..'" in escape.error
    plain = tmp_path / "plain"
    plain.mkdir()
    not_repo = await call(store, plain, "git_commit", {"message": "x"})
    assert not not_repo.ok and "is not inside a git repository" in not_repo.error


async def test_git_commit_falls_back_to_perdures_identity(store, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no global git config
    bare = tmp_path / "bare"
    bare.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=bare, check=True)
    (bare / "f").write_text("x")
    result = await call(store, bare, "git_commit", {"message": "First"})
    assert result.ok, result.error
    assert git(bare, "log", "-1", "--format=%an <%ae>") == "perdure <perdure@localhost>"


async def test_git_revert_compensates_once(store, repo):
    (repo / "notes.md").write_text("to be undone\n")
    commit = await call(store, repo, "git_commit", {"message": "Add notes"})
    compensation = commit.compensation
    revert = await call(store, repo, compensation.tool, compensation.args)
    assert revert.ok, revert.error
    assert not (repo / "notes.md").exists()
    assert git(repo, "log", "-1", "--format=%s") == 'Revert "Add notes"'
    trailers = git(repo, "log", "-1", "--format=%(trailers:only,unfold)")
    assert f"Effect-Key: {revert.effect_key}" in trailers and f"Reverts-Effect-Key: {commit.effect_key}" in trailers
    env, _ = attempt_env(attempt=2)
    again = await call(store, repo, compensation.tool, compensation.args, env)
    assert again.ok and again.receipt["commit"] == revert.receipt["commit"]
    assert git(repo, "rev-list", "--count", "HEAD") == "3"
    never = await call(store, repo, "git_revert", {"effect_key": "fx-" + "0" * 32})
    assert never.ok and text(store, never).startswith("nothing to revert")


# --- make_payment (irreversible) and refund_payment ---------------------------------------------


async def test_payment_needs_a_human_confirmation(services, store, tmp_path):
    result = await call(store, tmp_path, "make_payment", PAYMENT)
    assert not result.ok and not result.uncertain and result.risk == "irreversible"
    assert "needs a human confirmation" in result.error and result.effect_key
    assert result.compensation is None
    assert services.payments.requests == 0


async def test_confirmed_payment_is_made_once_and_refunded_by_its_compensation(services, store, tmp_path):
    env, beats = attempt_env()
    paid = await call(store, tmp_path, "make_payment", PAYMENT, env, confirmed=True)
    assert paid.ok and paid.receipt["status"] == "succeeded"
    assert text(store, paid).startswith("paid 12.50 EUR to ACME GmbH (payment pay_")
    assert beats.phases() == ["intent", "done"]
    assert paid.compensation.tool == "refund_payment"
    assert paid.compensation.args == {"payment_key": paid.effect_key, "reason": "perdure rollback"}

    retry_env, _ = attempt_env(attempt=2, details=[intent_details(paid.effect_key)])
    retry = await call(store, tmp_path, "make_payment", PAYMENT, retry_env, confirmed=True)
    assert retry.receipt["payment_id"] == paid.receipt["payment_id"]
    assert [e["kind"] for e in services.payments.ledger()] == ["payment"]

    refund = await call(store, tmp_path, paid.compensation.tool, paid.compensation.args)
    assert refund.ok and refund.receipt["payment_id"] == paid.receipt["payment_id"]
    refund_again, _ = attempt_env(attempt=2)
    again = await call(store, tmp_path, paid.compensation.tool, paid.compensation.args, refund_again)
    assert again.ok and again.receipt["refund_id"] == refund.receipt["refund_id"]
    other_reason = await call(store, tmp_path, "refund_payment", {**paid.compensation.args, "reason": "duplicate"})
    assert other_reason.ok and "already refunded" in text(store, other_reason)
    assert [e["kind"] for e in services.payments.ledger()] == ["payment", "refund"]


async def test_payment_that_may_have_happened_is_uncertain_and_carries_its_refund(
    services, store, tmp_path, monkeypatch
):
    monkeypatch.setattr(services.payments, "write", lambda *a: (502, {"error": {"type": "api_error"}}, {}))
    env, _ = attempt_env(attempt=3, max_attempts=3)
    result = await call(store, tmp_path, "make_payment", PAYMENT, env, confirmed=True)
    assert result.uncertain and not result.ok and "answered HTTP 502" in result.error
    assert "Running it again is safe" in result.error
    assert result.compensation.tool == "refund_payment"  # a rollback can still undo it, if it happened


async def test_refund_of_a_payment_that_never_happened_is_a_no_op(services, store, tmp_path):
    result = await call(store, tmp_path, "refund_payment", {"payment_key": "fx-" + "4" * 32})
    assert result.ok and text(store, result).startswith("nothing to refund")
    assert services.payments.ledger() == []


# --- heartbeats -----------------------------------------------------------------------------


@pytest.mark.slow
async def test_slow_call_keeps_heartbeating_its_phase(services, store, tmp_path):
    services.mail.respond_delay_s = 0.8
    env, beats = attempt_env(heartbeat_timeout=timedelta(seconds=0.3))
    result = await call(store, tmp_path, "send_email", NOTICE, env)
    assert result.ok
    phases = beats.phases()
    assert phases[0] == "intent" and phases[-1] == "done"
    assert phases.count("intent") >= 3, phases  # background beats repeat the current phase


async def test_safe_tools_heartbeat_only_when_asked(store, tmp_path):
    (tmp_path / "a.txt").write_text("a")
    env, beats = attempt_env()
    result = await call(store, tmp_path, "read_file", {"path": "a.txt"}, env)
    assert result.ok and result.effect_key is None and result.receipt is None and beats == []
