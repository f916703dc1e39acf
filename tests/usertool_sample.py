"""Tools of a user's own, as their package would declare them with `perdure.tool`: the tests
load this module into real workers and devices (`perdure worker --tools tests.usertool_sample`)
and into in-process ones. They talk to the fakes of testing/fakes.py, which keep ledgers:
the payments API (a paid service: each charge costs CHARGE_FEE_USD, refunds by idempotency
key), the bookkeeping API (entries found again by the effect key they carry), a webhook
receiver (which cannot deduplicate) and the quotes API (a paid read whose key is in its
URLs). Not a test module."""

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
ENTRY_FEE_USD = 0.05
"""What filing a bookkeeping entry costs, as `file_entry` reports it when it files one."""
ENTRY_MAX_USD = 0.10
"""`file_entry`'s max_cost_usd: what an entry its lookup found is charged (its cost unknown)."""
NOTE_MAX_USD = 0.03
"""`post_note`'s max_cost_usd: what a note a person says was posted is charged."""


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


async def find_entry(args: EntryArgs, call: perdure.ToolCall) -> dict | None:
    """The entry filed under this call's effect key, if there is one (the API does not say
    what it cost: the goal charges it at max_cost_usd)."""
    async with httpx.AsyncClient(timeout=10) as http:
        entries = (await http.get(f"{args.url}/entries")).json()["data"]
    return next((e for e in entries if e.get("effect_key") == call.idempotency_key), None)


@perdure.tool(
    risk="remote-write",
    replay="check",
    lookup=find_entry,
    key_fields=["account", "amount_cents"],
    max_cost_usd=ENTRY_MAX_USD,
)
async def file_entry(args: EntryArgs, call: perdure.ToolCall) -> dict:
    """File a bookkeeping entry; it carries its effect key, so a retry finds it instead of filing it again."""
    body = {"account": args.account, "amount_cents": args.amount_cents, "effect_key": call.idempotency_key}
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.post(f"{args.url}/entries", json=body)
    reply.raise_for_status()  # a 502 may have filed it: "may have happened", looked up next attempt
    call.cost(ENTRY_FEE_USD)
    return reply.json()


@perdure.tool(risk="remote-write", replay="once", heartbeat_s=5, max_cost_usd=NOTE_MAX_USD)
async def post_note(args: NoteArgs) -> str:
    """Post a note to a webhook, which cannot deduplicate: never sent twice on its own."""
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.post(args.url, json={"text": args.text})
    if reply.status_code >= 500:
        raise perdure.OutcomeUnknown(f"the webhook answered {reply.status_code}: it may have taken the note")
    return f"posted ({reply.status_code})"


class QuoteArgs(BaseModel):
    amount_cents: int = Field(gt=0)


@perdure.tool
def quote(args: QuoteArgs, call: perdure.ToolCall) -> dict:
    """Quote what a charge of this amount would cost in fees (a paid read: 0.01 USD a quote)."""
    call.cost(QUOTE_FEE_USD)
    return {"amount_cents": args.amount_cents, "fee_usd": CHARGE_FEE_USD}


@perdure.tool(network=True, secrets=["QUOTES_API_KEY"])
async def fx_quote(args: QuoteArgs, call: perdure.ToolCall) -> dict:
    """Quote a charge's fee from the paid quotes API (billed per quote), in USD at today's rate."""
    base, key = os.environ["QUOTES_API_URL"], os.environ["QUOTES_API_KEY"]
    async with httpx.AsyncClient(timeout=10) as http:
        quote = (await http.get(f"{base}/quotes", params={"amount_cents": args.amount_cents, "key": key})).json()
        call.cost(quote["price_usd"])  # billed, whatever happens next
        # The key is in the URL: a failure's message names it, and perdure takes it out.
        rate = (await http.get(f"{base}/rates", params={"key": key})).raise_for_status().json()
    return {"fee_cents": quote["fee_cents"], "fee_usd_cents": round(quote["fee_cents"] * rate["usd"])}
