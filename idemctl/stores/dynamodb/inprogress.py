"""The sparse index of in-progress keys on DynamoDB (GSI ``in_progress``), and the
operator's reads that go through it.

An item carries ``ip_shard`` exactly while its key is in progress: claims and takeovers set
it; completions, failures and forgets remove it; release and unlock keep it (the key is
still in progress, waiting for its next delivery); items deleted by purge or the TTL leave
the index with them. Each of those is a term of the UpdateItem the protocol sends anyway,
so the index costs no request on the hot path, only DynamoDB's own write of the index.
The index is keyed by ``ip_shard`` (one of ``items.SHARDS`` strings by a CRC-32 of the key,
so that no one partition of the index takes every claim) and sorted by
``lease_expires_at`` (ms), so "lease ended by T" is a key condition on each shard.

It projects every attribute: a listing shows whole records, and ``unlock_stale`` needs the
owner and fencing token it frees by; with KEYS_ONLY each key found would cost a GetItem.
The copies cost little: an in-progress item is small (no result yet), and every write to
one changes its lease, the index's sort key, so a narrower projection would save the size
of the index's writes, not their number.

``list --stale``, ``list --released``, ``list --status in_progress``, ``unlock --stale`` and
the in-progress part of ``stats`` Query it shard by shard instead of scanning the table:
they cost what they find, not what the table holds.

A GSI is eventually consistent, usually within a second: a reader may miss a key claimed
or released a moment ago, still list one completed or freed a moment ago, or show a record
as it was before its last write. Every change the operator's commands make is still a
conditional write on the table, which looks at the item again, so a stale reading never
frees a lease it should not.

A table made before the index has none: ``idemctl init`` adds it (``provision``). Until
it is ACTIVE, these reads scan, as before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from idemctl.errors import ConfigError, InvalidCursor
from idemctl.model import Record, RecordPage, Stats, Status
from idemctl.stores.dynamodb.core import DynamoDBCore
from idemctl.stores.dynamodb.items import (
    INDEX,
    INDEX_KEYS,
    SHARDS,
    ms_of,
    n,
    names_in,
    s,
    to_record,
    value_of,
)
from idemctl.stores.queries import InProgressTally, Scan

PAGE_READ = 100
"""The fewest items one Query of a listing asks for (``Limit``): a page of ``limit`` asks
for ``limit`` + 1, so that a short listing does not read a whole 1 MB page of each shard."""


@dataclass(frozen=True)
class Position:
    """An item's place in the index: its shard, its lease's end (ms), its key. The index's
    key with the table's: what DynamoDB resumes a Query after (ExclusiveStartKey)."""

    shard: int
    lease: int
    key: str

    def start_key(self) -> dict[str, Any]:
        return {
            "key": s(self.key),
            "ip_shard": s(str(self.shard)),
            "lease_expires_at": n(self.lease),
        }

    def cursor(self) -> str:
        """This position as a cursor of ``scan``: ``{"ip": [shard, lease ms, key]}``."""
        return json.dumps({"ip": [self.shard, self.lease, self.key]})

    @classmethod
    def of_cursor(cls, cursor: str) -> Position:
        """The position a cursor of ``cursor()`` stands for; InvalidCursor for anything
        else (DynamoDB would refuse it with a less helpful error)."""
        try:
            shard, lease, key = json.loads(cursor)["ip"]
        except (ValueError, KeyError, TypeError):
            shard = lease = key = None
        if (
            type(shard) is int
            and 0 <= shard < SHARDS
            and type(lease) is int
            and lease >= 0
            and isinstance(key, str)
            and key
        ):
            return cls(shard, lease, key)
        raise InvalidCursor(f"not a cursor of this DynamoDB store's in-progress keys: {cursor!r}")


