"""PostgresStore: the ``postgresql://`` store whose keys can commit together with the
handler's own data.

Normal mode: every transition is one SQL statement (claim is one ``INSERT ... ON CONFLICT
... DO UPDATE ... WHERE <claimable> RETURNING``; batches go through ``unnest``), on
connections from a psycopg_pool pool with short lock and statement timeouts.

Transactional mode (``store.transaction(key)``): claim, the handler's SQL on the same
connection, outbox rows and complete share one transaction; a crash rolls all of it back.

The sequence guard keeps one row per entity in its own table: guard is one ``INSERT ... ON
CONFLICT ... DO UPDATE ... WHERE <go>`` per batch, settle one ``UPDATE ... FROM unnest``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any

import psycopg

from idemctl.errors import (
    ConfigError,
    EntityNotFound,
    KeyNotFound,
    NotProvisioned,
    StoreError,
)
from idemctl.model import (
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Entity,
    EntityPage,
    Finding,
    Guard,
    GuardReply,
    Holder,
    Order,
    Page,
    Provisioning,
    Record,
    Settle,
    Stats,
    Status,
    validate_key,
)
from idemctl.stores import postgres as package
from idemctl.stores.base import (
    DEFAULT_LEASE,
    DEFAULT_RETENTION,
    BaseStore,
    Progress,
    Scan,
    server_clock_finding,
)
from idemctl.stores.machine import check_forgettable, entity_locked, unlocked
from idemctl.stores.postgres import flows, transactional
from idemctl.stores.postgres import url as postgres_url
from idemctl.stores.postgres.flows import drive
from idemctl.stores.postgres.pool import LockTimeout, Pool, PoolSettings
from idemctl.stores.postgres.sql import (
    COLUMNS,
    DEFAULT_SCHEMA,
    ENTITY_COLUMNS,
    entity_of,
    lock_wait,
    maybe_utc,
    migrations,
    names,
    protocol_statements,
    provision_lock,
    record_of,
    utc,
)
from idemctl.stores.postgres.transactional import Unit

ADMIN_LOCK_WAIT = 3.0
"""Seconds unlock and forget (of a key or an entity) wait for a row that another
transaction holds; also how long a settle waits for an entity's row before it gives up."""
PROVISION_LOCK_WAIT = 60.0
"""Seconds provision waits for another provisioner of the schema (workers that all start
at once) and for the locks its DDL needs, instead of the claims' lock_timeout."""


