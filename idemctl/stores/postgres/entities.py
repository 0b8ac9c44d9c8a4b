"""The sequence guard on PostgreSQL: one row per entity in its own table; guard is one
``INSERT ... ON CONFLICT ... DO UPDATE ... WHERE <go>`` per batch, settle one ``UPDATE ...
FROM unnest``. A part of PostgresStore."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import psycopg

from idemctl.errors import (
    EntityNotFound,
    NotProvisioned,
    StoreError,
)
from idemctl.model import (
    Entity,
    EntityPage,
    Guard,
    GuardReply,
    Settle,
    validate_key,
)
from idemctl.stores.machine import entity_locked
from idemctl.stores.postgres import flows
from idemctl.stores.postgres.core import ADMIN_LOCK_WAIT, PostgresCore
from idemctl.stores.postgres.flows import drive
from idemctl.stores.postgres.pool import LockTimeout
from idemctl.stores.postgres.sql import (
    ENTITY_COLUMNS,
    entity_of,
    lock_wait,
    migrations,
    utc,
)


class PostgresEntities(PostgresCore):
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
