"""A session-wide PostgreSQL server, started on first use and stopped by PID at the end of
the session (also when tests fail). Tests share it through schemas of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import PostgresServer


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path_factory.mktemp("postgres"))
    try:
        server.start()
        yield server
    finally:
        server.remove()
