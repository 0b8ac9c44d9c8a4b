"""Where ``idemctl verify`` keeps its keys: a namespace of the user's store that nothing else
uses, made from their URL, and how to remove it again without touching anything beside it.

- SQLite: a new file beside theirs, ``idemctl-verify-RUN.db``;
- Redis and Redis Cluster: the same database, under the prefix ``PREFIXverify-RUN:``;
- PostgreSQL: the same schema, tables named ``PREFIXverify_RUN_...``;
- DynamoDB: a new table ``TABLE-verify-RUN``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from idemctl.errors import ConfigError, Refused
from idemctl.stores import open_store
from idemctl.stores.base import Store
from idemctl.urls import redact_url, split_url

LEDGER_TABLE = "ledger"
"""PostgreSQL, transactional mode: the recording handler's table, beside the store's."""


def with_option(url: str, name: str, value: str) -> str:
    """``url`` with query option ``name`` set to ``value`` (replaced if it was there)."""
    parts = split_url(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != name]
    return parts._replace(query=urlencode([*query, (name, value)], safe=":/")).geturl()


def option(url: str, name: str) -> str | None:
    return dict(parse_qsl(split_url(url).query)).get(name)


class Scratch:
    """The scratch namespace of run ``run`` in the store at ``url``."""

    def __init__(self, url: str, run: str, default_store: bool = False) -> None:
        parts = split_url(url)
        self.scheme = parts.scheme.lower()
        self.run = run
        self._created_dir: str | None = None
        self._created_schema = False
        if self.scheme == "memory":
            raise ConfigError(
                "verify runs consume processes, which cannot share a memory:// store: give a "
                "sqlite://, redis://, postgresql:// or dynamodb:// URL"
            )
        if self.scheme == "sqlite":
            if default_store:
                self._created_dir = tempfile.mkdtemp(prefix="idemctl-verify-")
                folder = self._created_dir
            else:
                folder = os.path.dirname(parts.path[1:]) or "."
            self.path: Path | None = Path(folder) / f"idemctl-verify-{run}.db"
            self.url = f"sqlite:///{self.path}" + (f"?{parts.query}" if parts.query else "")
        elif self.scheme in ("redis", "rediss", "redis+cluster"):
            self.path = None
            self.url = with_option(
                url, "prefix", f"{option(url, 'prefix') or 'idem:'}verify-{run}:"
            )
        elif self.scheme in ("postgresql", "postgres"):
            self.path = None
            self.url = with_option(url, "prefix", f"{option(url, 'prefix') or ''}verify_{run}_")
        elif self.scheme == "dynamodb":
            self.path = None
            table = parts.netloc or parts.path.strip("/")
            self.url = parts._replace(netloc=f"{table}-verify-{run}", path="").geturl()
        else:  # open_store names the schemes it knows
            open_store(url).close()
            raise ConfigError(f"verify does not know how to make scratch room in {self.scheme}://")

    @property
    def shown(self) -> str:
        return redact_url(self.url)

    @property
    def ledger_table(self) -> str | None:
        """The transactional ledger's table, schema-qualified and quoted (PostgreSQL)."""
        if self.scheme not in ("postgresql", "postgres"):
            return None
        from idemctl.stores.postgres.sql import names, quote_ident

        prefix = option(self.url, "prefix") or ""
        return f"{names(option(self.url, 'schema') or 'idem', prefix).schema}." + quote_ident(
            prefix + LEDGER_TABLE
        )

    def store(self) -> Store:
        """The scratch store, opened (a context manager: closed after the block)."""
        return open_store(self.url)

    def refuse_if_used(self) -> None:
        """Refused when the namespace holds anything: verify never runs among keys it did
        not write."""
        if self._exists():
            raise Refused(
                f"the scratch namespace {self.shown} already exists: choose another --run-id"
            )

    def _exists(self) -> bool:
        if self.path is not None:
            return self.path.exists()
        with self.store() as store:
            if self.scheme == "dynamodb":
                return bool(store._table_exists())  # type: ignore[attr-defined]
            if self.scheme.startswith("redis"):
                return any(True for _ in _redis_keys(store))
            with store.connection() as conn:  # type: ignore[attr-defined]
                return bool(_postgres_objects(conn, store))

    def provision(self, transactional_ledger: bool) -> None:
        with self.store() as store:
            if self.scheme in ("postgresql", "postgres"):
                with store.connection() as conn:  # type: ignore[attr-defined]
                    found = conn.execute(
                        "SELECT 1 FROM pg_namespace WHERE nspname = %s",
                        (store.schema,),  # type: ignore[attr-defined]
                    ).fetchone()
                self._created_schema = found is None
            store.provision()
            table = self.ledger_table
            if transactional_ledger and table is not None:
                with store.connection() as conn:  # type: ignore[attr-defined]
                    conn.execute(
                        f"CREATE TABLE {table} (n bigserial PRIMARY KEY, key text NOT NULL, "
                        "pid integer NOT NULL, sent double precision NOT NULL, "
                        "handled double precision NOT NULL, token bigint)"
                    )

    def keys_left(self) -> int:
        """How many keys, tables or files of this run the store still holds."""
        if self.path is not None:
            return sum(1 for p in self._files() if p.exists())
        with self.store() as store:
            if self.scheme == "dynamodb":
                return 1 if store._table_exists() else 0  # type: ignore[attr-defined]
            if self.scheme.startswith("redis"):
                return sum(1 for _ in _redis_keys(store))
            with store.connection() as conn:  # type: ignore[attr-defined]
                return len(_postgres_objects(conn, store))

    def remove(self) -> None:
        """Delete everything of this run: its file, keys, tables or table."""
        if self.path is not None:
            for p in self._files():
                p.unlink(missing_ok=True)
            if self._created_dir is not None:
                os.rmdir(self._created_dir)
                self._created_dir = None
            return
        with self.store() as store:
            if self.scheme == "dynamodb":
                _drop_dynamodb_table(store)
            elif self.scheme.startswith("redis"):
                _drop_redis_keys(store)
            else:
                with store.connection() as conn:  # type: ignore[attr-defined]
                    _drop_postgres_objects(conn, store)
                    if self._created_schema:  # verify made it: gone too, if nothing else is
                        _drop_empty_schema(conn, store.schema)  # type: ignore[attr-defined]

    def _files(self) -> list[Path]:
        assert self.path is not None
        return [self.path, *(Path(f"{self.path}{s}") for s in ("-wal", "-shm", "-journal"))]


