"""Tools of a user's own, as their package would declare them with `perdure.tool`: the tests
load this module into real workers and devices (`perdure worker --tools tests.usertool_sample`)
and into in-process ones. They talk to the fakes of testing/fakes.py, which keep ledgers:
the payments API (a paid service: each charge costs CHARGE_FEE_USD, refunds by idempotency
key), the bookkeeping API (entries found again by the effect key they carry) and a webhook
receiver (which cannot deduplicate). Not a test module."""

from __future__ import annotations

import os

import httpx
from pydantic import BaseModel, ConfigDict, Field

import perdure

CHARGE_FEE_USD = 0.25
"""What one charge costs the goal: reported by `charge` and `wire`."""
QUOTE_FEE_USD = 0.01
"""What one quote costs: `quote` is a paid read."""
REFUND_TIMEOUT_S = 20
"""refund_charge's own timeout: not a default, so a test sees the compensation ran by it."""


class ChargeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    amount_cents: int = Field(gt=0, description="What to charge, in cents.")
    recipient: str = Field(min_length=1)
    memo: str = ""


class EntryArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="The bookkeeping API's base URL.")
    account: str
    amount_cents: int


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Where the webhook listens.")
    text: str


def _payments() -> tuple[str, dict[str, str]]:
    return os.environ["PERDURE_PAYMENTS_URL"], {"Authorization": f"Bearer {os.environ['PERDURE_PAYMENTS_KEY']}"}


async def _charge(args: ChargeArgs, call: perdure.ToolCall) -> dict:
    base, auth = _payments()
    body = {**args.model_dump(), "currency": "EUR"}
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.post(
            f"{base}/payments", json=body, headers={**auth, "Idempotency-Key": call.idempotency_key or ""}
        )
    if reply.status_code >= 500:
        raise perdure.OutcomeUnknown(f"the payments API answered {reply.status_code}")
    if reply.status_code >= 400:
        raise perdure.ToolError(f"the payments API refused the charge: {reply.text[:200]}")
    # The fee of the charge, also when the API answers a retry from its idempotency store.
    call.cost(CHARGE_FEE_USD)
    payment = reply.json()
    return {"payment": payment["id"], "amount_cents": payment["amount_cents"], "recipient": payment["recipient"]}


@perdure.tool(
    risk="remote-write",
    replay="keyed",
    target="payee:{recipient}",
    compensation="refund_charge",
    network=True,
    devices=True,
    max_cost_usd=1.0,
)
async def charge(args: ChargeArgs, call: perdure.ToolCall) -> dict:
    """Charge a recipient through the payments API (a paid call: 0.25 USD a charge)."""
    return await _charge(args, call)


@perdure.tool(risk="irreversible", replay="keyed", target="payee:{recipient}", compensation="refund_charge")
async def wire(args: ChargeArgs, call: perdure.ToolCall) -> dict:
    """Wire money to a recipient: cannot be taken back but by a refund, so a person confirms it."""
    return await _charge(args, call)


@perdure.tool(risk="remote-write", replay="keyed", network=True, devices=True, timeout_s=REFUND_TIMEOUT_S)
def refund_charge(args: perdure.Undo, call: perdure.ToolCall) -> str:
    """Refund the charge made under an effect key (the compensation of charge and wire)."""
    base, auth = _payments()
    with httpx.Client(timeout=10) as http:
        found = http.get(f"{base}/payments", params={"idempotency_key": args.effect_key}, headers=auth).json()["data"]
        if not found:
            return f"nothing to refund: no charge was made under {args.effect_key}"
        reply = http.post(
            f"{base}/refunds",
            json={"payment_id": found[0]["id"], "reason": f"undo {args.tool}"},
            headers={**auth, "Idempotency-Key": call.idempotency_key or ""},
        )
    if reply.status_code == 400 and "already_refunded" in reply.text:
        return f"charge {found[0]['id']} was already refunded"
    if reply.status_code >= 400:
        raise perdure.OutcomeUnknown(f"the payments API answered {reply.status_code}: {reply.text[:200]}")
    return f"refunded {found[0]['id']} ({reply.json()['id']})"


def find_entry(args: EntryArgs, call: perdure.ToolCall) -> dict | None:
    """The entry filed under this call's effect key, if there is one."""
    entries = httpx.get(f"{args.url}/entries", timeout=10).json()["data"]
    return next((e for e in entries if e.get("effect_key") == call.idempotency_key), None)


@perdure.tool(risk="remote-write", replay="check", lookup=find_entry, key_fields=["account", "amount_cents"])
def file_entry(args: EntryArgs, call: perdure.ToolCall) -> dict:
    """File a bookkeeping entry; it carries its effect key, so a retry finds it instead of filing it again."""
    body = {"account": args.account, "amount_cents": args.amount_cents, "effect_key": call.idempotency_key}
    reply = httpx.post(f"{args.url}/entries", json=body, timeout=10)
    reply.raise_for_status()
    return reply.json()


@perdure.tool(risk="remote-write", replay="once", heartbeat_s=5)
def post_note(args: NoteArgs) -> str:
    """Post a note to a webhook, which cannot deduplicate: never sent twice on its own."""
    reply = httpx.post(args.url, json={"text": args.text}, timeout=10)
    return f"posted ({reply.status_code})"


class QuoteArgs(BaseModel):
    amount_cents: int = Field(gt=0)


@perdure.tool
def quote(args: QuoteArgs, call: perdure.ToolCall) -> dict:
    """Quote what a charge of this amount would cost in fees (a paid read: 0.01 USD a quote)."""
    call.cost(QUOTE_FEE_USD)
    return {"amount_cents": args.amount_cents, "fee_usd": CHARGE_FEE_USD}
