"""The PostgreSQL store on psycopg's async connections (``psycopg_pool.AsyncConnectionPool``).

The claim/complete path (claim, complete, fail, extend, release, get, the sequence guard's
guard, settle and finish) and transactional mode (``async with store.transaction(key)``)
run natively: the protocol's steps (``idemctl.stores.postgres.steps_async``, from which the sync
store's are written) drive the same flows (``stores.postgres.flows``) on an async
connection, with the same pool settings and the same translation of the driver's errors.
The operator's operations (scan, stats, unlock, forget, purge, provision, check, the
entities') run the sync store in a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

from idemctl.model import (
    Completion,
    Order,
    Settle,
)
from idemctl.stores.postgres import unit_async as unit
from idemctl.stores.postgres.steps_async import AsyncPostgresSteps
from idemctl.stores.postgres.unit_async import AsyncUnit


class AsyncPostgresStore(AsyncPostgresSteps):
    """``sync``'s records on psycopg's async connections (``AsyncPostgresCore``), by the
    protocol's steps (``AsyncPostgresSteps``), and transactional mode."""

    async def finish_many(
        self,
        completions: Sequence[Completion],
        settles: Sequence[Settle],
        retention: float | None = None,
    ) -> list[bool]:
        """As PostgresStore.finish_many: the entities first, then the keys whose entity
        was still held (two round trips)."""
        return await self._settle_then_complete(completions, settles, retention)

    # Transactional mode ---------------------------------------------------------------------------

    def transaction(
        self,
        key: str,
        fingerprint: str | None = None,
        lease: float | None = None,
        order: Order | None = None,
    ) -> AbstractAsyncContextManager[AsyncUnit]:
        """``PostgresStore.transaction`` for asyncio: claim ``key`` in a new transaction and
        keep it open around the block::

            async with store.transaction(key) as unit:
                if isinstance(unit.outcome, Acquired):
                    await unit.connection.execute("INSERT INTO ...")
                    await AsyncOutbox(unit.connection, store.outbox_table).add(...)
                    await unit.complete(result)

        Leaving the block commits all of it; an exception, a cancellation or a block that
        never completes rolls everything back, the claim included. With ``order`` the
        entity's row is locked in the transaction: a stale event's key is completed and
        committed before the block (``unit.outcome`` is Stale), and ``unit.complete()``
        advances the entity in the transaction."""
        return unit.transaction(self, key, fingerprint, lease, order)