def _redis_keys(store: Any) -> Iterator[tuple[Any, str]]:
    """(client, key) for each key under the store's prefix, on every primary."""
    from idemctl.stores.redis.core import glob_escape

    match = glob_escape(store.prefix) + "*"
    with store._guard():  # the driver's errors as idemctl's (StoreUnavailable: exit 3)
        for node in store._nodes():
            # a cluster's primaries are scanned, and their keys deleted, through their own
            # connections: the keys a node returns live there
            client = store._client if node is None else node.redis_connection
            cursor = 0
            while True:
                cursor, found = client.scan(cursor, match=match, count=1000)
                for key in found:
                    yield client, key.decode() if isinstance(key, bytes) else key
                if int(cursor) == 0:
                    break


def _drop_redis_keys(store: Any) -> None:
    pipes: dict[int, Any] = {}
    keys = list(_redis_keys(store))
    with store._guard():
        for client, key in keys:
            pipe = pipes.setdefault(id(client), client.pipeline(transaction=False))
            pipe.delete(key)  # a key a command: a cluster node refuses DEL across slots
            if len(pipe) >= 1000:
                pipe.execute()
        for pipe in pipes.values():
            pipe.execute()


_POSTGRES_OBJECTS = (
    ("TABLE", "pg_class", "relname", "relnamespace", "relkind IN ('r', 'p')"),
    ("FUNCTION", "pg_proc", "proname", "pronamespace", "true"),
    ("TYPE", "pg_type", "typname", "typnamespace", "typtype = 'e'"),
)
"""What a store's migrations make in its schema, each named with the store's prefix: kind,
catalog, its name and schema columns, which of its rows (indexes, triggers and sequences go
with their tables). Dropped in this order."""


def _postgres_objects(conn: Any, store: Any) -> list[tuple[str, str]]:
    """(kind, name) of each table, function and enum type of the store's prefix."""
    found = []
    for kind, catalog, name, namespace, which in _POSTGRES_OBJECTS:
        query = (  # the catalogs' names are the constants above; the values are bound
            f"SELECT o.{name} FROM pg_catalog.{catalog} o "  # noqa: S608
            f"JOIN pg_catalog.pg_namespace n ON n.oid = o.{namespace} "
            f"WHERE {which} AND n.nspname = %s AND left(o.{name}, %s) = %s"
        )
        rows = conn.execute(query, (store.schema, len(store.prefix), store.prefix)).fetchall()
        found += [(kind, r[0]) for r in rows]
    return found


def _drop_postgres_objects(conn: Any, store: Any) -> None:
    from idemctl.stores.postgres.sql import quote_ident

    schema = quote_ident(store.schema)
    for kind, name in _postgres_objects(conn, store):
        conn.execute(f"DROP {kind} IF EXISTS {schema}.{quote_ident(name)} CASCADE")


def _drop_dynamodb_table(store: Any) -> None:
    if store._table_exists():
        store.client.delete_table(TableName=store.table)
        store.client.get_waiter("table_not_exists").wait(
            TableName=store.table, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
        )


def _drop_empty_schema(conn: Any, schema: str) -> None:
    from idemctl.errors import StoreError
    from idemctl.stores.postgres.sql import quote_ident

    with suppress(StoreError):  # something of someone else's went into it meanwhile: theirs
        conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} RESTRICT")
