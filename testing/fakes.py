"""Small local stand-ins for the services remote-write tools talk to, each keeping a ledger.

Used by the tests, the crash harness and `make demo-crash`; never by a worker in production.
Each service is a threaded HTTP server speaking a realistic wire format:

- `MailAPI`: modelled on Resend's `POST /emails` (JSON, `Authorization: Bearer`,
  `Idempotency-Key`), answering `{"id": ...}`;
- `PaymentsAPI`: `POST /payments`, `POST /refunds`, `GET /payments?idempotency_key=`,
  Stripe-shaped errors;
- `LedgerAPI`: a bookkeeping API for `http_request`: `POST /entries`,
  `PUT|PATCH|DELETE /entries/{id}`; it can lose the answer to an entry it made
  (`lose_answers`: a gateway's 502 after the backend did the work);
- `WebhookReceiver`: records every POST and cannot deduplicate;
- `QuotesAPI`: a paid data API taking its key in the query string, billing each quote.

The first three implement idempotency keys the way payment and mail APIs do:
the same key with the same request replays the stored response (with
`Idempotent-Replayed: true`) and records nothing new; the same key with a
different request is refused with 422; a key whose first request is still being
processed gets 409. Each exposes what it received (`ledger()`, `requests`,
`replays`, and `GET /_ledger`) and can wait `respond_delay_s` after recording an
effect before answering, which widens the "accepted but not yet completed"
window a crash test aims at.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from perdure.testing.http import BackgroundHTTPServer, JSONHandler, serve_until_interrupted
from perdure.workflows.shared.canonical import digest_of

Reply = tuple[int, Any, dict[str, str]]

# The keys tests start the services with: any value works, as long as the worker sends the same.
MAIL_KEY = "re_test_mail_key"
PAYMENTS_KEY = "sk_test_payments_key"
QUOTES_KEY = "qk_test_quotes_key"


@dataclass
class _Remembered:
    request_digest: str
    reply: Reply | None = None  # None while the first request is being processed


class FakeService(BackgroundHTTPServer):
    """Base: HTTP plumbing, bearer auth, idempotency keys, the ledger and the response delay."""

    name = "service"
    env_prefix: str | None = None
    """Where the effect tools look for this service: `{env_prefix}_URL` and `{env_prefix}_KEY`."""

    @property
    def handler(self) -> type[BaseHTTPRequestHandler]:  # defined below this class
        return _Handler

    @property
    def thread_name(self) -> str:
        return f"fake-{self.name}"

    def __init__(
        self, *, api_key: str | None = None, respond_delay_s: float = 0.0, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        super().__init__(host, port)
        self.api_key = api_key
        self.respond_delay_s = respond_delay_s
        self._lock = threading.Lock()
        self._ledger: list[dict] = []
        self._keys: dict[str, _Remembered] = {}
        self.requests = 0
        self.replays = 0

    def worker_env(self) -> dict[str, str]:
        """The variables that point a worker's tools at this service; none for services a
        tool is given the URL of in its arguments (the ledger, webhooks)."""
        if self.env_prefix is None:
            return {}
        variables = {f"{self.env_prefix}_URL": self.base_url}
        if self.api_key is not None:
            variables[f"{self.env_prefix}_KEY"] = self.api_key
        return variables

    # --- what it received -----------------------------------------------------------

    def ledger(self) -> list[dict]:
        with self._lock:
            return [dict(entry) for entry in self._ledger]

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "service": self.name,
                "ledger": [dict(e) for e in self._ledger],
                "requests": self.requests,
                "replays": self.replays,
            }

    def record(self, entry: dict) -> None:
        with self._lock:
            self._ledger.append(entry)

    # --- request handling -------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str], body: Any) -> Reply:
        if method == "GET" and path == "/_ledger":
            return 200, self.snapshot(), {}
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return self.error(401, "missing_api_key", "Missing or invalid API key in the Authorization header.")
        if method == "GET":
            return self.read(path, query)
        with self._lock:
            self.requests += 1
        key = headers.get("idempotency-key")
        if not key:
            return self.write(method, path, body, None)
        fingerprint = digest_of({"method": method, "path": path, "body": body})
        with self._lock:
            remembered = self._keys.get(key)
            if remembered is None:
                self._keys[key] = _Remembered(fingerprint)
            elif remembered.request_digest != fingerprint:
                return self.error(
                    422,
                    "invalid_idempotent_request",
                    "Same idempotency key used with a different request payload.",
                )
            elif remembered.reply is None:
                return self.error(
                    409, "concurrent_idempotent_requests", "A request with this idempotency key is still in progress."
                )
            else:
                self.replays += 1
                status, payload, extra = remembered.reply
                return status, payload, {**extra, "Idempotent-Replayed": "true"}
        reply = self.write(method, path, body, key)
        with self._lock:
            if reply[0] >= 500:
                del self._keys[key]  # a failure the client may retry with the same key
            else:
                self._keys[key].reply = reply
        return reply

    def read(self, path: str, query: dict[str, list[str]]) -> Reply:
        return self.error(404, "not_found", f"no such path: GET {path}")

    def write(self, method: str, path: str, body: Any, key: str | None) -> Reply:
        """Make the effect (first time a key is seen) and answer. Services that take writes override it."""
        return self.error(405, "method_not_allowed", f"{self.name} takes no writes")

    def error(self, status: int, name: str, message: str) -> Reply:
        return status, {"statusCode": status, "name": name, "message": message}, {}


class MailAPI(FakeService):
    """`POST /emails` as Resend takes it: from, to (string or list), subject, text/html, headers."""

    name = "mail"
    env_prefix = "PERDURE_MAIL"

    def write(self, method: str, path: str, body: Any, key: str | None) -> Reply:
        if (method, path) != ("POST", "/emails"):
            return self.error(404, "not_found", f"no such path: {method} {path}")
        if not isinstance(body, dict):
            return self.error(422, "validation_error", "The request body must be a JSON object.")
        to = body.get("to")
        recipients = [to] if isinstance(to, str) else to
        missing = [f for f in ("from", "subject") if not body.get(f)]
        if not recipients or not all(isinstance(r, str) and "@" in r for r in recipients):
            missing.append("to")
        if not (body.get("text") or body.get("html")):
            missing.append("text")
        if missing:
            return self.error(422, "validation_error", f"Missing or invalid field(s): {', '.join(missing)}.")
        message_id = str(uuid.uuid4())
        headers = body.get("headers") if isinstance(body.get("headers"), dict) else {}
        self.record(
            {
                "id": message_id,
                "from": body["from"],
                "to": list(recipients),
                "subject": body["subject"],
                "text": body.get("text") or "",
                "message_id_header": headers.get("Message-ID"),
                "idempotency_key": key,
                "received_at": time.time(),
            }
        )
        return 200, {"id": message_id}, {}

    def read(self, path: str, query: dict[str, list[str]]) -> Reply:
        if path.startswith("/emails/"):
            wanted = path.removeprefix("/emails/")
            for message in self.ledger():
                if message["id"] == wanted:
                    return 200, {"object": "email", **message}, {}
            return self.error(404, "not_found", "Email not found.")
        return super().read(path, query)


class PaymentsAPI(FakeService):
    """Payments and full refunds; errors shaped like Stripe's (`{"error": {"type", "code", "message"}}`)."""

    name = "payments"
    env_prefix = "PERDURE_PAYMENTS"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.payments: dict[str, dict] = {}
        self.refunds: dict[str, dict] = {}
        self._payment_keys: dict[str, str] = {}

    def error(self, status: int, name: str, message: str, **extra: Any) -> Reply:
        kind = "idempotency_error" if "idempotent" in name else "invalid_request_error"
        return status, {"error": {"type": kind, "code": name, "message": message, **extra}}, {}

    def write(self, method: str, path: str, body: Any, key: str | None) -> Reply:
        if not isinstance(body, dict):
            return self.error(400, "parameter_invalid", "The request body must be a JSON object.")
        if (method, path) == ("POST", "/payments"):
            return self._pay(body, key)
        if (method, path) == ("POST", "/refunds"):
            return self._refund(body, key)
        return self.error(404, "resource_missing", f"no such path: {method} {path}")

    def _pay(self, body: dict, key: str | None) -> Reply:
        amount, currency, recipient = body.get("amount_cents"), body.get("currency"), body.get("recipient")
        if not isinstance(amount, int) or amount <= 0 or not isinstance(currency, str) or not recipient:
            return self.error(400, "parameter_invalid", "amount_cents (> 0), currency and recipient are required.")
        payment = {
            "id": f"pay_{uuid.uuid4().hex[:16]}",
            "object": "payment",
            "status": "succeeded",
            "amount_cents": amount,
            "currency": currency,
            "recipient": recipient,
            "memo": body.get("memo", ""),
            "refunded": False,
        }
        with self._lock:
            self.payments[payment["id"]] = payment
            if key:
                self._payment_keys[key] = payment["id"]
        self.record({"kind": "payment", "idempotency_key": key, **payment})
        return 200, payment, {}

    def _refund(self, body: dict, key: str | None) -> Reply:
        with self._lock:
            payment = self.payments.get(str(body.get("payment_id")))
            if payment is None:
                return self.error(404, "resource_missing", f"No such payment: '{body.get('payment_id')}'")
            if payment["refunded"]:
                return self.error(
                    400,
                    "charge_already_refunded",
                    f"Payment {payment['id']} has already been refunded.",
                    refund_id=payment.get("refund_id"),
                )
            refund = {
                "id": f"re_{uuid.uuid4().hex[:16]}",
                "object": "refund",
                "status": "succeeded",
                "payment_id": payment["id"],
                "amount_cents": payment["amount_cents"],
                "reason": body.get("reason", ""),
            }
            payment["refunded"], payment["refund_id"] = True, refund["id"]
            self.refunds[refund["id"]] = refund
        self.record({"kind": "refund", "idempotency_key": key, **refund})
        return 200, refund, {}

    def read(self, path: str, query: dict[str, list[str]]) -> Reply:
        with self._lock:
            if path == "/payments":
                key = (query.get("idempotency_key") or [""])[0]
                found = [self.payments[self._payment_keys[key]]] if key in self._payment_keys else []
                return 200, {"object": "list", "data": [dict(p) for p in found]}, {}
            if path.startswith("/payments/") and path.removeprefix("/payments/") in self.payments:
                return 200, dict(self.payments[path.removeprefix("/payments/")]), {}
        return self.error(404, "resource_missing", f"no such path: GET {path}")


