"""``idemctl.runner.heartbeat`` as a task: one heartbeat for the key an async attempt holds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from idemctl.errors import LeaseLost, StoreError

if TYPE_CHECKING:
    from idemctl.aio.store import AsyncStore
    from idemctl.model import Acquired, Guard

log = logging.getLogger("idemctl.runner")


class Heartbeat:
    """Every ``lease/3`` seconds, a task extends the leases of ``held`` (and the entity holds
    ``guards`` name) until stopped: the thread of ``idemctl.runner.Heartbeat``, as a task."""

    def __init__(
        self,
        store: AsyncStore,
        lease: float,
        held: Iterable[Acquired] = (),
        guards: Iterable[Guard] = (),
        *,
        name: str = "idemctl-heartbeat",
    ) -> None:
        self.store, self.lease = store, lease
        self._held = list(held)
        self._guards = list(guards)
        self._task = asyncio.create_task(self._beat(), name=name)

    async def stop(self) -> None:
        """Cancel the beats and wait for them to end. The caller's own cancellation still
        reaches it (awaiting the cancelled task under ``suppress`` would swallow it)."""
        self._task.cancel()
        await asyncio.wait([self._task])
        if not self._task.cancelled() and self._task.exception() is not None:
            log.warning("heartbeat stopped: %r", self._task.exception())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            unanswered: StoreError | None = None
            if self._guards:  # asking again extends the hold; a lost one shows when it settles
                try:
                    await self.store.guard_many(self._guards, self.lease)
                except StoreError as exc:
                    unanswered = exc
            for a in list(self._held):
                try:
                    await self.store.extend(a.key, a.owner, a.fencing_token, self.lease)
                except LeaseLost as exc:  # completed meanwhile, or taken: completion says
                    log.debug("heartbeat: %s", exc)
                    self._held.remove(a)
                except StoreError as exc:
                    unanswered = exc
            if unanswered is not None:
                log.warning("heartbeat could not extend the leases it holds: %s", unanswered)
