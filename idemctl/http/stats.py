"""This process's guarded requests, every middleware's: what
``idemctl.metrics.http_families`` shows."""

from __future__ import annotations

import bisect
import threading
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
"""The added-latency histogram's buckets: 100 µs to 1 s."""

OUTCOMES = (
    "new",  # the app ran and its response was stored
    "not_stored",  # the app ran; a 5xx or a status before the endpoint: the key released
    "error",  # the app raised: the key released
    "unavailable",  # the store did not answer: 503
    "replayed",
    "too_large",  # the key's response was too large to keep: 422
    "conflict",  # in progress: 409
    "mismatch",  # the key with another request: 422
    "failed",  # the key failed for good: 422
    "missing_key",
    "invalid_key",
)


@dataclass
class HttpStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    buckets: list[int] = field(default_factory=lambda: [0] * (len(SECONDS) + 1))
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, outcome: str, added: float) -> None:
        """One request that ended in ``outcome``, with ``added`` seconds spent outside the
        app (reading the body, the store's round trips, buffering)."""
        with self._lock:
            self.outcomes[outcome] += 1
            self.buckets[bisect.bisect_left(SECONDS, added)] += 1
            self.seconds += added

    def snapshot(self) -> tuple[dict[str, int], list[int], float]:
        with self._lock:
            counts = {name: self.outcomes[name] for name in OUTCOMES}
            return counts, list(self.buckets), self.seconds


STATS = HttpStats()


class Durations:
    """How long the app took, for the last ``keep`` stored responses of each route (the
    ``routes`` most recently seen): what a 409's ``Retry-After`` estimates from."""

    def __init__(self, keep: int = 32, routes: int = 512) -> None:
        self._keep, self._routes = keep, routes
        self._seen: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, method: str, path: str, seconds: float) -> None:
        route = (method, path)
        with self._lock:
            kept = self._seen.get(route)
            if kept is None:
                kept = self._seen[route] = deque(maxlen=self._keep)
                if len(self._seen) > self._routes:
                    self._seen.popitem(last=False)
            else:
                self._seen.move_to_end(route)
            kept.append(seconds)

    def typical(self, method: str, path: str) -> float | None:
        """The route's 75th percentile of recent durations; None before any."""
        with self._lock:
            kept = self._seen.get((method, path))
            if not kept:
                return None
            ordered = sorted(kept)
        return ordered[min(len(ordered) - 1, len(ordered) * 3 // 4)]


DURATIONS = Durations()
