"""idemctl.fence.redis on the real redis-server (one server, and a cluster): the rules of
fenced SET, HSET and XADD, with and without decode_responses, sync and asyncio."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from idemctl.errors import StaleFence
from idemctl.fence import Fence
from idemctl.fence.redis import (
    afenced_hset,
    afenced_set,
    afenced_xadd,
    fence_key,
    fenced_hset,
    fenced_set,
    fenced_xadd,
)
from tests.servers import RedisCluster, RedisServer


def name(what: str) -> str:
    return f"test:{what}:{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
def r(request: pytest.FixtureRequest, redis_server: RedisServer) -> Any:
    client = redis_server.client(decode_responses=request.param)
    yield client
    client.close()


def test_the_fence_lives_in_the_resources_hash_slot() -> None:
    assert fence_key("orders:1") == "{orders:1}:idemctl-fence"
    assert fence_key("{user-7}:orders") == "{user-7}:orders:idemctl-fence"
    assert fence_key("a{}b") == "{a{}b}:idemctl-fence"  # an empty tag is no tag


def test_fenced_set_refuses_an_older_token_of_the_same_key(r: Any) -> None:
    n = name("set")
    fenced_set(r, n, "first", Fence("k", 5))
    fenced_set(r, n, "again", Fence("k", 5))  # the same attempt writes again
    fenced_set(r, n, "newer", Fence("k", 6), px=60_000)
    with pytest.raises(StaleFence) as refused:
        fenced_set(r, n, "late", Fence("k", 5))
    assert (refused.value.resource, refused.value.token, refused.value.last) == (n, 5, 6)
    assert r.get(n) in (b"newer", "newer") and 0 < r.pttl(n) <= 60_000
    fenced_set(r, n, "other", Fence("j", 1))  # another key's tokens are not compared
    assert r.get(n) in (b"other", "other")
    assert {_s(k): _s(v) for k, v in r.hgetall(fence_key(n)).items()} == {"key": "j", "token": "1"}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def test_fenced_hset_refuses_an_older_token_and_keeps_the_hash(r: Any) -> None:
    n = name("hset")
    assert fenced_hset(r, n, {"status": "paid", "cents": 100}, Fence("k", 2)) == 2
    assert fenced_hset(r, n, {"status": "refunded"}, Fence("k", 3)) == 0  # a field changed
    with pytest.raises(StaleFence):
        fenced_hset(r, n, {"status": "late"}, Fence("k", 2))
    assert {_s(k): _s(v) for k, v in r.hgetall(n).items()} == {"status": "refunded", "cents": "100"}
    with pytest.raises(ValueError, match="at least one field"):
        fenced_hset(r, n, {}, Fence("k", 4))


def test_fenced_xadd_appends_once_per_key(r: Any) -> None:
    s = name("stream")
    first = fenced_xadd(r, s, {"payment": "p1"}, Fence("p1", 4))
    assert (
        fenced_xadd(r, s, {"payment": "p1"}, Fence("p1", 9)) == first
    )  # the takeover's: no second
    with pytest.raises(StaleFence) as refused:
        fenced_xadd(r, s, {"payment": "p1"}, Fence("p1", 3))
    assert refused.value.last == 4
    other = fenced_xadd(r, s, {"payment": "p2"}, Fence("p2", 1))
    assert [_s(i) for i, _ in r.xrange(s)] == [first, other]


def test_a_server_that_lost_the_script_gets_it_again(r: Any) -> None:
    r.script_flush()
    n = name("flushed")
    fenced_set(r, n, "v", Fence("k", 1))
    assert r.get(n) in (b"v", "v")


def test_tokens_out_of_range_are_refused_before_sending(r: Any) -> None:
    with pytest.raises(ValueError, match="2\\*\\*53"):
        fenced_set(r, name("big"), "v", Fence("k", 2**53))
    with pytest.raises(ValueError, match="px"):
        fenced_set(r, name("px"), "v", Fence("k", 1), px=0)


def test_the_asyncio_twins(redis_server: RedisServer) -> None:
    import redis.asyncio

    async def main() -> None:
        c = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
        try:
            n, h, s = name("aset"), name("ahset"), name("astream")
            await afenced_set(c, n, "v", Fence("k", 2))
            with pytest.raises(StaleFence):
                await afenced_set(c, n, "late", Fence("k", 1))
            assert await afenced_hset(c, h, {"a": 1}, Fence("k", 2)) == 1
            with pytest.raises(StaleFence):
                await afenced_hset(c, h, {"a": 2}, Fence("k", 1))
            first = await afenced_xadd(c, s, {"a": 1}, Fence("k", 2))
            assert await afenced_xadd(c, s, {"a": 1}, Fence("k", 3)) == first
            with pytest.raises(StaleFence):
                await afenced_xadd(c, s, {"a": 1}, Fence("k", 1))
            assert await c.get(n) == b"v" and await c.hget(h, "a") == b"1"
            assert await c.xlen(s) == 1
        finally:
            await c.aclose()

    asyncio.run(main())


def test_on_a_cluster_the_fence_goes_with_its_resource(redis_cluster: RedisCluster) -> None:
    import redis.cluster

    c = redis.cluster.RedisCluster(host="127.0.0.1", port=redis_cluster.port)
    try:
        for n in (name("c"), "{user-1}:" + name("c"), name("d")):
            fenced_set(c, n, "v", Fence("k", 2))
            with pytest.raises(StaleFence):
                fenced_set(c, n, "late", Fence("k", 1))
            assert c.get(n) == b"v"
        s = name("cstream")
        first = fenced_xadd(c, s, {"a": 1}, Fence("k", 1))
        assert fenced_xadd(c, s, {"a": 1}, Fence("k", 2)) == first
    finally:
        c.close()
