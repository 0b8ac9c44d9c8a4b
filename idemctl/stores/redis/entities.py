"""The sequence guard on a Redis store: guard_many and settle_many, each one script call
(one per slot on a cluster), and the operator's entity operations.

An entity is one JSON string under ``PREFIXentity:{ENTITY}`` (see lua/_lib.lua): out of the
records' ``PREFIX{KEY}`` namespace, so no record can collide with it and key scans never see
it, with the entity's name as its hash tag, so a cluster routes it by that name. Its TTL
ends with its retention."""

from __future__ import annotations

from collections.abc import Iterator

from idemctl.errors import EntityNotFound
from idemctl.model import Entity, EntityPage, validate_key
from idemctl.stores.machine import entity_locked
from idemctl.stores.redis.client import Client, ClusterNode
from idemctl.stores.redis.core import glob_escape
from idemctl.stores.redis.index import RedisIndex
from idemctl.stores.redis.ops import ENTITIES
from idemctl.stores.redis.records import entity_fields_of, text, to_entity
from idemctl.stores.redis.walk import Batch, parse_cursor, read_strings, walk_page


class RedisEntities(RedisIndex):
    """The sequence guard: a part of RedisStore."""

    def _ekey(self, entity: str) -> str:
        return self.ops.ekey(entity)

    def _entity_of(self, ekey: str) -> str:
        return ekey[len(self.prefix) + len(ENTITIES) + 1 : -1]

    def get_entity(self, entity: str) -> Entity | None:
        raw, now = self._read(self._ekey(entity))
        fields = entity_fields_of(raw)
        if fields is None:
            return None
        found = to_entity(entity, fields)
        return None if found.retention_over(now) else found

    def scan_entities(
        self, prefix: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> EntityPage:
        """Pages in SCAN order as the keys' (``RedisWalk``: ``WALK_KEYS`` examined a page at
        most, a short page's cursor goes on), each page in name order."""
        position, after = parse_cursor(cursor, "entities")
        found, then = walk_page(
            self._entity_batches(prefix, position), after, limit, lambda e: e.entity
        )
        return EntityPage(sorted(found, key=lambda e: e.entity), then)

    def count_entities(self) -> int:
        if self.index_ready():
            return self._index_entities()
        return sum(len(entities) for _, entities, _ in self._entity_batches())

    def forget_entity(self, entity: str, force: bool = False) -> Entity:
        validate_key(entity, "entity")
        (reply,) = self._call(
            "forget_entity", ("1" if force else "0",), [(entity, ())], named=self._ekey
        )
        code = text(reply[0])
        if code == "missing":
            raise EntityNotFound(entity)
        fields = entity_fields_of(reply[1])
        if fields is None:  # the key holds something that is not an entity
            raise EntityNotFound(entity)
        found = to_entity(entity, fields)
        if code == "held":
            raise entity_locked(found)
        return found

    def _entity_batches(
        self, prefix: str | None = None, start: str | None = None
    ) -> Iterator[Batch[Entity]]:
        """The live entities under ``prefix``, a SCAN call at a time from ``start``."""
        with self._guard():
            now = self._now()
        match = f"{glob_escape(self.prefix + ENTITIES)}{{{glob_escape(prefix or '')}*"

        def read(node: ClusterNode | None, client: Client, ekeys: list[str]) -> list[Entity]:
            ekeys = [k for k in ekeys if k.endswith("}")]  # else not an entity's key
            found = []
            for ekey, raw in zip(ekeys, read_strings(node, client, ekeys), strict=True):
                fields = entity_fields_of(raw)
                if fields is not None:  # gone since SCAN saw it, or not ours
                    entity = to_entity(self._entity_of(ekey), fields)
                    if not entity.retention_over(now):
                        found.append(entity)
            return found

        return self._scan_batches(match, start, read)
