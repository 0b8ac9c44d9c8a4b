"""The PostgreSQL store's connections: a psycopg_pool pool with short lock and statement
timeouts, and the translation of the driver's errors into idemctl's.

``Pool`` serves the sync store, ``AsyncPool`` the async one (``idemctl.aio``): both take
their settings from one ``PoolSettings`` and translate errors with ``PoolBase.error_for``."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from idemctl.errors import ConfigError, NotProvisioned, StoreError, StoreUnavailable


class LockTimeout(Exception):
    """Another transaction held a row past lock_timeout: the key is busy."""


_SERVER_BUSY = (
    "starting up",
    "shutting down",
    "in recovery",
    "too many clients",
    "slots are reserved",
    "not yet accepting connections",
    "not accepting connections",
)
"""What a server that refuses a connection for now (not for good) says."""
_REFUSED = ("FATAL:", "fe_sendauth", "SSL was required", "does not support SSL", "certificate")
"""A server's refusal (FATAL: ...), or libpq's own when the URL cannot satisfy the server."""
RENEW_EVERY = 1.0
"""Seconds between two new pools after the server went away (see ``Pool._renew``)."""


@dataclass(frozen=True)
class PoolSettings:
    """What one store's connections are made with: the sync pool's and the async pool's."""

    conninfo: str
    url: str
    """Redacted: what error messages name."""
    schema: str
    pool_min: int
    pool_max: int
    lock_timeout: float
    statement_timeout: float
    connect_timeout: float

    def connect_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of every connection: autocommit, timeouts, UTC."""
        # plan_cache_mode: psycopg prepares what it runs often, and PostgreSQL may then keep
        # one generic plan made while the table was tiny, where a sequential scan is cheapest;
        # as the table grows that plan gets slower with every key until autovacuum's ANALYZE
        # happens to replace it. Planning each execution for its values costs a fraction of
        # a millisecond and never degrades.
        options = (
            f"-c lock_timeout={round(self.lock_timeout * 1000)} "
            f"-c statement_timeout={round(self.statement_timeout * 1000)} -c TimeZone=UTC "
            "-c plan_cache_mode=force_custom_plan"
        )
        return {
            "autocommit": True,
            "options": options,
            "connect_timeout": max(1, round(self.connect_timeout)),
        }

    def pool_args(self) -> dict[str, Any]:
        """The keyword arguments of a psycopg_pool pool, sync or async."""
        return {
            "conninfo": self.conninfo,
            "min_size": self.pool_min,
            "max_size": self.pool_max,
            "kwargs": self.connect_kwargs(),
            "timeout": self.connect_timeout,
            "name": f"idemctl {self.url}",
        }


class PoolBase:
    """What the sync and the async pool share: their settings and the translation of the
    driver's errors into idemctl's (the password never shows: ``url`` is redacted)."""

    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self.url, self.schema = settings.url, settings.schema
        self._connect_timeout = settings.connect_timeout
        self._pool_args = settings.pool_args()
        self._lent = 0  # connections this store holds right now
        self._reached = False

    def _renew(self) -> None:
        """Start over with a new pool after the server went away."""
        raise NotImplementedError

    def reach_error(self, exc: psycopg.Error) -> ConfigError | StoreError:
        """A failed first, direct connection as idemctl's error (see ``Pool._reach``)."""
        if isinstance(exc, psycopg.OperationalError):
            return connect_error(exc, self.url)
        return StoreError(f"PostgreSQL at {self.url}: {first_line(exc)}")

    def error_for(self, exc: psycopg.Error) -> Exception:
        """The error to raise (from ``exc``) for a driver error in a pooled connection's
        block; a row lock waited out past lock_timeout is LockTimeout."""
        if isinstance(exc, PoolTimeout):
            if self._lent >= self._pool_args["max_size"]:  # every connection is in use here
                return StoreUnavailable(
                    f"PostgreSQL at {self.url}: all {self._lent} pooled connections stayed "
                    f"busy for {self._connect_timeout:g}s (raise pool_max?)"
                )
            self._renew()
            return StoreUnavailable(
                f"PostgreSQL at {self.url} is unreachable: no connection within "
                f"{self._connect_timeout:g}s"
            )
        if isinstance(exc, pg_errors.LockNotAvailable):
            return LockTimeout()
        if isinstance(
            exc, pg_errors.UndefinedTable | pg_errors.InvalidSchemaName | pg_errors.UndefinedObject
        ):
            return NotProvisioned(
                f"PostgreSQL at {self.url} has no idemctl schema {self.schema!r}: "
                "run 'idemctl init'"
            )
        if isinstance(exc, pg_errors.UndefinedColumn):
            return NotProvisioned(
                f"PostgreSQL at {self.url} has an older idemctl schema {self.schema!r}: "
                "run 'idemctl init' to upgrade it"
            )
        if isinstance(exc, pg_errors.QueryCanceled):
            return StoreUnavailable(f"PostgreSQL at {self.url} did not answer in time: {exc}")
        if isinstance(exc, psycopg.OperationalError):
            self._renew()  # the other pooled connections died with this one
            return StoreUnavailable(f"PostgreSQL at {self.url} is unreachable: {first_line(exc)}")
        return StoreError(f"PostgreSQL at {self.url}: {first_line(exc)}")


