# Written by scripts/unasync.py from idemctl/stores/postgres/unit_async.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""Transactional mode's unit: one key claimed in a transaction that stays open around the
caller's block, with the caller's SQL, outbox rows and the completion in it; leaving the
block without completing, or with an exception, rolls all of it back.

What runs in the transaction is two flows (``idemctl.stores.postgres.transactional``):
``open_unit`` before the block and ``complete_unit`` in it.

Written by scripts/unasync.py from ``idemctl.stores.postgres.unit_async``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from idemctl.errors import StoreError
from idemctl.model import JSON, Acquired, ClaimOutcome, Order, Record, Stale, validate_key
from idemctl.stores.postgres.drive import drive
from idemctl.stores.postgres.transactional import (
    NOT_ACQUIRED,
    complete_unit,
    ending,
    incomplete,
    open_unit,
)

if TYPE_CHECKING:
    from idemctl.stores.postgres.store import PostgresStore


@dataclass
class Unit:
    """One key inside an open transaction (``PostgresStore.transaction``)."""

    outcome: ClaimOutcome | Stale
    connection: psycopg.Connection[Any] | None
    """The transaction's connection while the key is Acquired; run your own SQL on it."""
    _store: PostgresStore | None = field(default=None, repr=False)
    completed: Record | None = None
    order: Order | None = None
    """The event's place in its entity's history: ``complete`` advances the entity to it."""

    def complete(self, result: JSON = None, retention: float | None = None) -> Record:
        """Complete the key in this transaction (and, with an order, advance its entity):
        it commits with everything else or not at all."""
        if not isinstance(self.outcome, Acquired) or self.connection is None or self._store is None:
            raise StoreError(NOT_ACQUIRED)
        store = self._store
        done = complete_unit(
            store.statements, self.outcome, self.order, result, store.retention_for(retention)
        )
        with store.translated():
            record = drive(self.connection, done)
        self.completed = record
        return record


@contextmanager
def transaction(
    store: PostgresStore,
    key: str,
    fingerprint: str | None,
    lease: float | None,
    order: Order | None = None,
) -> Iterator[Unit]:
    """``store.transaction(key, fingerprint, lease, order)``: see there."""
    validate_key(key)
    opening = open_unit(
        store.statements,
        store.names,
        key,
        fingerprint,
        store.lease_for(lease),
        order,
        store.default_retention,
    )
    with store.connection() as conn:
        conn.execute("BEGIN")
        open_tx = True
        try:
            outcome = drive(conn, opening)
            if not isinstance(outcome, Acquired):
                conn.execute(ending(outcome))
                open_tx = False
                yield Unit(outcome, None)
                return
            unit = Unit(outcome, conn, store, order=order)
            yield unit
            if unit.completed is None:
                raise incomplete(key)
            conn.execute("COMMIT")
            open_tx = False
        finally:
            if open_tx and (not conn.closed):
                conn.execute("ROLLBACK")
