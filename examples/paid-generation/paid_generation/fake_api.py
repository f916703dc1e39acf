"""A fake of the paid generation API that keeps a billing ledger: the example's tests run
against it, and so can you (`python -m paid_generation.fake_api --port 8787`).

It speaks the JSON of an asynchronous generation API (modelled on Replicate's predictions
and OpenAI's video jobs), under `Authorization: Bearer KEY` (401 otherwise):

- `POST /v1/generations` `{"prompt", "seed"}` with an `Idempotency-Key`: a job is accepted
  (201) and billed at once, a ledger entry of its price; the same key again is answered
  from the idempotency store (the same job, billed nothing; `Idempotent-Replayed: true`),
  the same key with another body is refused (422), and one still being answered gets 409;
- `GET /v1/generations/{id}`: the job, `queued`, then `running` with its `progress`, then
  `succeeded` with `output.url` (or `canceled`); each read is counted as a poll of the job;
- `GET /v1/generations/{id}/content`: the result, a small PNG as `b64_json`;
- `GET /v1/generations?idempotency_key=KEY`: the job submitted under that key, if any;
- `POST /v1/generations/{id}/refund`: stops the job if it runs and refunds its price, a
  negative ledger entry, once per job (a second refund is refused: `already_refunded`);
- `GET /v1/billing/ledger`: the entries, their total, and the polls of each job.

Errors are `{"error": {"type", "code", "message"}}` with the HTTP status that fits. A job
runs for `duration_s`. A test's gates: `hold()` keeps every job running, `hold_answers()`
keeps the answer to a submission it billed (a retry of its key meanwhile gets 409), both
until `release()`.
It never calls anything real. The HTTP plumbing, the bearer check and the idempotency store
are perdure's own test fake's (`perdure.testing.fakes.FakeService`).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import struct
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from perdure.testing.fakes import FakeService, Reply
from perdure.testing.http import serve_until_interrupted

MODEL = "paidgen-image-1"
DEFAULT_KEY = "pg_test_key"
DEFAULT_PRICE = "0.40"
QUEUED_SHARE = 0.1
"""The first tenth of a job's time it is `queued`, then `running`."""
IMAGE_SIDE = 8
ANSWER_HOLD_LIMIT_S = 60.0
"""The longest `hold_answers()` keeps an answer: a test that forgot to release never hangs."""


@dataclass
class Job:
    id: str
    prompt: str
    seed: int
    idempotency_key: str | None
    price: Decimal
    created_at: int
    started: float
    canceled_progress: float | None = None
    refund_id: str | None = None
    polls: int = 0


