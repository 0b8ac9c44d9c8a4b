"""The PostgreSQL store on psycopg's async connections (``psycopg_pool.AsyncConnectionPool``).

The claim/complete path (claim, complete, fail, extend, release, get, the sequence guard's
guard, settle and finish) and transactional mode (``async with store.transaction(key)``)
run natively: the same flows as the sync ``PostgresStore`` (``stores.postgres.flows``), so
the same statements, parameters, row reading and decisions, driven on an async connection;
the same pool settings and the same translation of the driver's errors. The operator's
operations (scan, stats, unlock, forget, purge, provision, check, the entities') run the
sync store in a thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from datetime import datetime
from typing import Any

import psycopg

from idemctl.aio import unit
from idemctl.aio.store import AsyncStore
from idemctl.aio.unit import AsyncUnit
from idemctl.errors import NotProvisioned
from idemctl.model import (
    JSON,
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Guard,
    GuardReply,
    Holder,
    Order,
    Record,
    Settle,
)
from idemctl.stores.base import check_claims, check_guards
from idemctl.stores.postgres import PostgresStore, flows
from idemctl.stores.postgres.flows import Flow, T, drive_async
from idemctl.stores.postgres.pool import AsyncPool, LockTimeout
from idemctl.stores.postgres.sql import lock_wait
from idemctl.stores.postgres.store import ADMIN_LOCK_WAIT


class AsyncPostgresStore(AsyncStore):
    """``sync``'s records on psycopg's async connections: a pool of this store's own, made
    with the sync store's settings and opened on first use (nothing connects before)."""

    def __init__(self, sync: PostgresStore, *, threads: int | None = None) -> None:
        super().__init__(sync, threads=threads)
        self.sync: PostgresStore = sync
        self.names = sync.names
        self.keys_table = sync.keys_table
        self.outbox_table = sync.outbox_table
        """The outbox table that transactional handlers' ``AsyncOutbox`` writes to."""
        self.statements = sync.statements
        self._pool = AsyncPool(sync.pool_settings)

    # Plumbing --------------------------------------------------------------------------------

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A pooled async connection in autocommit mode (``async with conn.transaction():``
        for more than one statement); driver errors in the block become idemctl's."""
        return self._pool.connection()

    def translated(self) -> AbstractAsyncContextManager[None]:
        """Driver errors inside the block become idemctl's (on a connection already lent)."""
        return self._pool.translated()

    async def _run(self, flow: Flow[T]) -> T:
        """``flow`` on a pooled connection."""
        async with self._pool.connection() as conn:
            return await drive_async(conn, flow)

    @asynccontextmanager
    async def _on_entities(self) -> AsyncIterator[None]:
        """NotProvisioned that says to upgrade when the schema predates the entities."""
        try:
            yield
        except NotProvisioned:
            older = self.sync.without_entities(await self._schema_version())
            if older is not None:
                raise older from None
            raise

    async def _schema_version(self) -> int:
        try:
            return await self._run(flows.schema_version(self.statements))
        except NotProvisioned:
            return 0

    # The claim/complete protocol ---------------------------------------------------------------

    async def claim_many(
        self, requests: Sequence[ClaimRequest], lease: float | None = None
    ) -> list[ClaimOutcome]:
        check_claims(requests)
        return await self._claim_many(requests, self.lease_for(lease))

    async def _claim_many(
        self, requests: Sequence[ClaimRequest], lease: float
    ) -> list[ClaimOutcome]:
        try:
            return await self._run(flows.claim(self.statements, requests, lease))
        except LockTimeout:
            if len(requests) == 1:
                return [Busy(None)]
        # A row of the batch is held by an open transaction: claim one by one, so only
        # that key answers Busy.
        return [(await self._claim_many([r], lease))[0] for r in requests]

    async def complete(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        result: JSON = None,
        retention: float | None = None,
    ) -> Record:
        done = Completion(key, owner, fencing_token, result)
        return await self._run(
            flows.complete_one(self.statements, done, self.retention_for(retention))
        )

    async def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        retention = self.retention_for(retention)
        return await self._run(flows.complete_many(self.statements, completions, retention))

    async def fail(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        error: str,
        retriable: bool = True,
        retention: float | None = None,
    ) -> Record:
        held = Holder(key, owner, fencing_token)
        retention = self.retention_for(retention)
        return await self._run(flows.fail(self.statements, held, error, retriable, retention))

    async def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        held = Holder(key, owner, fencing_token)
        return await self._run(flows.extend(self.statements, held, self.lease_for(lease)))

    async def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        held = Holder(key, owner, fencing_token)
        return await self._run(flows.release(self.statements, held, handler_ran))

    async def get(self, key: str) -> Record | None:
        return await self._run(flows.get(self.statements, key))

    # The sequence guard --------------------------------------------------------------------------

    async def guard_many(
        self, guards: Sequence[Guard], lease: float | None = None
    ) -> list[GuardReply]:
        check_guards(guards)
        return await self._guard_many(guards, self.lease_for(lease)) if guards else []

    async def _guard_many(self, guards: Sequence[Guard], lease: float) -> list[GuardReply]:
        try:
            async with self._on_entities():
                return await self._run(
                    flows.guard(self.statements, guards, lease, self.default_retention)
                )
        except LockTimeout:
            if len(guards) == 1:
                # Its row is held by an open transaction (transactional mode).
                async with self._on_entities():
                    unwritten = flows.reply_unwritten(
                        self.statements, guards[0], self.default_retention
                    )
                    return [await self._run(unwritten)]
        # A row of the batch is held by an open transaction: one by one, so only that item
        # answers BUSY. Items that went already go again: the holder asking again keeps it.
        return [(await self._guard_many([g], lease))[0] for g in guards]

    async def settle_many(
        self, settles: Sequence[Settle], retention: float | None = None
    ) -> list[bool]:
        if not settles:
            return []
        seconds = self.retention_for(retention)
        try:
            async with self._on_entities(), self.connection() as conn:
                return await self._settle_on(conn, settles, seconds)
        except LockTimeout:
            pass
        # An entity's row is held by an open transaction (transactional mode): it decides
        # whether this holder still holds it, so wait for it a while, as admin commands do.
        try:
            async with self._on_entities(), self.connection() as conn, conn.transaction():
                await conn.execute(lock_wait(ADMIN_LOCK_WAIT))
                return await self._settle_on(conn, settles, seconds)
        except LockTimeout:
            raise flows.settle_blocked(settles, ADMIN_LOCK_WAIT) from None

    async def _settle_on(
        self, conn: psycopg.AsyncConnection[Any], settles: Sequence[Settle], retention: float
    ) -> list[bool]:
        # More than one round: in one transaction, so a lock timeout undoes all of them.
        async with conn.transaction() if flows.settle_in_transaction(settles) else nullcontext():
            return await drive_async(conn, flows.settle(self.statements, settles, retention))

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

    # Lifetime -------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        await self._pool.close()
        await super().aclose()
