"""The servers of tests/tasks: a Redis server and a RabbitMQ node of each test's own, on
free loopback ports, stopped by their PIDs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import RedisServer
from tests.tasks.rabbit import RabbitServer


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def rabbit(tmp_path: Path) -> Iterator[RabbitServer]:
    server = RabbitServer(tmp_path / "rabbit").start()
    try:
        yield server
    finally:
        server.stop()
