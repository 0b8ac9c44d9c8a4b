"""This process's guarded requests, every middleware's: what
``idemctl.metrics.http_families`` shows."""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from dataclasses import dataclass, field

SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
"""The added-latency histogram's buckets: 100 µs to 1 s."""

OUTCOMES = (
    "new",  # the app ran and its response was stored
    "not_stored",  # the app ran; a 5xx or a body too big: the key released
    "error",  # the app raised: the key released
    "replayed",
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
