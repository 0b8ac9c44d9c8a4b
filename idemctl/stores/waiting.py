"""Waiting for a key in flight (``wait=``): one ``Watch`` per store and process.

A caller that finds its key in progress registers it with the store's watch and sleeps
until the key may have moved on: completed, failed, released, forgotten, or its lease over.
Two things wake it:

- a hint: the store's own notification (Redis publishes from its scripts, PostgreSQL
  NOTIFYs from the completing statement; every store tells the watch of its own process's
  completions at once);
- the watch's poller: one thread that reads every key this process waits for in one
  ``get_many`` per interval (backing off to ``max_poll`` while nothing moves), and wakes
  early for a lease that ends sooner. N waiters on a key cost one read an interval, not N.

A hint is never the truth: the waiter claims again, and the claim decides (a replay, a
takeover, or busy still, and then it waits again until its deadline).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from idemctl.errors import StoreError
from idemctl.model import Record, Status

if TYPE_CHECKING:
    from idemctl.stores.base import Store

log = logging.getLogger("idemctl.stores")

MAX_WAIT = 3600.0
"""The longest ``wait=`` a call may give (seconds)."""
SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""The wait time histogram's buckets."""


@dataclass
class WaitStats:
    """This process's waits, every store's: what ``idemctl.metrics.wait_families`` shows."""

    begun: int = 0
    woken: int = 0
    """Waits that ended with the key settled by another: its result, or the key to take."""
    timed_out: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(SECONDS) + 1))
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def ended(self, seconds: float, woken: bool) -> None:
        with self._lock:
            if woken:
                self.woken += 1
            else:
                self.timed_out += 1
            self.buckets[bisect.bisect_left(SECONDS, seconds)] += 1
            self.seconds += seconds

    def started(self) -> None:
        with self._lock:
            self.begun += 1

    def snapshot(self) -> tuple[int, int, int, list[int], float]:
        """begun, woken, timed_out, the histogram's buckets and its sum, read together."""
        with self._lock:
            return self.begun, self.woken, self.timed_out, list(self.buckets), self.seconds


STATS = WaitStats()


def moved(record: Record | None, seen: Record | None, now: datetime) -> bool:
    """Whether a key whose holder a waiter saw (``seen``) may be claimed or replayed now."""
    if record is None or record.status is not Status.IN_PROGRESS:
        return True
    if seen is not None and record.fencing_token != seen.fencing_token:
        return True  # another attempt took it: claim again, see who holds it now
    return not record.owner or (
        record.lease_expires_at is not None and record.lease_expires_at <= now
    )


class _Waited:
    """One key this process waits for: the holder its waiters last saw, and a count of
    the hints about it (a waiter sleeps until the count moves)."""

    __slots__ = ("futures", "generation", "seen", "waiters")

    def __init__(self, seen: Record | None) -> None:
        self.seen = seen
        self.generation = 0
        self.waiters = 0
        self.futures: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()


