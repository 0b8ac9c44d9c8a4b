"""Session-wide Redis servers: one standalone server, one that wants a password and one
3-primary cluster, started on first use and stopped by PID at the end of the session (also
when tests fail)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import RedisCluster, RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


REDIS_PASSWORD = "Rpw-5e1f0c9b7a"
"""What ``redis_with_password`` wants (``--requirepass``)."""


@pytest.fixture(scope="session")
def redis_with_password(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis-auth"), password=REDIS_PASSWORD)
    try:
        server.start()
        yield server
    finally:
        server.stop()