class Pool(PoolBase):
    """The pooled connections of one store, in autocommit mode.

    The pool starts only once a first, direct connection got in (see ``_reach``), and starts
    over after the server went away. ``url`` (redacted) and ``schema`` are what error
    messages name."""

    def __init__(
        self,
        conninfo: str,
        *,
        url: str,
        schema: str,
        pool_min: int,
        pool_max: int,
        lock_timeout: float,
        statement_timeout: float,
        connect_timeout: float,
    ) -> None:
        super().__init__(
            PoolSettings(
                conninfo,
                url,
                schema,
                pool_min,
                pool_max,
                lock_timeout,
                statement_timeout,
                connect_timeout,
            )
        )
        self._pool_lock = threading.Lock()
        self._pool_made = 0.0
        self._reach_lock = threading.Lock()
        self._pool = self._new_pool(start=False)

    def _new_pool(self, start: bool = True) -> ConnectionPool[Any]:
        pool: ConnectionPool[Any] = ConnectionPool(**self._pool_args, open=False)
        if start:
            pool.open(wait=False)
        self._pool_made = time.monotonic()
        return pool

    def _reach(self) -> None:
        """Make this store's first connection directly, then start the pool.

        psycopg_pool connects in the background and retries what fails, so through it a
        refused password, a missing database or a closed port all look alike: no connection
        within connect_timeout. A direct connection fails at once with the server's reason:
        refused credentials or database become ConfigError (exit 2), a refused or timed-out
        connection StoreUnavailable (exit 3)."""
        with self._reach_lock:
            if self._reached:
                return
            try:
                conn = psycopg.connect(self._pool_args["conninfo"], **self._pool_args["kwargs"])
            except psycopg.Error as exc:
                raise self.reach_error(exc) from exc
            conn.close()
            self._pool.open(wait=False)
            self._reached = True

    def _renew(self) -> None:
        """Start over with a new pool after the server went away, at most once a second.
        psycopg_pool backs off exponentially while the server is down (1, 2, 4 ... s), so
        its own pool would keep failing long after the server is back."""
        with self._pool_lock:
            if time.monotonic() - self._pool_made < RENEW_EVERY:
                return
            old, self._pool = self._pool, self._new_pool()
        # Connections still lent out are closed as they come back; nobody waits for that.
        threading.Thread(target=old.close, name="idemctl-pool-close", daemon=True).start()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; driver errors become idemctl's (the password never shows)."""
        if not self._reached:
            self._reach()
        with self.translated(), self._pool.connection() as conn:
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
        except psycopg.Error as exc:  # PoolTimeout too
            raise self.error_for(exc) from exc

    def close(self) -> None:
        self._pool.close()


