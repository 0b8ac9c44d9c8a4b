"""The examples' charge, what each queue's ``charge`` task does once its charge is made: a
line ``<order>`` appended to the file ``$LEDGER`` names (default ./ledger.txt), or, where
``$LEDGER`` names a SQLite file (``*.db``, made by ``create``), the order's row of a fenced
ledger (``idemctl.fence.sql.fenced_insert``): a takeover's charge replaces the row its
killed predecessor left, instead of adding one, and a late write of an attempt that was
taken over is refused, so no order is charged twice."""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing


def record(order: str, amount: int) -> None:
    """One charge of ``order``."""
    path = os.environ.get("LEDGER", "ledger.txt")
    if not path.endswith(".db"):
        with open(path, "a") as ledger:
            ledger.write(f"{order}\n")
        return
    from idemctl import current_context
    from idemctl.fence.sql import fenced_insert

    fence = current_context().fence
    with closing(sqlite3.connect(path, timeout=60)) as connection, connection:
        fenced_insert(
            connection, "charges", {"order_id": order, "amount": amount}, fence,
            unique=("order_id",),
        )  # fmt: skip


def create(path: str) -> None:
    """The fenced ledger's table, in the SQLite file ``path``."""
    from idemctl.fence.sql import add_fence_columns

    with closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("CREATE TABLE charges (order_id TEXT PRIMARY KEY, amount INTEGER)")
        add_fence_columns(connection, "charges")
