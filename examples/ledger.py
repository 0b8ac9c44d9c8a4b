"""A handler for `idemctl consume --transactional` on PostgreSQL: the ledger row commits in
the same transaction as the idempotency key, so a crash anywhere leaves both or neither.

    CREATE TABLE ledger (key text, account text, cents bigint, fencing_token bigint);

    idemctl --store postgresql://app@db/shop consume --transactional \\
        --brokers localhost:9092 --topic payments --group ledger --handler ledger:record
"""

from __future__ import annotations

from typing import Any

from idemctl import Permanent
from idemctl.consume import Event
from idemctl.runner import Context


def record(event: Event, ctx: Context) -> dict[str, Any]:
    payment = event.json()
    if payment.get("poison"):
        raise Permanent(f"payment {ctx.key} is malformed: no account")  # straight to the DLQ
    ctx.connection.execute(
        "INSERT INTO ledger (key, account, cents, fencing_token) VALUES (%s, %s, %s, %s)",
        (ctx.key, payment["account"], payment["cents"], ctx.fencing_token),
    )
    return {"booked": payment["cents"]}
