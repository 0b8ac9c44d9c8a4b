"""What ``AsyncRedisStore`` stands on: an async client of the sync store's server, and
script calls (``ops.Call``) sent on it as the sync ``ScriptRunner`` sends them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from idemctl.aio.store import AsyncStore
from idemctl.errors import ConfigError, StoreError
from idemctl.model import (
    Record,
)
from idemctl.stores.redis import RedisStore
from idemctl.stores.redis.connect import mendable
from idemctl.stores.redis.errors import translate
from idemctl.stores.redis.ops import Call, Op, Ops, live
from idemctl.stores.redis.records import server_time
from idemctl.stores.redis.scripts import has_waitaof

T = TypeVar("T")


class _Retry(Retry):
    """redis-py's retries, except for what another try cannot mend (see connect._Retry)."""

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[T]],
        fail: Callable[[Exception], Any] | Callable[[Exception, int], Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        return await super().call_with_retry(do, fail, mendable(is_retryable), with_failure_count)


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
        if client is not None:
            self._client = client
            return
        to = sync.target
        if to is None:
            raise ConfigError("idemctl.aio opens Redis stores by URL: aio.open_store(url)")
        retry = _Retry(ExponentialBackoff(cap=0.5, base=0.05), 3)
        options: dict[str, Any] = {"decode_responses": True, "retry": retry, **to.options}
        self._client = (
            RedisCluster.from_url(to.url, **options)
            if to.cluster
            else Redis.from_url(to.url, **options)
        )

    async def _do(self, op: Op[T]) -> T:
        call, read = op
        return read(await self._call(call))

    async def _call(self, c: Call) -> list[Any]:
        """ScriptRunner.call's pipelined way, awaited: EVALSHA per group of keys, what
        confirms them under durable=1, and once more for the calls refused with NOSCRIPT."""
        runner = self.sync.script_runner
        calls = runner.commands(runner.scripts[c.name].sha, c.shared, c.items)
        replies: list[Any] = [None] * len(c.items)
        try:
            if len(calls) == 1 and not c.confirm:  # one command: no pipeline's cost
                for _ in range(2):
                    try:
                        return list(await self._client.execute_command("EVALSHA", *calls[0][1]))
                    except NoScriptError:
                        await self._load()
            for _ in range(2):
                pipe: Pipeline | ClusterPipeline = self._client.pipeline(transaction=False)
                for _, command in calls:
                    pipe.execute_command("EVALSHA", *command)
                confirmations = await self._confirmation(pipe) if c.confirm else 0
                results = await pipe.execute(raise_on_error=False)
                calls = runner.sort(calls, results, confirmations, replies)
                if not calls:
                    return replies
                await self._load()
        except (RedisError, RedisClusterException) as exc:
            raise translate(exc, self.url) from exc
        raise StoreError(f"Redis at {self.url} keeps losing idemctl's Lua scripts")

    async def _load(self) -> None:
        for script in self.sync.script_runner.scripts.values():
            await self._client.script_load(script.source)

    async def _confirmation(self, pipe: Pipeline | ClusterPipeline) -> int:
        """Queue durable=1's confirmation: what the server has is asked once, as the sync
        store does (ScriptRunner._add_confirmation)."""
        runner = self.sync.script_runner
        if runner.waitaof is None:
            waitaof = has_waitaof(await self._client.info("server"))
            if not waitaof:
                runner.check_fsync(await self._client.config_get("append*"))
            runner.waitaof = waitaof
        return runner.add_confirmation(pipe)

    async def get(self, key: str) -> Record | None:
        rkey = self.sync.ops.rkey(key)
        try:
            if isinstance(self._client, RedisCluster):  # TIME has no key to route by
                raw = await self._client.get(rkey)
                seconds, micros = await self._client.time()
            else:
                pipe = self._client.pipeline(transaction=False)
                pipe.get(rkey)
                pipe.time()
                raw, (seconds, micros) = await pipe.execute()
        except (RedisError, RedisClusterException) as exc:
            raise translate(exc, self.url) from exc
        return live(key, raw, server_time(seconds, micros))

    async def aclose(self) -> None:
        await self._client.aclose()
        await super().aclose()
