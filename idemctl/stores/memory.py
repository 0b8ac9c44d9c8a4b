"""``memory://``: records in a dict of this process, for tests and examples."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any

from idemctl.model import Entity, Finding, Provisioning, Record, canonical_json
from idemctl.stores.limits import DEFAULT_LEASE, DEFAULT_RETENTION, LEASE_RANGE, RETENTION_RANGE
from idemctl.stores.queries import RecordFilter
from idemctl.stores.rows import RowStore
from idemctl.urls import UrlOptions

# Results are kept as JSON text, as other stores keep them: a caller that changes a
# returned result changes nothing stored, and a replay gives what SQLite's would.
_Row = tuple[Record, bytes]


def _row(record: Record) -> _Row:
    return replace(record, result=None), canonical_json(record.result)


def _record(row: _Row) -> Record:
    return replace(row[0], result=json.loads(row[1]))


class _MemoryTx:
    def __init__(self, rows: dict[str, _Row], entities: dict[str, Entity]) -> None:
        self._rows = rows
        self.pending: dict[str, _Row | None] = {}
        self._entities = entities
        self.pending_entities: dict[str, Entity | None] = {}

    def get_entity(self, entity: str) -> Entity | None:
        if entity in self.pending_entities:
            return self.pending_entities[entity]
        return self._entities.get(entity)

    def put_entity(self, entity: Entity) -> None:
        self.pending_entities[entity.entity] = entity

    def delete_entity(self, entity: str) -> None:
        self.pending_entities[entity] = None

    def select_entities(
        self,
        prefix: str | None,
        after: str | None,
        limit: int | None,
        live_at: datetime | None = None,
    ) -> list[Entity]:
        out = []
        for name in sorted(self._entities.keys() | self.pending_entities.keys()):
            found = self.get_entity(name)
            if (
                found is None
                or (prefix and not name.startswith(prefix))
                or (after is not None and name <= after)
                or (live_at is not None and found.retention_over(live_at))
            ):
                continue
            out.append(found)
            if limit is not None and len(out) >= limit:
                break
        return out

    def get(self, key: str) -> Record | None:
        row = self.pending[key] if key in self.pending else self._rows.get(key)
        return None if row is None else _record(row)

    def put(self, record: Record) -> None:
        self.pending[record.key] = _row(record)

    def delete(self, key: str) -> None:
        self.pending[key] = None

    def select(self, query: RecordFilter) -> list[Record]:
        out = []
        for key in sorted(self._rows.keys() | self.pending.keys()):
            record = self.get(key)
            if record is not None and query.matches(record):
                out.append(record)
                if query.limit is not None and len(out) >= query.limit:
                    break
        return out


class MemoryStore(RowStore):
    """Thread-safe; gone with the process. Every ``memory://`` URL opens a new, empty store."""

    scheme = "memory"

    def __init__(self, url: str = "memory://", **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._rows: dict[str, _Row] = {}
        self._entities: dict[str, Entity] = {}
        self._lock = threading.RLock()

    @classmethod
    def from_url(cls, url: str) -> MemoryStore:
        options = UrlOptions(url)
        lease = options.duration("lease", DEFAULT_LEASE, *LEASE_RANGE)
        retention = options.duration("retention", DEFAULT_RETENTION, *RETENTION_RANGE)
        options.finish()
        return cls(url, lease=lease, retention=retention)

    @contextmanager
    def _transaction(self, write: bool = True) -> Iterator[_MemoryTx]:
        with self._lock:
            tx = _MemoryTx(self._rows, self._entities)
            yield tx
            for key, row in tx.pending.items():
                if row is None:
                    self._rows.pop(key, None)
                else:
                    self._rows[key] = row
            for name, entity in tx.pending_entities.items():
                if entity is None:
                    self._entities.pop(name, None)
                else:
                    self._entities[name] = entity

    def provision(self, dry_run: bool = False) -> Provisioning:
        return Provisioning(
            [], changed=False, dry_run=dry_run, notes=["memory store needs no provisioning"]
        )

    def check(self) -> list[Finding]:
        return [
            Finding("memory", True, f"in-process memory store with {len(self._rows)} records"),
            Finding(
                "durability",
                True,
                "records vanish when the process exits (sqlite:///path survives restarts)",
            ),
        ]
