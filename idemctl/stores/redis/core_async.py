"""What ``AsyncRedisStore`` stands on: an async client of the sync store's server, and the
script runner (``idemctl.stores.redis.runner_async``, the sync store's written from it) that sends
the sync store's own operations (``stores.redis.ops``) on it."""

from __future__ import annotations

from typing import TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from idemctl.errors import ConfigError
from idemctl.model import Record
from idemctl.stores.base_async import AsyncStore
from idemctl.stores.redis import RedisStore
from idemctl.stores.redis.connect import connect_async
from idemctl.stores.redis.connections_async import AsyncDirect
from idemctl.stores.redis.ops import Op, Ops, live
from idemctl.stores.redis.runner_async import AsyncScriptRunner

T = TypeVar("T")


class AsyncRedisCore(AsyncStore):
    """``sync``'s records on ``redis.asyncio``: one pipelined round trip an operation."""

    ops: Ops
    cluster: bool

    def __init__(self, sync: RedisStore, client: Redis | RedisCluster | None = None) -> None:
        """``client``: the async client to use (of the same server as ``sync``'s); by default
        one made from the URL ``sync`` was opened with."""
        super().__init__(sync)
        self.sync: RedisStore = sync
        self.ops, self.cluster = sync.ops, sync.cluster
        if client is None:
            if sync.target is None:
                raise ConfigError("idemctl.aio opens Redis stores by URL: aio.open_store(url)")
            client = connect_async(self.url, sync.target)
        self._client = client
        direct, keyslot = (
            (None, client.keyslot)
            if isinstance(client, RedisCluster)
            else (AsyncDirect(client), None)
        )
        self._runner = AsyncScriptRunner(
            client, direct, self.url, index=sync.index_keys, replicas=sync.replicas,
            timeout=sync.durable_timeout, keyslot=keyslot,
        )  # fmt: skip

    async def _do(self, op: Op[T]) -> T:
        call, read = op
        return read(await self._runner.call(call.name, call.shared, call.items, call.confirm))

    async def get(self, key: str) -> Record | None:
        return live(key, *await self._runner.read(self.ops.rkey(key)))

    async def aclose(self) -> None:
        self._runner.close()
        await self._client.aclose()
        await super().aclose()
