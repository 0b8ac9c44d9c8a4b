"""A heartbeat: every ``lease/3`` seconds, the leases of the keys it holds extended.

On an event loop, the loop's own timer heap is the schedule, one per loop: a heartbeat is a
timer (``call_later``), and a task is made only when a beat falls due, so a handler that
ends within ``lease/3`` costs a timer pushed and cancelled, no task. In threads, the
process's one scheduler (``idemctl.runner.schedule``) is the schedule: a heap entry, and a
beat handed to its small pool when due, so a store that does not answer holds up no other
beat.

This module is the original of ``idemctl.runner.heartbeat`` (scripts/unasync.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from idemctl._unasync import is_async
from idemctl.aio.beat import beat as beat_once

if is_async():
    import asyncio
else:
    from idemctl.runner.schedule import scheduler

if TYPE_CHECKING:
    from idemctl.model import Acquired, Guard
    from idemctl.stores.base_async import AsyncStore

log = logging.getLogger("idemctl.runner")


class Heartbeat:
    """Every ``lease/3`` seconds, extends the lease of each key it holds, so a slow handler
    does not let its key lapse; work that ends within lease/3 costs it nothing. A key whose
    lease was lost is dropped (completing it says so); a store that does not answer is
    tried again at the next beat, while the lease may still hold."""

    def __init__(
        self,
        store: AsyncStore,
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
        # On the loop, nothing runs between two awaits: nothing to lock.
        self._lock: AbstractContextManager[object] = (
            nullcontext() if is_async() else threading.Lock()
        )
        if is_async():
            self._loop = asyncio.get_running_loop()
            self._timer: asyncio.TimerHandle | None = None
            self._task: asyncio.Task[None] | None = None
        else:
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
            self._next()

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

    async def stop(self) -> None:
        """No more beats. On the loop, a beat under way is cancelled and waited for (the
        caller's own cancellation still reaches it: awaiting the cancelled task under
        ``suppress`` would swallow it); in a thread, it is waited for (5 s at most)."""
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
            scheduled = self._scheduled
        if not scheduled:
            return
        if is_async():
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            task, self._task = self._task, None
            if task is None:
                return
            task.cancel()
            await asyncio.wait([task])
            if not task.cancelled() and task.exception() is not None:
                log.warning("heartbeat stopped: %r", task.exception())
        else:
            scheduler().stopped()
            if self._beating.acquire(timeout=5):
                self._beating.release()

    async def __aenter__(self) -> Heartbeat:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _next(self) -> None:
        """The next beat, due ``lease/3`` from now."""
        if is_async():
            self._timer = self._loop.call_later(self.lease / 3, self._due)
        else:
            scheduler().push(time.monotonic() + self.lease / 3, self)

    if is_async():

        def _due(self) -> None:
            """A beat fell due: its task."""
            self._timer = None
            self._task = self._loop.create_task(self.beat(), name=self.name)

    async def beat(self) -> None:
        """One beat (a task on the loop, or in the scheduler's pool), then the next one
        scheduled."""
        if is_async():
            await self._beat()
            self._task = None
            self._next()
        else:
            with self._beating:
                if self.stopped:
                    return
                try:
                    self._beat()
                finally:
                    with self._lock:
                        again = not self.stopped
                    if again:
                        self._next()

    async def _beat(self) -> None:
        with self._lock:
            held = list(self._held.values())
            guards = list(self._guards.values())
        began = time.monotonic()
        if await beat_once(self.store, self.lease, held, guards, lambda a: self.done([a.key])):
            self.kept_since = began
