"""What ``AsyncPostgresStore`` stands on: the sync store's settings, a pool of async
connections of its own, and the statements (``idemctl.stores.postgres.core`` for asyncio)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from idemctl.errors import NotProvisioned
from idemctl.stores.base_async import AsyncStore
from idemctl.stores.postgres import PostgresStore
from idemctl.stores.postgres.pool_async import AsyncPool


class AsyncPostgresCore(AsyncStore):
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

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A pooled async connection in autocommit mode (``async with conn.transaction():``
        for more than one statement); driver errors in the block become idemctl's."""
        return self._pool.connection()

    def translated(self) -> AbstractAsyncContextManager[None]:
        """Driver errors inside the block become idemctl's (on a connection already lent)."""
        return self._pool.translated()

    def without_entities(self, version: int) -> NotProvisioned | None:
        return self.sync.without_entities(version)

    async def aclose(self) -> None:
        await self._pool.close()
        await super().aclose()
