"""The operator's operations on a DynamoDB store: get, scan, stats, unlock, unlock_stale,
forget and purge. Bulk operations read the table and change each item by a conditional
write of its own, which skips an item changed since it was read. What concerns keys in
progress only (the stale and released listings, ``unlock_stale``, ``stats`` but with
``exact``) reads the index of keys in progress (``inprogress``) where the table has it;
the rest scans the table. They see keys only: the sequence guard's entities in the same
table (``entities``) are left out of every scan of keys, and ``purge`` deletes them past
retention too."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from idemctl.errors import InvalidCursor, KeyNotFound, StoreError
from idemctl.model import Record, RecordPage, Stats, Status
from idemctl.stores import dynamodb as package
from idemctl.stores.base import Progress
from idemctl.stores.dynamodb.client import translate
from idemctl.stores.dynamodb.entities import DynamoDBEntities
from idemctl.stores.dynamodb.inprogress import DynamoDBInProgress
from idemctl.stores.dynamodb.items import (
    ENTITY_PREFIX,
    from_ms,
    is_entity_key,
    n,
    s,
    to_ms,
    to_record,
)
from idemctl.stores.machine import check_forgettable, unlocked
from idemctl.stores.queries import RecordFilter, Scan, stats_of

BATCH_GET = 100
"""Keys one BatchGetItem may ask for."""


class DynamoDBAdmin(DynamoDBEntities, DynamoDBInProgress):
    """The operator's operations: a part of DynamoDBStore. Where the table has the index of
    in-progress keys (``inprogress``), their listings, unlock_stale and stats Query it."""

    def get(self, key: str) -> Record | None:
        if is_entity_key(key):  # no key can be: an entity's item
            return None
        item = self._call("get_item", Key={"key": s(key)}, ConsistentRead=True).get("Item")
        if not item:
            return None
        record = to_record(item)
        return None if record.retention_over(datetime.now(UTC)) else record

    def get_many(self, keys: Sequence[str]) -> dict[str, Record]:
        """BatchGetItem, 100 keys a request; keys DynamoDB leaves unprocessed (throttled)
        are asked for again after a back-off."""
        wanted = [k for k in dict.fromkeys(keys) if not is_entity_key(k)]
        items: list[dict[str, Any]] = []
        for start in range(0, len(wanted), BATCH_GET):
            batch = [{"key": s(k)} for k in wanted[start : start + BATCH_GET]]
            ask: dict[str, Any] = {"Keys": batch, "ConsistentRead": True}
            for attempt in itertools.count():
                reply = self._batch_get(ask)
                items += reply.get("Responses", {}).get(self.table, [])
                left = reply.get("UnprocessedKeys", {}).get(self.table)
                if not left:
                    break
                ask = left
                time.sleep(min(0.05 * 2**attempt, 1.0))
        now = datetime.now(UTC)
        records = (to_record(item) for item in items)
        return {r.key: r for r in records if not r.retention_over(now)}

    def _batch_get(self, ask: dict[str, Any]) -> Any:
        try:
            return self.client.batch_get_item(RequestItems={self.table: ask})
        except (ClientError, BotoCoreError) as exc:
            raise translate(exc, self.table, self.url) from exc

    def _scan(
        self, start: dict[str, Any] | None = None
    ) -> Iterator[tuple[list[Record], dict[str, Any] | None]]:
        """Every key's item (no entity's), a page at a time, with the key to continue from
        (None at the end)."""
        while True:
            kwargs: dict[str, Any] = {
                "ConsistentRead": True,
                "FilterExpression": "NOT begins_with(#k, :ent)",
                "ExpressionAttributeNames": {"#k": "key"},
                "ExpressionAttributeValues": {":ent": s(ENTITY_PREFIX)},
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._call("scan", **kwargs)
            start = response.get("LastEvaluatedKey")
            yield [to_record(item) for item in response.get("Items", [])], start
            if not start:
                return

    def _scan_page(self, scan: Scan) -> RecordPage:
        """Records in DynamoDB's scan order (not by key), at most ``limit`` a page; in-progress
        keys from the index where the table has it."""
        in_progress = scan.stale_only or scan.released_only or scan.status is Status.IN_PROGRESS
        if in_progress and self._has_index():
            return self._index_page(scan)
        query, limit = scan.query(datetime.now(UTC)), scan.limit
        found: list[Record] = []
        for records, after in self._scan(_start_key(scan.cursor)):
            for i, record in enumerate(records):
                if query.matches(record):
                    found.append(record)
                    if len(found) == limit:
                        if after is None and not any(query.matches(r) for r in records[i + 1 :]):
                            return RecordPage(found, None)  # nothing left: offer no empty page
                        # DynamoDB resumes a Scan after any item's key: go on after this one.
                        return RecordPage(found, json.dumps({"key": s(record.key)}))
            if after is None:
                break
        return RecordPage(found, None)

    def stats(self, exact: bool = False) -> Stats:
        """From the index where the table has it: the keys in progress exact, the rest
        DynamoDB's approximate item count (``counted_by`` approximate, see
        ``_index_stats``). ``exact``, or no index: every item read (``counted_by`` scan)."""
        if not exact and self._has_index():
            return self._index_stats()
        return stats_of([r for records, _ in self._scan() for r in records], datetime.now(UTC))

    def _free(self, record: Record, lease_ended_by: int | None, now: int | None = None) -> bool:
        """Take the lease from its owner, if that owner still holds it with that token and
        (``lease_ended_by``, ms) its lease ended by then; False when anything changed.
        ``now`` (ms) is the time written, by default this moment's."""
        assert record.owner is not None
        values = {
            ":now": n(self._now() if now is None else now),
            ":owner": s(record.owner),
            ":tok": n(record.fencing_token),
        }
        condition = "#ow = :owner AND #tok = :tok"
        if lease_ended_by is not None:
            values[":cut"] = n(lease_ended_by)
            condition += " AND #lease <= :cut"
        try:
            self._update(
                record.key, "SET #lease = :now, #up = :now REMOVE #ow", condition, values, "NONE"
            )
        except ClientError:
            return False
        return True

    def unlock(self, key: str, force: bool = False) -> Record:
        record = self.get(key)
        if record is None:
            raise KeyNotFound(key)
        now = self._now()  # one reading: the record returned is the record written
        freed = unlocked(record, datetime.fromtimestamp(now / 1000, UTC), force)
        if freed is not record and not self._free(record, None if force else now, now):
            raise StoreError(f"key {key!r} changed while it was being unlocked; try again")
        return freed

    def _batches(self, query: RecordFilter) -> Iterator[list[Record]]:
        """The records matching ``query``, at most ``ITEMS_PER_BATCH`` at a time: each is
        written by a request of its own, so a batch is only how often progress is told."""
        size = package.ITEMS_PER_BATCH  # read from the package at each call: it may be set
        for records, _ in self._scan():
            matching = [r for r in records if query.matches(r)]
            for i in range(0, len(matching), size):
                yield matching[i : i + size]

    def _stale_batches(self, stale: RecordFilter, cutoff: int) -> Iterator[list[Record]]:
        """The stale records, at most ITEMS_PER_BATCH at a time: from the index where the
        table has it (a Query of each shard for leases ended by ``cutoff``, ms: released
        keys among them are left out here), else from a scan of the table."""
        if not self._has_index():
            yield from self._batches(stale)
            return
        size = package.ITEMS_PER_BATCH
        batch: list[Record] = []
        for _, record in self._in_progress(cutoff):
            if stale.matches(record):
                batch.append(record)
                if len(batch) >= size:
                    yield batch
                    batch = []
        if batch:
            yield batch

    def unlock_stale(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> list[str]:
        cutoff = datetime.fromtimestamp(time.time() - older_than, UTC)
        stale = RecordFilter(lease_expired_at=cutoff, owned=True)
        keys: set[str] = set()
        for batch in self._stale_batches(stale, to_ms(cutoff.timestamp())):
            # Each is freed by a conditional write that reads the item again: skipped if it
            # was claimed, completed or freed meanwhile, whatever the index still showed.
            keys.update(r.key for r in batch if dry_run or self._free(r, to_ms(cutoff.timestamp())))
            if batch and not dry_run and progress is not None:
                progress(len(batch))
        return sorted(keys)

    def forget(self, key: str, force: bool = False) -> Record:
        record = self.get(key)
        if record is None:
            raise KeyNotFound(key)
        check_forgettable(record, force)
        # A tombstone past retention, not a deletion: it keeps the fencing counter, and the
        # TTL deletes it a retention later. done_by goes too: a retried complete or fail of
        # the old owner must not bring the key back.
        now = self._now()
        values = {
            ":tok": n(record.fencing_token),
            ":now": n(now),
            ":ttl": n((now + to_ms(self.default_retention)) // 1000),
        }
        try:
            self._update(
                key,
                "SET #exp = :now, #up = :now, #ttl = :ttl REMOVE #ow, #lease, #res, #by, #ips",
                "#tok = :tok",
                values,
                "NONE",
            )
        except ClientError as exc:
            raise StoreError(
                f"key {key!r} changed while it was being forgotten; try again"
            ) from exc
        return record

    def purge(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> int:
        cutoff = self._now() - to_ms(older_than)
        purged = 0
        for batch in self._batches(RecordFilter(retention_over_at=from_ms(cutoff))):
            purged += sum(1 for r in batch if dry_run or self._delete_over(r.key, cutoff))
            if batch and not dry_run and progress is not None:
                progress(len(batch))
        # The sequence guard's entities past retention go too, counted with the keys.
        return purged + self._purge_entities(cutoff, dry_run, package.ITEMS_PER_BATCH, progress)


def _start_key(cursor: str | None) -> dict[str, Any] | None:
    """The ExclusiveStartKey a ``scan`` cursor stands for."""
    if not cursor:
        return None
    try:
        start = json.loads(cursor)
        if isinstance(start, dict) and isinstance(start["key"]["S"], str):
            return start
    except (ValueError, KeyError, TypeError):
        pass
    raise InvalidCursor(f"not a cursor of this DynamoDB store: {cursor!r}")
