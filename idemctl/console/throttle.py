"""What bounds one caller's cost to the console: failures counted in a sliding window (a
login's per name and per address), a gate that lets a few in at once and turns the rest
away (password hashing, on the event loop), and slots for work in threads that may take
long (audits), each with the time after which to try again (``Retry-After``)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from types import TracebackType
from typing import TypeVar

T = TypeVar("T")


class Throttled(Exception):
    """Turned away: try again in ``retry_after`` seconds."""

    def __init__(self, retry_after: int, why: str = "busy") -> None:
        super().__init__(why)
        self.retry_after = retry_after


class TimedOut(Exception):
    """Work that did not end within its ``seconds`` (it may go on in its thread)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"not done within {seconds:g} s")
        self.seconds = seconds


class Window:
    """At most ``limit`` events per key in any ``seconds``: ``wait`` says how long until
    the next is allowed. Holds at most ``most`` keys (the oldest forgotten first), so a
    caller inventing keys costs bounded memory."""

    def __init__(
        self,
        limit: int,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
        most: int = 10_000,
    ) -> None:
        self.limit, self.seconds, self.clock, self.most = limit, seconds, clock, most
        self._events: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def wait(self, key: str) -> int:
        """Whole seconds until ``key`` may have another event; 0: now."""
        with self._lock:
            events = self._fresh(key)
            if events is None or len(events) < self.limit:
                return 0
            return max(1, math.ceil(events[0] + self.seconds - self.clock()))

    def add(self, key: str) -> None:
        with self._lock:
            events = self._fresh(key)
            if events is None:
                if len(self._events) >= self.most:
                    self._forget()
                events = self._events[key] = deque(maxlen=self.limit)
            events.append(self.clock())

    def clear(self, key: str) -> None:
        with self._lock:
            self._events.pop(key, None)

    def _fresh(self, key: str) -> deque[float] | None:
        events = self._events.get(key)
        if events is None:
            return None
        since = self.clock() - self.seconds
        while events and events[0] <= since:
            events.popleft()
        if not events:
            del self._events[key]
            return None
        return events

    def _forget(self) -> None:
        since = self.clock() - self.seconds
        for key in [k for k, e in self._events.items() if not e or e[-1] <= since]:
            del self._events[key]
        while len(self._events) >= self.most:
            del self._events[next(iter(self._events))]


class Gate:
    """``async with gate:`` lets ``at_once`` in, keeps up to ``waiting`` more waiting, and
    raises ``Throttled`` for the rest at once (they never queue without bound)."""

    def __init__(self, at_once: int, waiting: int, retry_after: int = 1) -> None:
        self.at_once, self.waiting, self.retry_after = at_once, waiting, retry_after
        self._inside = 0
        self._semaphore: asyncio.Semaphore | None = None

    async def __aenter__(self) -> None:
        if self._inside >= self.at_once + self.waiting:
            raise Throttled(self.retry_after, "too many at once")
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.at_once)
        self._inside += 1
        try:
            await self._semaphore.acquire()
        except BaseException:
            self._inside -= 1
            raise

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._semaphore is not None
        self._semaphore.release()
        self._inside -= 1


class Slots:
    """Work run in a thread of its own, ``at_once`` at most (``Throttled`` beyond), awaited at
    most ``seconds`` (``TimedOut``: the work goes on, holding its slot until it ends, so
    that a hung one never lets more start)."""

    def __init__(self, at_once: int, seconds: float) -> None:
        self.at_once, self.seconds = at_once, seconds
        self._free = threading.BoundedSemaphore(at_once)

    def run(self, work: Callable[[], T], name: str = "idemctl-console-work") -> T:
        if not self._free.acquire(blocking=False):
            raise Throttled(max(1, min(30, math.ceil(self.seconds))), f"{self.at_once} running")
        done: Future[T] = Future()

        def go() -> None:
            try:
                done.set_result(work())
            except BaseException as exc:  # handed to the waiter, whatever it is
                done.set_exception(exc)
            finally:
                self._free.release()

        threading.Thread(target=go, name=name, daemon=True).start()
        try:
            return done.result(timeout=self.seconds)
        except FutureTimeout:
            raise TimedOut(self.seconds) from None
