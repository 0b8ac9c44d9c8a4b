"""What an outbox row holds, checked: the table's name, the insert statement, an event's
values, and the transaction it must be written in. ``Outbox`` (``idemctl.outbox.writer``)
and ``AsyncOutbox`` (``idemctl.aio.outbox``) write them."""

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


class NoOutbox:
    """What ``ctx.outbox`` is where rows could not commit with the key: it says why."""

    def __init__(self, reason: str) -> None:  # no table: nothing is ever written
        self.connection, self.table, self.reason = None, "", reason

    def add(self, *args: Any, **kwargs: Any) -> uuid.UUID:
        raise OutboxError(self.reason)
