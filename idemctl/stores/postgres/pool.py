# Written by scripts/unasync.py from idemctl/stores/postgres/pool_async.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""The PostgreSQL store's pooled connections: a psycopg_pool pool in autocommit mode,
started once a first, direct connection got in, and started over after the server went
away; settings and error translation from ``idemctl.stores.postgres.pool_base``.

Written by scripts/unasync.py from ``idemctl.stores.postgres.pool_async``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from idemctl.stores.postgres.pool_base import RENEW_EVERY, PoolBase, PoolSettings


class Pool(PoolBase):
    """The pooled connections of one store, in autocommit mode. Nothing connects before
    the first ``connection()``; then the pool starts only once a first, direct connection
    got in (see ``_reach``), and starts over after the server went away. ``url``
    (redacted) and ``schema`` are what error messages name.

    On asyncio, a pool belongs to the event loop that made it: used from another loop (a
    new ``asyncio.run``), the store starts a pool of its own there. A pool still open when
    its loop ends (``asyncio.run`` returning without ``aclose()``) is closed then by a task
    of its own, the warden: psycopg_pool's workers take a cancellation that lands while they
    connect for a failed connection attempt and wait for more work, so the loop's end,
    which cancels every task and waits for them, would otherwise never come."""

    def __init__(self, settings: PoolSettings) -> None:
        super().__init__(settings)
        self._pool_made = 0.0
        self._pool_lock: AbstractContextManager[object] = threading.Lock()
        self._reach_lock = threading.Lock()
        self._pool = self._new_pool()

    def _new_pool(self) -> ConnectionPool[Any]:
        """A pool not yet open."""
        self._pool_made = time.monotonic()
        return ConnectionPool(**self._pool_args, open=False)

    def _current(self) -> ConnectionPool[Any]:
        """The pool, started (after a first, direct connection) if it was not; on asyncio,
        this loop's, renewed as due."""
        if not self._reached:
            self._reach()
        assert self._pool is not None
        return self._pool

    def _reach(self) -> None:
        """Make this store's first connection directly, then start the pool.

        psycopg_pool connects in the background and retries what fails, so through it a
        refused password, a missing database or a closed port all look alike: no connection
        within connect_timeout. A direct connection fails at once with the server's reason:
        refused credentials or database become ConfigError (exit 2), a refused or timed-out
        connection StoreUnavailable (exit 3)."""
        assert self._reach_lock is not None
        with self._reach_lock:
            if self._reached:
                return
            try:
                conn = psycopg.Connection.connect(
                    self._pool_args["conninfo"], **self._pool_args["kwargs"]
                )
            except psycopg.Error as exc:
                raise self.reach_error(exc) from exc
            conn.close()
            assert self._pool is not None
            self._pool.open(wait=False)
            self._reached = True

    def _renew(self) -> None:
        """Start over with a new pool after the server went away, at most once a second.
        psycopg_pool backs off exponentially while the server is down (1, 2, 4 ... s), so
        its own pool would keep failing long after the server is back. On asyncio, the next
        ``connection()`` does it, as a new pool opens with an await."""
        with self._pool_lock:
            if time.monotonic() - self._pool_made < RENEW_EVERY:
                return
            old, self._pool = (self._pool, self._new_pool())
            self._pool.open(wait=False)
        assert old is not None
        threading.Thread(target=old.close, name="idemctl-pool-close", daemon=True).start()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; driver errors become idemctl's (the password never shows)."""
        with self.translated():
            pool = self._current()
            with pool.connection() as conn:
                with self._pool_lock:
                    self._lent += 1
                try:
                    yield conn
                finally:
                    with self._pool_lock:
                        self._lent -= 1

    @contextmanager
    def translated(self) -> Iterator[None]:
        """Driver errors inside the block as idemctl's; a row lock waited out past
        lock_timeout as LockTimeout."""
        try:
            yield
        except psycopg.Error as exc:
            raise self.error_for(exc) from exc

    def close(self) -> None:
        assert self._pool is not None
        self._pool.close()
