"""The outbox table's reads and changes, on the PostgreSQL store's connections: what the
relay takes and marks, what replay selects, what status counts and purge deletes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from idemctl.errors import ConfigError
from idemctl.model import JSON

if TYPE_CHECKING:
    import psycopg

    from idemctl.stores.base import Store
    from idemctl.stores.postgres import PostgresStore

BATCH = 500
"""Rows per purge statement: each is atomic and holds its locks briefly."""
WINDOW = 4
"""The relay first looks for aggregates among this many times ``--batch-size`` of the
oldest unpublished rows (see ``take``)."""
WIDEN = 8
"""How much further each next look goes when one finds too few rows."""
TAKE_MARK = "idemctl outbox relay: take"
"""Opens the relay's selection as a comment: what pg_stat_activity shows of it (the rest
may be cut off there)."""

_COLUMNS = (
    "id, aggregatetype, aggregateid, type, payload, nullif(headers, '{}'::jsonb), created_at, "
    "published_at, attempts, last_error, seq"
)
"""An ``OutboxRow``'s columns; no headers is NULL, not '{}' (a JSON document less to parse)."""


@dataclass(frozen=True)
class OutboxRow:
    id: uuid.UUID
    aggregatetype: str
    aggregateid: str
    type: str
    payload: JSON
    headers: dict[str, str]
    created_at: datetime
    published_at: datetime | None = None
    attempts: int = 0
    last_error: str | None = None
    seq: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "aggregatetype": self.aggregatetype,
            "aggregateid": self.aggregateid,
            "type": self.type,
            "payload": self.payload,
            "headers": self.headers,
            "created_at": self.created_at.isoformat(),
            "published_at": None if self.published_at is None else self.published_at.isoformat(),
            "attempts": self.attempts,
            "last_error": self.last_error,
        }


def _row(values: Sequence[Any]) -> OutboxRow:
    return OutboxRow(
        id=values[0],
        aggregatetype=values[1],
        aggregateid=values[2],
        type=values[3],
        payload=values[4],
        headers=dict(values[5] or {}),
        created_at=values[6].astimezone(UTC),
        published_at=_utc(values[7]),
        attempts=values[8],
        last_error=values[9],
        seq=values[10],
    )


