"""A handler for `idemctl consume --transactional` on PostgreSQL that publishes events:
the order row, the idempotency key and two outbox events commit in one transaction, and
`idemctl outbox relay` sends the events to Kafka once they have.

    CREATE TABLE orders (id text PRIMARY KEY, customer text, cents bigint);

    idemctl --store postgresql://app@db/shop consume --transactional \\
        --brokers localhost:9092 --topic orders --group orders --handler orders:place
    idemctl --store postgresql://app@db/shop outbox relay --brokers localhost:9092
    # events on outbox.event.order, keyed by order id, with an `id` header per event
"""

from __future__ import annotations

from typing import Any

from idemctl import Permanent
from idemctl.consume import Event
from idemctl.runner import Context


def place(event: Event, ctx: Context) -> dict[str, Any]:
    order = event.json()
    if "id" not in order or "cents" not in order:
        raise Permanent(f"order {ctx.key} has no id or amount")  # straight to the DLQ
    ctx.connection.execute(
        "INSERT INTO orders (id, customer, cents) VALUES (%s, %s, %s)",
        (order["id"], order.get("customer"), order["cents"]),
    )
    placed = ctx.outbox.add("order", order["id"], "OrderPlaced", order)
    ctx.outbox.add(
        "order", order["id"], "PaymentRequested", {"order": order["id"], "cents": order["cents"]},
        headers={"causation-id": str(placed)},
    )  # fmt: skip
    return {"placed": order["id"], "event": str(placed)}
