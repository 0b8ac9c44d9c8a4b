"""The PostgreSQL store's pooled connections: a psycopg_pool pool in autocommit mode,
started once a first, direct connection got in, and started over after the server went
away; settings and error translation from ``idemctl.stores.postgres.pool_base``.

This module is the original of ``idemctl.stores.postgres.pool`` (scripts/unasync.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from idemctl._unasync import is_async
from idemctl.stores.postgres.pool_base import RENEW_EVERY, PoolBase, PoolSettings

if is_async():
    import asyncio


class AsyncPool(PoolBase):
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
        # On the loop, nothing runs between two awaits: nothing to lock.
        self._pool_lock: AbstractContextManager[object] = (
            nullcontext() if is_async() else threading.Lock()
        )
        if is_async():
            self._pool: AsyncConnectionPool[Any] | None = None
            self._loop: asyncio.AbstractEventLoop | None = None
            self._reach_lock: asyncio.Lock | None = None
            self._renew_due = False
            self._closing: set[asyncio.Task[None]] = set()
            self._warden: asyncio.Task[None] | None = None
        else:
            self._reach_lock = threading.Lock()
            self._pool = self._new_pool()

    def _new_pool(self) -> AsyncConnectionPool[Any]:
        """A pool not yet open."""
        self._pool_made = time.monotonic()
        return AsyncConnectionPool(**self._pool_args, open=False)

    async def _current(self) -> AsyncConnectionPool[Any]:
        """The pool, started (after a first, direct connection) if it was not; on asyncio,
        this loop's, renewed as due."""
        if is_async():
            loop = asyncio.get_running_loop()
            if self._loop is not loop:
                # The loop that made the pool is gone or elsewhere (its warden closed the
                # pool as it ended): its connections cannot be used from here. Start over.
                self._loop, self._pool, self._reached = loop, None, False
                self._reach_lock, self._renew_due, self._closing = asyncio.Lock(), False, set()
                self._warden = None
        if not self._reached:
            await self._reach()
        assert self._pool is not None
        if is_async() and self._renew_due:
            self._renew_due = False
            old, self._pool = self._pool, self._new_pool()
            await self._pool.open(wait=False)
            # Connections still lent out are closed as they come back; nobody waits.
            task = loop.create_task(old.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return self._pool

    async def _reach(self) -> None:
        """Make this store's first connection directly, then start the pool.

        psycopg_pool connects in the background and retries what fails, so through it a
        refused password, a missing database or a closed port all look alike: no connection
        within connect_timeout. A direct connection fails at once with the server's reason:
        refused credentials or database become ConfigError (exit 2), a refused or timed-out
        connection StoreUnavailable (exit 3)."""
        assert self._reach_lock is not None
        async with self._reach_lock:
            if self._reached:
                return
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._pool_args["conninfo"], **self._pool_args["kwargs"]
                )
            except psycopg.Error as exc:
                raise self.reach_error(exc) from exc
            await conn.close()
            if is_async():
                self._pool = self._new_pool()
            assert self._pool is not None
            await self._pool.open(wait=False)
            self._reached = True
            if is_async() and self._warden is None:
                self._warden = asyncio.get_running_loop().create_task(
                    self._close_at_loop_end(), name=f"{self._pool_args['name']} warden"
                )

    if is_async():

        async def _close_at_loop_end(self) -> None:
            """Wait until cancelled (by ``close()``, or by ``asyncio.run`` ending the loop),
            then close what is open: the workers are told to stop rather than cancelled."""
            try:
                await asyncio.get_running_loop().create_future()
            finally:
                await self.close()

    def _renew(self) -> None:
        """Start over with a new pool after the server went away, at most once a second.
        psycopg_pool backs off exponentially while the server is down (1, 2, 4 ... s), so
        its own pool would keep failing long after the server is back. On asyncio, the next
        ``connection()`` does it, as a new pool opens with an await."""
        if is_async():
            if self._pool is not None and time.monotonic() - self._pool_made >= RENEW_EVERY:
                self._renew_due = True
        else:
            with self._pool_lock:
                if time.monotonic() - self._pool_made < RENEW_EVERY:
                    return
                old, self._pool = self._pool, self._new_pool()
                self._pool.open(wait=False)
            # Connections still lent out are closed as they come back; nobody waits for that.
            assert old is not None
            threading.Thread(target=old.close, name="idemctl-pool-close", daemon=True).start()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection; driver errors become idemctl's (the password never shows)."""
        async with self.translated():
            pool = await self._current()
            async with pool.connection() as conn:
                with self._pool_lock:
                    self._lent += 1
                try:
                    yield conn
                finally:
                    with self._pool_lock:
                        self._lent -= 1

    @asynccontextmanager
    async def translated(self) -> AsyncIterator[None]:
        """Driver errors inside the block as idemctl's; a row lock waited out past
        lock_timeout as LockTimeout."""
        try:
            yield
        except psycopg.Error as exc:  # PoolTimeout too
            raise self.error_for(exc) from exc

    async def close(self) -> None:
        if is_async():
            pool, loop = self._pool, self._loop
            self._pool, self._loop, self._reached = None, None, False
            closing, self._closing = self._closing, set()
            warden, self._warden = self._warden, None
            if pool is None or loop is not asyncio.get_running_loop():
                return  # nothing opened, or opened on a loop that is gone
            if warden is not None and warden is not asyncio.current_task():
                warden.cancel()  # its close() finds nothing left to do
            await pool.close()
            if closing:
                await asyncio.gather(*closing, return_exceptions=True)
        else:
            assert self._pool is not None
            self._pool.close()
