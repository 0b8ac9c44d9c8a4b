"""The operator's operations on a Redis store: get, scan, stats, unlock, unlock_stale,
forget and purge. Bulk operations walk the keyspace with SCAN, a batch at a time, and
change each key with the same scripts as the protocol, which look at it again."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta

from idemctl.errors import InvalidCursor, KeyNotFound
from idemctl.model import Page, Record, Stats, Status, validate_key
from idemctl.stores import redis as package
from idemctl.stores.base import Progress
from idemctl.stores.machine import check_forgettable, live_lease, not_unlockable
from idemctl.stores.queries import Query, Scan, stats_of
from idemctl.stores.redis.client import ClusterNode
from idemctl.stores.redis.core import glob_escape
from idemctl.stores.redis.index import RedisIndex
from idemctl.stores.redis.ops import live
from idemctl.stores.redis.records import fields_of, parse_reply, server_time, text, to_record


class RedisAdmin(RedisIndex):
    """The operator's operations: a part of RedisStore. Once ``idemctl init`` has counted
    the records (``index_ready``), stats, the in-progress pages, unlock_stale and purge read
    the index; other pages walk the keyspace."""

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

    def _scan_batch(
        self, node: ClusterNode | None, cursor: int, match: str
    ) -> tuple[int, list[Record]]:
        # On a cluster, each primary is scanned through its own connection: the keys it
        # returns live there, so their records are read there in one pipeline too.
        client = self._client if node is None else node.redis_connection
        # SCAN_COUNT is read from the package at each call, where it may be set.
        cursor, found = client.scan(cursor, match=match, count=package.SCAN_COUNT, _type="string")
        rkeys = [text(k) for k in found]
        records = []
        if node is None:
            texts = client.mget(rkeys) if rkeys else []
        else:  # a cluster node refuses MGET across slots, even its own
            pipe = client.pipeline(transaction=False)
            for rkey in rkeys:
                pipe.get(rkey)
            texts = pipe.execute()
        for rkey, raw in zip(rkeys, texts, strict=True):
            fields = fields_of(raw)
            if fields is not None:  # gone since SCAN saw it, or not ours
                records.append(to_record(self._key_of(rkey), fields))
        return int(cursor), records

    def _iterate(
        self, prefix: str | None = None, start: str | None = None
    ) -> Iterator[tuple[str, list[Record]]]:
        """Every record under ``prefix``, a SCAN batch at a time, with the position
        ("node:cursor") the batch started at."""
        match = glob_escape(self.prefix) + "{" + glob_escape(prefix or "") + "*"
        nodes = self._nodes()
        node_index, cursor = (0, 0) if not start else (int(p) for p in start.split(":"))
        with self._guard():
            while node_index < len(nodes):
                at = f"{node_index}:{cursor}"
                cursor, records = self._scan_batch(nodes[node_index], cursor, match)
                if cursor == 0:
                    node_index += 1
                yield at, records

    def _scan_page(self, scan: Scan) -> Page:
        in_progress = scan.stale_only or scan.released_only or scan.status is Status.IN_PROGRESS
        if in_progress and self.index_ready():
            return self._index_page(scan)
        return self._walk_page(scan)

    def _walk_page(self, scan: Scan) -> Page:
        """Pages in SCAN order, sorted by key within each SCAN batch. A cursor is the
        position of a batch and the last key taken from it: SCAN cannot stop mid-batch,
        so the next page scans that batch again and goes on after that key. A full page
        gets a cursor only if a record after it matches: SCAN goes on until it finds one
        or ends."""
        with self._guard():
            query = scan.query(self._now())
        position, after = _parse_cursor(scan.cursor)
        limit = scan.limit
        found: list[Record] = []
        for at, records in self._iterate(scan.prefix, position):
            batch = sorted(
                (r for r in records if query.matches(r) and (after is None or r.key > after)),
                key=lambda r: r.key,
            )
            after = None
            if found and len(found) == limit:  # full: the next page starts at the next match
                if batch:
                    return Page(found, f"{at}/")
                continue
            room = limit - len(found)
            if len(batch) > room:
                found += batch[:room]
                return Page(found, f"{at}/{found[-1].key}" if found else at)
            found += batch
        return Page(found, None)

    def stats(self, exact: bool = False) -> Stats:
        if not exact and self.index_ready():
            return self._index_stats()
        with self._guard():
            now = self._now()
        return stats_of([r for _, records in self._iterate() for r in records], now)

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

    def _batches(self, query: Callable[[datetime], Query]) -> Iterator[list[Record]]:
        """The records matching ``query`` at the server's time, a SCAN batch at a time."""
        with self._guard():
            matching = query(self._now())
        for _, records in self._iterate():
            yield [r for r in records if matching.matches(r)]

    def unlock_stale(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> list[str]:
        def stale(now: datetime) -> Query:
            return Query(lease_expired_at=now - timedelta(seconds=older_than), owned=True)

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

        def over(now: datetime) -> Query:
            return Query(retention_over_at=now - timedelta(seconds=older_than))

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


def _parse_cursor(cursor: str | None) -> tuple[str | None, str | None]:
    """A ``scan`` cursor's batch position ("node:cursor") and the last key taken from that
    batch ("node:cursor/" starts the batch afresh)."""
    if cursor is None:
        return None, None
    position, _, after = cursor.partition("/")
    if not re.fullmatch(r"\d+:\d+", position):
        raise InvalidCursor(f"not a cursor of this Redis store: {cursor!r}")
    return position, after or None