class LedgerAPI(FakeService):
    """A bookkeeping API: entries created, replaced, patched and deleted over JSON."""

    name = "ledger"

    def __init__(self, *, lose_answers: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entries: dict[str, dict] = {}
        self.lose_answers = lose_answers
        """The next this many entries are made, and answered 502 (the answer lost on the way)."""

    def write(self, method: str, path: str, body: Any, key: str | None) -> Reply:
        if (method, path) == ("POST", "/entries"):
            if not isinstance(body, dict):
                return self.error(422, "validation_error", "An entry is a JSON object.")
            entry = {**body, "id": f"ent_{uuid.uuid4().hex[:12]}"}
            with self._lock:
                self.entries[entry["id"]] = entry
                lost, self.lose_answers = self.lose_answers > 0, max(0, self.lose_answers - 1)
            self.record({"op": "create", "id": entry["id"], "body": body, "idempotency_key": key})
            if lost:
                return self.error(502, "bad_gateway", "The upstream server did not answer in time.")
            return 201, entry, {}
        if path.startswith("/entries/") and method in ("PUT", "PATCH", "DELETE"):
            entry_id = path.removeprefix("/entries/")
            with self._lock:
                current = self.entries.get(entry_id)
                if current is None:
                    return self.error(404, "not_found", f"no entry {entry_id}")
                if method == "DELETE":
                    del self.entries[entry_id]
                    reply: dict = {"id": entry_id, "deleted": True}
                else:
                    if not isinstance(body, dict):
                        return self.error(422, "validation_error", "An entry is a JSON object.")
                    base = {} if method == "PUT" else current
                    reply = self.entries[entry_id] = {**base, **body, "id": entry_id}
            self.record({"op": method.lower(), "id": entry_id, "body": body, "idempotency_key": key})
            return 200, reply, {}
        return self.error(404, "not_found", f"no such path: {method} {path}")

    def read(self, path: str, query: dict[str, list[str]]) -> Reply:
        if path == "/entries":
            with self._lock:
                return 200, {"data": list(self.entries.values())}, {}
        return super().read(path, query)


class WebhookReceiver(FakeService):
    """Accepts any POST and records it; knows nothing of idempotency, like most webhooks."""

    name = "webhook"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reply_status = 200

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str], body: Any) -> Reply:
        if method == "GET" and path == "/_ledger":
            return 200, self.snapshot(), {}
        if method != "POST":
            return self.error(405, "method_not_allowed", "webhooks take POST")
        with self._lock:
            self.requests += 1
        self.record({"path": path, "body": body, "effect_key": headers.get("x-perdure-effect-key")})
        return self.reply_status, {"received": self.reply_status < 300}, {}


