"""The watch behind ``wait=``, on a store of the test's own: what its poller reads, and
when it wakes waiters."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from idemctl.model import Record, Status
from idemctl.stores.waiting import Watch, moved

NOW = datetime.now(UTC)
HELD = Record(
    "k", Status.IN_PROGRESS, None, "owner-1", 7, 1, NOW, NOW,
    lease_expires_at=NOW + timedelta(seconds=600),
)  # fmt: skip


class Reads:
    """A store whose ``get_many`` answers ``record`` and counts the reads."""

    def __init__(self, record: Record | None) -> None:
        self.record, self.reads = record, 0

    def get_many(self, keys: list[str]) -> dict[str, Record]:
        self.reads += 1
        return {k: self.record for k in keys} if self.record else {}


def test_what_counts_as_moved_on() -> None:
    assert moved(None, HELD, NOW)  # forgotten, or past its retention
    assert moved(replace(HELD, status=Status.COMPLETED), HELD, NOW)
    assert moved(replace(HELD, owner=None), HELD, NOW)  # released
    assert moved(replace(HELD, fencing_token=8), HELD, NOW)  # taken over meanwhile
    assert moved(HELD, HELD, NOW + timedelta(seconds=601))  # its lease is over
    assert not moved(HELD, HELD, NOW)


def test_a_holder_that_extends_its_lease_is_not_read_over_and_over() -> None:
    """The waiter saw a lease that has ended since, but the holder extended it: the poller
    keeps the record it read (the lease as extended) and polls at its interval, not at
    once again and again."""
    store = Reads(HELD)
    watch = Watch(store, poll=0.05, max_poll=0.05)  # type: ignore[arg-type]
    seen = replace(HELD, lease_expires_at=NOW - timedelta(seconds=5))
    with watch.watching("k") as watching:
        started = time.monotonic()
        woke = watching.wait(seen, 0.5)
        elapsed = time.monotonic() - started
    assert not woke
    assert 1 <= store.reads <= elapsed / 0.05 + 2, (store.reads, elapsed)


def test_one_read_a_poll_for_many_waiters_of_a_key() -> None:
    store = Reads(HELD)
    watch = Watch(store, poll=0.05, max_poll=0.05)  # type: ignore[arg-type]
    results: list[Any] = []

    def wait() -> None:
        with watch.watching("k") as watching:
            results.append(watching.wait(HELD, 0.5))

    started = time.monotonic()
    threads = [threading.Thread(target=wait) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    assert results == [False] * 20
    assert store.reads <= elapsed / 0.05 + 2, (store.reads, elapsed)  # not 20 a poll


def test_a_hint_wakes_every_waiter_of_its_key_and_no_other() -> None:
    watch = Watch(Reads(HELD), poll=10, max_poll=10)  # type: ignore[arg-type]
    woke: dict[str, bool] = {}
    ready = threading.Barrier(3)

    def wait(key: str) -> None:
        with watch.watching(key) as watching:
            ready.wait()
            woke[key] = watching.wait(HELD, 5 if key == "k" else 0.3)

    threads = [threading.Thread(target=wait, args=(k,)) for k in ("k", "other")]
    for t in threads:
        t.start()
    ready.wait()
    watch.notify(["k"])
    for t in threads:
        t.join()
    assert woke == {"k": True, "other": False}
    assert watch.waited == []
