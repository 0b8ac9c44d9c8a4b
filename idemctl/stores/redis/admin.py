"""The operator's operations on a Redis store: get, scan, stats, unlock, unlock_stale,
forget and purge. Bulk operations walk the keyspace with SCAN, a batch at a time, and
change each key with the same scripts as the protocol, which look at it again."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta

from idemctl.errors import KeyNotFound
from idemctl.model import Record, RecordPage, Stats, Status, validate_key
from idemctl.stores.base import Progress
from idemctl.stores.machine import check_forgettable, live_lease, not_unlockable
from idemctl.stores.queries import RecordFilter, Scan, stats_of
from idemctl.stores.redis.client import Client, ClusterNode
from idemctl.stores.redis.core import glob_escape
from idemctl.stores.redis.index import RedisIndex
from idemctl.stores.redis.ops import live
from idemctl.stores.redis.records import fields_of, parse_reply, server_time, text, to_record
from idemctl.stores.redis.walk import Batch, parse_cursor, read_strings, walk_page


class RedisAdmin(RedisIndex):
    """The operator's operations: a part of RedisStore. Once ``idemctl init`` has counted
    the records (``index_ready``), stats, the in-progress and failed pages, unlock_stale and
    purge read the index; other pages walk the keyspace (``RedisWalk``: in SCAN order, sorted by key
    within each SCAN batch, ``WALK_KEYS`` examined a page at most)."""

    def get(self, key: str) -> Record | None:
        return live(key, *self._read(self._rkey(key)))

    def get_many(self, keys: Sequence[str]) -> dict[str, Record]:
        keys = list(dict.fromkeys(keys))
        if not keys:
            return {}
        rkeys = [self._rkey(key) for key in keys]
        with self._guard():
            pipe = self._client.pipeline(transaction=False)
            if self.cluster:  # MGET is refused across slots; the pipeline sends GETs by node
                for rkey in rkeys:
                    pipe.get(rkey)
                texts, now = pipe.execute(), self._now()
            else:  # the records and the server's clock in one round trip
                pipe.execute_command("MGET", *rkeys)
                pipe.time()
                texts, (seconds, micros) = pipe.execute()
                now = server_time(seconds, micros)
        found = {}
        for key, raw in zip(keys, texts, strict=True):
            record = live(key, raw, now)
            if record is not None:
                found[key] = record
        return found

    def _read_records(
        self, node: ClusterNode | None, client: Client, rkeys: list[str]
    ) -> list[Record]:
        """The records at ``rkeys``, read on their node; none where a key is gone since
        SCAN saw it, or is not ours."""
        records = []
        for rkey, raw in zip(rkeys, read_strings(node, client, rkeys), strict=True):
            fields = fields_of(raw)
            if fields is not None:
                records.append(to_record(self._key_of(rkey), fields))
        return records

    def _iterate(
        self, prefix: str | None = None, start: str | None = None
    ) -> Iterator[Batch[Record]]:
        """Every record under ``prefix``, a SCAN call at a time (``RedisWalk``)."""
        match = glob_escape(self.prefix) + "{" + glob_escape(prefix or "") + "*"
        return self._scan_batches(match, start, self._read_records)

    def _scan_page(self, scan: Scan) -> RecordPage:
        in_progress = scan.stale_only or scan.released_only or scan.status is Status.IN_PROGRESS
        if in_progress and self.index_ready():
            return self._index_page(scan)
        if scan.status is Status.FAILED and self.failed_indexed():
            return self._index_page(scan)
        with self._guard():
            query = scan.query(self._now())
        position, after = parse_cursor(scan.cursor, "keys")
        batches = (
            (at, [r for r in records if query.matches(r)], then)
            for at, records, then in self._iterate(scan.prefix, position)
        )
        found, cursor = walk_page(batches, after, scan.limit, lambda r: r.key)
        return RecordPage(found, cursor)

    def stats(self, exact: bool = False) -> Stats:
        if not exact and self.index_ready():
            return self._index_stats()
        with self._guard():
            now = self._now()
        return stats_of([r for _, records, _ in self._iterate() for r in records], now)

    def unlock(self, key: str, force: bool = False) -> Record:
        validate_key(key)
        code, fields = parse_reply(self._one("unlock", ("one", "1" if force else "0"), key))
        if fields is None:
            raise KeyNotFound(key)
        record = to_record(key, fields)
        if code == "not_in_progress":
            raise not_unlockable(record)
        if code == "live":
            raise live_lease(record)
        return record

    def _batches(self, query: Callable[[datetime], RecordFilter]) -> Iterator[list[Record]]:
        """The records matching ``query`` at the server's time, a SCAN batch at a time."""
        with self._guard():
            matching = query(self._now())
        for _, records, _ in self._iterate():
            yield [r for r in records if matching.matches(r)]

    def unlock_stale(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> list[str]:
        def stale(now: datetime) -> RecordFilter:
            return RecordFilter(lease_expired_at=now - timedelta(seconds=older_than), owned=True)

        ready = self.index_ready()
        keys: list[str] = []
        for batch in self._index_stale(older_than) if ready else self._batches(stale):
            if dry_run or not batch:
                keys += [r.key for r in batch]
                continue
            # The script looks at each key again: it may have been claimed meanwhile.
            shared = ("stale", round(older_than * 1000))
            replies = self._call("unlock", shared, [(r.key, ()) for r in batch])
            freed = zip(batch, replies, strict=True)
            keys += [r.key for r, reply in freed if text(reply[0]) == "ok"]
            if progress is not None:
                progress(len(batch))
        return sorted(keys)

    def forget(self, key: str, force: bool = False) -> Record:
        validate_key(key)
        # The tombstone keeps the fencing counter for a retention, then expires by TTL.
        shared = ("1" if force else "0", self._ms(self.default_retention))
        code, fields = parse_reply(self._one("forget", shared, key))
        if fields is None:
            raise KeyNotFound(key)
        record = to_record(key, fields)
        if code == "in_progress":
            check_forgettable(record, force)
        return record

    def purge(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> int:
        if self.index_ready():
            return self._index_purge(older_than, dry_run, progress)

        def over(now: datetime) -> RecordFilter:
            return RecordFilter(retention_over_at=now - timedelta(seconds=older_than))

        purged = 0
        for batch in self._batches(over):
            if dry_run or not batch:
                purged += len(batch)
                continue
            replies = self._call("purge", (round(older_than * 1000),), [(r.key, ()) for r in batch])
            purged += sum(int(r) for r in replies)
            if progress is not None:
                progress(len(batch))
        return purged
