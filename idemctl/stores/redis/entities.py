"""The sequence guard on a Redis store: guard_many and settle_many, each one script call
(one per slot on a cluster), and the operator's entity operations.

An entity is one JSON string under ``PREFIXentity:{ENTITY}`` (see lua/_lib.lua): out of the
records' ``PREFIX{KEY}`` namespace, so no record can collide with it and key scans never see
it, with the entity's name as its hash tag, so a cluster routes it by that name. Its TTL
ends with its retention."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

from idemctl.errors import EntityNotFound
from idemctl.model import Entity, EntityPage, validate_key
from idemctl.stores import redis as package
from idemctl.stores.machine import entity_locked
from idemctl.stores.queries import batched
from idemctl.stores.redis.client import Client
from idemctl.stores.redis.core import glob_escape
from idemctl.stores.redis.index import RedisIndex
from idemctl.stores.redis.ops import ENTITIES
from idemctl.stores.redis.records import entity_fields_of, text, to_entity


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
        """Pages in name order: every matching name is collected with SCAN (on every
        primary of a cluster) and sorted, and a page goes on after the cursor, the last
        name of the page before. An operator's command: it holds the names, not the
        entities, of one prefix in memory."""
        with self._guard():
            now = self._now()
        names = sorted(n for n in self._entity_names(prefix) if cursor is None or n > cursor)
        found: list[Entity] = []
        for chunk in batched(names, package.SCAN_COUNT):
            found += self._read_entities(chunk, now)
            if len(found) > limit:
                break
        page = found[: max(limit, 0)]
        return EntityPage(page, page[-1].entity if len(found) > limit and page else None)

    def count_entities(self) -> int:
        if self.index_ready():
            return self._index_entities()
        with self._guard():
            now = self._now()
        return sum(
            len(self._read_entities(chunk, now))
            for chunk in batched(self._entity_names(), package.SCAN_COUNT)
        )

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

    def _entity_names(self, prefix: str | None = None) -> set[str]:
        """The names of the entities under ``prefix`` (SCAN may return a key twice)."""
        match = f"{glob_escape(self.prefix + ENTITIES)}{{{glob_escape(prefix or '')}*"
        names: set[str] = set()
        with self._guard():
            for node in self._nodes():
                client = self._client if node is None else node.redis_connection
                names.update(self._scan_names(client, match))
        return {n for n in names if prefix is None or n.startswith(prefix)}

    def _scan_names(self, client: Client, match: str) -> Iterator[str]:
        cursor = 0
        while True:
            # SCAN_COUNT is read from the package at each call, where it may be set.
            cursor, found = client.scan(
                cursor, match=match, count=package.SCAN_COUNT, _type="string"
            )
            for ekey in (text(k) for k in found):
                if ekey.endswith("}"):
                    yield self._entity_of(ekey)
            if int(cursor) == 0:
                return

    def _read_entities(self, names: Sequence[str], now: datetime) -> list[Entity]:
        """The live entities among ``names``, in their order: one pipelined round trip (one
        per node on a cluster)."""
        with self._guard():
            pipe = self._client.pipeline(transaction=False)
            for name in names:
                pipe.get(self._ekey(name))
            texts = pipe.execute()
        found = []
        for name, raw in zip(names, texts, strict=True):
            fields = entity_fields_of(raw)
            if fields is not None:  # gone since SCAN saw it, or not ours
                entity = to_entity(name, fields)
                if not entity.retention_over(now):
                    found.append(entity)
        return found
