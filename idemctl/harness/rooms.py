"""Each backend family's scratch room for ``idemctl verify`` (``idemctl.backends`` names
them): a namespace of the user's store that nothing else uses, made from their URL, how to
remove it again without touching anything beside it, and how verify takes the store away.

- SQLite: a new file beside theirs, ``idemctl-verify-RUN.db``; faulted by an exclusive lock;
- Redis and Redis Cluster: the same database, under the prefix ``PREFIXverify-RUN:``;
- PostgreSQL: the same schema, tables named ``PREFIXverify_RUN_...``;
- DynamoDB: a new table ``TABLE-verify-RUN``;
- the last three faulted by SIGSTOP of the server listening on this host.
"""

from __future__ import annotations

import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import parse_qsl, urlencode

from idemctl.errors import ConfigError
from idemctl.stores import open_store
from idemctl.urls import split_url

if TYPE_CHECKING:
    from idemctl.stores.dynamodb import DynamoDBStore
    from idemctl.stores.postgres import PostgresStore
    from idemctl.stores.redis import RedisStore

LEDGER_TABLE = "ledger"
"""PostgreSQL, transactional mode: the recording handler's table, beside the store's."""


def with_option(url: str, name: str, value: str) -> str:
    """``url`` with query option ``name`` set to ``value`` (replaced if it was there)."""
    parts = split_url(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != name]
    return parts._replace(query=urlencode([*query, (name, value)], safe=":/")).geturl()


def option(url: str, name: str) -> str | None:
    return dict(parse_qsl(split_url(url).query)).get(name)


class Room(ABC):
    """The scratch namespace of run ``run`` in the store at ``url``: ``self.url`` opens it."""

    fault: ClassVar[str] = "pause"
    """How verify takes the store away: ``pause`` (SIGSTOP of the server on this host) or
    ``lock`` (an exclusive lock on the file at ``path``)."""
    path: Path | None = None
    url: str

    @abstractmethod
    def __init__(self, url: str, run: str, default_store: bool) -> None: ...

    @property
    def ledger_table(self) -> str | None:
        """The transactional ledger's table, where the family has transactional mode."""
        return None

    def server(self) -> tuple[str | None, int | None]:
        """The host and port of the server that ``pause`` stops."""
        parts = split_url(self.url)
        return parts.hostname, parts.port

    @abstractmethod
    def exists(self) -> bool: ...

    def provision(self, transactional_ledger: bool) -> None:
        with open_store(self.url) as store:
            store.provision()

    @abstractmethod
    def left(self) -> int:
        """How many keys, tables or files of this run the store still holds."""

    @abstractmethod
    def remove(self) -> None: ...


class MemoryRoom(Room):
    def __init__(self, url: str, run: str, default_store: bool) -> None:
        raise ConfigError(
            "verify runs consume processes, which cannot share a memory:// store: give a "
            "sqlite://, redis://, postgresql:// or dynamodb:// URL"
        )

    def exists(self) -> bool:
        raise NotImplementedError

    def left(self) -> int:
        raise NotImplementedError

    def remove(self) -> None:
        raise NotImplementedError


class SQLiteRoom(Room):
    fault = "lock"

    def __init__(self, url: str, run: str, default_store: bool) -> None:
        parts = split_url(url)
        self._created_dir: str | None = None
        if default_store:
            self._created_dir = tempfile.mkdtemp(prefix="idemctl-verify-")
            folder = self._created_dir
        else:
            folder = os.path.dirname(parts.path[1:]) or "."
        self.path = Path(folder) / f"idemctl-verify-{run}.db"
        self.url = f"sqlite:///{self.path}" + (f"?{parts.query}" if parts.query else "")

    def exists(self) -> bool:
        return self._file.exists()

    def left(self) -> int:
        return sum(1 for p in self._files() if p.exists())

    def remove(self) -> None:
        for p in self._files():
            p.unlink(missing_ok=True)
        if self._created_dir is not None:
            os.rmdir(self._created_dir)
            self._created_dir = None

    @property
    def _file(self) -> Path:
        assert self.path is not None
        return self.path

    def _files(self) -> list[Path]:
        return [self._file, *(Path(f"{self._file}{s}") for s in ("-wal", "-shm", "-journal"))]


class RedisRoom(Room):
    def __init__(self, url: str, run: str, default_store: bool) -> None:
        self.url = with_option(url, "prefix", f"{option(url, 'prefix') or 'idem:'}verify-{run}:")

    def _store(self) -> RedisStore:
        from idemctl.stores.redis import RedisStore

        return RedisStore.from_url(self.url)

    def exists(self) -> bool:
        with self._store() as store:
            return any(True for _ in _redis_keys(store))

    def left(self) -> int:
        with self._store() as store:
            return sum(1 for _ in _redis_keys(store))

    def remove(self) -> None:
        with self._store() as store:
            keys = list(_redis_keys(store))
            pipes: dict[int, Any] = {}
            with store._guard():
                for client, key in keys:
                    pipe = pipes.setdefault(id(client), client.pipeline(transaction=False))
                    pipe.delete(key)  # a key a command: a cluster node refuses DEL across slots
                    if len(pipe) >= 1000:
                        pipe.execute()
                for pipe in pipes.values():
                    pipe.execute()


