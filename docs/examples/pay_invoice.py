"""Pay an invoice from Python with perdure: start a goal whose plan makes a payment, approve
the payment when the goal asks (a payment cannot be undone, so the goal asks first), watch
the goal to its end and print its report.

It needs a Temporal server and a worker (`perdure server start`, `perdure worker`): the
worker holds the payment service's PERDURE_PAYMENTS_URL and PERDURE_PAYMENTS_KEY, this
program needs neither. Usage: python pay_invoice.py [GOAL_ID]
"""

from __future__ import annotations

import asyncio
import sys

import perdure

PLAN = perdure.Plan.model_validate(
    {
        "steps": [
            {
                "name": "pay",
                "kind": "tool",
                "tool": "make_payment",
                "args": {"amount_cents": 12500, "currency": "EUR", "recipient": "ACME GmbH", "memo": "invoice 42"},
            }
        ],
    }
)


async def main(goal_id: str) -> None:
    client = await perdure.Client.connect()  # configured as the `perdure` command is

    # Idempotent by id: run this again and it finds the same goal; nothing is paid twice.
    started = await client.start("Pay ACME's invoice 42", plan=PLAN, goal_id=goal_id)
    print(started.text)

    # Read the goal's events until it asks its question (or ends).
    offset = 0
    async for item in client.events(goal_id):
        if item.offset is not None:
            offset = item.offset + 1
        if item.kind == "question" and item.data["status"] == "open":
            break

    for question in await client.questions(goal_id):
        options = ", ".join(option["id"] for option in question.options)
        print(f"question {question.id}: {question.title} [{options}]")
        delivery = await client.approve(goal_id, question.id, text="invoice 42 checked")
        status = delivery.receipt.status if delivery.receipt else "stored by the server"
        print(f"approval {delivery.request_id}: {status}")

    # The rest of the events, from where we left off, until the goal ends.
    async for item in client.events(goal_id, offset):
        if item.kind == "node":
            print(f"step {item.data['node']}: {item.data['status']}")

    result = await client.result(goal_id)
    print(f"outcome: {result.outcome}, tokens: {result.tokens}, cost: ${result.cost_usd:.4f}")
    report = await client.report(goal_id)
    print(report.report)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "pay-invoice-42"))