class QuotesAPI(FakeService):
    """A paid data API that takes its key in the query string (`?key=`, as many map and
    market-data APIs do). `GET /quotes?amount_cents=N` quotes a charge's fee and bills the
    quote (`price_usd` in the answer; one ledger line each, whatever the client does next);
    `GET /rates` gives the EUR rate, free, after failing with 503 `rates_failures` times."""

    name = "quotes"
    env_prefix = "QUOTES_API"  # a user's own service: not a perdure setting
    PRICE_USD = 0.02

    def __init__(self, *, rates_failures: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rates_failures = rates_failures

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str], body: Any) -> Reply:
        if method == "GET" and path == "/_ledger":
            return 200, self.snapshot(), {}
        if self.api_key is not None and (query.get("key") or [""])[0] != self.api_key:
            return self.error(403, "forbidden", "The provided API key is invalid.")
        with self._lock:
            self.requests += 1
        if (method, path) == ("GET", "/quotes"):
            amount = (query.get("amount_cents") or [""])[0]
            if not amount.isdigit():
                return self.error(400, "invalid_request", "amount_cents is required.")
            quote = {"id": f"qt_{uuid.uuid4().hex[:12]}", "amount_cents": int(amount), "price_usd": self.PRICE_USD}
            self.record({"kind": "quote", **quote})
            return 200, {**quote, "fee_cents": 30 + int(amount) // 50}, {}
        if (method, path) == ("GET", "/rates"):
            with self._lock:
                failing, self.rates_failures = self.rates_failures > 0, max(0, self.rates_failures - 1)
            if failing:
                return self.error(503, "unavailable", "The rates service is unavailable.")
            return 200, {"base": "EUR", "usd": 1.08}, {}
        return self.error(404, "not_found", f"no such path: {method} {path}")


class _Handler(JSONHandler):
    def _serve(self) -> None:
        service: FakeService = self.server.owner  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        raw = self.read_whole_body()
        if raw is None:
            return  # cut off mid-request: nothing happened, as at a real service
        try:
            body = json.loads(raw) if raw.strip() else None
        except ValueError:
            self.send_json(*service.error(400, "invalid_json", "The request body is not valid JSON."))
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, payload, extra = service.handle(
            self.command, url.path.rstrip("/") or "/", parse_qs(url.query), headers, body
        )
        if self.command != "GET" and service.respond_delay_s:
            time.sleep(service.respond_delay_s)
        self.send_json(status, payload, extra)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815 - the stdlib's names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the fake mail, payments, ledger and webhook services.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--respond-delay", type=float, default=0.0, help="seconds to wait after recording an effect")
    args = parser.parse_args(argv)
    services = [
        cls(host=args.host, respond_delay_s=args.respond_delay).start()
        for cls in (MailAPI, PaymentsAPI, LedgerAPI, WebhookReceiver)
    ]
    for service in services:
        print(f"{service.name:9} {service.base_url}  (ledger: {service.base_url}/_ledger)", flush=True)
    print("set PERDURE_MAIL_URL / PERDURE_PAYMENTS_URL on the worker to use them; Ctrl-C stops", flush=True)
    serve_until_interrupted(*services)


if __name__ == "__main__":
    main()