def _redis_keys(store: RedisStore) -> Iterator[tuple[Any, str]]:
    """(client, key) for each key under the store's prefix, on every primary."""
    from idemctl.stores.redis.core import glob_escape

    match = glob_escape(store.prefix) + "*"
    with store._guard():  # the driver's errors as idemctl's (StoreUnavailable: exit 3)
        for node in store._nodes():
            # a cluster's primaries are scanned, and their keys deleted, through their own
            # connections: the keys a node returns live there
            client: Any = store._client if node is None else node.redis_connection
            cursor = 0
            while True:
                cursor, found = client.scan(cursor, match=match, count=1000)
                for key in found:
                    yield client, key.decode() if isinstance(key, bytes) else key
                if int(cursor) == 0:
                    break


class PostgresRoom(Room):
    _OBJECTS = (
        ("TABLE", "pg_class", "relname", "relnamespace", "relkind IN ('r', 'p')"),
        ("FUNCTION", "pg_proc", "proname", "pronamespace", "true"),
        ("TYPE", "pg_type", "typname", "typnamespace", "typtype = 'e'"),
    )
    """What a store's migrations make in its schema, each named with the store's prefix:
    kind, catalog, its name and schema columns, which of its rows (indexes, triggers and
    sequences go with their tables). Dropped in this order."""

    def __init__(self, url: str, run: str, default_store: bool) -> None:
        self.url = with_option(url, "prefix", f"{option(url, 'prefix') or ''}verify_{run}_")
        self._created_schema = False

    def _store(self) -> PostgresStore:
        from idemctl.stores.postgres import PostgresStore

        return PostgresStore.from_url(self.url)

    @property
    def ledger_table(self) -> str | None:
        from idemctl.stores.postgres.sql import names, quote_ident

        prefix = option(self.url, "prefix") or ""
        return f"{names(option(self.url, 'schema') or 'idem', prefix).schema}." + quote_ident(
            prefix + LEDGER_TABLE
        )

    def exists(self) -> bool:
        with self._store() as store, store.connection() as conn:
            return bool(self._objects(conn, store))

    def provision(self, transactional_ledger: bool) -> None:
        with self._store() as store:
            with store.connection() as conn:
                found = conn.execute(
                    "SELECT 1 FROM pg_namespace WHERE nspname = %s", (store.schema,)
                ).fetchone()
            self._created_schema = found is None
            store.provision()
            if transactional_ledger:
                with store.connection() as conn:
                    conn.execute(
                        f"CREATE TABLE {self.ledger_table} (n bigserial PRIMARY KEY, "
                        "key text NOT NULL, pid integer NOT NULL, sent double precision NOT "
                        "NULL, handled double precision NOT NULL, token bigint)"
                    )

    def left(self) -> int:
        with self._store() as store, store.connection() as conn:
            return len(self._objects(conn, store))

    def remove(self) -> None:
        from idemctl.errors import StoreError
        from idemctl.stores.postgres.sql import quote_ident

        with self._store() as store, store.connection() as conn:
            schema = quote_ident(store.schema)
            for kind, name in self._objects(conn, store):
                conn.execute(f"DROP {kind} IF EXISTS {schema}.{quote_ident(name)} CASCADE")
            if self._created_schema:  # verify made it: gone too, if nothing else is
                # something of someone else's went into it meanwhile: theirs
                with suppress(StoreError):
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} RESTRICT")

    def _objects(self, conn: Any, store: PostgresStore) -> list[tuple[str, str]]:
        """(kind, name) of each table, function and enum type of the store's prefix."""
        found = []
        for kind, catalog, name, namespace, which in self._OBJECTS:
            query = (  # the catalogs' names are the constants above; the values are bound
                f"SELECT o.{name} FROM pg_catalog.{catalog} o "  # noqa: S608
                f"JOIN pg_catalog.pg_namespace n ON n.oid = o.{namespace} "
                f"WHERE {which} AND n.nspname = %s AND left(o.{name}, %s) = %s"
            )
            rows = conn.execute(query, (store.schema, len(store.prefix), store.prefix)).fetchall()
            found += [(kind, r[0]) for r in rows]
        return found


class DynamoDBRoom(Room):
    def __init__(self, url: str, run: str, default_store: bool) -> None:
        parts = split_url(url)
        table = parts.netloc or parts.path.strip("/")
        self.url = parts._replace(netloc=f"{table}-verify-{run}", path="").geturl()

    def _store(self) -> DynamoDBStore:
        from idemctl.stores.dynamodb import DynamoDBStore

        return DynamoDBStore.from_url(self.url)

    def server(self) -> tuple[str | None, int | None]:
        endpoint = option(self.url, "endpoint_url")
        parts = split_url(endpoint or self.url)
        return parts.hostname, parts.port

    def exists(self) -> bool:
        with self._store() as store:
            return store._table_exists()

    def left(self) -> int:
        return 1 if self.exists() else 0

    def remove(self) -> None:
        with self._store() as store:
            if store._table_exists():
                store.client.delete_table(TableName=store.table)
                store.client.get_waiter("table_not_exists").wait(
                    TableName=store.table, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
                )
