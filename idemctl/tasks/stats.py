"""This process's guarded task runs, every queue's door's: what
``idemctl.metrics.task_families`` shows, by queue, task and outcome."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field

OUTCOMES = (
    "new",  # the task ran and its result was stored
    "replayed",  # the key was done: the stored result returned, the task not run
    "error",  # the task raised: recorded (retriable, or final), raised to the queue
    "busy",  # another attempt held the key (past any wait): sent back to the queue
    "mismatch",  # the key with other arguments: not run
    "failed",  # the key failed for good: not run
    "lease_lost",  # the task ran, but another attempt took the key over meanwhile
)


@dataclass
class TaskStats:
    runs: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    seconds: defaultdict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, queue: str, task: str, outcome: str, seconds: float) -> None:
        """One guarded call of ``task`` on ``queue`` that ended in ``outcome`` after
        ``seconds`` (the task's run and the store's round trips)."""
        with self._lock:
            self.runs[queue, task, outcome] += 1
            self.seconds[queue, task] += seconds

    def snapshot(self) -> tuple[dict[tuple[str, str, str], int], dict[tuple[str, str], float]]:
        with self._lock:
            return dict(self.runs), dict(self.seconds)


STATS = TaskStats()