class FakeGenerationAPI(FakeService):
    name = "generation"
    env_prefix = "PAIDGEN_API"
    """`worker_env()` is PAIDGEN_API_URL and PAIDGEN_API_KEY: where the example's tools look."""

    def __init__(self, *, duration_s: float = 1.5, price: str = DEFAULT_PRICE, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.duration_s = duration_s
        self.price = Decimal(price)
        self.jobs: dict[str, Job] = {}
        self._held = threading.Event()
        self._answers_held = threading.Event()

    # --- what a test reads and does -----------------------------------------------------

    def hold(self) -> None:
        """Keep every job running (a job past its time finishes when released)."""
        self._held.set()

    def hold_answers(self) -> None:
        """Bill each submission, then keep its answer until `release()`."""
        self._answers_held.set()

    def release(self) -> None:
        self._held.clear()
        self._answers_held.clear()

    def charges(self) -> list[dict]:
        return [e for e in self.ledger() if e["kind"] == "charge"]

    def refunds(self) -> list[dict]:
        return [e for e in self.ledger() if e["kind"] == "refund"]

    def total(self) -> Decimal:
        """What the ledger adds up to: charges less refunds."""
        return sum((Decimal(e["amount"]) for e in self.ledger()), Decimal("0"))

    def polls(self) -> dict[str, int]:
        with self._lock:
            return {job.id: job.polls for job in self.jobs.values()}

    # --- the API --------------------------------------------------------------------------

    def error(self, status: int, name: str, message: str, **extra: Any) -> Reply:
        if status == 401:
            kind = "authentication_error"
        elif status == 404:
            kind = "not_found_error"
        else:
            kind = "idempotency_error" if "idempotent" in name else "invalid_request_error"
        return status, {"error": {"type": kind, "code": name, "message": message, **extra}}, {}

    def write(self, method: str, path: str, body: Any, key: str | None) -> Reply:
        if (method, path) == ("POST", "/v1/generations"):
            return self._submit(body, key)
        parts = path.split("/")
        if method == "POST" and len(parts) == 5 and parts[:3] == ["", "v1", "generations"] and parts[4] == "refund":
            return self._refund(parts[3], key)
        return self.error(404, "not_found", f"no such path: {method} {path}")

    def read(self, path: str, query: dict[str, list[str]]) -> Reply:
        if path == "/v1/billing/ledger":
            return 200, self._ledger_page(), {}
        if path == "/v1/generations":
            key = (query.get("idempotency_key") or [""])[0]
            with self._lock:
                found = [j for j in self.jobs.values() if key and j.idempotency_key == key]
            return 200, {"object": "list", "data": [self._public(j) for j in found]}, {}
        parts = path.split("/")
        if len(parts) in (4, 5) and parts[:3] == ["", "v1", "generations"]:
            with self._lock:
                job = self.jobs.get(parts[3])
                if job is not None and len(parts) == 4:
                    job.polls += 1
            if job is None:
                return self.error(404, "generation_not_found", f"No generation with id '{parts[3]}'.")
            if len(parts) == 4:
                return 200, self._public(job), {}
            if parts[4] == "content":
                return self._content(job)
        return self.error(404, "not_found", f"no such path: GET {path}")

    def _submit(self, body: Any, key: str | None) -> Reply:
        if not isinstance(body, dict):
            return self.error(400, "invalid_body", "The request body must be a JSON object.")
        prompt, seed = body.get("prompt"), body.get("seed", 0)
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > 4_000:
            return self.error(400, "invalid_prompt", "prompt must be a non-empty string of at most 4000 characters.")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            return self.error(400, "invalid_seed", "seed must be an integer >= 0.")
        job = Job(
            id=f"gen_{uuid.uuid4().hex[:20]}",
            prompt=prompt,
            seed=seed,
            idempotency_key=key,
            price=self.price,
            created_at=int(time.time()),
            started=time.monotonic(),
        )
        with self._lock:
            self.jobs[job.id] = job
        self.record(self._entry("charge", job, job.price))
        deadline = time.monotonic() + ANSWER_HOLD_LIMIT_S
        while self._answers_held.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        return 201, self._public(job), {}

    def _refund(self, job_id: str, key: str | None) -> Reply:
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None:
                return self.error(404, "generation_not_found", f"No generation with id '{job_id}'.")
            if job.refund_id is not None:
                return self.error(
                    409, "already_refunded", f"Generation {job_id} was already refunded.", refund=job.refund_id
                )
            status, progress = self._state(job)
            if status in ("queued", "running"):
                job.canceled_progress = progress
            job.refund_id = f"rf_{uuid.uuid4().hex[:20]}"
        self.record(self._entry("refund", job, -job.price))
        refund = {
            "id": job.refund_id,
            "object": "refund",
            "generation": job.id,
            "amount": {"amount": f"{job.price:.2f}", "currency": "usd"},
            "status": "succeeded",
        }
        return 200, refund, {}

    def _content(self, job: Job) -> Reply:
        status, _ = self._state(job)
        if status != "succeeded":
            return self.error(409, "not_ready", f"Generation {job.id} is {status}; its content exists once succeeded.")
        image = _png(job.prompt, job.seed)
        content = {"object": "generation.content", "generation": job.id, "content_type": "image/png"}
        return 200, {**content, "b64_json": base64.b64encode(image).decode("ascii")}, {}

    def _state(self, job: Job) -> tuple[str, float]:
        if job.canceled_progress is not None:
            return "canceled", job.canceled_progress
        elapsed = time.monotonic() - job.started
        if elapsed < self.duration_s * QUEUED_SHARE:
            return "queued", 0.0
        if elapsed < self.duration_s or self._held.is_set():
            return "running", min(elapsed / self.duration_s, 0.99)
        return "succeeded", 1.0

    def _public(self, job: Job) -> dict:
        status, progress = self._state(job)
        output = None
        if status == "succeeded":
            output = {"url": f"{self.base_url}/v1/generations/{job.id}/content", "content_type": "image/png"}
        return {
            "id": job.id,
            "object": "generation",
            "model": MODEL,
            "status": status,
            "created_at": job.created_at,
            "progress": round(progress, 2),
            "prompt": job.prompt,
            "seed": job.seed,
            "price": {"amount": f"{job.price:.2f}", "currency": "usd"},
            "output": output,
            "refunded": job.refund_id is not None,
            "error": None,
        }

    def _entry(self, kind: str, job: Job, amount: Decimal) -> dict:
        return {
            "id": f"le_{uuid.uuid4().hex[:20]}",
            "object": "ledger_entry",
            "kind": kind,
            "generation": job.id,
            "amount": f"{amount:.2f}",
            "currency": "usd",
            "created_at": int(time.time()),
        }

    def _ledger_page(self) -> dict:
        return {
            "object": "list",
            "data": self.ledger(),
            "total": {"amount": f"{self.total():.2f}", "currency": "usd"},
            "polls": self.polls(),
        }


def _png(prompt: str, seed: int) -> bytes:
    """A small square PNG of one colour, the prompt's and the seed's: a result to fetch."""
    colour = hashlib.sha256(f"{seed}:{prompt}".encode()).digest()[:3]
    rows = b"".join(b"\x00" + colour * IMAGE_SIDE for _ in range(IMAGE_SIDE))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", IMAGE_SIDE, IMAGE_SIDE, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the fake paid generation API (it bills nothing real).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--api-key", default=DEFAULT_KEY, help="the key callers must send (default: %(default)s)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds a job runs (default: %(default)s)")
    parser.add_argument("--price", default=DEFAULT_PRICE, help="USD billed per job (default: %(default)s)")
    args = parser.parse_args(argv)
    fake = FakeGenerationAPI(
        api_key=args.api_key, duration_s=args.duration, price=args.price, host=args.host, port=args.port
    ).start()
    print(f"fake paid generation API at {fake.base_url} (its ledger: GET {fake.base_url}/v1/billing/ledger)")
    print("the worker's environment: " + " ".join(f"{k}={v}" for k, v in fake.worker_env().items()), flush=True)
    serve_until_interrupted(fake)


if __name__ == "__main__":
    main()
