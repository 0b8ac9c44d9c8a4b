"""Transactional mode (``PostgresStore.transaction(key)``): the claim, the handler's SQL on
the same connection, outbox rows and the completion share one transaction; a crash rolls
all of it back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors

from idemctl.errors import IncompleteTransaction, StoreError
from idemctl.model import (
    JSON,
    Acquired,
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Record,
    validate_key,
)

if TYPE_CHECKING:
    from idemctl.stores.postgres.store import PostgresStore


@dataclass
class Unit:
    """One key inside an open transaction (``PostgresStore.transaction``)."""

    outcome: ClaimOutcome
    connection: psycopg.Connection[Any] | None
    """The transaction's connection while the key is Acquired; run your own SQL on it."""
    _store: PostgresStore | None = field(default=None, repr=False)
    completed: Record | None = None

    def complete(self, result: JSON = None, retention: float | None = None) -> Record:
        """Complete the key in this transaction: it commits with everything else or not at all."""
        if not isinstance(self.outcome, Acquired) or self.connection is None or self._store is None:
            raise StoreError("complete() needs a unit that acquired its key")
        a = self.outcome
        with self._store._pool.translated():
            records = self._store._complete_on(
                self.connection, [Completion(a.key, a.owner, a.fencing_token, result)], retention
            )
            if not records:
                raise self._store._lost(self.connection, a.key, a.owner, a.fencing_token)
        self.completed = records[0]
        return records[0]


@contextmanager
def transaction(
    store: PostgresStore, key: str, fingerprint: str | None, lease: float | None
) -> Iterator[Unit]:
    """``store.transaction(key, fingerprint, lease)``: see there."""
    validate_key(key)
    with store.connection() as conn:
        conn.execute("BEGIN")
        open_tx = True
        try:
            (locked,) = conn.execute(
                "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"{store.keys_table}/{key}",),
            ).fetchone() or (False,)
            outcome: ClaimOutcome = Busy(None)
            if locked:
                try:
                    conn.execute("SAVEPOINT claim")
                    outcome = store._claim_on(conn, [ClaimRequest(key, fingerprint)], lease)[0]
                except pg_errors.LockNotAvailable:
                    conn.execute("ROLLBACK TO SAVEPOINT claim")
            if not isinstance(outcome, Acquired):
                conn.execute("ROLLBACK")
                open_tx = False
                yield Unit(outcome, None)
                return
            unit = Unit(outcome, conn, store)
            yield unit
            if unit.completed is None:
                raise IncompleteTransaction(
                    f"the transaction on key {key!r} ended without complete(): rolled back"
                )
            conn.execute("COMMIT")
            open_tx = False
        finally:
            if open_tx and not conn.closed:
                conn.execute("ROLLBACK")