class Watch:
    """The keys this process waits for on one store, and their wake-ups. ``poll`` is the
    first interval between reads, ``max_poll`` the longest after backing off."""

    def __init__(self, store: Store, poll: float, max_poll: float) -> None:
        self.store, self.poll, self.max_poll = store, poll, max_poll
        self._cond = threading.Condition(threading.Lock())
        self._keys: dict[str, _Waited] = {}
        self._poller: threading.Thread | None = None
        self._fresh = False
        self.listening: Callable[[], None] | None = None
        """Stops the store's notifications (Redis pub/sub, PostgreSQL LISTEN), if any."""
        self.on_key: Callable[[str], None] | None = None
        """Called with each key as it begins to be waited for (a Redis Cluster subscribes
        to the key's slot)."""

    # What wakes waiters ----------------------------------------------------------------

    def notify(self, keys: Iterable[str]) -> None:
        """A hint that these keys moved on: their waiters claim again."""
        with self._cond:
            woke = False
            for key in keys:
                waited = self._keys.get(key)
                if waited is None:
                    continue
                waited.generation += 1
                woke = True
                for loop, future in waited.futures:
                    with suppress(RuntimeError):  # its loop is closed: nobody waits there
                        loop.call_soon_threadsafe(_resolve, future)
            if woke:
                self._cond.notify_all()

    @property
    def waited(self) -> list[str]:
        with self._cond:
            return list(self._keys)

    # Waiting -----------------------------------------------------------------------------

    def watching(self, key: str) -> Watching:
        """Wake-ups for ``key`` from now on: hints that arrive before the caller sleeps
        count too (register, claim again, then sleep)."""
        with self._cond:
            waited = self._keys.get(key)
            first = waited is None
            if waited is None:
                waited = self._keys[key] = _Waited(None)
            waited.waiters += 1
            watching = Watching(self, key, waited)
        if first and self.on_key is not None:
            try:
                self.on_key(key)
            except Exception as exc:
                log.debug("wake-ups for %r: %s", key, exc)
        return watching

    def _unregister(self, key: str, waited: _Waited) -> None:
        with self._cond:
            waited.waiters -= 1
            if waited.waiters == 0 and self._keys.get(key) is waited:
                del self._keys[key]

    def _polling(self) -> None:
        """The poller runs (the caller holds the lock): started, or told of a new key."""
        self._fresh = True
        if self._poller is None:
            self._poller = threading.Thread(
                target=self._poll, name="idemctl-wait-poller", daemon=True
            )
            self._poller.start()
        else:
            self._cond.notify_all()

    # The poller --------------------------------------------------------------------------

    def _poll(self) -> None:
        interval = self.poll
        while True:
            with self._cond:
                if not self._keys:
                    self._poller = None
                    return
                due = time.monotonic() + interval
                wall = time.time()
                for waited in self._keys.values():
                    ends = waited.seen.lease_expires_at if waited.seen else None
                    if ends is not None:  # a lease that ends sooner: read just after it
                        due = min(due, time.monotonic() + ends.timestamp() - wall + 0.01)
                self._fresh = False
                while not self._fresh and self._keys and (left := due - time.monotonic()) > 0:
                    self._cond.wait(left)
                if self._fresh:  # a new waiter: its key read soon, the back-off over
                    interval = self.poll
                    self._fresh = False
                    continue
                seen = {key: waited.seen for key, waited in self._keys.items()}
            if not seen:
                continue
            try:
                records = self.store.get_many(list(seen))
            except StoreError as exc:  # the waiters' own claims will say; try again later
                log.debug("wait poller: %s", exc)
                interval = min(interval * 2, self.max_poll)
                continue
            now = datetime.now(UTC)
            moving = [key for key, s in seen.items() if moved(records.get(key), s, now)]
            if moving:
                self.notify(moving)
            with self._cond:  # a holder still there: its lease as now extended, to wake by
                for key, record in records.items():
                    still = self._keys.get(key)
                    if still is not None and key not in moving:
                        still.seen = record
            interval = self.poll if moving else min(interval * 1.5, self.max_poll)

    def close(self) -> None:
        """Stops the store's notifications; waiters still there go on polling."""
        stop, self.listening = self.listening, None
        if stop is not None:
            stop()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Watching:
    """A caller's registration for one key's wake-ups (``Watch.watching``); ``close`` it."""

    def __init__(self, watch: Watch, key: str, waited: _Waited) -> None:
        self.watch, self.key, self._waited = watch, key, waited
        self._generation = waited.generation

    def wait(self, seen: Record | None, seconds: float) -> bool:
        """Sleep until a hint about the key since the last wake-up (True) or ``seconds``
        are over (False); ``seen`` is the record the last claim found."""
        watch, waited = self.watch, self._waited
        with watch._cond:
            waited.seen = seen
            watch._polling()
            woke = watch._cond.wait_for(lambda: waited.generation != self._generation, seconds)
            self._generation = waited.generation
        return woke

    async def wait_async(self, seen: Record | None, seconds: float) -> bool:
        """``wait`` for a coroutine: the event loop goes on meanwhile."""
        watch, waited = self.watch, self._waited
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (loop, future)
        with watch._cond:
            waited.seen = seen
            if waited.generation != self._generation:
                self._generation = waited.generation
                return True
            waited.futures.add(entry)
            watch._polling()
        try:
            done, _ = await asyncio.wait([future], timeout=seconds)
        finally:
            with watch._cond:
                waited.futures.discard(entry)
                self._generation = waited.generation
        return bool(done)

    def close(self) -> None:
        self.watch._unregister(self.key, self._waited)

    def __enter__(self) -> Watching:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