class PostgresStore(BaseStore):
    scheme = "postgresql"

    def __init__(
        self,
        conninfo: str,
        *,
        url: str,
        schema: str = DEFAULT_SCHEMA,
        prefix: str = "",
        lease: float = DEFAULT_LEASE,
        retention: float = DEFAULT_RETENTION,
        pool_min: int = 1,
        pool_max: int = 8,
        lock_timeout: float = 0.1,
        statement_timeout: float = 10.0,
        connect_timeout: float = 5.0,
    ) -> None:
        super().__init__(url, lease=lease, retention=retention)
        if pool_min > pool_max:
            raise ConfigError(f"pool_min={pool_min} exceeds pool_max={pool_max}")
        self.schema, self.prefix = schema, prefix
        self.names = names(schema, prefix)
        self.keys_table = self.names.keys_table
        self.outbox_table = self.names.outbox_table
        self._pool = Pool(
            conninfo,
            url=self.url,
            schema=schema,
            pool_min=pool_min,
            pool_max=pool_max,
            lock_timeout=lock_timeout,
            statement_timeout=statement_timeout,
            connect_timeout=connect_timeout,
        )
        self._sql = protocol_statements(self.names)

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        conninfo, settings = postgres_url.from_url(url)
        return cls(conninfo, url=url, **settings)

    # Plumbing --------------------------------------------------------------------------------

    @property
    def pool_settings(self) -> PoolSettings:
        """What this store's connections are made with (the async store makes its own
        with the same)."""
        return self._pool.settings

    @property
    def statements(self) -> dict[str, str]:
        """The protocol's statements on this store's schema, by name (see ``sql``)."""
        return self._sql

    def connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A pooled connection in autocommit mode (``with conn.transaction():`` for more than
        one statement); driver errors inside the block become idemctl's errors."""
        return self._pool.connection()

    def _fetch(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.connection() as conn:
            return conn.execute(sql, params).fetchall()

    def _run(self, flow: flows.Flow[flows.T]) -> flows.T:
        """``flow`` on a pooled connection."""
        with self.connection() as conn:
            return drive(conn, flow)

    # The protocol ------------------------------------------------------------------------------

    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        try:
            return self._run(flows.claim(self._sql, requests, lease))
        except LockTimeout:
            if len(requests) == 1:
                return [Busy(None)]
        # A row of the batch is held by an open transaction: claim one by one, so only
        # that key answers Busy.
        return [self.claim(r.key, r.fingerprint, lease) for r in requests]

    def _complete(self, c: Completion, retention: float) -> Record:
        return self._run(flows.complete_one(self._sql, c, retention))

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        return self._run(flows.complete_many(self._sql, completions, self._retention(retention)))

    def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        return self._run(flows.fail(self._sql, held, error, retriable, retention))

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        held = Holder(key, owner, fencing_token)
        return self._run(flows.extend(self._sql, held, self._lease(lease)))

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        held = Holder(key, owner, fencing_token)
        return self._run(flows.release(self._sql, held, handler_ran))

    # The sequence guard ---------------------------------------------------------------------------

    def _guard_many(self, guards: Sequence[Guard], lease: float) -> list[GuardReply]:
        try:
            with self._on_entities():
                return self._run(flows.guard(self._sql, guards, lease, self.default_retention))
        except LockTimeout:
            if len(guards) == 1:
                return [self._guard_blocked(guards[0])]
        # A row of the batch is held by an open transaction: one by one, so only that item
        # answers BUSY. Items that went already go again: the holder asking again keeps it.
        return [self._guard_many([g], lease)[0] for g in guards]

    def _guard_blocked(self, g: Guard) -> GuardReply:
        """The reply to a guard whose row an open transaction holds (transactional mode)."""
        with self._on_entities():
            return self._run(flows.reply_unwritten(self._sql, g, self.default_retention))

    def _settle_many(self, settles: Sequence[Settle], retention: float) -> list[bool]:
        try:
            with self._on_entities(), self.connection() as conn:
                return self._settle_on(conn, settles, retention)
        except LockTimeout:
            pass
        # An entity's row is held by an open transaction (transactional mode): it decides
        # whether this holder still holds it, so wait for it a while, as admin commands do.
        try:
            with self._on_entities(), self.connection() as conn, conn.transaction():
                conn.execute(lock_wait(ADMIN_LOCK_WAIT))
                return self._settle_on(conn, settles, retention)
        except LockTimeout:
            raise flows.settle_blocked(settles, ADMIN_LOCK_WAIT) from None

    def _settle_on(
        self, conn: psycopg.Connection[Any], settles: Sequence[Settle], retention: float
    ) -> list[bool]:
        # More than one round: in one transaction, so a lock timeout undoes all of them.
        with conn.transaction() if flows.settle_in_transaction(settles) else nullcontext():
            return drive(conn, flows.settle(self._sql, settles, retention))

    def get_entity(self, entity: str) -> Entity | None:
        with self._on_entities():
            rows = self._fetch(self._sql["get_entity"], {"entity": entity})
        return entity_of(rows[0]) if rows else None

    def scan_entities(
        self, prefix: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> EntityPage:
        where = ["(expires_at IS NULL OR expires_at > now())"]
        params: dict[str, Any] = {"limit": limit + 1}
        if prefix:
            # left(), not LIKE: a prefix's % and _ are plain characters.
            where.append("left(entity, %(plen)s) = %(prefix)s")
            params |= {"plen": len(prefix), "prefix": prefix}
        if cursor is not None:
            where.append("entity > %(after)s")
            params["after"] = cursor
        with self._on_entities():
            rows = self._fetch(
                f"SELECT {ENTITY_COLUMNS} FROM {self.names.entities_table} "
                f"WHERE {' AND '.join(where)} ORDER BY entity LIMIT %(limit)s",
                params,
            )
        found = [e for r in rows[:limit] if (e := entity_of(r)) is not None]
        return EntityPage(found, found[-1].entity if len(rows) > limit and found else None)

    def count_entities(self) -> int:
        with self._on_entities():
            rows = self._fetch(
                f"SELECT count(*) FROM {self.names.entities_table} "
                "WHERE expires_at IS NULL OR expires_at > now()"
            )
        return int(rows[0][0])

    def forget_entity(self, entity: str, force: bool = False) -> Entity:
        validate_key(entity, "entity")
        try:
            with self._on_entities(), self.connection() as conn, conn.transaction():
                conn.execute(lock_wait(ADMIN_LOCK_WAIT))
                row = conn.execute(self._sql["lock_entity"], {"entity": entity}).fetchone()
                found = None if row is None else entity_of(row)
                if row is None or found is None or found.retention_over(utc(row[9])):
                    raise EntityNotFound(entity)
                if found.locked(utc(row[9])) and not force:
                    raise entity_locked(found)
                conn.execute(
                    f"DELETE FROM {self.names.entities_table} WHERE entity = %(entity)s",
                    {"entity": entity},
                )
                return found
        except LockTimeout:
            raise StoreError(
                f"entity {entity!r} is locked by a transaction in progress (waited "
                f"{ADMIN_LOCK_WAIT:g}s); try again"
            ) from None

    @contextmanager
    def _on_entities(self) -> Iterator[None]:
        """NotProvisioned that says to upgrade when the schema predates the entities."""
        try:
            yield
        except NotProvisioned:
            older = self.without_entities(self.schema_version())
            if older is not None:
                raise older from None
            raise

    def without_entities(self, version: int) -> NotProvisioned | None:
        """What to say when the entities' table is missing from a schema at ``version``:
        None unless that is an older schema (then the usual NotProvisioned stands)."""
        if 0 < version < max(migrations(self.names)):
            return NotProvisioned(
                f"PostgreSQL at {self.url} has an older idemctl schema {self.schema!r} "
                f"(version {version}), without the sequence guard's entities: "
                "run 'idemctl init' to upgrade it"
            )
        return None

    # Transactional mode ---------------------------------------------------------------------------

    def transaction(
        self,
        key: str,
        fingerprint: str | None = None,
        lease: float | None = None,
        order: Order | None = None,
    ) -> AbstractContextManager[Unit]:
        """Claim ``key`` in a new transaction and keep it open around the block.

        When ``unit.outcome`` is Acquired, run your SQL on ``unit.connection`` and call
        ``unit.complete(result)``: leaving the block commits all of it. An exception, a
        crash or a block that never completes rolls everything back, the claim included.
        Another transaction on the same key meanwhile gets Busy at once: a transaction-level
        advisory lock is tried before the claim, and other claimers wait on the row at most
        lock_timeout. For any other outcome nothing is held and ``unit.connection`` is None.

        With ``order``, the entity's row is locked in the same transaction once the key is
        acquired (another transaction on it: Busy(None) at once, as another attempt's live
        hold from ``guard_many``). An event not newer than the entity's last applied one is
        Stale: its key is completed with a null result and committed before the block, and
        nothing is held. Otherwise ``unit.complete()`` advances the entity too, in the
        transaction: it commits with the handler's SQL or not at all.
        """
        return transactional.transaction(self, key, fingerprint, lease, order)

    # Admin ----------------------------------------------------------------------------------------

    def get(self, key: str) -> Record | None:
        return self._run(flows.get(self._sql, key))

    def get_many(self, keys: Sequence[str]) -> dict[str, Record]:
        return self._run(flows.get_many(self._sql, keys)) if keys else {}

    def _scan_page(self, scan: Scan) -> Page:
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
        return Page(records, records[-1].key if len(rows) > scan.limit else None)

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

    def schema_version(self) -> int:
        """The version of the provisioned schema; 0 when there is none."""
        try:
            return self._run(flows.schema_version(self._sql))
        except NotProvisioned:
            return 0

    def provision(self, dry_run: bool = False, upto: int | None = None) -> Provisioning:
        steps = migrations(self.names)
        target = max(steps) if upto is None else upto
        table = self.names.version_table
        lock = provision_lock(self.names)
        current = self.schema_version()
        statements = []
        for version in sorted(v for v in steps if current < v <= target):
            statements += steps[version]
            statements.append(f"INSERT INTO {table} (version) VALUES ({version})")
        if not statements:
            return Provisioning(
                [], changed=False, dry_run=dry_run, notes=[f"schema version {current} is current"]
            )
        statements.insert(0, lock)
        if not dry_run:
            with self.connection() as conn, conn.transaction():
                conn.execute(lock_wait(PROVISION_LOCK_WAIT))
                conn.execute(statements[0])
                if self.schema_version_on(conn) > current:  # another process provisioned meanwhile
                    return Provisioning([], changed=False, notes=["provisioned concurrently"])
                for statement in statements[1:]:
                    conn.execute(statement)
        return Provisioning(statements, changed=not dry_run, dry_run=dry_run)

    def schema_version_on(self, conn: psycopg.Connection[Any]) -> int:
        table = self.names.version_table
        if not _exists(conn, table):
            return 0
        row = conn.execute(self._sql["schema_version"]).fetchone()
        return int(row[0]) if row else 0

    def check(self) -> list[Finding]:
        started = time.perf_counter()
        with self.connection() as conn:
            row = conn.execute("SELECT current_setting('server_version'), now()").fetchone()
            latency = (time.perf_counter() - started) * 1000
            version_on = self.schema_version_on(conn)
        latest = max(migrations(self.names))
        assert row is not None
        server_version, server_now = row
        skew = (server_now - datetime.now(UTC)).total_seconds()
        return [
            Finding(
                "connection", True, f"PostgreSQL {server_version} at {self.url}, {latency:.1f} ms"
            ),
            Finding(
                "schema",
                version_on == latest,
                f"schema {self.schema!r} at version {version_on} of {latest}",
                None if version_on == latest else "run 'idemctl init'",
            ),
            server_clock_finding(skew),
        ]

    def close(self) -> None:
        self._pool.close()


def _now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0].astimezone(UTC)  # type: ignore[no-any-return]


def _exists(conn: psycopg.Connection[Any], table: str) -> bool:
    """Whether ``table`` (schema-qualified, quoted) exists."""
    row = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
    return row is not None and row[0] is not None
