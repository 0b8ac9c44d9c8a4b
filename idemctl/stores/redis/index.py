"""The index the operator's commands read on Redis instead of every key (see lua/_lib.lua):
LIVE (in-progress keys by lease), COUNTS and DUE (completed, failed, tombstones and
entities, by the second their TTL ends), GONE (tombstones by the end of their retention),
FAILED (failed keys by the end of their retention).
The scripts that change records keep it; ``idemctl init`` counts the records written
before it and then marks the store ready. Until then the operator's commands read every
key, as before.

What each command costs with the index: ``stats`` one script per index (one on a server,
one per hash slot on a cluster) plus tally.lua, which reads the in-progress records where
they are, 500 a call; ``list --stale``,
``list --status in_progress``, ``unlock --stale`` read the in-progress keys; ``list
--status failed`` the failed ones; ``purge`` reads the tombstones. None of them grows with
the completed keys the store holds."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from idemctl.errors import InvalidCursor
from idemctl.model import Record, RecordPage, Stats, Status
from idemctl.stores.base import Progress
from idemctl.stores.queries import InProgressTally, RecordFilter, Scan
from idemctl.stores.redis.core import glob_escape
from idemctl.stores.redis.records import fields_of, from_ms, text, to_record
from idemctl.stores.redis.walk import RedisWalk

EXPIRE_DUE = 100_000
"""Seconds that are over one stats script takes out of the counts at most (a day is
86,400): ``expire_due()`` in lua/_lib.lua."""

Position = tuple[int, float, str]
"""Where a walk of an index's sorted sets is: the index's number, a score, a member."""

LIVE, GONE, FAILED = 0, 3, 4
"""The sorted sets of the index, by their place among its keys (``INDEX_NAMES``)."""
COLUMNS = {LIVE: 4, GONE: 6, FAILED: 7}
"""Where stats.lua's reply says how many members each has."""


def _chunk() -> int:
    """Members read from a sorted set at a time, records read in one round trip, keys in one
    script call: an admin batch, SCAN_COUNT (read at each call: it may be set)."""
    from idemctl.stores import redis as package

    return package.SCAN_COUNT


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


