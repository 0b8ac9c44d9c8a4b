"""What the PostgreSQL store's two pools share, with no I/O: their settings (short lock and
statement timeouts), and the translation of the driver's errors into idemctl's.

``AsyncPool`` (``idemctl.stores.postgres.pool_async``) serves the async store, and ``Pool``,
written from it (``idemctl.stores.postgres.pool``), the sync one: both take their settings
from one ``PoolSettings`` and translate errors with ``PoolBase.error_for``."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

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
        # prepare_threshold never reached: psycopg prepares only the statements that ask, the
        # library's single-key path (``flows.Statement.prepare``), whose plans PostgreSQL
        # keeps after five executions. Any other statement, a batch's or an operator's (or
        # a transactional handler's own SQL on this connection), is planned at each
        # execution for its values: a plan kept from while the table was tiny (a sequential
        # scan, cheapest then) would get slower with every key until autovacuum's next
        # ANALYZE replaced it; a key's lookup by its primary key is exposed to that only
        # for REPLAN_EVERY executions (stores.postgres.drive; docs/guides/production.md).
        options = (
            f"-c lock_timeout={round(self.lock_timeout * 1000)} "
            f"-c statement_timeout={round(self.statement_timeout * 1000)} -c TimeZone=UTC"
        )
        return {
            "autocommit": True,
            "prepare_threshold": sys.maxsize,  # None would refuse prepare=True too
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
