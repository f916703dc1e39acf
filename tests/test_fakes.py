"""The fake services crash tests rely on: their idempotency must behave like real mail and payment APIs."""

from __future__ import annotations

import os
import socket
import time

import httpx
import pytest

from perdure.testing.fakes import LedgerAPI, MailAPI, PaymentsAPI, WebhookReceiver

AUTH = {"Authorization": "Bearer k"}
MESSAGE = {"from": "ops@example.com", "to": ["a@example.com"], "subject": "Hi", "text": "hello"}


@pytest.fixture
def mail(fake_service) -> MailAPI:
    return fake_service(MailAPI, api_key="k")


def test_mail_requires_the_bearer_key_and_valid_fields(mail):
    assert httpx.post(f"{mail.base_url}/emails", json=MESSAGE).status_code == 401
    bad = httpx.post(f"{mail.base_url}/emails", json={**MESSAGE, "to": "nobody"}, headers=AUTH)
    assert bad.status_code == 422 and bad.json()["name"] == "validation_error" and "to" in bad.json()["message"]
    assert mail.ledger() == []


def test_mail_same_key_same_body_replays_the_stored_response(mail):
    headers = {**AUTH, "Idempotency-Key": "fx-1"}
    first = httpx.post(f"{mail.base_url}/emails", json=MESSAGE, headers=headers)
    again = httpx.post(f"{mail.base_url}/emails", json=MESSAGE, headers=headers)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert len(mail.ledger()) == 1 and (mail.requests, mail.replays) == (2, 1)
    assert mail.ledger()[0]["idempotency_key"] == "fx-1"


def test_mail_same_key_different_body_is_422(mail):
    headers = {**AUTH, "Idempotency-Key": "fx-1"}
    httpx.post(f"{mail.base_url}/emails", json=MESSAGE, headers=headers)
    changed = httpx.post(f"{mail.base_url}/emails", json={**MESSAGE, "text": "other"}, headers=headers)
    assert changed.status_code == 422 and changed.json()["name"] == "invalid_idempotent_request"
    assert len(mail.ledger()) == 1


def test_mail_without_a_key_sends_every_time(mail):
    for _ in range(2):
        assert httpx.post(f"{mail.base_url}/emails", json=MESSAGE, headers=AUTH).status_code == 200
    assert len(mail.ledger()) == 2
    snapshot = httpx.get(f"{mail.base_url}/_ledger").json()
    assert snapshot["service"] == "mail" and len(snapshot["ledger"]) == 2 and snapshot["requests"] == 2
    message_id = snapshot["ledger"][0]["id"]
    assert httpx.get(f"{mail.base_url}/emails/{message_id}", headers=AUTH).json()["subject"] == "Hi"


@pytest.mark.slow
def test_respond_delay_comes_after_recording(fake_service):
    mail = fake_service(MailAPI, respond_delay_s=0.6)
    client = httpx.Client(timeout=0.2)
    with pytest.raises(httpx.ReadTimeout):
        client.post(f"{mail.base_url}/emails", json=MESSAGE)
    assert len(mail.ledger()) == 1  # accepted, though the caller never heard back
    time.sleep(0.6)


