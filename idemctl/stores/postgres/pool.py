"""The PostgreSQL store's connections: a psycopg_pool pool with short lock and statement
timeouts, and the translation of the driver's errors into idemctl's."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

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


class Pool:
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
        self.url, self.schema = url, schema
        self._connect_timeout = connect_timeout
        # plan_cache_mode: psycopg prepares what it runs often, and PostgreSQL may then keep
        # one generic plan made while the table was tiny, where a sequential scan is cheapest;
        # as the table grows that plan gets slower with every key until autovacuum's ANALYZE
        # happens to replace it. Planning each execution for its values costs a fraction of
        # a millisecond and never degrades.
        options = (
            f"-c lock_timeout={round(lock_timeout * 1000)} "
            f"-c statement_timeout={round(statement_timeout * 1000)} -c TimeZone=UTC "
            "-c plan_cache_mode=force_custom_plan"
        )
        self._pool_args: dict[str, Any] = {
            "conninfo": conninfo,
            "min_size": pool_min,
            "max_size": pool_max,
            "kwargs": {
                "autocommit": True,
                "options": options,
                "connect_timeout": max(1, round(connect_timeout)),
            },
            "timeout": connect_timeout,
            "name": f"idemctl {url}",
        }
        self._pool_lock = threading.Lock()
        self._pool_made = 0.0
        self._lent = 0  # connections this store holds right now
        self._reached = False
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
            except psycopg.OperationalError as exc:
                raise connect_error(exc, self.url) from exc
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL at {self.url}: {first_line(exc)}") from exc
            conn.close()
            self._pool.open(wait=False)
            self._reached = True

    def _renew(self) -> None:
        """Start over with a new pool after the server went away, at most once a second.
        psycopg_pool backs off exponentially while the server is down (1, 2, 4 ... s), so
        its own pool would keep failing long after the server is back."""
        with self._pool_lock:
            if time.monotonic() - self._pool_made < 1.0:
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
        except PoolTimeout as exc:
            if self._lent >= self._pool_args["max_size"]:  # every connection is in use here
                raise StoreUnavailable(
                    f"PostgreSQL at {self.url}: all {self._lent} pooled connections stayed "
                    f"busy for {self._connect_timeout:g}s (raise pool_max?)"
                ) from exc
            self._renew()
            raise StoreUnavailable(
                f"PostgreSQL at {self.url} is unreachable: no connection within "
                f"{self._connect_timeout:g}s"
            ) from exc
        except pg_errors.LockNotAvailable as exc:
            raise LockTimeout() from exc
        except (
            pg_errors.UndefinedTable,
            pg_errors.InvalidSchemaName,
            pg_errors.UndefinedObject,
        ) as exc:
            raise NotProvisioned(
                f"PostgreSQL at {self.url} has no idemctl schema {self.schema!r}: "
                "run 'idemctl init'"
            ) from exc
        except pg_errors.UndefinedColumn as exc:
            raise NotProvisioned(
                f"PostgreSQL at {self.url} has an older idemctl schema {self.schema!r}: "
                "run 'idemctl init' to upgrade it"
            ) from exc
        except pg_errors.QueryCanceled as exc:
            raise StoreUnavailable(
                f"PostgreSQL at {self.url} did not answer in time: {exc}"
            ) from exc
        except psycopg.OperationalError as exc:
            self._renew()  # the other pooled connections died with this one
            raise StoreUnavailable(
                f"PostgreSQL at {self.url} is unreachable: {first_line(exc)}"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL at {self.url}: {first_line(exc)}") from exc

    def close(self) -> None:
        self._pool.close()


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
