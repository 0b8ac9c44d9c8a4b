"""Every store the contract suite runs on. A new backend joins by adding one entry to
BACKENDS: a function that takes pytest's request and returns a Backend (starting its server
through a session fixture if it needs one)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from idemctl.aio import AsyncStore
from idemctl.stores import open_store
from idemctl.stores.base import Store


@dataclass
class Backend:
    name: str
    url: str
    """Opens the same store from another process; empty for stores that live in one process."""
    open: Callable[[], Store]
    reset: Callable[[], None] = lambda: None
    open_async: Callable[[], AsyncStore] | None = None
    """The store on idemctl.aio; by default ``aio.wrap(open())``."""
    api: str = "sync"
    """Which API the contract suite drives it through: sync, or async (tests/contract/api.py)."""


def _memory(request: pytest.FixtureRequest) -> Backend:
    from idemctl.stores.memory import MemoryStore

    store = MemoryStore()
    return Backend("memory", "", lambda: store)


def _sqlite(request: pytest.FixtureRequest) -> Backend:
    tmp = request.getfixturevalue("tmp_path")
    url = f"sqlite:///{tmp}/contract.db"
    return Backend("sqlite", url, lambda: open_store(url))


def unique_prefix() -> str:
    """A key prefix of its own for one test: tests sharing a server never see each other's keys."""
    return f"t-{uuid.uuid4().hex}:"


def _provisioned(url: str) -> Callable[[], Store]:
    """Opens the store at ``url``, provisioned: on Redis, ``init`` marks the index ready, so
    the operator's operations read it (fakeredis, never provisioned, walks every key)."""

    def open_provisioned() -> Store:
        store = open_store(url)
        store.provision()
        return store

    return open_provisioned


def _redis(request: pytest.FixtureRequest) -> Backend:
    server = request.getfixturevalue("redis_server")
    url = f"redis://127.0.0.1:{server.port}/0?prefix={unique_prefix()}"
    return Backend("redis", url, _provisioned(url))


def _redis_cluster(request: pytest.FixtureRequest) -> Backend:
    cluster = request.getfixturevalue("redis_cluster")
    url = f"redis+cluster://127.0.0.1:{cluster.port}?prefix={unique_prefix()}"
    return Backend("redis-cluster", url, _provisioned(url))


def _fakeredis(request: pytest.FixtureRequest) -> Backend:
    """The Redis store over fakeredis, in this process: its Lua runs in lupa."""
    from tests.conftest import need

    try:
        import fakeredis
        import lupa  # noqa: F401 - fakeredis runs EVAL/EVALSHA only with lupa installed
    except ImportError:
        need(False, "fakeredis[lua] is not installed (pip install -e '.[dev]')")
        raise
    from idemctl.stores.redis import RedisStore

    server = fakeredis.FakeServer()
    prefix = unique_prefix()

    def open_fake() -> Store:
        return RedisStore(
            fakeredis.FakeRedis(server=server, decode_responses=True),
            url="redis://fake",
            prefix=prefix,
        )

    def open_fake_async() -> AsyncStore:
        from idemctl.aio.redis import AsyncRedisStore

        sync = open_fake()
        assert isinstance(sync, RedisStore)
        return AsyncRedisStore(sync, fakeredis.FakeAsyncRedis(server=server, decode_responses=True))

    return Backend("fakeredis", "", open_fake, open_async=open_fake_async)


def unique_schema() -> str:
    """A PostgreSQL schema of its own for one test (tests share one server)."""
    return f"t_{uuid.uuid4().hex}"


def _postgres(request: pytest.FixtureRequest) -> Backend:
    server = request.getfixturevalue("postgres_server")
    url = server.url(schema=unique_schema())

    def open_provisioned() -> Store:
        store = open_store(url)
        store.provision()
        return store

    def provision() -> None:
        # Before any worker process opens the URL (the race test opens it only there).
        open_provisioned().close()

    return Backend("postgres", url, open_provisioned, provision)


def unique_table() -> str:
    """A DynamoDB table of its own for one test (tests share one moto server)."""
    return f"t-{uuid.uuid4().hex}"


def _dynamodb(request: pytest.FixtureRequest) -> Backend:
    """The DynamoDB store on the session's moto server, in a table of the test's own."""
    server = request.getfixturevalue("moto_server")
    url = server.url(unique_table())

    def open_provisioned() -> Store:
        store = open_store(url)
        store.provision()
        return store

    def provision() -> None:
        # Before any worker process opens the URL (the race test opens it only there).
        open_provisioned().close()

    return Backend("dynamodb", url, open_provisioned, provision)


BACKENDS: dict[str, Callable[[pytest.FixtureRequest], Backend]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "redis": _redis,
    "redis-cluster": _redis_cluster,
    "fakeredis": _fakeredis,
    "postgres": _postgres,
    "dynamodb": _dynamodb,
}
