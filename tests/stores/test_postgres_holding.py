"""On PostgreSQL, the writes of the attempt holding a key (complete, fail, extend, release)
wait out a brief lock instead of failing on the claims' short lock_timeout (CI saw a
purge's neighbour fail a complete with the driver's LockTimeout), and give up on a long one
with a clear StoreError, writing nothing. Real server; the lock is a second connection's
``SELECT ... FOR UPDATE`` on the key's row."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg import sql

from idemctl import Acquired, Completion
from idemctl.errors import StoreError
from idemctl.stores import open_store
from idemctl.stores.postgres import ADMIN_LOCK_WAIT, PostgresStore
from tests.backends import unique_schema
from tests.servers import PostgresServer
from tests.stores.test_postgres import HANG, LONG, bounded

Write = Callable[[PostgresStore, Acquired], object]
WRITES: dict[str, Write] = {
    "complete": lambda s, a: s.complete(a.key, a.owner, a.fencing_token, {"ok": 1}),
    "complete_many": lambda s, a: s.complete_many([Completion(a.key, a.owner, a.fencing_token)]),
    "fail": lambda s, a: s.fail(a.key, a.owner, a.fencing_token, "boom", retriable=True),
    "extend": lambda s, a: s.extend(a.key, a.owner, a.fencing_token, LONG),
    "release": lambda s, a: s.release(a.key, a.owner, a.fencing_token),
}


@pytest.fixture
def pg(postgres_server: PostgresServer) -> Iterator[PostgresStore]:
    opened = open_store(postgres_server.url(schema=unique_schema()))
    assert isinstance(opened, PostgresStore)
    opened.provision()
    yield opened
    opened.close()


@pytest.fixture
def holder(
    postgres_server: PostgresServer,
) -> Iterator[Callable[[PostgresStore, str, float], threading.Event]]:
    """Hold a key's row from another connection for ``most`` seconds (or until the event
    it returns is set); returns once the row is held."""
    threads: list[tuple[threading.Thread, threading.Event]] = []
    db = postgres_server.connect()

    def hold(on: PostgresStore, key: str, most: float) -> threading.Event:
        locked, release = threading.Event(), threading.Event()
        table = sql.SQL(on.keys_table)

        def run() -> None:
            with db.transaction():
                db.execute(
                    sql.SQL("SELECT 1 FROM {} WHERE key = %s FOR UPDATE").format(table), (key,)
                )
                locked.set()
                release.wait(most)

        thread = threading.Thread(target=run)
        thread.start()
        threads.append((thread, release))
        assert locked.wait(HANG)
        return release

    yield hold
    for thread, release in threads:
        release.set()
        thread.join(HANG)
    db.close()


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_holder_s_write_waits_out_a_brief_lock(
    pg: PostgresStore, holder: Any, write: str
) -> None:
    store = pg
    attempt = store.claim(f"brief-{write}", None, LONG)
    assert isinstance(attempt, Acquired)
    holder(store, attempt.key, 0.5)  # five times the claims' lock_timeout (0.1 s)
    bounded(lambda: WRITES[write](store, attempt))
    record = store.get(attempt.key)
    assert record is not None
    expected = {"complete": "completed", "complete_many": "completed", "fail": "failed"}
    assert record.status.value == expected.get(write, "in_progress")
    if write == "release":
        assert record.owner is None


def test_a_holder_s_write_gives_up_on_a_long_lock_writing_nothing(
    pg: PostgresStore, holder: Any
) -> None:
    store = pg
    attempt = store.claim("long", None, LONG)
    assert isinstance(attempt, Acquired)
    holder(store, "long", HANG)
    with pytest.raises(StoreError, match=rf"a lock stayed held for {ADMIN_LOCK_WAIT:g}s"):
        bounded(lambda: WRITES["complete"](store, attempt))
    record = store.get("long")
    assert record is not None and record.status.value == "in_progress"
    assert record.owner == attempt.owner
