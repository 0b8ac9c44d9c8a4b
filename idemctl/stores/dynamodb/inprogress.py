"""The sparse index of in-progress keys on DynamoDB (GSI ``in_progress``): an item carries
``ip_shard`` only while its key is in progress (claims set it, completions, failures and
forgets remove it; items deleted by purge or TTL leave the index with them), keyed by that
shard and the lease's end. ``list --stale``, ``list --released``, ``list --status
in_progress``, ``unlock --stale`` and the in-progress part of ``stats`` Query it, shard by
shard, instead of scanning the table: they cost what they find.

A GSI is eventually consistent: a key claimed or completed a moment ago may be missing
from a listing, or listed as it was. Every change is still a conditional write on the
table that looks at the item again, so a stale reading never frees a lease it should not.

A table made before the index has no GSI: ``idemctl init`` adds it (UpdateTable) and marks
the keys already in progress; until then these operations scan, as before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from idemctl.errors import InvalidCursor
from idemctl.model import Page, Record, Stats, Status
from idemctl.stores.base import Scan
from idemctl.stores.dynamodb.core import DynamoDBCore
from idemctl.stores.dynamodb.items import INDEX, SHARDS, ms_of, n, names_in, s, to_record

Start = tuple[int, dict[str, Any] | None]
"""Where a walk of the index is: a shard, and the item to go on after (None: its start)."""


class DynamoDBInProgress(DynamoDBCore):
    """The in-progress index: a part of DynamoDBStore."""

    _index_active: bool | None = None

    def index_status(self) -> str | None:
        """The GSI's status (ACTIVE, CREATING, ...), or None when the table has none."""
        table = self._call("describe_table")["Table"]
        for index in table.get("GlobalSecondaryIndexes") or []:
            if index.get("IndexName") == INDEX:
                return str(index.get("IndexStatus", "ACTIVE"))
        return None

    def _has_index(self) -> bool:
        """Whether the operator's reads may Query the index (asked once per store)."""
        if self._index_active is None:
            self._index_active = self.index_status() == "ACTIVE"
        return self._index_active

    def _in_progress(
        self, lease_ended_by: int | None = None, start: Start = (0, None)
    ) -> Iterator[tuple[int, list[Record]]]:
        """The in-progress keys (those whose lease ended by ``lease_ended_by``, ms), a
        Query page at a time, shard after shard from ``start``; each page with its shard."""
        shard, after = start
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
            if after:
                kwargs["ExclusiveStartKey"] = after
            response = self._call("query", **kwargs)
            items = response.get("Items", [])
            after = response.get("LastEvaluatedKey")
            yield shard, [to_record(item) for item in items]
            if not after:
                shard, after = shard + 1, None

    def _index_page(self, scan: Scan) -> Page:
        """A page of in-progress keys from the index, in shard and lease order; its cursor
        is the index position of the last key given."""
        now = datetime.now(UTC)
        query = scan.query(now)
        # A stale lease ended; a released key's lease was set to the moment it was freed.
        by = ms_of(now) if scan.stale_only or scan.released_only else None
        found: list[Record] = []
        last = 0
        for shard, records in self._in_progress(by, _parse_cursor(scan.cursor)):
            for record in records:
                if not query.matches(record):
                    continue
                if len(found) == scan.limit:
                    return Page(found, _cursor(last, found[-1]))
                found.append(record)
                last = shard
        return Page(found, None)

    def _index_stats(self) -> Stats:
        """In progress, stale, released and the oldest from the index, exact; the total
        from DescribeTable's item count (entities and records past retention the TTL has
        not deleted yet included; DynamoDB refreshes it about every six hours)."""
        now = datetime.now(UTC)
        in_progress = stale = released = 0
        oldest: datetime | None = None
        for _, records in self._in_progress():
            for r in records:
                if r.retention_over(now):  # a tombstone forgotten with --force
                    continue
                in_progress += 1
                if r.stale(now):
                    stale += 1
                elif r.released():
                    released += 1
                if oldest is None or r.created_at < oldest:
                    oldest = r.created_at
        items = int(self._call("describe_table")["Table"].get("ItemCount", 0))
        return Stats(
            max(items, in_progress),
            {Status.IN_PROGRESS: in_progress, Status.COMPLETED: None, Status.FAILED: None},
            stale,
            oldest,
            None,
            released,
            counted_by="approximate",
        )


def _cursor(shard: int, record: Record) -> str:
    assert record.lease_expires_at is not None
    after = {
        "key": s(record.key),
        "ip_shard": s(str(shard)),
        "lease_expires_at": n(ms_of(record.lease_expires_at)),
    }
    return json.dumps({"shard": shard, "after": after})


def _parse_cursor(cursor: str | None) -> Start:
    if not cursor:
        return 0, None
    try:
        start = json.loads(cursor)
        shard, after = int(start["shard"]), start["after"]
        if 0 <= shard < SHARDS and isinstance(after["key"]["S"], str):
            return shard, after
    except (ValueError, KeyError, TypeError):
        pass
    raise InvalidCursor(f"not a cursor of this DynamoDB store's in-progress keys: {cursor!r}")
