"""The operator's operations on PostgreSQL: get, scan, stats, unlock, unlock_stale, forget
and purge. A part of PostgresStore."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg

from idemctl.errors import (
    KeyNotFound,
    StoreError,
)
from idemctl.model import (
    Record,
    RecordPage,
    Stats,
    Status,
)
from idemctl.stores import postgres as package
from idemctl.stores.base import Progress
from idemctl.stores.machine import check_forgettable, unlocked
from idemctl.stores.postgres.core import ADMIN_LOCK_WAIT, _exists, _now
from idemctl.stores.postgres.pool_base import LockTimeout
from idemctl.stores.postgres.sql import (
    COLUMNS,
    lock_wait,
    maybe_utc,
    record_of,
)
from idemctl.stores.postgres.steps import PostgresSteps
from idemctl.stores.queries import Scan


class PostgresAdmin(PostgresSteps):
    def _scan_page(self, scan: Scan) -> RecordPage:
        where = ["(expires_at IS NULL OR expires_at > now())"]
        if scan.older_than:
            where.append("created_at <= now() - %(older)s * interval '1 second'")
        params: dict[str, Any] = {"limit": scan.limit + 1, "older": scan.older_than}
        if scan.status is not None or scan.stale_only or scan.released_only:
            where.append("status = %(status)s")
            params["status"] = (scan.status or Status.IN_PROGRESS).value
        if scan.stale_only:
            where.append("owner IS NOT NULL AND lease_expires_at <= now()")
        if scan.released_only:
            where.append("owner IS NULL")
        if scan.prefix:
            where.append("left(key, %(plen)s) = %(prefix)s")
            params |= {"plen": len(scan.prefix), "prefix": scan.prefix}
        if scan.cursor is not None:
            where.append("key > %(after)s")
            params["after"] = scan.cursor
        rows = self._fetch(
            f"SELECT {COLUMNS} FROM {self.keys_table} WHERE {' AND '.join(where)} "
            "ORDER BY key LIMIT %(limit)s",
            params,
        )
        records = [record_of(r) for r in rows[: scan.limit]]
        return RecordPage(records, records[-1].key if len(rows) > scan.limit else None)

    def stats(self, exact: bool = False) -> Stats:
        rows = self._fetch(
            f"""SELECT status::text, count(*),
                       count(*) FILTER (WHERE status = 'in_progress'
                                          AND owner IS NOT NULL AND lease_expires_at <= now()),
                       min(created_at) FILTER (WHERE status = 'in_progress'),
                       (SELECT count(*) FROM {self.keys_table} WHERE expires_at <= now()),
                       count(*) FILTER (WHERE status = 'in_progress' AND owner IS NULL)
                FROM {self.keys_table} WHERE expires_at IS NULL OR expires_at > now()
                GROUP BY status"""
        )
        by_status = dict.fromkeys(Status, 0)
        stale, oldest, past, released = 0, None, 0, 0
        for status, count, stale_count, oldest_at, past_count, released_count in rows:
            by_status[Status(status)] = count
            stale += stale_count
            released += released_count
            oldest = maybe_utc(oldest_at) or oldest
            past = past_count
        if not rows:
            past = self._fetch(f"SELECT count(*) FROM {self.keys_table} WHERE expires_at <= now()")[
                0
            ][0]
        return Stats(
            sum(by_status.values()), by_status, stale, oldest, past, released, counted_by="query"
        )

    @contextmanager
    def _locked(self, key: str) -> Iterator[tuple[psycopg.Connection[Any], Record, datetime]]:
        """The key's row, locked in a transaction; KeyNotFound when absent or past retention.

        Another admin command's lock on the row lasts milliseconds and is waited out; a
        handler's transaction (transactional mode) can hold it for a whole lease, so the
        wait ends after ADMIN_LOCK_WAIT with an error that says to try again."""
        try:
            with self.connection() as conn, conn.transaction():
                conn.execute(lock_wait(ADMIN_LOCK_WAIT))
                row = conn.execute(self._sql["lock"], {"key": key}).fetchone()
                now = _now(conn)
                if row is None or record_of(row).retention_over(now):
                    raise KeyNotFound(key)
                yield conn, record_of(row), now
        except LockTimeout:
            raise StoreError(
                f"key {key!r} is locked by a transaction in progress (waited "
                f"{ADMIN_LOCK_WAIT:g}s); try again"
            ) from None

    def unlock(self, key: str, force: bool = False) -> Record:
        with self._locked(key) as (conn, record, now):
            freed = unlocked(record, now, force)
            if freed is not record:
                conn.execute(
                    f"UPDATE {self.keys_table} SET owner = NULL, lease_expires_at = %(now)s, "
                    "updated_at = %(now)s WHERE key = %(key)s",
                    {"key": key, "now": now},
                )
            return freed

    def unlock_stale(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> list[str]:
        t = self.keys_table
        stale = """status = 'in_progress' AND owner IS NOT NULL
                    AND lease_expires_at <= now() - %(older)s * interval '1 second'"""
        # package.BATCH: read from the package at each call, where it may be set.
        args = {"older": older_than, "batch": package.BATCH}
        if dry_run:
            return sorted(r[0] for r in self._fetch(f"SELECT key FROM {t} WHERE {stale}", args))
        freed: list[str] = []
        while True:  # a batch a transaction; a freed key has no owner, so none comes twice
            rows = self._fetch(
                f"""UPDATE {t} SET owner = NULL, lease_expires_at = now(), updated_at = now()
                    WHERE key IN (SELECT key FROM {t} WHERE {stale}
                                  LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
                    RETURNING key""",
                args,
            )
            freed += (r[0] for r in rows)
            if rows and progress is not None:
                progress(len(rows))
            if len(rows) < args["batch"]:
                return sorted(freed)

    def forget(self, key: str, force: bool = False) -> Record:
        with self._locked(key) as (conn, record, _):
            check_forgettable(record, force)
            # A tombstone past retention, not a deletion: it keeps the fencing counter.
            conn.execute(
                f"UPDATE {self.keys_table} SET owner = NULL, lease_expires_at = NULL, "
                "updated_at = now(), expires_at = now(), result = NULL WHERE key = %(key)s",
                {"key": key},
            )
            return record

    def purge(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> int:
        """Keys and entities of the sequence guard past retention (an older schema's
        purge, without the entities table, purges keys only)."""
        t = self.keys_table
        over = "expires_at <= now() - %(older)s * interval '1 second'"
        args = {"older": older_than, "batch": package.BATCH}
        entities = self.names.entities_table
        with self.connection() as conn:
            has_entities = _exists(conn, entities)
        if dry_run:
            count = int(self._fetch(f"SELECT count(*) FROM {t} WHERE {over}", args)[0][0])
            if has_entities:
                count += int(
                    self._fetch(f"SELECT count(*) FROM {entities} WHERE {over}", args)[0][0]
                )
            return count
        purged = self.delete_in_batches(t, "key", over, args, progress)
        if has_entities:
            purged += self.delete_in_batches(entities, "entity", over, args, progress)
        return purged

    def delete_in_batches(
        self,
        table: str,
        column: str,
        where: str,
        params: dict[str, Any],
        progress: Progress | None = None,
        order: str = "",
    ) -> int:
        """Delete the rows of ``table`` that ``where`` picks, ``params["batch"]`` at a time,
        each batch its own statement and transaction (a long purge never holds many row
        locks), skipping rows others hold; ``column`` is the key. Returns how many went.

        Each batch commits without waiting for its WAL to reach the disk (synchronous_commit
        off for that transaction alone), so the claims beside it do not wait on the purge's
        flushes. A deletion a crash loses is made again by the next purge, and nothing after
        it can be lost without it: the WAL is one sequence, flushed in order."""
        deleted_total = 0
        while True:
            with self.connection() as conn, conn.transaction():
                conn.execute("SET LOCAL synchronous_commit TO off")
                deleted = conn.execute(
                    f"DELETE FROM {table} WHERE {column} IN (SELECT {column} FROM {table} "
                    f"WHERE {where} {order} LIMIT %(batch)s FOR UPDATE SKIP LOCKED)",
                    params,
                ).rowcount
            deleted_total += deleted
            if deleted and progress is not None:
                progress(deleted)
            if deleted < params["batch"]:
                return deleted_total

    # Provisioning and health ---------------------------------------------------------------------