class AsyncPool(PoolBase):
    """``Pool`` for asyncio: the same settings, errors and first direct connection, on
    psycopg's async connections. Nothing connects before the first ``connection()``.

    A pool belongs to the event loop that made it: used from another loop (a new
    ``asyncio.run``), the store starts a pool of its own there. A pool still open when its
    loop ends (``asyncio.run`` returning without ``aclose()``) is closed then by a task of
    its own, the warden: psycopg_pool's workers take a cancellation that lands while they
    connect for a failed connection attempt and wait for more work, so the loop's end,
    which cancels every task and waits for them, would otherwise never come."""

    def __init__(self, settings: PoolSettings) -> None:
        super().__init__(settings)
        self._pool: AsyncConnectionPool[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reach_lock: asyncio.Lock | None = None
        self._pool_made = 0.0
        self._renew_due = False
        self._closing: set[asyncio.Task[None]] = set()
        self._warden: asyncio.Task[None] | None = None

    def _new_pool(self) -> AsyncConnectionPool[Any]:
        self._pool_made = time.monotonic()
        return AsyncConnectionPool(**self._pool_args, open=False)

    async def _current(self) -> AsyncConnectionPool[Any]:
        """This loop's pool, made (after a first, direct connection) or renewed as due."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # The loop that made the pool is gone or elsewhere (its warden closed the pool
            # as it ended): its connections cannot be used from here. Start over here.
            self._loop, self._pool, self._reached = loop, None, False
            self._reach_lock, self._renew_due, self._closing = asyncio.Lock(), False, set()
            self._warden = None
        if not self._reached:
            await self._reach()
        assert self._pool is not None
        if self._renew_due:
            self._renew_due = False
            old, self._pool = self._pool, self._new_pool()
            await self._pool.open(wait=False)
            # Connections still lent out are closed as they come back; nobody waits for that.
            task = loop.create_task(old.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return self._pool

    async def _reach(self) -> None:
        """``Pool._reach``: the first connection made directly, then the pool started."""
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
            self._pool = self._new_pool()
            await self._pool.open(wait=False)
            self._reached = True
            if self._warden is None:
                self._warden = asyncio.get_running_loop().create_task(
                    self._close_at_loop_end(), name=f"{self._pool_args['name']} warden"
                )

    async def _close_at_loop_end(self) -> None:
        """Wait until cancelled (by ``close()``, or by ``asyncio.run`` ending the loop), then
        close what is open: the workers are told to stop rather than cancelled."""
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            await self.close()

    def _renew(self) -> None:
        """``Pool._renew``, at most once a second; done by the next ``connection()``, as
        a new pool opens with an await."""
        if self._pool is not None and time.monotonic() - self._pool_made >= RENEW_EVERY:
            self._renew_due = True

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled async connection; driver errors become idemctl's."""
        async with self.translated():
            pool = await self._current()
            async with pool.connection() as conn:
                self._lent += 1
                try:
                    yield conn
                finally:
                    self._lent -= 1

    @asynccontextmanager
    async def translated(self) -> AsyncIterator[None]:
        """``Pool.translated`` for async blocks."""
        try:
            yield
        except psycopg.Error as exc:  # PoolTimeout too
            raise self.error_for(exc) from exc

    async def close(self) -> None:
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


def connect_error(exc: psycopg.OperationalError, url: str) -> ConfigError | StoreUnavailable:
    """A failed connection attempt as idemctl's error, with the server's (or libpq's) reason.

    The server answered and refused (FATAL: wrong password, no such database or role, no
    pg_hba.conf entry; or libpq found it wants a password the URL lacks): ConfigError. No
    answer (refused, timed out, unknown host) or a server busy starting, stopping or full:
    StoreUnavailable."""
    line = first_line(exc)
    found = re.search(r"port \d+ failed: (.*)$", line)
    reason = " ".join((found.group(1) if found else line).split())
    refused = any(mark in reason for mark in _REFUSED) and not any(
        busy in reason for busy in _SERVER_BUSY
    )
    if refused:
        if "no password supplied" in reason:
            reason += " (the server wants a password and the URL has none)"
        return ConfigError(f"PostgreSQL at {url} refused the connection: {reason}")
    return StoreUnavailable(f"PostgreSQL at {url} is unreachable: {reason}")


def first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