class DynamoDBInProgress(DynamoDBCore):
    """The in-progress index: a part of DynamoDBStore."""

    _index_active: bool | None = None
    """Whether the operator's reads use the index: asked once per store (``_has_index``),
    and again after ``provision``."""

    def _index(self, table: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The index as DescribeTable describes it (``table``: a description already at
        hand), or None when the table has none."""
        if table is None:
            table = self._call("describe_table")["Table"]
        for index in table.get("GlobalSecondaryIndexes") or []:
            if index.get("IndexName") == INDEX:
                return dict(index)
        return None

    def index_status(self) -> str | None:
        """The index's status (ACTIVE, CREATING, ...), or None when the table has none."""
        index = self._index()
        return None if index is None else str(index.get("IndexStatus", "ACTIVE"))

    def _has_index(self) -> bool:
        """Whether the operator's reads may Query the index: it is ACTIVE with idemctl's
        keys. Asked once per store (one DescribeTable). Without it, or when this identity
        may not describe the table, they scan the table as before the index."""
        if self._index_active is None:
            try:
                index = self._index()
            except ConfigError:  # DescribeTable refused: scan (which says so if refused too)
                index = None
            self._index_active = (
                index is not None
                and index.get("IndexStatus", "ACTIVE") == "ACTIVE"
                and index.get("KeySchema") == INDEX_KEYS
            )
        return self._index_active

    def _in_progress(
        self,
        lease_ended_by: int | None = None,
        after: Position | None = None,
        read: int | None = None,
    ) -> Iterator[tuple[Position, Record]]:
        """Every key in the index (only those whose lease ended by ``lease_ended_by``, ms),
        shard after shard from ``after`` (excluded), in lease order within a shard; each
        with its position. ``read``: items per Query (None: DynamoDB's 1 MB pages).
        Eventually consistent (see the module)."""
        shard, start = (0, None) if after is None else (after.shard, after.start_key())
        while shard < SHARDS:
            condition = "#ips = :shard"
            values: dict[str, Any] = {":shard": s(str(shard))}
            if lease_ended_by is not None:
                condition += " AND #lease <= :cut"
                values[":cut"] = n(lease_ended_by)
            kwargs: dict[str, Any] = {
                "IndexName": INDEX,
                "KeyConditionExpression": condition,
                "ExpressionAttributeNames": names_in(condition),
                "ExpressionAttributeValues": values,
            }
            if read is not None:
                kwargs["Limit"] = read
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._call("query", **kwargs)
            for item in response.get("Items", []):
                at = Position(shard, value_of(item, "lease_expires_at"), value_of(item, "key"))
                yield at, to_record(item)
            start = response.get("LastEvaluatedKey")
            if not start:
                shard += 1

    def _index_page(self, scan: Scan) -> RecordPage:
        """A page of in-progress keys (``scan`` asks for stale, released or in-progress
        ones) from the index, in shard order, by lease within a shard; its cursor is the
        index position of its last key. A key whose lease changes between two pages moves
        in the index: it may be listed on both, or on neither."""
        now = datetime.now(UTC)
        query = scan.query(now)
        # A stale lease has ended; a released key's lease is the moment it was freed.
        by = ms_of(now) if scan.stale_only or scan.released_only else None
        after = None if not scan.cursor else Position.of_cursor(scan.cursor)
        found: list[Record] = []
        last = after
        for at, record in self._in_progress(by, after, max(scan.limit + 1, PAGE_READ)):
            if not query.matches(record):
                continue
            if len(found) >= scan.limit:  # one more is there: offer the next page
                return RecordPage(found, None if last is None else last.cursor())
            found.append(record)
            last = at
        return RecordPage(found, None)

    def _index_stats(self) -> Stats:
        """In progress, stale, released and the oldest in progress, exact from the index
        (as of its last update: see the module); the total from DescribeTable's item
        count, approximate (it counts the sequence guard's entities and records past
        retention the TTL has not deleted yet; DynamoDB refreshes it about every six
        hours), and at least the keys in progress. Completed, failed and past retention:
        None (only a scan of the table knows)."""
        now = datetime.now(UTC)
        tally = InProgressTally()
        for _, r in self._in_progress():
            if not r.retention_over(now):  # not in the index once forgotten: never, but be sure
                tally.add(r, now)
        items = int(self._call("describe_table")["Table"].get("ItemCount", 0))
        return Stats(
            max(items, tally.count),
            {Status.IN_PROGRESS: tally.count, Status.COMPLETED: None, Status.FAILED: None},
            tally.stale,
            tally.oldest,
            None,
            tally.released,
            counted_by="approximate",
        )
