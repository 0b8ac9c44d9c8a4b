# Written by scripts/unasync.py from idemctl/aio/outbox.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""Writing outbox rows: in the same transaction as the effect they announce.

Inside a transactional handler, ``ctx.outbox.add(...)``. Anywhere else, on a psycopg
connection with a transaction open::

    with conn.transaction():
        conn.execute("UPDATE accounts SET ...")
        add(conn, "account", account_id, "AccountDebited", {"cents": 500})

The row commits with the update or not at all; ``idemctl outbox relay`` publishes it.
Written by scripts/unasync.py from ``idemctl.aio.outbox``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from idemctl.model import JSON
from idemctl.outbox.rows import (
    DEFAULT_SCHEMA,
    insert_statement,
    outbox_table,
    require_transaction,
    row_values,
)


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
        require_transaction(self.connection)
        row_id = uuid.uuid4()
        self.connection.execute(self._insert, (row_id, *values))
        return row_id


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
