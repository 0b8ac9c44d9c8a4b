"""Transactional mode (``PostgresStore.transaction(key)``): the claim, the handler's SQL on
the same connection, outbox rows and the completion share one transaction; a crash rolls
all of it back.

With an ``Order``, the sequence guard joins the transaction: the entity's row is locked in
it (``FOR UPDATE NOWAIT``, behind a transaction-level advisory lock, so a second
transaction on the entity is Busy at once instead of waiting), a stale event's key is
completed with a null result and committed before the block, and ``complete()`` advances
the entity in the same transaction as everything else."""

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
    Guard,
    Order,
    Record,
    Stale,
    Verdict,
    validate_key,
)
from idemctl.stores.machine import decide_guard
from idemctl.stores.postgres.sql import entity_of, utc

if TYPE_CHECKING:
    from idemctl.stores.postgres.store import PostgresStore

ENTITY_TRIES = 3
"""Times the entity's row is made and locked when it vanishes in between (a purge or a
forced forget between the two statements): then the unit is Busy."""


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
            raise StoreError("complete() needs a unit that acquired its key")
        a, store, conn = self.outcome, self._store, self.connection
        with store._pool.translated():
            records = store._complete_on(
                conn, [Completion(a.key, a.owner, a.fencing_token, result)], retention
            )
            if not records:
                raise store._lost(conn, a.key, a.owner, a.fencing_token)
            if self.order is not None:
                advanced = conn.execute(
                    store._sql["advance_entity"],
                    {
                        "entity": self.order.entity,
                        "sequence": self.order.sequence,
                        "key": a.key,
                        "retention": store._retention(retention),
                    },
                ).rowcount
                if advanced != 1:  # the row is locked since the guard: it cannot have gone
                    raise StoreError(
                        f"entity {self.order.entity!r} vanished from the transaction on key "
                        f"{a.key!r}"
                    )
        self.completed = records[0]
        return records[0]


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
    with store.connection() as conn:
        conn.execute("BEGIN")
        open_tx = True
        try:
            outcome: ClaimOutcome | Stale = Busy(None)
            if _try_lock(conn, f"{store.keys_table}/{key}"):
                try:
                    conn.execute("SAVEPOINT claim")
                    outcome = store._claim_on(conn, [ClaimRequest(key, fingerprint)], lease)[0]
                except pg_errors.LockNotAvailable:
                    conn.execute("ROLLBACK TO SAVEPOINT claim")
            if isinstance(outcome, Acquired) and order is not None:
                acquired = outcome
                outcome = _guard(store, conn, acquired, order, lease)
                if isinstance(outcome, Stale):
                    # Decided for good: the key completes with a null result (a duplicate
                    # replays it), committed now; there is nothing to run.
                    done = Completion(acquired.key, acquired.owner, acquired.fencing_token)
                    store._complete_on(conn, [done], None)
                    conn.execute("COMMIT")
                    open_tx = False
                    yield Unit(outcome, None)
                    return
            if not isinstance(outcome, Acquired):
                conn.execute("ROLLBACK")
                open_tx = False
                yield Unit(outcome, None)
                return
            unit = Unit(outcome, conn, store, order=order)
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


def _try_lock(conn: psycopg.Connection[Any], name: str) -> bool:
    """A transaction-level advisory lock on ``name``, if nobody else holds it."""
    row = conn.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", (name,))
    (locked,) = row.fetchone() or (False,)
    return bool(locked)


def _guard(
    store: PostgresStore,
    conn: psycopg.Connection[Any],
    a: Acquired,
    order: Order,
    lease: float | None,
) -> Acquired | Busy | Stale:
    """The sequence guard inside the transaction, once the key is acquired: the entity's
    row made if missing and locked until the transaction ends, then ``decide_guard``'s
    verdict on it. Busy(None) when another transaction holds the row."""
    if not _try_lock(conn, f"{store.names.entities_table}/{order.entity}"):
        return Busy(None)
    params = {"entity": order.entity}
    row = None
    try:
        for _ in range(ENTITY_TRIES):
            conn.execute(store._sql["make_entity"], params)
            row = conn.execute(store._sql["lock_entity_nowait"], params).fetchone()
            if row is not None:
                break
    except pg_errors.LockNotAvailable:  # a statement (guard, settle, forget) holds it now
        return Busy(None)
    if row is None:
        return Busy(None)
    guard = Guard(order.entity, order.sequence, a.key, a.fencing_token)
    reply, _ = decide_guard(entity_of(row), guard, utc(row[9]), store._lease(lease), 0.0)
    if reply.verdict is Verdict.STALE:
        assert reply.last is not None
        return Stale(order.entity, order.sequence, reply.last)
    if reply.verdict is Verdict.BUSY:  # another key's attempt holds it (guard_many)
        return Busy(None)
    return a
