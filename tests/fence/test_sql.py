"""idemctl.fence.sql on real databases: SQLite files and the PostgreSQL server, the rules
of a fenced write (the takeover of a stopped holder: test_takeover.py)."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from idemctl.errors import StaleFence
from idemctl.fence import Fence
from idemctl.fence.sql import (
    FenceConflict,
    add_fence_columns,
    afenced_insert,
    afenced_update,
    fenced_insert,
    fenced_update,
)

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Db:
    """A database of the test's: ``connect()`` gives an autocommit connection, ``table`` a
    fresh ``charges`` table (payment primary key, cents) with the fence columns."""

    kind: str
    target: str  # a file path or a libpq DSN
    table: str

    def connect(self) -> Any:
        if self.kind == "sqlite":
            return sqlite3.connect(self.target, isolation_level=None, timeout=30)
        import psycopg

        return psycopg.connect(self.target, autocommit=True)

    def rows(self) -> list[tuple[Any, ...]]:
        with closing(self.connect()) as c:
            query = f"SELECT payment, cents, idemctl_key, idemctl_token FROM {self.table}"
            return [tuple(r) for r in c.execute(query + " ORDER BY payment").fetchall()]


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    table = f"charges_{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        d = Db("sqlite", str(tmp_path / "effects.db"), table)
    else:
        d = Db("postgres", request.getfixturevalue("postgres_server").dsn(), table)
    with closing(d.connect()) as c:
        c.execute(f"CREATE TABLE {table} (payment TEXT PRIMARY KEY, cents INTEGER)")
        add_fence_columns(c, table)
        add_fence_columns(c, table)  # a second time: nothing to add
    yield d
    if d.kind == "postgres":
        with closing(d.connect()) as c:
            c.execute(f"DROP TABLE {table}")


def test_an_insert_is_replaced_by_a_newer_token_and_refuses_an_older_one(db: Db) -> None:
    with closing(db.connect()) as c:
        fenced_insert(c, db.table, {"payment": "p", "cents": 1}, Fence("p", 1), unique=["payment"])
        fenced_insert(c, db.table, {"payment": "p", "cents": 2}, Fence("p", 2), unique=["payment"])
        fenced_insert(c, db.table, {"payment": "p", "cents": 3}, Fence("p", 2), unique=["payment"])
        late, other = {"payment": "p", "cents": 4}, {"payment": "p", "cents": 5}
        with pytest.raises(StaleFence) as refused:
            fenced_insert(c, db.table, late, Fence("p", 1), unique=["payment"])
        with pytest.raises(FenceConflict):  # another key's row is not this key's to replace
            fenced_insert(c, db.table, other, Fence("q", 9), unique=["payment"])
    assert (refused.value.token, refused.value.last, refused.value.key) == (1, 2, "p")
    assert db.table in str(refused.value) and "older than 2" in str(refused.value)
    assert db.rows() == [("p", 3, "p", 2)]  # one row: the newest attempt's last write


def test_an_update_applies_to_same_or_newer_tokens_and_refuses_older(db: Db) -> None:
    with closing(db.connect()) as c:
        c.execute(f"INSERT INTO {db.table} (payment, cents) VALUES ('a', 0), ('b', 0)")
        assert fenced_update(c, db.table, {"cents": 10}, {"payment": "a"}, Fence("k", 3)) == 1
        assert fenced_update(c, db.table, {"cents": 11}, {"payment": "a"}, Fence("k", 3)) == 1
        with pytest.raises(StaleFence):
            fenced_update(c, db.table, {"cents": 12}, {"payment": "a"}, Fence("k", 2))
        # another key's token is not comparable: its write applies (and stamps the row)
        assert fenced_update(c, db.table, {"cents": 13}, {"payment": "a"}, Fence("j", 1)) == 1
        assert fenced_update(c, db.table, {"cents": 1}, {"payment": "none"}, Fence("k", 9)) == 0
    assert db.rows() == [("a", 13, "j", 1), ("b", 0, None, None)]


def test_names_are_checked_before_any_sql(db: Db) -> None:
    with closing(db.connect()) as c:
        for bad in ("charges; DROP TABLE x", 'a"b', "a.b.c", ""):
            with pytest.raises(ValueError, match="not a plain SQL name"):
                fenced_update(c, bad, {"cents": 1}, {"payment": "a"}, Fence("k", 1))
        with pytest.raises(ValueError, match="not a plain SQL name"):
            fenced_insert(c, db.table, {"cents) --": 1}, Fence("k", 1), unique=["cents) --"])
        with pytest.raises(ValueError, match="must name columns"):
            fenced_insert(c, db.table, {"cents": 1}, Fence("k", 1), unique=["payment"])
    assert db.rows() == []


def test_the_asyncio_forms_on_postgres(postgres_server: Any) -> None:
    import psycopg

    table = f"charges_{uuid.uuid4().hex[:12]}"

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(
            postgres_server.dsn(), autocommit=True
        ) as c:
            await c.execute(f"CREATE TABLE {table} (payment TEXT PRIMARY KEY, cents INTEGER)")
            await c.execute(f"ALTER TABLE {table} ADD idemctl_key text, ADD idemctl_token bigint")
            try:
                row = {"payment": "p", "cents": 1}
                await afenced_insert(c, table, row, Fence("p", 2), unique=["payment"])
                with pytest.raises(StaleFence):
                    await afenced_insert(c, table, row, Fence("p", 1), unique=["payment"])
                assert await afenced_update(c, table, {"cents": 7}, {"payment": "p"}, Fence("p", 2))
                with pytest.raises(StaleFence):
                    await afenced_update(c, table, {"cents": 8}, {"payment": "p"}, Fence("p", 1))
                read = await c.execute(f"SELECT cents, idemctl_token FROM {table}")
                got = await read.fetchall()
                assert got == [(7, 2)]
            finally:
                await c.execute(f"DROP TABLE {table}")

    asyncio.run(main())