def test_payments_pay_look_up_by_key_and_refund_once(fake_service):
    payments = fake_service(PaymentsAPI)
    body = {"amount_cents": 1250, "currency": "EUR", "recipient": "ACME", "memo": "invoice 7"}
    paid = httpx.post(f"{payments.base_url}/payments", json=body, headers={"Idempotency-Key": "fx-p"}).json()
    assert paid["status"] == "succeeded" and paid["id"].startswith("pay_")
    found = httpx.get(f"{payments.base_url}/payments", params={"idempotency_key": "fx-p"}).json()
    assert [p["id"] for p in found["data"]] == [paid["id"]]
    assert httpx.get(f"{payments.base_url}/payments", params={"idempotency_key": "fx-x"}).json()["data"] == []
    refund = httpx.post(f"{payments.base_url}/refunds", json={"payment_id": paid["id"]}).json()
    assert refund["payment_id"] == paid["id"] and refund["amount_cents"] == 1250
    twice = httpx.post(f"{payments.base_url}/refunds", json={"payment_id": paid["id"]})
    assert twice.status_code == 400 and twice.json()["error"]["code"] == "charge_already_refunded"
    assert twice.json()["error"]["refund_id"] == refund["id"]
    missing = httpx.post(f"{payments.base_url}/refunds", json={"payment_id": "pay_nope"})
    assert missing.status_code == 404
    mismatch = httpx.post(
        f"{payments.base_url}/payments", json={**body, "amount_cents": 1}, headers={"Idempotency-Key": "fx-p"}
    )
    assert mismatch.status_code == 422 and mismatch.json()["error"]["type"] == "idempotency_error"
    assert [e["kind"] for e in payments.ledger()] == ["payment", "refund"]


def test_ledger_api_entries(fake_service):
    ledger = fake_service(LedgerAPI)
    created = httpx.post(f"{ledger.base_url}/entries", json={"ref": "a", "amount": 1})
    assert created.status_code == 201
    entry_id = created.json()["id"]
    patched = httpx.patch(f"{ledger.base_url}/entries/{entry_id}", json={"amount": 2}).json()
    assert patched == {"ref": "a", "amount": 2, "id": entry_id}
    assert httpx.delete(f"{ledger.base_url}/entries/{entry_id}").json()["deleted"] is True
    assert httpx.delete(f"{ledger.base_url}/entries/{entry_id}").status_code == 404
    assert [op["op"] for op in ledger.ledger()] == ["create", "patch", "delete"]


def test_webhook_records_every_delivery(fake_service):
    hook = fake_service(WebhookReceiver)
    url = f"{hook.base_url}/hooks/deploy"
    for _ in range(2):
        assert httpx.post(url, json={"v": 1}, headers={"Idempotency-Key": "k"}).is_success
    assert len(hook.ledger()) == 2 and hook.ledger()[0]["path"] == "/hooks/deploy"
    hook.reply_status = 500
    assert httpx.post(url, json={"v": 2}).status_code == 500
    assert len(hook.ledger()) == 3  # it acted, then failed: the caller cannot tell


def test_worker_env_names_where_the_effect_tools_find_each_service(fake_service):
    mail = fake_service(MailAPI, api_key="k")
    payments = fake_service(PaymentsAPI)
    assert mail.worker_env() == {"PERDURE_MAIL_URL": mail.base_url, "PERDURE_MAIL_KEY": "k"}
    assert payments.worker_env() == {"PERDURE_PAYMENTS_URL": payments.base_url}
    assert fake_service(LedgerAPI).worker_env() == {}  # http_request is given its URL
    assert os.environ["PERDURE_MAIL_URL"] == mail.base_url  # the fixture set it for this test


def test_a_request_cut_off_before_its_body_makes_nothing_happen_and_its_key_stays_free():
    """A call cancelled after its headers went out (its activity timed out under load) sent
    no body; the fake took it as a write of nothing, remembered its Idempotency-Key, and
    refused the retry with the whole body as "a different request payload" (found by
    tests/test_wide_fanout.py). A real server never hands a cut-off request to its service."""
    with LedgerAPI() as ledger:
        host, port = ledger.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as conn:
            conn.sendall(
                b"POST /entries HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Idempotency-Key: k-1\r\nContent-Length: 8\r\n\r\n"
            )
            conn.shutdown(socket.SHUT_WR)
            conn.recv(100)
        retried = httpx.post(f"{ledger.base_url}/entries", json={"n": 1}, headers={"Idempotency-Key": "k-1"})
        assert retried.status_code == 201, retried.text
        assert [entry["body"] for entry in ledger.ledger()] == [{"n": 1}]
