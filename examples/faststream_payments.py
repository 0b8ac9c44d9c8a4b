"""A FastStream app that charges each payment once, however often Kafka delivers it.

Payments arrive on a topic with an ``idempotency-key`` header, some of them more than once
(producer retries, redeliveries after a crash or a rebalance). ``IdempotencyMiddleware``
runs the handler once per key and commits a message only once it is finished; duplicates
are answered from the store. The charge goes to a payment provider, modelled by a SQLite
ledger, that takes the idempotency key with the charge (as real providers do: Stripe's
``Idempotency-Key``): a process killed between the charge and the key's completion runs the
handler again when its lease runs out, and the provider answers that repeat without
charging twice. ``requests`` counts how often a payment was asked for.

    pip install 'idemctl[faststream]'
    KAFKA_BOOTSTRAP=localhost:9092 faststream run examples.faststream_payments:app
    KAFKA_BOOTSTRAP=localhost:9092 python examples/faststream_payments.py    # the same

Settings (environment): KAFKA_BOOTSTRAP (localhost:9092), PAYMENTS_TOPIC (payments),
PAYMENTS_GROUP (billing), PAYMENTS_LEDGER (./ledger.db), IDEMCTL_STORE
(sqlite:///./idemctl.db), PAYMENTS_LEASE (seconds, 30), KAFKA_SESSION_TIMEOUT_MS (10000) and
KAFKA_HEARTBEAT_INTERVAL_MS (3000).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from typing import Any

from faststream import FastStream
from faststream.kafka import KafkaBroker
from faststream.middlewares import AckPolicy

from idemctl.faststream import IdemContext, IdempotencyMiddleware
from idemctl.kafka.options import Handling


class Ledger:
    """The payment provider: one charge per idempotency key, whatever the requests."""

    def __init__(self, path: str) -> None:
        self.path = path
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")  # a committed charge survives a SIGKILL
            db.execute(
                "CREATE TABLE IF NOT EXISTS charges (payment TEXT PRIMARY KEY, "
                "cents INTEGER NOT NULL, fencing_token INTEGER NOT NULL, "
                "requests INTEGER NOT NULL)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def charge(self, payment: str, cents: int, fencing_token: int) -> bool:
        """Charge ``payment`` unless it was charged before; whether this request charged."""
        with self._connect() as db:
            (requests,) = db.execute(
                "INSERT INTO charges (payment, cents, fencing_token, requests) "
                "VALUES (?, ?, ?, 1) ON CONFLICT (payment) DO UPDATE SET "
                "requests = requests + 1 RETURNING requests",
                (payment, cents, fencing_token),
            ).fetchone()
        return bool(requests == 1)


ledger = Ledger(os.environ.get("PAYMENTS_LEDGER", "ledger.db"))
idem = IdempotencyMiddleware(
    os.environ.get("IDEMCTL_STORE", "sqlite:///./idemctl.db"),
    options=Handling(
        key="header:idempotency-key", lease=float(os.environ.get("PAYMENTS_LEASE", "30"))
    ),
)
broker = KafkaBroker(
    os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092"),
    middlewares=[idem],
    ack_policy=AckPolicy.ACK,  # commit after the handler, never before (not ACK_FIRST)
)
app = FastStream(broker, after_shutdown=[idem.aclose])


@broker.subscriber(
    os.environ.get("PAYMENTS_TOPIC", "payments"),
    group_id=os.environ.get("PAYMENTS_GROUP", "billing"),
    auto_offset_reset="earliest",
    session_timeout_ms=int(os.environ.get("KAFKA_SESSION_TIMEOUT_MS", "10000")),
    heartbeat_interval_ms=int(os.environ.get("KAFKA_HEARTBEAT_INTERVAL_MS", "3000")),
)
async def charge(payment: dict[str, Any], ctx: IdemContext) -> dict[str, Any]:
    """Runs once per payment; a redelivered payment gets this result back from the store."""
    charged = await asyncio.to_thread(ledger.charge, ctx.key, payment["cents"], ctx.fencing_token)
    return {"payment": ctx.key, "cents": payment["cents"], "charged_now": charged}


if __name__ == "__main__":
    asyncio.run(app.run())
