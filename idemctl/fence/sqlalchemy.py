"""Fenced writes through SQLAlchemy (2.0+): the rules of ``idemctl.fence.sql`` for a Core
``Table`` or an ORM model, on a ``Connection`` or a ``Session`` (and their asyncio forms),
PostgreSQL and SQLite.

- :func:`fenced_update`: ``UPDATE ... WHERE ... AND`` the row's fence is not a newer token
  of the same key; it stamps the fence and returns the rows updated; StaleFence if a
  matching row carries a newer token of the key.
- :func:`fenced_insert`: ``INSERT ... ON CONFLICT (unique) DO UPDATE ... WHERE`` the row
  there is this key's with an older token (a dead attempt's row, replaced) ``RETURNING``;
  StaleFence if a newer attempt's row is there, FenceConflict if another key's (SQLite
  3.35 or later, for RETURNING).
- :func:`fence_columns` (Core) and :class:`FencedMixin` (ORM) declare the two columns;
  ``idemctl.fence.alembic.add_fence_columns`` adds them in a migration.

Each runs in the caller's transaction: the fence commits with the effect.

    from idemctl.fence.sqlalchemy import fenced_update

    def ship(event, ctx):
        with Session(engine) as session, session.begin():
            fenced_update(session, Order, {"status": "shipped"}, {"id": event.json()["id"]},
                          ctx.fence)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import BigInteger, Column, Table, Text, and_, or_, select, update
from sqlalchemy.orm import Mapped, mapped_column

from idemctl.fence import Fence
from idemctl.fence.sql import KEY_COLUMN, TOKEN_COLUMN, refusal

__all__ = [
    "FencedMixin",
    "afenced_insert",
    "afenced_update",
    "fence_columns",
    "fenced_insert",
    "fenced_update",
]


def fence_columns() -> list[Column[Any]]:
    """The fence's two columns, for a Core ``Table(...)`` of your own."""
    return [
        Column(KEY_COLUMN, Text, nullable=True),
        Column(TOKEN_COLUMN, BigInteger, nullable=True),
    ]


class FencedMixin:
    """The fence's two columns on an ORM model: ``class Charge(FencedMixin, Base): ...``."""

    idemctl_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    idemctl_token: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


def _table(target: Any) -> Table:
    table = getattr(target, "__table__", target)
    if not isinstance(table, Table):
        raise TypeError(f"a fenced write needs a Table or a mapped class, not {target!r}")
    return table


def _dialect(executor: Any) -> str:
    """The dialect's name of a Connection, Session or their asyncio forms."""
    bind = executor.get_bind() if hasattr(executor, "get_bind") else executor
    name: str = bind.dialect.name if hasattr(bind, "dialect") else bind.sync_engine.dialect.name
    return name


def _update(
    table: Table, values: Mapping[str, Any], where: Mapping[str, Any], fence: Fence
) -> tuple[Any, Any]:
    if not values or not where:
        raise ValueError("fenced_update needs values to set and a where to select the rows")
    k, tok = table.c[KEY_COLUMN], table.c[TOKEN_COLUMN]
    match = [table.c[c] == v for c, v in where.items()]
    stamped = {**values, KEY_COLUMN: fence.key, TOKEN_COLUMN: fence.token}
    ours = or_(k.is_(None), k != fence.key, tok <= fence.token)
    statement = update(table).where(*match, ours).values(stamped)
    check = select(k, tok).where(*match, k == fence.key, tok > fence.token).limit(1)
    return statement, check


def _insert(
    table: Table, dialect: str, values: Mapping[str, Any], fence: Fence, unique: Sequence[str]
) -> tuple[Any, Any]:
    if not unique or any(c not in values for c in unique):
        raise ValueError(f"fenced_insert: unique {tuple(unique)!r} must name columns of values")
    from sqlalchemy.dialects import postgresql, sqlite

    inserts: dict[str, Any] = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}
    if dialect not in inserts:
        raise ValueError(f"fenced_insert runs on PostgreSQL and SQLite, not {dialect}")
    row = {**values, KEY_COLUMN: fence.key, TOKEN_COLUMN: fence.token}
    statement = inserts[dialect](table).values(row)
    k, tok = table.c[KEY_COLUMN], table.c[TOKEN_COLUMN]
    statement = statement.on_conflict_do_update(
        index_elements=[table.c[c] for c in unique],
        set_={c: statement.excluded[c] for c in row},
        where=and_(k == statement.excluded[KEY_COLUMN], tok <= statement.excluded[TOKEN_COLUMN]),
    ).returning(k)  # a row back when it was written (rowcount is -1 on some drivers)
    check = select(k, tok).where(*[table.c[c] == values[c] for c in unique]).limit(1)
    return statement, check


def fenced_update(
    executor: Any, target: Any, values: Mapping[str, Any], where: Mapping[str, Any], fence: Fence
) -> int:
    """``UPDATE target SET values WHERE where``, fenced, on a ``Connection`` or ``Session``;
    the rows updated (0: none matched)."""
    table = _table(target)
    statement, check = _update(table, values, where, fence)
    changed = executor.execute(statement).rowcount
    if changed:
        return int(changed)
    refused = refusal(table.name, fence, executor.execute(check).first())
    if refused is not None:
        raise refused
    return 0


def fenced_insert(
    executor: Any, target: Any, values: Mapping[str, Any], fence: Fence, *, unique: Sequence[str]
) -> None:
    """Write the row ``values`` (its ``unique`` columns a unique constraint), fenced, on a
    ``Connection`` or ``Session``."""
    table = _table(target)
    statement, check = _insert(table, _dialect(executor), values, fence, unique)
    if executor.execute(statement).first() is not None:
        return
    refused = refusal(table.name, fence, executor.execute(check).first())
    raise refused or AssertionError(f"fenced insert into {table.name} wrote nothing")


async def afenced_update(
    executor: Any, target: Any, values: Mapping[str, Any], where: Mapping[str, Any], fence: Fence
) -> int:
    """:func:`fenced_update` on an ``AsyncConnection`` or ``AsyncSession``."""
    table = _table(target)
    statement, check = _update(table, values, where, fence)
    changed = (await executor.execute(statement)).rowcount
    if changed:
        return int(changed)
    refused = refusal(table.name, fence, (await executor.execute(check)).first())
    if refused is not None:
        raise refused
    return 0


async def afenced_insert(
    executor: Any, target: Any, values: Mapping[str, Any], fence: Fence, *, unique: Sequence[str]
) -> None:
    """:func:`fenced_insert` on an ``AsyncConnection`` or ``AsyncSession``."""
    table = _table(target)
    statement, check = _insert(table, _dialect(executor), values, fence, unique)
    if (await executor.execute(statement)).first() is not None:
        return
    refused = refusal(table.name, fence, (await executor.execute(check)).first())
    raise refused or AssertionError(f"fenced insert into {table.name} wrote nothing")
