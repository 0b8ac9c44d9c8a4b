"""Writing outbox rows: in the same transaction as the effect they announce.

Inside a transactional handler, ``ctx.outbox.add(...)``. Anywhere else, on a psycopg
connection with a transaction open::

    with conn.transaction():
        conn.execute("UPDATE accounts SET ...")
        idemctl.outbox.add(conn, "account", account_id, "AccountDebited", {"cents": 500})

The row commits with the update or not at all; ``idemctl outbox relay`` publishes it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from idemctl import tracing
from idemctl.errors import InvalidPayload, OutboxError
from idemctl.model import JSON, canonical_json

DEFAULT_SCHEMA = "idem"


def outbox_table(schema: str = DEFAULT_SCHEMA, prefix: str = "") -> str:
    """The quoted name of the outbox table (as ``postgresql://...?schema=&prefix=`` names it)."""
    from idemctl.stores.postgres.sql import names  # loads psycopg: not on `import idemctl`

    return names(schema, prefix).outbox_table


class Outbox:
    """Adds outbox rows on one connection, inside the transaction open on it."""

    def __init__(self, connection: Any, table: str | None = None) -> None:
        self.connection = connection
        self.table = table or outbox_table()
        self._insert = insert_statement(self.table)

    def add(
        self,
        aggregatetype: str,
        aggregateid: str | int | uuid.UUID,
        type: str,
        payload: JSON,
        headers: Mapping[str, str] | None = None,
    ) -> uuid.UUID:
        """Write one event; returns its id (the ``id`` header the relay sends with it).

        ``aggregatetype`` picks the topic (``outbox.event.{aggregatetype}`` by default),
        ``aggregateid`` is the Kafka message key (so one aggregate's events share a
        partition), ``payload`` the message value as JSON, ``headers`` extra Kafka headers.
        """
        values = row_values(aggregatetype, aggregateid, type, payload, headers)
        self._require_transaction()
        row_id = uuid.uuid4()
        self.connection.execute(self._insert, (row_id, *values))
        return row_id

    def _require_transaction(self) -> None:
        require_transaction(self.connection)


class AsyncOutbox:
    """``Outbox`` on a psycopg async connection (``idemctl.aio``'s transactional mode):
    ``await ctx.outbox.add(...)``, the same checks and the same row."""

    def __init__(self, connection: Any, table: str | None = None) -> None:
        self.connection = connection
        self.table = table or outbox_table()
        self._insert = insert_statement(self.table)

    async def add(
        self,
        aggregatetype: str,
        aggregateid: str | int | uuid.UUID,
        type: str,
        payload: JSON,
        headers: Mapping[str, str] | None = None,
    ) -> uuid.UUID:
        """``Outbox.add``, awaited: write one event; returns its id."""
        values = row_values(aggregatetype, aggregateid, type, payload, headers)
        require_transaction(self.connection)
        row_id = uuid.uuid4()
        await self.connection.execute(self._insert, (row_id, *values))
        return row_id


def insert_statement(table: str) -> str:
    """The statement that writes one row to ``table`` (quoted): its id, then ``row_values``."""
    return (
        f"INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload, headers) "
        "VALUES (%s, %s, %s, %s, %s::jsonb, %s::jsonb)"
    )


def row_values(
    aggregatetype: str,
    aggregateid: str | int | uuid.UUID,
    type: str,
    payload: JSON,
    headers: Mapping[str, str] | None,
) -> tuple[Any, ...]:
    """An event's checked values as the insert statement takes them after the id (the
    trace's headers added); OutboxError for what cannot be written."""
    fields = {"aggregatetype": aggregatetype, "aggregateid": aggregateid, "type": type}
    for name, value in fields.items():
        if not isinstance(value, str | int | uuid.UUID) or isinstance(value, bool):
            raise OutboxError(f"outbox {name} must be text, not {value!r}")
        if not str(value):
            raise OutboxError(f"outbox {name} must not be empty")
    extra = dict(headers or {})
    for name, value in tracing.current_traceparent().items():  # the trace goes on
        extra.setdefault(name, value)
    for name, value in extra.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise OutboxError(f"outbox headers map text to text, not {name!r}: {value!r}")
        if name in ("id", "type"):
            raise OutboxError(f"outbox header {name!r} is set by the relay itself")
    if _has_nul([*fields.values(), extra, payload]):
        # PostgreSQL's text and jsonb cannot hold one; failing here keeps the caller's
        # transaction usable.
        raise OutboxError("outbox fields, headers and payload must not contain NUL (\\x00)")
    try:
        body = canonical_json(payload).decode()
    except InvalidPayload as exc:
        raise OutboxError(f"outbox payload is not JSON: {exc}") from None
    return (aggregatetype, str(aggregateid), type, body, json.dumps(extra))


def require_transaction(conn: Any) -> None:
    """OutboxError unless ``conn`` (sync or async) has a transaction open."""
    # An autocommit connection outside a transaction would commit the row on its own,
    # whatever became of the effect: the very dual write the outbox is there to avoid.
    if conn is None:
        raise OutboxError("no connection to write outbox rows on")
    if getattr(conn, "autocommit", False) and conn.info.transaction_status.name == "IDLE":
        raise OutboxError(
            "outbox rows must be written inside a transaction: use "
            "'with conn.transaction():' (or a connection with autocommit off)"
        )


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


class NoOutbox(Outbox):
    """What ``ctx.outbox`` is where rows could not commit with the key: it says why."""

    def __init__(self, reason: str) -> None:  # no table: nothing is ever written
        self.connection, self.table, self.reason = None, "", reason

    def add(self, *args: Any, **kwargs: Any) -> uuid.UUID:
        raise OutboxError(self.reason)


def add(
    connection: Any,
    aggregatetype: str,
    aggregateid: str | int | uuid.UUID,
    type: str,
    payload: JSON,
    headers: Mapping[str, str] | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    prefix: str = "",
) -> uuid.UUID:
    """``Outbox(connection).add(...)`` for a table in ``schema`` with ``prefix``."""
    return Outbox(connection, outbox_table(schema, prefix)).add(
        aggregatetype, aggregateid, type, payload, headers
    )
