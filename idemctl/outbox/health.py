"""What ``idemctl doctor`` says of the outbox: how many rows wait for the relay, whether
their deliveries fail, and whether they have waited too long."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemctl.durations import format_duration
from idemctl.model import Finding
from idemctl.stores.base import TransactionalStore

if TYPE_CHECKING:
    from idemctl.stores.base import Store

OUTBOX_LAG = 300.0
"""Seconds an outbox row may wait for the relay before doctor calls it a problem."""


def outbox_findings(store: Store) -> list[Finding]:
    """The ``outbox`` finding of a PostgreSQL store whose schema is current; none for any
    other store, nor for a schema that 'idemctl init' must upgrade first (the store's own
    ``schema`` finding says so).

    Raises what the store's ``check()`` raises (StoreUnavailable, NotProvisioned, ...)."""
    if not isinstance(store, TransactionalStore):  # only PostgreSQL has an outbox
        return []
    from idemctl.stores.postgres import PostgresStore, migrations  # psycopg: loaded already

    if not isinstance(store, PostgresStore):
        return []
    with store.connection() as conn:
        if store.schema_version_on(conn) != max(migrations(store.names)):
            return []
        # The unpublished rows only: the partial index has them.
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE attempts > 0), "
            "extract(epoch FROM now() - min(created_at)) "
            f"FROM {store.names.outbox_table} WHERE published_at IS NULL"
        ).fetchone()
    assert row is not None
    return [backlog_finding(*row)]


def backlog_finding(unpublished: int, failing: int, oldest: Any) -> Finding:
    """``unpublished`` rows, ``failing`` of them with failed deliveries, the oldest waiting
    for ``oldest`` seconds."""
    if not unpublished:
        return Finding("outbox", True, "no outbox row waits to be published")
    waiting = float(oldest or 0)
    detail = (
        f"{unpublished} outbox row(s) unpublished, the oldest for {format_duration(waiting)}; "
        f"{failing} with failed deliveries"
    )
    if failing:
        fix = "'idemctl outbox status' shows the errors: can the relay reach the brokers?"
        return Finding("outbox", False, detail, fix)
    if waiting > OUTBOX_LAG:
        return Finding("outbox", False, detail, "is a relay running? 'idemctl outbox relay'")
    return Finding("outbox", True, detail)