@dataclass(frozen=True)
class Selection:
    """Which rows to replay; every given condition must hold. ``since``/``until`` bound
    ``created_at`` (since inclusive, until exclusive)."""

    ids: tuple[uuid.UUID, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    aggregatetype: str | None = None
    aggregateid: str | None = None

    def __bool__(self) -> bool:
        return bool(self.ids) or any(
            v is not None for v in (self.since, self.until, self.aggregatetype, self.aggregateid)
        )

    def where(self) -> tuple[str, dict[str, Any]]:
        conditions, params = [], {}
        for column, value, test in (
            ("id", list(self.ids) or None, "id = ANY(%(id)s)"),
            ("since", self.since, "created_at >= %(since)s"),
            ("until", self.until, "created_at < %(until)s"),
            ("aggregatetype", self.aggregatetype, "aggregatetype = %(aggregatetype)s"),
            ("aggregateid", self.aggregateid, "aggregateid = %(aggregateid)s"),
        ):
            if value is not None:
                conditions.append(test)
                params[column] = value
        return " AND ".join(conditions) or "true", params


@dataclass
class TypeStatus:
    aggregatetype: str
    unpublished: int = 0
    failing: int = 0
    """Unpublished rows whose delivery failed at least once."""
    published: int = 0
    oldest_unpublished: datetime | None = None
    last_published: datetime | None = None
    last_error: str | None = None
    last_error_seq: int = field(default=0, repr=False)
    """Where the row of ``last_error`` stands in write order: the total shows the newest."""

    def to_json(self, now: datetime) -> dict[str, Any]:
        oldest, last = self.oldest_unpublished, self.last_published
        return {
            "aggregatetype": self.aggregatetype,
            "unpublished": self.unpublished,
            "failing": self.failing,
            "published": self.published,
            "oldest_unpublished_at": None if oldest is None else oldest.isoformat(),
            "oldest_unpublished_age_seconds": (
                None if oldest is None else (now - oldest).total_seconds()
            ),
            "last_published_at": None if last is None else last.isoformat(),
            "last_error": self.last_error,
        }


@dataclass
class OutboxStatus:
    now: datetime
    types: list[TypeStatus] = field(default_factory=list)

    @property
    def total(self) -> TypeStatus:
        total = TypeStatus("*")
        for t in self.types:
            total.unpublished += t.unpublished
            total.failing += t.failing
            total.published += t.published
            if t.last_error is not None and t.last_error_seq > total.last_error_seq:
                total.last_error, total.last_error_seq = t.last_error, t.last_error_seq
            for name, pick in (("oldest_unpublished", min), ("last_published", max)):
                mine, theirs = getattr(total, name), getattr(t, name)
                if theirs is not None:
                    setattr(total, name, theirs if mine is None else pick(mine, theirs))
        return total


class OutboxTable:
    """The outbox table of a PostgreSQL store (its schema and prefix)."""

    def __init__(self, store: Store) -> None:
        from idemctl.stores.postgres import PostgresStore

        if not isinstance(store, PostgresStore):
            raise ConfigError(f"the outbox lives in a PostgreSQL store, not {store.url}")
        self.store: PostgresStore = store
        self.name = store.names.outbox_table

    def check(self) -> None:
        """Raise NotProvisioned (run 'idemctl init') unless the table is at the current
        schema, StoreUnavailable when the server cannot be reached."""
        with self.store.connection() as conn:
            conn.execute(f"SELECT seq, retry_at FROM {self.name} LIMIT 0")

    def notifies(self) -> bool:
        """Whether the table has the trigger that wakes relays (schema migration 5); True
        when there is no table at all (``check`` says what to do then)."""
        with self.store.connection() as conn:
            found = conn.execute(
                "SELECT to_regclass(%(t)s) IS NULL OR EXISTS (SELECT FROM pg_trigger "
                "WHERE tgrelid = to_regclass(%(t)s) AND tgname = %(name)s)",
                {"t": self.name, "name": self.store.prefix + "outbox_notify"},
            ).fetchone()
        return bool(found and found[0])

    # The relay -------------------------------------------------------------------------------

    def take(self, conn: psycopg.Connection[Any], limit: int) -> list[OutboxRow]:
        """Lock up to ``limit`` rows to publish, keeping each aggregate's order: call inside
        a transaction, which keeps them until it ends. See ``take``."""
        return take(conn, self.name, limit)

    def mark_published(self, conn: psycopg.Connection[Any], rows: Sequence[OutboxRow]) -> None:
        """Mark ``rows`` (taken by this transaction) published: one statement."""
        if rows:
            conn.execute(
                f"UPDATE {self.name} SET published_at = now(), retry_at = NULL "
                "WHERE seq = ANY(%b::bigint[]) AND published_at IS NULL",
                ([row.seq for row in rows],),
            )

    def mark_failed(
        self,
        conn: psycopg.Connection[Any],
        failures: Sequence[tuple[OutboxRow, str]],
        backoff: float,
        max_backoff: float,
    ) -> None:
        """Count a failed delivery and hold the row back: ``backoff`` seconds after its
        first failure, doubling with each one after, at most ``max_backoff``; counted from
        now, not from the transaction's start (the wait for the broker came in between).
        One statement for all of ``failures``."""
        if failures:
            conn.execute(
                f"""
UPDATE {self.name} o SET attempts = o.attempts + 1, last_error = f.error,
    retry_at = clock_timestamp()
        + least(%(backoff)s * power(2, o.attempts), %(max)s) * interval '1 second'
FROM unnest(%(seqs)b::bigint[], %(errors)s::text[]) AS f(seq, error)
WHERE o.seq = f.seq AND o.published_at IS NULL""",
                {
                    "seqs": [row.seq for row, _ in failures],
                    "errors": [e for _, e in failures],
                    "backoff": backoff,
                    "max": max_backoff,
                },
            )

    # Replay ----------------------------------------------------------------------------------

    def count(self, selection: Selection) -> int:
        where, params = selection.where()
        with self.store.connection() as conn:
            row = conn.execute(f"SELECT count(*) FROM {self.name} WHERE {where}", params).fetchone()
        return int(row[0]) if row else 0

    def select(self, selection: Selection, page: int = BATCH) -> Iterator[list[OutboxRow]]:
        """The selected rows in the order they were written, a page at a time."""
        where, params = selection.where()
        after = 0
        while True:
            with self.store.connection() as conn:
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM {self.name} WHERE {where} AND seq > %(after)s "
                    "ORDER BY seq LIMIT %(page)s",
                    {**params, "after": after, "page": page},
                ).fetchall()
            if not rows:
                return
            found = [_row(r) for r in rows]
            yield found
            after = found[-1].seq

    def pending(self, limit: int, failing: bool = False) -> list[OutboxRow]:
        """The oldest ``limit`` unpublished rows, in write order (the unpublished index);
        ``failing``: only those whose delivery failed at least once."""
        failed = " AND attempts > 0" if failing else ""
        with self.store.connection() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM {self.name} WHERE published_at IS NULL{failed} "
                "ORDER BY seq LIMIT %(limit)s",
                {"limit": limit},
            ).fetchall()
        return [_row(r) for r in rows]

    def mark_replayed(self, ids: Sequence[uuid.UUID]) -> int:
        """Mark rows replayed to their own topics published, unless they are published or a
        relay holds them (it publishes them itself); returns how many were marked."""
        if not ids:
            return 0
        with self.store.connection() as conn:
            cursor = conn.execute(
                f"UPDATE {self.name} SET published_at = now(), retry_at = NULL WHERE id IN "
                f"(SELECT id FROM {self.name} WHERE id = ANY(%s) AND published_at IS NULL "
                "FOR UPDATE SKIP LOCKED)",
                (list(ids),),
            )
            return cursor.rowcount

    # Status and purge ---------------------------------------------------------------------------

    def status(self) -> OutboxStatus:
        """Counts per aggregate type (reads the whole table)."""
        with self.store.connection() as conn:
            rows = conn.execute(
                f"""
SELECT aggregatetype,
       count(*) FILTER (WHERE published_at IS NULL),
       count(*) FILTER (WHERE published_at IS NULL AND attempts > 0),
       count(*) FILTER (WHERE published_at IS NOT NULL),
       min(created_at) FILTER (WHERE published_at IS NULL),
       max(published_at),
       (array_agg(last_error ORDER BY seq DESC)
            FILTER (WHERE published_at IS NULL AND last_error IS NOT NULL))[1],
       now(),
       coalesce(max(seq) FILTER (WHERE published_at IS NULL AND last_error IS NOT NULL), 0)
FROM {self.name} GROUP BY aggregatetype ORDER BY aggregatetype"""
            ).fetchall()
            now = rows[0][7] if rows else conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        return OutboxStatus(
            now.astimezone(UTC),
            [TypeStatus(r[0], r[1], r[2], r[3], _utc(r[4]), _utc(r[5]), r[6], r[8]) for r in rows],
        )

    def purge(
        self,
        older_than: float,
        *,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete rows published at least ``older_than`` seconds ago, in atomic batches;
        unpublished rows are never touched. Returns how many (would have) gone."""
        due = "published_at IS NOT NULL AND published_at <= now() - %(age)s * interval '1 second'"
        params = {"age": older_than, "batch": BATCH}
        if dry_run:
            with self.store.connection() as conn:
                row = conn.execute(f"SELECT count(*) FROM {self.name} WHERE {due}", params)
                return int(row.fetchone()[0])  # type: ignore[index]
        return self.store.delete_in_batches(
            self.name, "id", due, params, progress, order="ORDER BY published_at"
        )


def take(conn: psycopg.Connection[Any], table: str, limit: int) -> list[OutboxRow]:
    """Lock up to ``limit`` rows of ``table`` to publish, in write order (``seq``), keeping
    each aggregate's order: call inside a transaction, which keeps them until it ends.

    An aggregate (``aggregatetype``, ``aggregateid``) is taken only when its head, its
    earliest unpublished row, is due (not held back after a failed delivery) and this
    transaction could lock it: the head's row lock, held to the commit, makes this relay
    the aggregate's only relay meanwhile. Other relays skip the aggregate, its later rows
    included, and a relay that dies releases it with its transaction. The rows taken of an
    aggregate are its head and the rows after it, with no gap.

    The search looks at the oldest ``WINDOW * limit`` unpublished rows, a few index pages.
    When those give fewer than ``limit`` rows (other relays hold their aggregates, or
    failed deliveries block them) and more rows wait, it looks again at ``WIDEN`` times as
    many, leaving out the aggregates it found held back after a failed delivery, and so
    on (``benchmarks/outbox_select.py`` measures it)."""
    window = WINDOW * limit
    skip: set[tuple[str, str]] = set()
    while True:
        # Rows this transaction locked in a narrower look are its own: a wider one takes
        # them again.
        rows, more, held = _take_within(conn, table, limit, window, skip)
        if len(rows) >= limit or not more:
            return rows
        skip |= held
        window *= WIDEN


def _take_within(
    conn: psycopg.Connection[Any],
    table: str,
    limit: int,
    window: int,
    skip: set[tuple[str, str]],
) -> tuple[list[OutboxRow], bool, set[tuple[str, str]]]:
    """``take`` among the oldest ``window`` unpublished rows but those of the aggregates
    in ``skip``. Returns the rows taken, whether more unpublished rows lie past the window,
    and the aggregates held back after a failed delivery found in it.

    The window holds, with any row of an aggregate, the aggregate's head: it starts at the
    oldest unpublished row and leaves out whole aggregates only. Three statements, none of
    which waits for a row lock, each with a plan that reads at most the window's rows
    (the rest is done here, so that no plan depends on the table's statistics):

    1. the window, in write order;
    2. the heads of its due aggregates, locked oldest first, skipping those another
       transaction holds, until there are as many as the aggregates of the oldest
       ``limit`` rows of the due aggregates (a relay holds no aggregate it has no room for
       in its batch). A head that a concurrent commit published or held back is checked on
       its newest version and left out;
    3. each locked aggregate's rows in the window, the oldest ``limit`` of all of them,
       locked, skipping any that another transaction holds or changed: an aggregate's
       rows are cut at the first such one, so that none goes out ahead of an earlier one.
    """
    types, ids = [t for t, _ in skip], [i for _, i in skip]
    found = conn.execute(
        f"/* {TAKE_MARK} */ SELECT seq, aggregatetype, aggregateid, "
        "retry_at IS NULL OR retry_at <= now() "
        f"FROM {table} WHERE published_at IS NULL AND (aggregatetype, aggregateid) NOT IN "
        "(SELECT * FROM unnest(%s::text[], %s::text[])) ORDER BY seq LIMIT %s",
        (types, ids, window + 1),
    ).fetchall()
    more = len(found) > window
    heads: dict[tuple[str, str], int] = {}
    due: dict[tuple[str, str], bool] = {}
    for seq, aggregatetype, aggregateid, ready in found[:window]:
        aggregate = (aggregatetype, aggregateid)
        heads.setdefault(aggregate, seq)
        due[aggregate] = due.get(aggregate, True) and ready
    held = {aggregate for aggregate, ready in due.items() if not ready}
    candidates = [(r[0], (r[1], r[2])) for r in found[:window] if due[r[1], r[2]]]
    wanted = len({aggregate for _, aggregate in candidates[:limit]})
    if not wanted:
        return [], more, held
    locked = {
        r[0]
        for r in conn.execute(
            f"/* {TAKE_MARK} */ SELECT o.seq "
            "FROM unnest(%b::bigint[]) WITH ORDINALITY AS h(seq, n) "
            f"JOIN {table} o ON o.seq = h.seq "
            "WHERE o.published_at IS NULL AND (o.retry_at IS NULL OR o.retry_at <= now()) "
            "ORDER BY h.n LIMIT %s FOR UPDATE OF o SKIP LOCKED",
            ([heads[aggregate] for aggregate, ready in due.items() if ready], wanted),
        )
    }
    mine = {aggregate for aggregate, head in heads.items() if head in locked}
    run = [(seq, aggregate) for seq, aggregate in candidates if aggregate in mine]
    run = run[:limit]
    got = {
        row.seq: row
        for row in map(
            _row,
            conn.execute(
                f"/* {TAKE_MARK} */ SELECT {_COLUMNS} FROM {table} "
                "WHERE seq = ANY(%b::bigint[]) AND published_at IS NULL FOR UPDATE SKIP LOCKED",
                ([seq for seq, _ in run],),
            ).fetchall(),
        )
    }
    rows, broken = [], set()
    for seq, aggregate in run:
        if aggregate in broken or seq not in got:
            broken.add(aggregate)
        else:
            rows.append(got[seq])
    return rows, more, held


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)
