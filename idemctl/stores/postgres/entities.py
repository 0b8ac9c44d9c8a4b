"""The operator's operations on the sequence guard's entities on PostgreSQL (one row per
entity in its own table): get, scan, count and forget. Guard and settle are protocol steps
(``steps``: one ``INSERT ... ON CONFLICT ... DO UPDATE ... WHERE <go>`` per batch, one
``UPDATE ... FROM unnest``). A part of PostgresStore."""

from __future__ import annotations

from typing import Any

from idemctl.errors import EntityNotFound, StoreError
from idemctl.model import Entity, EntityPage, validate_key
from idemctl.stores.machine import entity_locked
from idemctl.stores.postgres.core import ADMIN_LOCK_WAIT
from idemctl.stores.postgres.pool_base import LockTimeout
from idemctl.stores.postgres.sql import ENTITY_COLUMNS, entity_of, lock_wait, utc
from idemctl.stores.postgres.steps import PostgresSteps


class PostgresEntities(PostgresSteps):
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

    # Transactional mode ---------------------------------------------------------------------------
