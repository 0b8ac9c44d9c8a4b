"""What the operator's reads share across stores: a filter over records (``RecordFilter``), what
``scan`` was asked for (``Scan``), the counts ``stats`` reports, the server clock's finding,
and admin batches."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from idemctl.model import Finding, Record, Stats, Status

CLOCK_SKEW_TOLERANCE = 5.0
"""Seconds ``check()`` lets a store's clock differ from this machine's before it warns."""


@dataclass(frozen=True)
class RecordFilter:
    """A filter over records, pushed down into SQL by stores that have it."""

    status: Status | None = None
    prefix: str | None = None
    after: str | None = None
    limit: int | None = None
    live_at: datetime | None = None
    """Leave out records past retention at this time."""
    lease_expired_at: datetime | None = None
    """Only in-progress records whose lease ended (or was released) by this time."""
    owned: bool | None = None
    """Only records with (True) or without (False) an owner."""
    retention_over_at: datetime | None = None
    """Only records whose retention ended by this time."""
    created_by: datetime | None = None
    """Only records created by this time."""

    def matches(self, r: Record) -> bool:
        if self.status is not None and r.status is not self.status:
            return False
        if self.prefix is not None and not r.key.startswith(self.prefix):
            return False
        if self.after is not None and r.key <= self.after:
            return False
        if self.live_at is not None and r.retention_over(self.live_at):
            return False
        if self.lease_expired_at is not None and not (
            r.status is Status.IN_PROGRESS
            and r.lease_expires_at is not None
            and r.lease_expires_at <= self.lease_expired_at
        ):
            return False
        if self.owned is not None and (r.owner is not None) != self.owned:
            return False
        if self.created_by is not None and r.created_at > self.created_by:
            return False
        return self.retention_over_at is None or r.retention_over(self.retention_over_at)


@dataclass(frozen=True)
class Scan:
    """What ``scan`` was asked for (see ``Store.scan``)."""

    status: Status | None = None
    stale_only: bool = False
    prefix: str | None = None
    limit: int = 100
    cursor: str | None = None
    older_than: float = 0.0
    released_only: bool = False

    @property
    def nothing(self) -> bool:
        """The filters cannot match any record: stale or released keys are in progress,
        and a key is never both stale (owned) and released (not owned)."""
        return (self.stale_only and self.released_only) or (
            (self.stale_only or self.released_only)
            and self.status not in (None, Status.IN_PROGRESS)
        )

    def query(self, now: datetime) -> RecordFilter:
        """What it selects at ``now``, for stores that filter records themselves. Stale: in
        progress, an owner, its lease ended (Record.stale); released: in progress, no owner."""
        return RecordFilter(
            status=Status.IN_PROGRESS if self.stale_only or self.released_only else self.status,
            live_at=now,
            lease_expired_at=now if self.stale_only else None,
            owned=True if self.stale_only else False if self.released_only else None,
            created_by=now - timedelta(seconds=self.older_than) if self.older_than else None,
            prefix=self.prefix,
        )


def server_clock_finding(skew: float) -> Finding:
    """What ``check()`` says of a store whose clock is ``skew`` seconds ahead of ours."""
    fine = abs(skew) < CLOCK_SKEW_TOLERANCE
    return Finding(
        "clock",
        fine,
        f"server clock {skew * 1000:+.0f} ms from this machine's",
        None if fine else "leases are judged by the server's clock; fix NTP on one of them",
    )


def batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    """``items`` in lists of at most ``size`` (itertools.batched is Python 3.12+)."""
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@dataclass
class InProgressTally:
    """Keys in progress as ``stats`` reports them: how many, stale, released, the oldest."""

    count: int = 0
    stale: int = 0
    released: int = 0
    oldest: datetime | None = None

    def add(self, r: Record, now: datetime) -> None:
        self.count += 1
        if r.stale(now):
            self.stale += 1
        elif r.released():
            self.released += 1
        if self.oldest is None or r.created_at < self.oldest:
            self.oldest = r.created_at


def stats_of(records: Iterator[Record] | Sequence[Record], now: datetime) -> Stats:
    by_status = dict.fromkeys(Status, 0)
    past = 0
    tally = InProgressTally()
    for r in records:
        if r.retention_over(now):
            past += 1
            continue
        by_status[r.status] += 1
        if r.status is Status.IN_PROGRESS:
            tally.add(r, now)
    return Stats(
        sum(by_status.values()), by_status, tally.stale, tally.oldest, past, tally.released
    )
