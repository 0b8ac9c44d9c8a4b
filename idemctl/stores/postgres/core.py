"""What every part of PostgresStore stands on: the URL's settings, the pool, the statements
and a flow run on a pooled connection."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self

import psycopg

from idemctl.errors import ConfigError, NotProvisioned
from idemctl.stores.base import BaseStore
from idemctl.stores.limits import DEFAULT_LEASE, DEFAULT_RETENTION
from idemctl.stores.postgres import url as postgres_url
from idemctl.stores.postgres.pool import Pool
from idemctl.stores.postgres.pool_base import PoolSettings
from idemctl.stores.postgres.sql import (
    DEFAULT_SCHEMA,
    migrations,
    names,
    protocol_statements,
)

if TYPE_CHECKING:
    from idemctl.stores.waiting import Watch

ADMIN_LOCK_WAIT = 3.0
"""Seconds unlock and forget (of a key or an entity) wait for a row that another
transaction holds; also how long a settle waits for an entity's row before it gives up."""
PROVISION_LOCK_WAIT = 60.0
"""Seconds provision waits for another provisioner of the schema (workers that all start
at once) and for the locks its DDL needs, instead of the claims' lock_timeout."""


class PostgresCore(BaseStore):
    scheme = "postgresql"

    def __init__(
        self,
        conninfo: str,
        *,
        url: str,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = "",
        lease: float = DEFAULT_LEASE,
        retention: float = DEFAULT_RETENTION,
        pool_min: int = 1,
        pool_max: int = 8,
        lock_timeout: float = 0.1,
        statement_timeout: float = 10.0,
        connect_timeout: float = 5.0,
    ) -> None:
        super().__init__(url, lease=lease, retention=retention)
        if pool_min > pool_max:
            raise ConfigError(f"pool_min={pool_min} exceeds pool_max={pool_max}")
        self.schema, self.prefix = schema, prefix
        self.names = names(schema, prefix)
        self.keys_table = self.names.keys_table
        self.outbox_table = self.names.outbox_table
        self._pool = Pool(
            PoolSettings(
                conninfo=conninfo,
                url=self.url,
                schema=schema,
                pool_min=pool_min,
                pool_max=pool_max,
                lock_timeout=lock_timeout,
                statement_timeout=statement_timeout,
                connect_timeout=connect_timeout,
            )
        )
        self._sql = protocol_statements(self.names)

    @classmethod
    def from_url(cls, url: str) -> Self:
        conninfo, settings = postgres_url.from_url(url)
        return cls(conninfo, url=url, **settings)

    # Plumbing --------------------------------------------------------------------------------

    @property
    def pool_settings(self) -> PoolSettings:
        """What this store's connections are made with (the async store makes its own
        with the same)."""
        return self._pool.settings

    @property
    def statements(self) -> dict[str, str]:
        """The protocol's statements on this store's schema, by name (see ``sql``)."""
        return self._sql

    def connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A pooled connection in autocommit mode (``with conn.transaction():`` for more than
        one statement); driver errors inside the block become idemctl's errors."""
        return self._pool.connection()

    def translated(self) -> AbstractContextManager[None]:
        """Driver errors inside the block become idemctl's (on a connection of this store's
        already lent, such as a transactional unit's)."""
        return self._pool.translated()

    def _fetch(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.connection() as conn:
            return conn.execute(sql, params).fetchall()

    def without_entities(self, version: int) -> NotProvisioned | None:
        """What to say when the entities' table is missing from a schema at ``version``:
        None unless that is an older schema (then the usual NotProvisioned stands)."""
        if 0 < version < max(migrations(self.names)):
            return NotProvisioned(
                f"PostgreSQL at {self.url} has an older idemctl schema {self.schema!r} "
                f"(version {version}), without the sequence guard's entities: "
                "run 'idemctl init' to upgrade it"
            )
        return None

    def _listen(self, watch: Watch) -> Callable[[], None] | None:
        from idemctl.stores.postgres.wake import listen

        return listen(self, watch)

    def close(self) -> None:
        self._close_watch()
        self._pool.close()


def _now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0].astimezone(UTC)  # type: ignore[no-any-return]


def _exists(conn: psycopg.Connection[Any], table: str) -> bool:
    """Whether ``table`` (schema-qualified, quoted) exists."""
    row = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
    return row is not None and row[0] is not None
