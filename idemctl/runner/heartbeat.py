"""One heartbeat per process: a single scheduler extends every live lease in time.

A ``Heartbeat`` (one per attempt, one per batch) is an entry in the process's scheduler, a
heap ordered by when its next beat is due: a handler that finishes before ``lease/3`` costs
a heap push and a lazy pop, no thread of its own. When a beat is due, the scheduler's
thread hands it to a small pool, so a store that does not answer holds up no other beat.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from idemctl.runner.beat import beat

if TYPE_CHECKING:
    from idemctl.model import Acquired, Guard
    from idemctl.stores.base import Store


BEAT_THREADS = 4
"""Beats of several heartbeats that fall due together run side by side, up to this many."""


class _Scheduler:
    """The process's heartbeats by when their next beat is due; one thread waits for the
    earliest. A stopped heartbeat stays in the heap until it comes up (or until stopped
    ones are half of it, when the heap is rebuilt without them)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Heartbeat]] = []
        self._order = itertools.count()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._stopped = 0

    def push(self, due: float, beat: Heartbeat) -> None:
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._order), beat))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="idemctl-heartbeat", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is beat:  # sooner than what the thread waits for
                self._cond.notify()

    def stopped(self) -> None:
        """A heartbeat in the heap was stopped: drop the stopped ones once they are half."""
        with self._cond:
            self._stopped += 1
            if self._stopped > 64 and self._stopped * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].stopped]
                heapq.heapify(self._heap)
                self._stopped = 0

    @property
    def pending(self) -> int:
        """Heartbeats in the heap, stopped ones not yet dropped included."""
        return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        _, _, beat = heapq.heappop(self._heap)
                        if beat.stopped:
                            self._stopped = max(0, self._stopped - 1)
                            continue
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(BEAT_THREADS, "idemctl-heartbeat")
                pool = self._pool
            pool.submit(beat.beat)


_scheduler = _Scheduler()


def _forked() -> None:
    """A child process starts with a scheduler of its own (the parent's thread is not in it)."""
    global _scheduler  # noqa: PLW0603 - the process's one scheduler
    _scheduler = _Scheduler()


os.register_at_fork(after_in_child=_forked)


def scheduler() -> _Scheduler:
    return _scheduler


class Heartbeat:
    """Every ``lease/3`` seconds, extends the lease of each key it holds, so a slow handler
    does not let its key lapse; work that ends within lease/3 costs it nothing. A key whose
    lease was lost is dropped (completing it says so); a store that does not answer is
    tried again at the next beat, while the lease may still hold."""

    def __init__(
        self,
        store: Store,
        lease: float,
        held: Iterable[Acquired] = (),
        guards: Iterable[Guard] = (),
        *,
        name: str = "idemctl-heartbeat",
    ) -> None:
        """Keys ``held`` (and the entity holds ``guards`` name) are held from the start."""
        self.store, self.lease, self.name = store, lease, name
        self._held: dict[str, Acquired] = {}
        self._guards: dict[str, Guard] = {}
        self._lock = threading.Lock()
        self._beating = threading.Lock()
        self._scheduled = False
        self.stopped = False
        self.kept_since = 0.0
        """When (``time.monotonic()``) the last beat the store answered in full began: the
        leases it holds run at least ``lease`` seconds from then."""
        held = list(held)
        if held:
            self.hold(held, guards)

    def hold(self, acquired: Iterable[Acquired], guards: Iterable[Guard] = ()) -> None:
        """Keep these keys' leases alive too, and the holds on their entities that
        ``guards`` name."""
        with self._lock:
            self._held.update((a.key, a) for a in acquired)
            self._guards.update((g.key, g) for g in guards)
            schedule = not self._scheduled and not self.stopped
            self._scheduled = True
        if schedule:
            _scheduler.push(time.monotonic() + self.lease / 3, self)

    @property
    def holding(self) -> int:
        """Keys whose leases it keeps alive now."""
        return len(self._held)

    def done(self, keys: Iterable[str]) -> None:
        """Finished (completed, failed or released): their leases need no more extending."""
        with self._lock:
            for key in keys:
                self._held.pop(key, None)
                self._guards.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._guards.clear()

    def stop(self) -> None:
        """No more beats; a beat under way is waited for (5 s at most)."""
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
            scheduled = self._scheduled
        if scheduled:
            _scheduler.stopped()
            if self._beating.acquire(timeout=5):
                self._beating.release()

    def __enter__(self) -> Heartbeat:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def beat(self) -> None:
        """One beat (in the scheduler's pool), then the next one scheduled."""
        with self._beating:
            if self.stopped:
                return
            with self._lock:
                held = list(self._held.values())
                guards = list(self._guards.values())
            try:
                self._extend(held, guards)
            finally:
                with self._lock:
                    again = not self.stopped
                if again:
                    _scheduler.push(time.monotonic() + self.lease / 3, self)

    def _extend(self, held: list[Acquired], guards: list[Guard]) -> None:
        began = time.monotonic()
        if beat(self.store, self.lease, held, guards, lambda a: self.done([a.key])):
            self.kept_since = began
