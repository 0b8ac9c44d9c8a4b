"""The last hour, as the console saw it: a thread of the console process reads the store's
counts (``operate.stats``, what the overview shows) once every ``INTERVAL`` seconds into a
ring of ``SIZE`` samples, and the overview draws from them how many keys completed and
failed in each minute and how many were stale.

Completions and failures are the growth of the counts between two samples (a purge or the
store's expiry shrinks them: that minute counts 0); stale is the count at the sample. A
sample the store did not answer is kept as a gap. The ring is all it keeps: a restart
starts the hour again.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemctl import operate
from idemctl.operate.results import Counts

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from idemctl.console.views import Where

INTERVAL = 60.0
"""Seconds between two samples (a test's ``sitecustomize`` may set it smaller)."""
SIZE = 61
"""Samples kept: an hour of minutes between them."""
SERIES = ("completed", "failed", "stale")
log = logging.getLogger("idemctl.console.sampler")


@dataclass(frozen=True)
class Sample:
    at: float
    """Seconds since the Unix epoch."""
    completed: int | None
    failed: int | None
    stale: int | None
    """None: the store did not say (unreachable, or a count it cannot tell)."""


def counts_of(where: Where) -> tuple[int | None, int | None, int | None]:
    """The store's completed, failed and stale counts now (Powertools: completed and stale;
    it has no failed state)."""
    found = operate.stats(where.target)
    if isinstance(found, Counts):
        by = {s.value: n for s, n in found.stats.by_status.items()}
        return by.get("completed"), by.get("failed"), found.stats.stale
    states = {s.value: n for s, n in found.by_state.items()}
    return states.get("completed"), None, states.get("stale")


class Sampler:
    """A ring of samples, filled by a thread of its own every ``interval`` seconds."""

    def __init__(
        self,
        read: Callable[[], tuple[int | None, int | None, int | None]],
        interval: float | None = None,
        size: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.read, self.clock = read, clock
        self.interval = INTERVAL if interval is None else interval
        self.ring: deque[Sample] = deque(maxlen=SIZE if size is None else size)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Sample:
        """Read the counts once and keep them (a gap when the store does not answer)."""
        at = self.clock()
        try:
            found = Sample(at, *self.read())
        except Exception as exc:  # a store down, a timeout: a gap in the chart, not a crash
            log.warning("the console's sample of the store failed: %s", type(exc).__name__)
            found = Sample(at, None, None, None)
        with self._lock:
            self.ring.append(found)
        return found

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="idemctl-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self.ring)

    def document(self) -> dict[str, Any]:
        """The samples, and each interval between two of them: completed and failed in it,
        stale at its end."""
        samples = self.samples()
        steps = []
        for before, after in itertools.pairwise(samples):
            steps.append({
                "at": after.at,
                "completed": _growth(before.completed, after.completed),
                "failed": _growth(before.failed, after.failed),
                "stale": after.stale,
            })  # fmt: skip
        return {
            "interval_seconds": self.interval,
            "samples": [vars(s) for s in samples],
            "steps": steps,
        }


def _growth(before: int | None, after: int | None) -> int | None:
    if before is None or after is None:
        return None
    return max(0, after - before)


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """The console app's lifespan: its sampler runs while it serves (``app.state.history``)."""
    where = app.state.console.where
    history = Sampler(lambda: counts_of(where))
    app.state.history = history
    history.sample()  # the first before the console serves: what happens next is measured
    history.start()
    try:
        yield
    finally:
        history.stop()
