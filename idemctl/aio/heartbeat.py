"""``idemctl.runner.heartbeat`` on an event loop: the loop's own timer heap is the
scheduler, one per loop. An attempt's heartbeat is a timer (``call_later``); a task is made
only when a beat falls due, so a handler that ends within ``lease/3`` costs a timer pushed
and cancelled, no task."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from idemctl.aio.beat import beat

if TYPE_CHECKING:
    from idemctl.model import Acquired, Guard
    from idemctl.stores.base_async import AsyncStore

log = logging.getLogger("idemctl.runner")


class Heartbeat:
    """Every ``lease/3`` seconds, extends the leases of ``held`` (and the entity holds
    ``guards`` name) until stopped."""

    def __init__(
        self,
        store: AsyncStore,
        lease: float,
        held: Iterable[Acquired] = (),
        guards: Iterable[Guard] = (),
        *,
        name: str = "idemctl-heartbeat",
    ) -> None:
        self.store, self.lease, self.name = store, lease, name
        self._held = list(held)
        self._guards = list(guards)
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(lease / 3, self._due)
        self._task: asyncio.Task[None] | None = None
        self.kept_since = 0.0
        """When (``time.monotonic()``) the last beat the store answered in full began: the
        leases it holds run at least ``lease`` seconds from then."""

    def _due(self) -> None:
        self._timer = None
        self._task = self._loop.create_task(self._beat_then_next(), name=self.name)

    async def _beat_then_next(self) -> None:
        await self._beat()
        self._task = None
        self._timer = self._loop.call_later(self.lease / 3, self._due)

    async def stop(self) -> None:
        """No more beats; a beat under way is cancelled and waited for. The caller's own
        cancellation still reaches it (awaiting the cancelled task under ``suppress``
        would swallow it)."""
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

    async def _beat(self) -> None:
        began = time.monotonic()
        if await beat(self.store, self.lease, list(self._held), self._guards, self._held.remove):
            self.kept_since = began
