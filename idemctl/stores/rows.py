"""Stores built on row transactions (memory, SQLite): every operation from the state
machine in ``machine.py``, applied to a row read and written back in one transaction."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, ClassVar, Protocol

from idemctl.errors import EntityNotFound, KeyNotFound, LeaseLost
from idemctl.model import (
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Entity,
    EntityPage,
    Guard,
    GuardReply,
    Holder,
    Record,
    RecordPage,
    Settle,
    Stats,
    validate_key,
)
from idemctl.stores.base import BATCH, BaseStore, Progress, utcnow
from idemctl.stores.machine import (
    check_forgettable,
    check_holder,
    clock_passed,
    completed,
    decide_claim,
    decide_guard,
    decide_settle,
    entity_locked,
    failed,
    first_token,
    forgotten,
    released,
    unlocked,
)
from idemctl.stores.queries import RecordFilter, Scan, batched, stats_of


class RowTx(Protocol):
    """One atomic transaction over the records of a row store."""

    def get(self, key: str) -> Record | None: ...
    def put(self, record: Record) -> None: ...
    def delete(self, key: str) -> None: ...
    def select(self, query: RecordFilter) -> list[Record]:
        """Matching records in key order, at most ``query.limit``."""
        ...

    def get_entity(self, entity: str) -> Entity | None: ...
    def put_entity(self, entity: Entity) -> None: ...
    def delete_entity(self, entity: str) -> None: ...
    def select_entities(
        self,
        prefix: str | None,
        after: str | None,
        limit: int | None,
        live_at: datetime | None = None,
    ) -> list[Entity]:
        """Entities in name order, at most ``limit``; with ``live_at``, only those not past
        retention at that time (else those past it too)."""
        ...


class RowStore(BaseStore):
    """Every store operation, written once over ``_transaction()``."""

    claim_chunk: ClassVar[int | None] = None  # in this process: nothing to overlap

    def __init__(self, url: str, *, clock: Callable[[], datetime] = utcnow, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._clock = clock

    @abstractmethod
    def _transaction(self, write: bool = True) -> AbstractContextManager[RowTx]:
        """Exclusive until it exits when ``write``; rolled back if the block raises."""

    def now(self) -> datetime:
        # Milliseconds: what SQLite keeps, so a returned record equals the stored one.
        now = self._clock()
        return now.replace(microsecond=now.microsecond // 1000 * 1000)

    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        outcomes = []
        with self._transaction() as tx:
            now = self.now()
            first = first_token(self._clock())  # in microseconds, as the clock has them
            for r in requests:
                outcome, record = decide_claim(
                    tx.get(r.key), r.key, r.fingerprint, now, lease, first
                )
                if record is not None:
                    tx.put(record)
                outcomes.append(outcome)
        return outcomes

    def _complete(self, c: Completion, retention: float) -> Record:
        key, owner, fencing_token, result = c.key, c.owner, c.fencing_token, c.result
        with self._transaction() as tx:
            now = self.now()
            record = completed(
                check_holder(tx.get(key), key, owner, fencing_token, now),
                now,
                result,
                self.retention_for(retention),
            )
            tx.put(record)
        self._moved((key,))
        return record

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        return self.finish_many(completions, (), retention)

    def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        key, owner, fencing_token = held.key, held.owner, held.fencing_token
        with self._transaction() as tx:
            now = self.now()
            record = failed(
                check_holder(tx.get(key), key, owner, fencing_token, now),
                now,
                error,
                retriable,
                self.retention_for(retention),
            )
            tx.put(record)
        self._moved((key,))
        return record

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        with self._transaction() as tx:
            now = self.now()
            held = check_holder(tx.get(key), key, owner, fencing_token, now)
            expires = now + timedelta(seconds=self.lease_for(lease))
            tx.put(replace(held, lease_expires_at=expires, updated_at=now))
        return expires

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        with self._transaction() as tx:
            now = self.now()
            held = check_holder(tx.get(key), key, owner, fencing_token, now)
            record = released(held, now, handler_ran)
            tx.put(record)
        self._moved((key,))
        return record

    # The sequence guard -------------------------------------------------------------------

    def _guard_many(self, guards: Sequence[Guard], lease: float) -> list[GuardReply]:
        replies = []
        with self._transaction() as tx:
            now = self.now()
            for g in guards:
                reply, entity = decide_guard(
                    tx.get_entity(g.entity), g, now, lease, self.default_retention
                )
                if entity is not None:
                    tx.put_entity(entity)
                replies.append(reply)
        return replies

    def _settle_many(self, settles: Sequence[Settle], retention: float) -> list[bool]:
        done = []
        with self._transaction() as tx:
            now = self.now()
            for s in settles:
                held, entity = decide_settle(tx.get_entity(s.entity), s, now, retention)
                if entity is not None:
                    tx.put_entity(entity)
                done.append(held)
        return done

    def finish_many(
        self,
        completions: Sequence[Completion],
        settles: Sequence[Settle],
        retention: float | None = None,
    ) -> list[bool]:
        """In one transaction: each entity advanced and its key completed, or neither
        (``complete_many`` is this without settles)."""
        by_key = {s.key: s for s in settles}
        keep = self.retention_for(retention)
        done = []
        with self._transaction() as tx:
            now = self.now()
            for c in completions:
                try:
                    held = check_holder(tx.get(c.key), c.key, c.owner, c.fencing_token, now)
                except LeaseLost:
                    done.append(False)
                    continue
                s = by_key.get(c.key)
                if s is not None:
                    ok, entity = decide_settle(tx.get_entity(s.entity), s, now, keep)
                    if not ok or entity is None:
                        done.append(False)
                        continue
                    tx.put_entity(entity)
                tx.put(completed(held, now, c.result, keep))
                done.append(True)
        self._moved(c.key for c, ok in zip(completions, done, strict=True) if ok)
        return done

    def get_entity(self, entity: str) -> Entity | None:
        with self._transaction(write=False) as tx:
            found = tx.get_entity(entity)
        return None if found is None or found.retention_over(self.now()) else found

    def scan_entities(
        self, prefix: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> EntityPage:
        now = self.now()
        with self._transaction(write=False) as tx:
            found = tx.select_entities(prefix, cursor, None if limit < 0 else limit + 1, now)
        page = found[: max(limit, 0)]
        return EntityPage(page, page[-1].entity if len(found) > limit and page else None)

    def count_entities(self) -> int:
        now = self.now()
        with self._transaction(write=False) as tx:
            return len(tx.select_entities(None, None, None, now))

    def forget_entity(self, entity: str, force: bool = False) -> Entity:
        validate_key(entity, "entity")
        with self._transaction() as tx:
            now = self.now()
            found = tx.get_entity(entity)
            if found is None or found.retention_over(now):
                raise EntityNotFound(entity)
            if found.locked(now) and not force:
                raise entity_locked(found)
            tx.delete_entity(entity)
        return found

    # Admin ------------------------------------------------------------------------------

    def get(self, key: str) -> Record | None:
        with self._transaction(write=False) as tx:
            record = tx.get(key)
        return None if record is None or record.retention_over(self.now()) else record

    def get_many(self, keys: Sequence[str]) -> dict[str, Record]:
        with self._transaction(write=False) as tx:
            records = [tx.get(key) for key in dict.fromkeys(keys)]
        now = self.now()
        return {r.key: r for r in records if r is not None and not r.retention_over(now)}

    def _scan_page(self, scan: Scan) -> RecordPage:
        limit = scan.limit
        query = replace(scan.query(self.now()), after=scan.cursor, limit=limit + 1)
        with self._transaction(write=False) as tx:
            records = tx.select(query)
        more = len(records) > limit
        records = records[:limit]
        return RecordPage(records, records[-1].key if more and records else None)

    def stats(self, exact: bool = False) -> Stats:
        now = self.now()
        with self._transaction(write=False) as tx:
            records = tx.select(RecordFilter())
        return stats_of(records, now)

    def unlock(self, key: str, force: bool = False) -> Record:
        with self._transaction() as tx:
            now = self.now()
            record = tx.get(key)
            if record is None or record.retention_over(now):
                raise KeyNotFound(key)
            record = unlocked(record, now, force)
            tx.put(record)
        self._moved((key,))
        return record

    def unlock_stale(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> list[str]:
        def stale(now: datetime) -> RecordFilter:
            return RecordFilter(lease_expired_at=now - timedelta(seconds=older_than), owned=True)

        with self._transaction(write=False) as tx:
            found = [r.key for r in tx.select(stale(self.now()))]
        if dry_run:
            return found
        freed: list[str] = []
        for batch in batched(found, BATCH):
            with self._transaction() as tx:
                now = self.now()
                query = stale(now)
                for key in batch:  # looked at again: it may have been claimed meanwhile
                    record = tx.get(key)
                    if record is not None and query.matches(record):
                        tx.put(released(record, now))
                        freed.append(key)
            if progress is not None:
                progress(len(batch))
        return freed

    def forget(self, key: str, force: bool = False) -> Record:
        with self._transaction() as tx:
            now = self.now()
            record = tx.get(key)
            if record is None or record.retention_over(now):
                raise KeyNotFound(key)
            check_forgettable(record, force)
            tx.put(forgotten(record, now))
        self._moved((key,))
        return record

    def purge(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> int:
        def over(now: datetime) -> RecordFilter:
            return RecordFilter(retention_over_at=now - timedelta(seconds=older_than))

        with self._transaction(write=False) as tx:
            clock = self._clock()
            found = [r.key for r in tx.select(over(self.now())) if clock_passed(r, clock)]
        if dry_run:
            return len(found)
        purged = 0
        for batch in batched(found, BATCH):
            with self._transaction() as tx:
                clock = self._clock()
                query = over(self.now())
                for key in batch:
                    record = tx.get(key)
                    if record is not None and query.matches(record) and clock_passed(record, clock):
                        tx.delete(key)
                        purged += 1
            if progress is not None:
                progress(len(batch))
        return purged
