"""Fenced writes on your own SQL tables: sqlite3 and psycopg 3 (sync and asyncio).

A fenced table has two columns besides its own, ``idemctl_key`` and ``idemctl_token``:
the key and the fencing token of the attempt that last wrote the row
(:func:`add_fence_columns` adds them; :data:`MIGRATION` is the same as SQL for your own
migrations). Each write below is one statement, so it holds under concurrent writers:

- :func:`fenced_update` applies ``values`` to the rows ``where`` selects unless a row was
  last written under the same key with a newer token; a refused row raises StaleFence.
- :func:`fenced_insert` writes a ledger's row (one per ``unique`` value): a first write
  inserts it, a newer attempt of the same key replaces what an earlier one left, an older
  one raises StaleFence, and a row another key wrote raises FenceConflict.

The statements run on the connection (or cursor) you pass, inside your transaction: commit
as you do (with ``run(..., transactional=True)``, ``ctx.connection`` commits with the key).
"""

from __future__ import annotations

import functools
import re
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from idemctl.errors import StaleFence
from idemctl.fence import Fence, FenceConflict

__all__ = [
    "KEY_COLUMN",
    "MIGRATION",
    "TOKEN_COLUMN",
    "FenceConflict",
    "add_fence_columns",
    "afenced_insert",
    "afenced_update",
    "fenced_insert",
    "fenced_update",
]

KEY_COLUMN = "idemctl_key"
TOKEN_COLUMN = "idemctl_token"  # noqa: S105 - a column name

