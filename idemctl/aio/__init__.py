"""The async API: the same protocol, records and semantics as ``idemctl``, for asyncio.

    from idemctl import aio

    store = aio.open_store("redis://127.0.0.1:6379/0")

    @aio.idempotent(store, key="charge:{order_id}")
    async def charge(order_id: str, amount: int) -> dict: ...

    result = await aio.run(store, "order-1", handler)   # handler: async def (ctx) -> JSON

Redis runs on ``redis.asyncio`` and PostgreSQL on psycopg's async connections (with
``async with store.transaction(key)`` for transactional mode); SQLite and memory run in a
worker thread, DynamoDB in a pool of them around boto3. Importing this module loads no
driver: each is imported when its store is opened.
"""

from __future__ import annotations

from idemctl import backends
from idemctl.aio.attempt import run
from idemctl.aio.decorator import idempotent
from idemctl.stores import DEFAULT_URL
from idemctl.stores import open_store as open_sync_store
from idemctl.stores.base import Store
from idemctl.stores.base_async import AsyncStore

__all__ = ["AsyncStore", "idempotent", "open_store", "run", "wrap"]


def open_store(url: str = DEFAULT_URL) -> AsyncStore:
    """The async store at ``url``, for the same URLs as ``idemctl.open_store``. Connections
    are made on first use; close it with ``await store.aclose()`` or ``async with``."""
    return wrap(open_sync_store(url))


def wrap(store: Store) -> AsyncStore:
    """The async store over the sync ``store`` (which it closes when closed)."""
    backend = backends.named(getattr(store, "scheme", ""))
    if backend is not None and backend.async_store is not None:
        native: AsyncStore = backend.load("async_store")(store)
        return native
    in_process = backend is not None and backend.in_process  # writes serialised anyway
    return AsyncStore(store, threads=1 if in_process else None)
