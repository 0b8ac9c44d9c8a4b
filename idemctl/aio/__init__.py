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

from idemctl.aio.attempt import run
from idemctl.aio.decorator import idempotent
from idemctl.aio.opening import open_store, wrap
from idemctl.stores.base_async import AsyncStore

__all__ = ["AsyncStore", "idempotent", "open_store", "run", "wrap"]
