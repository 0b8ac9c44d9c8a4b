"""idemctl.fence.sqlalchemy on real databases (a SQLite file, the PostgreSQL server): the
fenced rules through a Core table on a Connection, an ORM model on a Session, and their
asyncio forms on PostgreSQL (psycopg's async driver); idemctl.fence.alembic's columns
added and dropped by a real Alembic migration context."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Integer, MetaData, String, Table, create_engine, inspect, select
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from idemctl.errors import StaleFence
from idemctl.fence import Fence, FenceConflict
from idemctl.fence.sqlalchemy import (
    FencedMixin,
    afenced_insert,
    afenced_update,
    fence_columns,
    fenced_insert,
    fenced_update,
)

pytestmark = pytest.mark.timeout(120)


def engine_url(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/effects.db"
    server = request.getfixturevalue("postgres_server")
    return server.url(scheme="postgresql+psycopg")


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    made = create_engine(engine_url(request, request.param, tmp_path))
    yield made
    made.dispose()


def charges_table(engine: Engine) -> Table:
    from sqlalchemy import Column

    table = Table(
        f"charges_{uuid.uuid4().hex[:10]}", MetaData(),
        Column("payment", String, primary_key=True), Column("cents", Integer),
        *fence_columns(),
    )  # fmt: skip
    table.create(engine)
    return table


def test_core_insert_replaces_an_older_attempt_and_refuses_a_zombie(engine: Engine) -> None:
    t = charges_table(engine)
    with engine.begin() as c:
        fenced_insert(c, t, {"payment": "p-1", "cents": 100}, Fence("p-1", 5), unique=["payment"])
        fenced_insert(c, t, {"payment": "p-1", "cents": 200}, Fence("p-1", 6), unique=["payment"])
    with engine.begin() as c, pytest.raises(StaleFence) as refused:
        fenced_insert(c, t, {"payment": "p-1", "cents": 300}, Fence("p-1", 5), unique=["payment"])
    assert (refused.value.token, refused.value.last) == (5, 6)
    with engine.begin() as c, pytest.raises(FenceConflict):
        fenced_insert(c, t, {"payment": "p-1", "cents": 1}, Fence("other", 9), unique=["payment"])
    with engine.connect() as c:
        assert c.execute(select(t)).all() == [("p-1", 200, "p-1", 6)]


def test_core_update_stamps_refuses_older_and_accepts_other_keys(engine: Engine) -> None:
    t = charges_table(engine)
    with engine.begin() as c:
        c.execute(t.insert().values(payment="acct", cents=0))
        assert fenced_update(c, t, {"cents": 10}, {"payment": "acct"}, Fence("pay-a", 3)) == 1
        assert fenced_update(c, t, {"cents": 20}, {"payment": "acct"}, Fence("pay-b", 1)) == 1
        assert fenced_update(c, t, {"cents": 30}, {"payment": "acct"}, Fence("pay-b", 2)) == 1
        assert fenced_update(c, t, {"cents": 1}, {"payment": "none"}, Fence("pay-b", 9)) == 0
    with engine.begin() as c, pytest.raises(StaleFence, match="older than 2"):
        fenced_update(c, t, {"cents": 99}, {"payment": "acct"}, Fence("pay-b", 1))
    with engine.connect() as c:
        assert c.execute(select(t)).all() == [("acct", 30, "pay-b", 2)]


class Base(DeclarativeBase):
    pass


class Shipment(FencedMixin, Base):
    __tablename__ = f"shipments_{uuid.uuid4().hex[:10]}"
    order: Mapped[str] = mapped_column(String, primary_key=True)
    status: Mapped[str] = mapped_column(String)


def test_orm_model_on_a_session_in_the_sessions_transaction(engine: Engine) -> None:
    Base.metadata.create_all(engine, tables=[Shipment.__table__])  # type: ignore[list-item]
    with Session(engine) as session, session.begin():
        session.add(Shipment(order="o-1", status="new"))
    with Session(engine) as session, session.begin():
        fenced_update(session, Shipment, {"status": "shipped"}, {"order": "o-1"}, Fence("s-1", 8))
    # a zombie's write, refused; its transaction rolled back
    with Session(engine) as session, pytest.raises(StaleFence), session.begin():
        fenced_update(session, Shipment, {"status": "lost"}, {"order": "o-1"}, Fence("s-1", 7))
    with Session(engine) as session:
        got = session.get(Shipment, "o-1")
        assert got is not None
        assert (got.status, got.idemctl_key, got.idemctl_token) == ("shipped", "s-1", 8)
    Base.metadata.drop_all(engine, tables=[Shipment.__table__])  # type: ignore[list-item]


def test_asyncio_connection_and_session_on_postgres(postgres_server: Any) -> None:
    t = charges_table(create_engine(postgres_server.url(scheme="postgresql+psycopg")))

    async def main() -> list[Any]:
        aengine = create_async_engine(postgres_server.url(scheme="postgresql+psycopg"))
        try:
            async with aengine.begin() as c:
                row = {"payment": "p-1", "cents": 100}
                await afenced_insert(c, t, row, Fence("p-1", 4), unique=["payment"])
                assert (
                    await afenced_update(c, t, {"cents": 5}, {"payment": "p-1"}, Fence("p-1", 4))
                    == 1
                )
            async with AsyncSession(aengine) as session:
                with pytest.raises(StaleFence):
                    async with session.begin():
                        await afenced_insert(session, t, row, Fence("p-1", 3), unique=["payment"])
            async with aengine.connect() as c:
                return list((await c.execute(select(t))).all())
        finally:
            await aengine.dispose()

    assert asyncio.run(main()) == [("p-1", 5, "p-1", 4)]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_alembic_op_adds_and_drops_the_columns(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from alembic.migration import MigrationContext
    from alembic.operations import Operations
    from sqlalchemy import Column

    from idemctl.fence.alembic import add_fence_columns, drop_fence_columns

    engine = create_engine(engine_url(request, kind, tmp_path))
    name = f"ledger_{uuid.uuid4().hex[:10]}"
    Table(name, MetaData(), Column("payment", String, primary_key=True)).create(engine)
    try:
        with engine.begin() as c, Operations.context(MigrationContext.configure(c)):
            add_fence_columns(name)
        columns = {col["name"] for col in inspect(engine).get_columns(name)}
        assert {"idemctl_key", "idemctl_token"} <= columns
        with engine.begin() as c, Operations.context(MigrationContext.configure(c)):
            drop_fence_columns(name)
        assert {col["name"] for col in inspect(engine).get_columns(name)} == {"payment"}
    finally:
        engine.dispose()