MIGRATION = """\
-- PostgreSQL
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS idemctl_key text,
                    ADD COLUMN IF NOT EXISTS idemctl_token bigint;
-- SQLite (once: it has no IF NOT EXISTS here)
ALTER TABLE {table} ADD COLUMN idemctl_key TEXT;
ALTER TABLE {table} ADD COLUMN idemctl_token INTEGER;
"""
"""The fence columns as SQL, for a migration of your own (``MIGRATION.format(table=...)``)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _ident(name: str) -> str:
    """``name`` (``table`` or ``schema.table``) quoted, or ValueError: no SQL in a name."""
    parts = name.split(".")
    if not 1 <= len(parts) <= 2 or not all(_NAME.fullmatch(p) for p in parts):
        raise ValueError(f"not a plain SQL name: {name!r} (letters, digits, _; schema.table)")
    return ".".join(f'"{p}"' for p in parts)


@dataclass(frozen=True)
class _Statement:
    sql: str
    params: tuple[Any, ...]
    check: str
    """Reads the fence of a refused write: its key and token (the first row)."""
    check_params: tuple[Any, ...]


def _mark(connection: Any) -> str:
    return "?" if isinstance(connection, (sqlite3.Connection, sqlite3.Cursor)) else "%s"


@functools.lru_cache(maxsize=256)
def _update_sql(
    mark: str, table: str, columns: tuple[str, ...], where: tuple[str, ...]
) -> tuple[str, str]:
    """The fenced UPDATE and its check, built once for a shape (the names checked here)."""
    t, k, tok = _ident(table), _ident(KEY_COLUMN), _ident(TOKEN_COLUMN)
    sets = ", ".join(f"{_ident(c)} = {mark}" for c in columns)
    match = " AND ".join(f"{_ident(c)} = {mark}" for c in where)
    # every name passed _ident, every value is a parameter
    sql = (
        f"UPDATE {t} SET {sets}, {k} = {mark}, {tok} = {mark} WHERE {match} "
        f"AND ({k} IS NULL OR {k} <> {mark} OR {tok} <= {mark})"
    )
    return sql, f"SELECT {k}, {tok} FROM {t} WHERE {match} AND {k} = {mark} AND {tok} > {mark}"


def _update(
    mark: str, table: str, values: Mapping[str, Any], where: Mapping[str, Any], fence: Fence
) -> _Statement:
    if not values or not where:
        raise ValueError("fenced_update needs values to set and a where to select the rows")
    sql, check = _update_sql(mark, table, tuple(values), tuple(where))
    params = (*values.values(), fence.key, fence.token, *where.values(), fence.key, fence.token)
    return _Statement(sql, params, check, (*where.values(), fence.key, fence.token))


@functools.lru_cache(maxsize=256)
def _insert_sql(
    mark: str, table: str, given: tuple[str, ...], unique: tuple[str, ...]
) -> tuple[str, str]:
    """The fenced INSERT and its check, built once for a shape (the names checked here)."""
    t, k, tok = _ident(table), _ident(KEY_COLUMN), _ident(TOKEN_COLUMN)
    columns = [*given, KEY_COLUMN, TOKEN_COLUMN]
    names = ", ".join(_ident(c) for c in columns)
    marks = ", ".join(mark for _ in columns)
    replace = ", ".join(f"{_ident(c)} = excluded.{_ident(c)}" for c in columns)
    conflict = ", ".join(_ident(c) for c in unique)
    # every name passed _ident, every value is a parameter
    sql = (
        f"INSERT INTO {t} ({names}) VALUES ({marks}) ON CONFLICT ({conflict}) DO UPDATE SET "
        f"{replace} WHERE {t}.{k} = excluded.{k} AND {t}.{tok} <= excluded.{tok}"
    )
    match = " AND ".join(f"{_ident(c)} = {mark}" for c in unique)
    return sql, f"SELECT {k}, {tok} FROM {t} WHERE {match}"


def _insert(
    mark: str, table: str, values: Mapping[str, Any], fence: Fence, unique: Sequence[str]
) -> _Statement:
    if not unique or any(c not in values for c in unique):
        raise ValueError(f"fenced_insert: unique {tuple(unique)!r} must name columns of values")
    sql, check = _insert_sql(mark, table, tuple(values), tuple(unique))
    return _Statement(
        sql, (*values.values(), fence.key, fence.token), check, tuple(values[c] for c in unique)
    )


def refusal(table: str, fence: Fence, row: Sequence[Any] | None) -> Exception | None:
    """Why a write that changed no row was refused (None: no row was there)."""
    if row is None:
        return None
    key, token = row[0], row[1]
    if key != fence.key:
        return FenceConflict(
            f"fenced write to {table} refused for key {fence.key!r}: the row was written "
            f"under key {key!r}"
        )
    return StaleFence(table, fence.key, fence.token, int(token))


def fenced_update(
    connection: Any,
    table: str,
    values: Mapping[str, Any],
    where: Mapping[str, Any],
    fence: Fence,
) -> int:
    """``UPDATE table SET values WHERE where``, fenced: the rows updated (0: none matched);
    StaleFence if a matching row carries a newer token of ``fence.key``."""
    s = _update(_mark(connection), table, values, where, fence)
    changed = connection.execute(s.sql, s.params).rowcount
    if changed:
        return int(changed)
    refused = refusal(table, fence, connection.execute(s.check, s.check_params).fetchone())
    if refused is not None:
        raise refused
    return 0


def fenced_insert(
    connection: Any,
    table: str,
    values: Mapping[str, Any],
    fence: Fence,
    *,
    unique: Sequence[str],
) -> None:
    """Write the row ``values`` (its ``unique`` columns a unique constraint), fenced: insert
    it, or replace the row an older attempt of ``fence.key`` left; StaleFence if a newer
    attempt's row is there, FenceConflict if another key's is."""
    s = _insert(_mark(connection), table, values, fence, unique)
    if connection.execute(s.sql, s.params).rowcount:
        return
    refused = refusal(table, fence, connection.execute(s.check, s.check_params).fetchone())
    raise refused or AssertionError(f"fenced insert into {table} wrote nothing")


async def afenced_update(
    connection: Any,
    table: str,
    values: Mapping[str, Any],
    where: Mapping[str, Any],
    fence: Fence,
) -> int:
    """:func:`fenced_update` on a psycopg ``AsyncConnection`` (or ``AsyncCursor``)."""
    s = _update("%s", table, values, where, fence)
    changed = (await connection.execute(s.sql, s.params)).rowcount
    if changed:
        return int(changed)
    row = await (await connection.execute(s.check, s.check_params)).fetchone()
    refused = refusal(table, fence, row)
    if refused is not None:
        raise refused
    return 0


async def afenced_insert(
    connection: Any,
    table: str,
    values: Mapping[str, Any],
    fence: Fence,
    *,
    unique: Sequence[str],
) -> None:
    """:func:`fenced_insert` on a psycopg ``AsyncConnection`` (or ``AsyncCursor``)."""
    s = _insert("%s", table, values, fence, unique)
    if (await connection.execute(s.sql, s.params)).rowcount:
        return
    row = await (await connection.execute(s.check, s.check_params)).fetchone()
    raise refusal(table, fence, row) or AssertionError(f"fenced insert into {table} wrote nothing")


def add_fence_columns(connection: Any, table: str) -> None:
    """Add ``idemctl_key`` and ``idemctl_token`` to ``table`` unless it has them (sqlite3 or
    psycopg; in your transaction)."""
    t = _ident(table)
    if _mark(connection) == "%s":
        connection.execute(
            f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {KEY_COLUMN} text, "
            f"ADD COLUMN IF NOT EXISTS {TOKEN_COLUMN} bigint"
        )
        return
    schema, _, name = table.rpartition(".")
    info = f'PRAGMA {_ident(schema) + "." if schema else ""}table_info("{name}")'
    have = {row[1] for row in connection.execute(info).fetchall()}
    if not have:
        raise ValueError(f"no table {table!r}")
    for column, kind in ((KEY_COLUMN, "TEXT"), (TOKEN_COLUMN, "INTEGER")):
        if column not in have:
            connection.execute(f"ALTER TABLE {t} ADD COLUMN {column} {kind}")