class RedisIndex(RedisWalk):
    """Reading the index: a part of RedisStore."""

    def index_ready(self) -> bool:
        """Whether every record is counted: ``idemctl init`` ran since the index came."""
        with self._guard():
            return bool(self._client.exists(self._ready_key()))

    def failed_indexed(self) -> bool:
        """Whether every failed record is in FAILED: ``idemctl init`` ran since it came."""
        with self._guard():
            return bool(self._client.exists(self._ready_key("failed")))

    def build_index(self) -> int:
        """Count the records and entities written before the index (one SCAN of the
        keyspace; index.lua leaves those already counted alone, so this may run while
        consumers work, and again), then mark the store ready; how many it counted."""
        counted = 0
        patterns = [glob_escape(self.prefix) + p for p in ("{*", "entity:{*")]
        with self._guard():
            for node in self._nodes():
                client = self._client if node is None else node.redis_connection
                for pattern in patterns:
                    cursor = None
                    while cursor != 0:
                        cursor, found = client.scan(
                            cursor or 0, match=pattern, count=_chunk(), _type="string"
                        )
                        items = [(text(k), ()) for k in found]
                        if items:
                            replies = self.script_runner.call("index", (), items)
                            counted += sum(int(r) for r in replies)
            now = str(_ms(self._now()))
            self._client.set(self._ready_key(), now)
            self._client.set(self._ready_key("failed"), now)
        return counted

    # Walks -----------------------------------------------------------------------------

    def _walk(
        self,
        which: int,
        high: float,
        after: Position | None = None,
        numbers: list[int] | None = None,
        low: float | None = None,
    ) -> Iterator[tuple[Position, str]]:
        """The members of every index's sorted set ``which`` (LIVE, GONE, FAILED) scored at
        most ``high`` (and above ``low``), in (index, score, member) order, each with its
        position; after ``after`` when given; only those ``numbers`` when given."""
        indexes = self._indexes()
        first = after[0] if after else 0
        for number in numbers if numbers is not None else self._nonempty(which, first):
            zkey = indexes[number][which]
            since = after if after is not None and after[0] == number else None
            for score, member in self._zwalk(zkey, high, since, low):
                yield (number, score, member), member

    def _nonempty(self, which: int, first: int) -> list[int]:
        """The numbers (from ``first``) of the indexes whose set ``which`` (LIVE, GONE,
        FAILED) has members: on a cluster, read from each slot's stats script (settling
        nothing), sent to every node at once."""
        if self._cluster is None:
            return [0] if first == 0 else []
        column = COLUMNS[which]
        replies = self._stats_replies(due=0)
        return [n for n in range(first, len(replies)) if replies[n][column]]

    def _zwalk(
        self, zkey: str, high: float, after: Position | None, floor: float | None = None
    ) -> Iterator[tuple[float, str]]:
        """Sorted set ``zkey``'s members scored at most ``high`` (above ``floor``), in
        (score, member) order after ``after``'s score and member, an admin batch at a time.
        Each batch starts again from the last member given, by score, so members the caller
        moved or removed meanwhile shift nothing; only a run of equal scores longer than a
        batch is paged by offset."""
        seen: tuple[float, str] | None = (after[1], after[2]) if after is not None else None
        low: float | str = seen[0] if seen is not None else "-inf"
        if floor is not None and (seen is None or seen[0] <= floor):
            low, seen = f"({floor:.0f}", None
        top: float | str = "+inf" if high == float("inf") else high
        offset, size = 0, _chunk()
        while True:
            with self._guard():
                pipe = self._client.pipeline(transaction=False)
                pipe.execute_command(
                    "ZRANGEBYSCORE", zkey, low, top, "WITHSCORES", "LIMIT", offset, size
                )
                (reply,) = pipe.execute()
            chunk = _pairs(reply)
            fresh = [pair for pair in chunk if seen is None or pair > seen]
            for pair in fresh:
                seen = pair
                yield pair
            if len(chunk) < size:
                return
            if fresh and seen is not None:
                low, offset = seen[0], 0
            else:  # a batch of equal scores, all given already
                offset += size

    def _records(self, rkeys: Sequence[str]) -> list[Record | None]:
        """The records at ``rkeys`` (None where there is none), in one round trip."""
        if not rkeys:
            return []
        with self._guard():
            if self._cluster is None:
                texts = self._client.mget(list(rkeys))
            else:  # MGET refuses keys of several slots
                pipe = self._client.pipeline(transaction=False)
                for rkey in rkeys:
                    pipe.get(rkey)
                texts = pipe.execute()
        out: list[Record | None] = []
        for rkey, raw in zip(rkeys, texts, strict=True):
            fields = fields_of(raw)
            out.append(None if fields is None else to_record(self._key_of(rkey), fields))
        return out

    def _chunks(
        self,
        which: int,
        high: float,
        after: Position | None = None,
        numbers: list[int] | None = None,
        low: float | None = None,
    ) -> Iterator[list[tuple[Position, str, Record | None]]]:
        """_walk's members an admin batch at a time, each with its record."""
        batch: list[tuple[Position, str]] = []
        size = _chunk()
        for item in self._walk(which, high, after, numbers, low):
            batch.append(item)
            if len(batch) == size:
                yield self._with_records(batch)
                batch = []
        if batch:
            yield self._with_records(batch)

    def _with_records(
        self, batch: list[tuple[Position, str]]
    ) -> list[tuple[Position, str, Record | None]]:
        records = self._records([member for _, member in batch])
        return [(at, m, r) for (at, m), r in zip(batch, records, strict=True)]

    # The operator's reads ----------------------------------------------------------------

    def _stats_replies(self, due: int = EXPIRE_DUE) -> list[list[int]]:
        """Every index's stats.lua reply, once the seconds that are over are out of the
        counts (up to ``due`` a call: a day's seconds; more only after a long quiet)."""
        items = [(keys[0], ()) for keys in self._indexes()]
        while True:
            answers = self.script_runner.call("stats", (due,), items)
            replies = [[int(x) for x in r] for r in answers]
            if not due or all(r[5] < due for r in replies):
                return replies

    @staticmethod
    def _counts(replies: list[list[int]]) -> tuple[int, int, int, int]:
        """Completed, failed, tombstones and entities, over every index."""
        c, f, t, e = (sum(r[i] for r in replies) for i in range(4))
        return c, f, t, e

    def _index_entities(self) -> int:
        return self._counts(self._stats_replies())[3]

    def _tally(self, numbers: list[int]) -> InProgressTally:
        """The keys in progress in the indexes ``numbers``, tallied by tally.lua where they
        are, an admin batch of each LIVE a call: the first batch of every index in one
        pipelined round trip (a call per slot on a cluster), then those that have more."""
        indexes, size = self._indexes(), _chunk()
        tally = InProgressTally()
        at = dict.fromkeys(numbers, 0)
        while at:
            items = [(indexes[n][LIVE], (rank,)) for n, rank in at.items()]
            replies = self.script_runner.call("tally", (size,), items)
            for n, reply in zip(list(at), replies, strict=True):
                count, stale, released, oldest, then = reply
                tally.count += int(count)
                tally.stale += int(stale)
                tally.released += int(released)
                created = from_ms(text(oldest))
                if created is not None and (tally.oldest is None or created < tally.oldest):
                    tally.oldest = created
                if int(then) < 0:
                    del at[n]
                else:
                    at[n] = int(then)
        return tally

    def _index_stats(self) -> Stats:
        replies = self._stats_replies()
        completed, failed, gone, _ = self._counts(replies)
        tally = self._tally([n for n, reply in enumerate(replies) if reply[4]])
        by_status = {
            Status.IN_PROGRESS: tally.count,
            Status.COMPLETED: completed,
            Status.FAILED: failed,
        }
        return Stats(
            sum(by_status.values()),
            by_status,
            tally.stale,
            tally.oldest,
            gone,
            tally.released,
            counted_by="index",
        )

    def _index_page(self, scan: Scan) -> RecordPage:
        """A page of in-progress keys (stale, released, or all) from LIVE, in (slot, lease,
        key) order, or of failed keys from FAILED, in (slot, end of retention, key) order;
        the cursor is the position of the last key given."""
        with self._guard():
            now = self._now()
        query = scan.query(now)
        failed = scan.status is Status.FAILED
        which, name = (FAILED, "failed") if failed else (LIVE, "live")
        # A stale lease ended; a released key's lease was set to the moment it was freed.
        high = _ms(now) if scan.stale_only or scan.released_only else float("inf")
        low = _ms(now) if failed else None  # the failed keys' retention ends after now
        found: list[Record] = []
        last: Position | None = None
        for chunk in self._chunks(which, high, _parse_position(scan.cursor, name), low=low):
            for at, _, record in chunk:
                if record is None or not query.matches(record):
                    continue
                if len(found) == scan.limit and last is not None:
                    return RecordPage(found, _position(last, name))
                found.append(record)
                last = at
        return RecordPage(found, None)

    def _index_stale(self, older_than: float) -> Iterator[list[Record]]:
        """The records whose lease ended at least ``older_than`` seconds ago, an admin batch
        at a time, from LIVE."""
        with self._guard():
            now = self._now()
        cutoff = now - timedelta(seconds=older_than)
        stale = RecordFilter(lease_expired_at=cutoff, owned=True, live_at=now)
        for chunk in self._chunks(LIVE, _ms(cutoff)):
            yield [r for _, _, r in chunk if r is not None and stale.matches(r)]

    def _index_purge(self, older_than: float, dry_run: bool, progress: Progress | None) -> int:
        with self._guard():
            now = self._now()
        cutoff = now - timedelta(seconds=older_than)
        over = RecordFilter(retention_over_at=cutoff)
        purged = 0
        for chunk in self._chunks(GONE, _ms(cutoff)):
            batch = [r for _, _, r in chunk if r is not None and over.matches(r)]
            if dry_run:
                purged += len(batch)
                continue
            # Every key goes to the script, which deletes what is still over and takes keys
            # whose TTL ended out of GONE.
            shared = (round(older_than * 1000),)
            replies = self.script_runner.call("purge", shared, [(m, ()) for _, m, _ in chunk])
            purged += sum(int(r) for r in replies)
            if progress is not None:
                progress(len(chunk))
        return purged


def _pairs(reply: list[Any]) -> list[tuple[float, str]]:
    """ZRANGEBYSCORE ... WITHSCORES as (score, member) pairs: redis-py gives pairs, or the
    flat list the server sent."""
    if reply and isinstance(reply[0], (list, tuple)):
        return [(float(score), text(member)) for member, score in reply]
    return [(float(reply[i + 1]), text(reply[i])) for i in range(0, len(reply), 2)]


def _position(at: Position, name: str) -> str:
    number, score, member = at
    return f"{name}:{number}:{score:.0f}:{member}"


def _parse_position(cursor: str | None, name: str) -> Position | None:
    if cursor is None:
        return None
    match = re.fullmatch(rf"{name}:(\d+):(-?\d+):(.*)", cursor, re.S)
    if match is None:
        what = "failed" if name == "failed" else "in-progress"
        raise InvalidCursor(f"not a cursor of this Redis store's {what} keys: {cursor!r}")
    return int(match[1]), float(match[2]), match[3]
