"""Transactional mode (``PostgresStore.transaction(key)``): the claim, the handler's SQL on
the same connection, outbox rows and the completion share one transaction; a crash rolls
all of it back.

With an ``Order``, the sequence guard joins the transaction: the entity's row is locked in
it (``FOR UPDATE NOWAIT``, behind a transaction-level advisory lock, so a second
transaction on the entity is Busy at once instead of waiting), a stale event's key is
completed with a null result and committed before the block, and ``complete()`` advances
the entity in the same transaction as everything else.

This module holds what happens inside the transaction, sans-IO: two flows (``flows``),
``open_unit`` before the block and ``complete_unit`` in it. ``idemctl.stores.postgres.unit``
drives them on a sync connection, ``idemctl.stores.postgres.unit_async`` on an async one."""

from __future__ import annotations

from collections.abc import Mapping

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
)
from idemctl.stores.machine import decide_guard
from idemctl.stores.postgres import flows
from idemctl.stores.postgres.flows import Flow, Statement
from idemctl.stores.postgres.sql import Names, entity_of, utc

ENTITY_TRIES = 3
"""Times the entity's row is made and locked when it vanishes in between (a purge or a
forced forget between the two statements): then the unit is Busy."""
NOT_ACQUIRED = "complete() needs a unit that acquired its key"


def ending(outcome: ClaimOutcome | Stale) -> str:
    """How the transaction of a unit that acquired nothing ends: Stale was decided for good
    (its key completed with a null result, which a duplicate replays) and commits; for
    anything else nothing is held, and it rolls back."""
    return "COMMIT" if isinstance(outcome, Stale) else "ROLLBACK"


def incomplete(key: str) -> IncompleteTransaction:
    return IncompleteTransaction(
        f"the transaction on key {key!r} ended without complete(): rolled back"
    )


def open_unit(
    sql: Mapping[str, str],
    names: Names,
    key: str,
    fingerprint: str | None,
    lease: float,
    order: Order | None,
    retention: float,
) -> Flow[ClaimOutcome | Stale]:
    """In a transaction just begun: claim ``key`` behind an advisory lock (Busy(None) when
    another transaction holds it, or holds the row past lock_timeout), then with ``order``
    lock the entity's row and judge the event. Stale: the key is completed (``retention``,
    the store's default) for the caller to commit; nothing runs."""
    outcome: ClaimOutcome | Stale = Busy(None)
    if (yield from try_lock(sql, f"{names.keys_table}/{key}")):
        yield Statement("SAVEPOINT claim")
        try:
            outcome = yield from flows.claim_one(sql, ClaimRequest(key, fingerprint), lease)
        except pg_errors.LockNotAvailable:
            yield Statement("ROLLBACK TO SAVEPOINT claim")
    if isinstance(outcome, Acquired) and order is not None:
        acquired = outcome
        outcome = yield from lock_entity(sql, names, acquired, order, lease)
        if isinstance(outcome, Stale):
            done = Completion(acquired.key, acquired.owner, acquired.fencing_token)
            yield from flows.complete_one(sql, done, retention)
    return outcome


def complete_unit(
    sql: Mapping[str, str], a: Acquired, order: Order | None, result: JSON, retention: float
) -> Flow[Record]:
    """``Unit.complete``: the key completed (LeaseLost if no longer held) and, with an
    order, the entity advanced, in the unit's transaction."""
    done = Completion(a.key, a.owner, a.fencing_token, result)
    record = yield from flows.complete_one(sql, done, retention)
    if order is not None:
        params = {
            "entity": order.entity,
            "sequence": order.sequence,
            "key": a.key,
            "retention": retention,
        }
        advanced = yield Statement(sql["advance_entity"], params)
        if advanced.rowcount != 1:  # the row is locked since the guard: it cannot have gone
            raise StoreError(
                f"entity {order.entity!r} vanished from the transaction on key {a.key!r}"
            )
    return record


def try_lock(sql: Mapping[str, str], name: str) -> Flow[bool]:
    """A transaction-level advisory lock on ``name``, if nobody else holds it."""
    reply = yield Statement(sql["try_lock"], (name,))
    (locked,) = reply.rows[0] if reply.rows else (False,)
    return bool(locked)


def lock_entity(
    sql: Mapping[str, str], names: Names, a: Acquired, order: Order, lease: float
) -> Flow[Acquired | Busy | Stale]:
    """The sequence guard inside the transaction, once the key is acquired: the entity's
    row made if missing and locked until the transaction ends, then ``decide_guard``'s
    verdict on it. Busy(None) when another transaction holds the row."""
    if not (yield from try_lock(sql, f"{names.entities_table}/{order.entity}")):
        return Busy(None)
    params = {"entity": order.entity}
    row = None
    try:
        for _ in range(ENTITY_TRIES):
            yield Statement(sql["make_entity"], params)
            reply = yield Statement(sql["lock_entity_nowait"], params)
            if reply.rows:
                row = reply.rows[0]
                break
    except pg_errors.LockNotAvailable:  # a statement (guard, settle, forget) holds it now
        return Busy(None)
    if row is None:
        return Busy(None)
    guard = Guard(order.entity, order.sequence, a.key, a.fencing_token)
    answer, _ = decide_guard(entity_of(row), guard, utc(row[9]), lease, 0.0)
    if answer.verdict is Verdict.STALE:
        assert answer.last is not None
        return Stale(order.entity, order.sequence, answer.last)
    if answer.verdict is Verdict.BUSY:  # another key's attempt holds it (guard_many)
        return Busy(None)
    return a
