"""make_payment and refund_payment: pay through the payments API configured on the worker
(PERDURE_PAYMENTS_URL, PERDURE_PAYMENTS_KEY, read at call time), and undo a payment.

make_payment is irreversible: a person confirms every call, and its refund is registered
as its compensation before it is sent. The refund may name the payment only by the
effect key it was made with (it is registered first); a payment that never happened
needs no refund. Both are `keyed`: the effect key goes out as the Idempotency-Key header.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from perdure.activities.tools.catalogue.tool_base import EffectCall, EffectTool, how_confirmed
from perdure.activities.tools.catalogue.tool_errors import OutcomeUnknown
from perdure.workflows.shared.tool_specs import EFFECT_KEY, REMOTE_TIMEOUTS, Compensation, Effect, ToolArgs, ToolSpec


class MakePaymentArgs(ToolArgs):
    amount_cents: int = Field(gt=0, le=100_000_000)
    currency: str = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code, upper case.")
    recipient: str = Field(min_length=1, max_length=200)
    memo: str = Field(default="", max_length=500)


class RefundPaymentArgs(ToolArgs):
    payment_key: str | None = Field(
        default=None, pattern=EFFECT_KEY, description="Effect key the payment was made with."
    )
    payment_id: str | None = Field(default=None, min_length=1, description="Payment id from the payments API.")
    reason: str = Field(default="compensation", max_length=500)

    @model_validator(mode="after")
    def _names_a_payment(self) -> RefundPaymentArgs:
        if not self.payment_key and not self.payment_id:
            raise ValueError("give payment_key or payment_id")
        return self


class MakePayment(EffectTool):
    spec = ToolSpec(
        name="make_payment",
        risk="irreversible",
        replay="keyed",
        description="Pay a recipient through the payments API configured on the worker. "
        "Needs a human confirmation; a refund is registered as its compensation before it is sent.",
        args_model=MakePaymentArgs,
        compensation="refund_payment",
        **REMOTE_TIMEOUTS,
    )
    example = {"amount_cents": 12_500, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 42"}

    def effect(self, args: MakePaymentArgs, workspace: str) -> Effect:
        return Effect(f"payee:{args.recipient}", "pay", args.model_dump(mode="json"))

    def undo(self, key: str, args: MakePaymentArgs) -> Compensation:
        return Compensation(
            tool="refund_payment",
            args={"payment_key": key, "reason": "perdure rollback"},
            reason=f"refund the payment to {args.recipient} ({args.amount_cents} cents {args.currency})",
        )

    def target(self, args: MakePaymentArgs) -> str:
        return f"the payments API (payee {args.recipient})"

    async def send(self, call: EffectCall, args: MakePaymentArgs) -> dict:
        from perdure.activities.tools import http_calls as http

        base = http.service_url(call.tool, "PERDURE_PAYMENTS_URL", "payments")
        headers = {"Idempotency-Key": call.key, **http.bearer("PERDURE_PAYMENTS_KEY")}
        response = await http.http_call("POST", f"{base}/payments", body=args.model_dump(mode="json"), headers=headers)
        http.check_status(response, "the payments API")
        reply = http.json_reply(response, "the payments API")
        if not isinstance(reply, dict) or not reply.get("id"):
            raise OutcomeUnknown(f"the payments API answered without a payment id: {http.excerpt(response)}")
        return {"payment_id": str(reply["id"]), "status": str(reply.get("status", "")), **http.replayed(response)}

    def describe(self, call: EffectCall, args: MakePaymentArgs, receipt: dict) -> str:
        amount = f"{args.amount_cents / 100:.2f} {args.currency}"
        return f"paid {amount} to {args.recipient} (payment {receipt.get('payment_id')}{how_confirmed(receipt)})"


class RefundPayment(EffectTool):
    spec = ToolSpec(
        name="refund_payment",
        risk="remote-write",
        replay="keyed",
        description="Refund a payment in full (a compensation for make_payment).",
        args_model=RefundPaymentArgs,
        **REMOTE_TIMEOUTS,
    )
    example = {"payment_id": "pay_1", "reason": "duplicate"}

    def effect(self, args: RefundPaymentArgs, workspace: str) -> Effect:
        return Effect(f"refund:{args.payment_key or args.payment_id}", "refund", args.model_dump(mode="json"))

    def target(self, args: RefundPaymentArgs) -> str:
        return f"the payments API (refund of {args.payment_id or args.payment_key})"

    async def send(self, call: EffectCall, args: RefundPaymentArgs) -> dict:
        from perdure.activities.tools import http_calls as http

        base = http.service_url(call.tool, "PERDURE_PAYMENTS_URL", "payments")
        auth = http.bearer("PERDURE_PAYMENTS_KEY")
        payment_id = args.payment_id
        if payment_id is None:
            # A compensation is registered before its payment is sent, so it may name
            # the payment only by its key; a payment that never happened needs no refund.
            response = await http.http_call("GET", f"{base}/payments?idempotency_key={args.payment_key}", headers=auth)
            http.check_status(response, "the payments API")
            found = (http.json_reply(response, "the payments API") or {}).get("data") or []
            if not found:
                return {"refund_id": None, "payment_id": None}
            payment_id = str(found[0]["id"])
        headers = {"Idempotency-Key": call.key, **auth}
        body = {"payment_id": payment_id, "reason": args.reason}
        response = await http.http_call("POST", f"{base}/refunds", body=body, headers=headers)
        if response.status_code == 400 and "already_refunded" in response.text:
            existing = (http.json_reply(response, "the payments API").get("error") or {}).get("refund_id")
            return {"refund_id": existing, "payment_id": payment_id, "already": True}
        http.check_status(response, "the payments API")
        reply = http.json_reply(response, "the payments API")
        return {"refund_id": str(reply.get("id")), "payment_id": payment_id, **http.replayed(response)}

    def describe(self, call: EffectCall, args: RefundPaymentArgs, receipt: dict) -> str:
        if receipt.get("payment_id") is None:
            return f"nothing to refund: no payment was made under key {args.payment_key}"
        if receipt.get("already"):
            return f"payment {receipt['payment_id']} was already refunded (refund {receipt.get('refund_id')})"
        return f"refunded payment {receipt['payment_id']} (refund {receipt.get('refund_id')}{how_confirmed(receipt)})"


DECLARED = (MakePayment(), RefundPayment())
