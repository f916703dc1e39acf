"""The pure side-effect contract: effect keys, the retry decision, compensations, the tool catalogue."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.tools.catalogue import DEFAULT_TOOLS, TOOL_SPECS
from perdure.activities.tools.catalogue.email_tool import SendEmailArgs
from perdure.activities.tools.catalogue.git_tools import GitCommitArgs
from perdure.activities.tools.catalogue.http_tools import HttpRequestArgs
from perdure.activities.tools.catalogue.payment_tools import MakePaymentArgs, RefundPaymentArgs
from perdure.activities.tools.catalogue.webhook_tool import NotifyWebhookArgs
from perdure.activities.tools.run_tool import ToolActivities
from perdure.workflows.shared.contracts import ArtifactRef, ToolInput
from perdure.workflows.shared.effects import (
    compensation_for,
    decide_retry,
    done_details,
    effect_key,
    effect_key_for,
    effect_of,
    intent_details,
    last_heartbeat,
    prepared_in_workflow,
)

KEY = re.compile(r"^fx-[0-9a-f]{32}$")
json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
texts = st.text(min_size=1, max_size=40)


@given(texts, texts, texts, st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_effect_key_is_stable_and_ignores_dict_order(goal, target, action, payload):
    key = effect_key(goal, target, action, payload)
    assert KEY.match(key)
    assert effect_key(goal, target, action, payload) == key
    reordered = dict(reversed(list(payload.items())))
    assert effect_key(goal, target, action, reordered) == key


@given(texts, texts, texts, json_values, texts)
def test_effect_key_changes_with_each_of_its_four_inputs(goal, target, action, payload, other):
    key = effect_key(goal, target, action, payload)
    if other != goal:
        assert effect_key(other, target, action, payload) != key
    if other != target:
        assert effect_key(goal, other, action, payload) != key
    if other != action:
        assert effect_key(goal, target, other, payload) != key
    if other != payload:
        assert effect_key(goal, target, action, other) != key


def test_effect_key_fields_do_not_run_together():
    # "ab" + "c" must not collide with "a" + "bc": the inputs are kept apart, not concatenated.
    assert effect_key("g", "ab", "c", {}) != effect_key("g", "a", "bc", {})


def test_effect_key_for_a_tool_call_depends_on_the_payload_only():
    email = SendEmailArgs(to="a@example.com", subject="Hi", body="one")
    key = effect_key_for("goal-1", "send_email", email, "/ws")
    assert key == effect_key_for("goal-1", "send_email", SendEmailArgs(**email.model_dump()), "/ws")
    assert key != effect_key_for("goal-1", "send_email", email.model_copy(update={"body": "two"}), "/ws")
    assert key != effect_key_for("goal-2", "send_email", email, "/ws")
    assert effect_key_for("goal-1", "read_file", email, "/ws") is None  # the tool's declaration decides
    request = HttpRequestArgs(method="POST", url="http://x/entries", body={"a": 1})
    with_undo = HttpRequestArgs(
        **request.model_dump(exclude={"undo"}), undo={"method": "DELETE", "url": "http://x/entries/1"}
    )
    bigger_cap = request.model_copy(update={"max_bytes": 10})
    base = effect_key_for("g", "http_request", request, "/ws")
    assert effect_key_for("g", "http_request", bigger_cap, "/ws") == base  # formatting is not the effect
    assert effect_key_for("g", "http_request", with_undo, "/ws") == base
    assert effect_key_for("g", "http_request", request.model_copy(update={"method": "PUT"}), "/ws") != base
    commit = GitCommitArgs(message="m")
    assert effect_key_for("g", "git_commit", commit, "/a") != effect_key_for("g", "git_commit", commit, "/b")


def test_effect_of_every_remote_tool_and_none_for_safe_tools():
    for name, spec in TOOL_SPECS.items():
        if spec.risk not in ("remote-write", "irreversible"):
            continue
        example = {
            "http_request": {"method": "POST", "url": "http://x/y"},
            "send_email": {"to": "a@b.c", "subject": "s", "body": "b"},
            "git_commit": {"message": "m"},
            "git_revert": {"effect_key": "fx-" + "0" * 32},
            "notify_webhook": {"url": "http://x/hook", "payload": {}},
            "make_payment": {"amount_cents": 1, "currency": "EUR", "recipient": "r"},
            "refund_payment": {"payment_id": "pay_1"},
        }[name]
        assert effect_of(name, spec.args_model.model_validate(example), "/ws") is not None, name
    read = TOOL_SPECS["read_file"].args_model.model_validate({"path": "a"})
    assert effect_of("read_file", read, "/ws") is None
    # A command has no key a service could deduplicate by: its retry is decided apart.
    command = TOOL_SPECS["run_command"].args_model.model_validate({"command": "make"})
    assert effect_of("run_command", command, "/ws") is None


# --- the retry decision ------------------------------------------------------------------

INTENT = intent_details("fx-" + "1" * 32)
DONE = done_details("fx-" + "1" * 32, {"message_id": "m-1"})


# replay policy -> (attempt, heartbeat details, decision) cases
RETRY_DECISIONS = {
    "safe": [(1, None, "send"), (3, INTENT, "send")],
    "keyed": [(1, None, "send"), (2, None, "send"), (2, INTENT, "send"), (2, DONE, "reuse")],
    "check": [(1, None, "lookup"), (2, INTENT, "lookup"), (2, DONE, "reuse")],
    "once": [
        (1, None, "send"),
        (2, None, "uncertain"),
        (2, INTENT, "uncertain"),
        (5, {"phase": "done", "effect_key": "fx-1", "receipt": None}, "uncertain"),
        (2, DONE, "reuse"),
    ],
}


@pytest.mark.parametrize(
    ("policy", "attempt", "heartbeat", "decision"),
    [(policy, *case) for policy, cases in RETRY_DECISIONS.items() for case in cases],
)
def test_decide_retry(policy, attempt, heartbeat, decision):
    assert decide_retry(policy, attempt, heartbeat) == decision


def test_every_policy_is_decided_on_a_first_attempt_without_heartbeats():
    decisions = {p: decide_retry(p, 1, None) for p in ("safe", "keyed", "check", "once")}
    assert decisions == {"safe": "send", "keyed": "send", "check": "lookup", "once": "send"}


def test_last_heartbeat_only_counts_for_the_same_effect():
    key = "fx-" + "1" * 32
    assert last_heartbeat([], key) is None
    assert last_heartbeat(["running for 5s"], key) is None
    assert last_heartbeat([done_details("fx-" + "2" * 32, {"a": 1})], key) is None
    assert last_heartbeat([INTENT], key) == INTENT
    assert last_heartbeat([INTENT, DONE], key) == DONE


# --- compensations ---------------------------------------------------------------------


def test_compensations_are_known_before_the_effect():
    key = "fx-" + "a" * 32
    payment = compensation_for(
        "make_payment", key, MakePaymentArgs(amount_cents=1250, currency="EUR", recipient="ACME")
    )
    assert payment is not None and payment.tool == "refund_payment"
    assert payment.args == {"payment_key": key, "reason": "perdure rollback"}
    RefundPaymentArgs.model_validate(payment.args)  # a valid call of the compensating tool
    assert "ACME" in payment.reason

    commit = compensation_for("git_commit", key, GitCommitArgs(message="Add notes\n\nbody"))
    assert commit is not None and commit.tool == "git_revert" and commit.args == {"effect_key": key}
    assert commit.reason == "revert the commit 'Add notes'"

    undo = {"method": "DELETE", "url": "http://ledger/entries/7"}
    request = compensation_for(
        "http_request", key, HttpRequestArgs(method="POST", url="http://ledger/entries", undo=undo)
    )
    assert request is not None and request.tool == "http_request" and request.args == undo
    assert compensation_for("http_request", key, HttpRequestArgs(method="POST", url="http://x")) is None
    assert compensation_for("send_email", key, SendEmailArgs(to="a@b.c", subject="s", body="b")) is None
    assert compensation_for("notify_webhook", key, NotifyWebhookArgs(url="http://x", payload={})) is None


# --- the catalogue ----------------------------------------------------------------------


def test_catalogue_declares_risk_and_replay_for_every_tool():
    # (risk, replay) -> the tools declaring it
    expected = {
        ("read", "safe"): ["read_file", "list_dir", "read_artifact", "http_get"],
        ("local-write", "safe"): ["write_file"],
        # Re-run only when replay-safe (declared, or read-only): tests/test_command_replay.py.
        ("local-write", "once"): ["run_command"],
        ("remote-write", "keyed"): ["http_request", "send_email", "refund_payment"],
        ("remote-write", "check"): ["git_commit", "git_revert"],
        ("remote-write", "once"): ["notify_webhook"],
        ("irreversible", "keyed"): ["make_payment"],
    }
    declared = {name: (s.risk, s.replay) for name, s in TOOL_SPECS.items()}
    assert declared == {name: kind for kind, names in expected.items() for name in names}
    for spec in TOOL_SPECS.values():
        if spec.risk in ("remote-write", "irreversible") or spec.expected_s is None:
            # Anything that may run long heartbeats: a killed worker is noticed in seconds.
            assert spec.heartbeat_timeout_s and spec.heartbeat_timeout_s < spec.start_to_close_s, spec.name
    assert TOOL_SPECS["make_payment"].compensation == "refund_payment"
    assert TOOL_SPECS["git_commit"].compensation == "git_revert"


def test_default_tools_stay_inside_the_workspace():
    assert DEFAULT_TOOLS == ["read_file", "list_dir", "write_file", "run_command", "http_get"]


@pytest.mark.parametrize(
    ("tool", "args", "problem"),
    [
        ("http_request", {"method": "GET", "url": "http://x"}, "method"),
        ("http_request", {"method": "POST", "url": "ftp://x"}, "url"),
        ("send_email", {"to": "not-an-address", "subject": "s", "body": "b"}, "to"),
        ("send_email", {"to": "a@b.c", "subject": "s", "body": "b", "cc": "x@y.z"}, "cc"),
        ("make_payment", {"amount_cents": 0, "currency": "EUR", "recipient": "r"}, "amount_cents"),
        ("make_payment", {"amount_cents": 5, "currency": "eur", "recipient": "r"}, "currency"),
        ("refund_payment", {"reason": "x"}, "payment_key or payment_id"),
        ("git_revert", {"effect_key": "abc"}, "effect_key"),
    ],
)
def test_remote_tool_arguments_are_checked(tool, args, problem):
    with pytest.raises(ValueError, match=problem):
        TOOL_SPECS[tool].args_model.model_validate(args)


# --- writes prepared in the workflow ------------------------------------------------------


def call(tool: str, args: dict | None, **fields) -> ToolInput:
    return ToolInput(goal_id="goal-1", node_key="n:1", tool=tool, workspace="/ws", args=args, **fields)


WRITES_IN_THEIR_CALL = [
    call("http_request", {"method": "POST", "url": "http://ledger/entries", "body": {"n": 1}}),
    call(
        "http_request",
        {
            "method": "POST",
            "url": "http://ledger/entries",
            "body": {"n": 2},
            "undo": {"method": "DELETE", "url": "http://ledger/entries/2"},
        },
    ),
    call("http_request", {"method": "PUT", "url": "http://ledger/big", "body": {"text": "y" * 5000}}),
    call("send_email", {"to": "a@b.c", "subject": "s", "body": "b"}),
    call("git_commit", {"message": "Add notes\n\nbody"}),
    call("notify_webhook", {"url": "http://hooks/x", "payload": {"release": "2.0"}}),
    call("make_payment", {"amount_cents": 1250, "currency": "EUR", "recipient": "ACME"}),
    # A device's call, resolved on its worker: braces in it are text, not a template.
    call("send_email", {"to": "a@b.c", "subject": "{{steps.x}}", "body": "b"}, resolved=True),
]


@pytest.mark.parametrize("write", WRITES_IN_THEIR_CALL, ids=lambda c: c.tool)
async def test_a_write_prepared_in_the_workflow_is_what_the_prepare_activity_returns(write, tmp_path):
    prepared = prepared_in_workflow(write)
    assert prepared is not None and prepared.effect_key is not None
    assert prepared == await ToolActivities(DiskArtifactStore(tmp_path)).prepare_effect(write)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
async def test_any_body_gets_the_key_the_prepare_activity_gives(body):
    write = call("http_request", {"method": "POST", "url": "http://ledger/entries", "body": body})
    with tempfile.TemporaryDirectory() as tmp:
        from_activity = await ToolActivities(DiskArtifactStore(Path(tmp))).prepare_effect(write)
    assert prepared_in_workflow(write) == from_activity


def test_writes_whose_arguments_are_in_the_store_or_wrong_are_left_to_the_activity():
    ref = ArtifactRef(digest="sha256:" + "0" * 64, size=2)
    templated = {"to": "a@b.c", "subject": "{{steps.summary}}", "body": "b"}
    assert prepared_in_workflow(call("send_email", templated)) is None  # its text is in the store
    assert prepared_in_workflow(call("send_email", None, args_ref=ref)) is None  # a model's JSON, by reference
    assert prepared_in_workflow(call("send_email", {"to": "not an address", "subject": "s", "body": "b"})) is None
    assert prepared_in_workflow(call("mcp__srv__tool", {"a": 1})) is None  # the worker's config may grade it
