"""The process's heartbeat schedule in threads: what the event loop's timer heap is to the
async heartbeat (``idemctl.aio.heartbeat``), for the sync one written from it.

A heartbeat is an entry in one heap ordered by when its next beat is due: a handler that
finishes before ``lease/3`` costs a heap push and a lazy pop, no thread of its own. When a
beat is due, the scheduler's thread hands it to a small pool, so a store that does not
answer holds up no other beat.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

BEAT_THREADS = 4
"""Beats of several heartbeats that fall due together run side by side, up to this many."""


class Beating(Protocol):
    """What the scheduler runs: a heartbeat's ``beat()``, unless it was stopped meanwhile."""

    stopped: bool

    def beat(self) -> None: ...


class _Scheduler:
    """The process's heartbeats by when their next beat is due; one thread waits for the
    earliest. A stopped heartbeat stays in the heap until it comes up (or until stopped
    ones are half of it, when the heap is rebuilt without them)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Beating]] = []
        self._order = itertools.count()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._stopped = 0

    def push(self, due: float, beat: Beating) -> None:
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
