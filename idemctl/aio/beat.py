"""A heartbeat's beat: every lease it keeps extended (a lost one dropped), every hold on an
entity asked again. The heartbeat (``idemctl.aio.heartbeat``, and the sync one written from
it) beats with its own concurrency's copy of this.

This module is the original of ``idemctl.runner.beat`` (scripts/unasync.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from idemctl.errors import LeaseLost, StoreError

if TYPE_CHECKING:
    from idemctl.model import Acquired, Guard
    from idemctl.stores.base_async import AsyncStore

log = logging.getLogger("idemctl.runner")


async def beat(
    store: AsyncStore,
    lease: float,
    held: Sequence[Acquired],
    guards: Sequence[Guard],
    dropped: Callable[[Acquired], None],
) -> bool:
    """Extend ``held``'s leases and ask ``guards`` again, for ``lease`` seconds; a key whose
    lease was lost (completed meanwhile, or taken) goes to ``dropped`` (completing it says
    so); a store that does not answer is logged, and tried again at the next beat. True
    when the store answered every request."""
    unanswered: StoreError | None = None
    if guards:  # asking again extends the hold; a lost one shows when it settles
        try:
            await store.guard_many(guards, lease)
        except StoreError as exc:
            unanswered = exc
    for a in held:
        try:
            await store.extend(a.key, a.owner, a.fencing_token, lease)
        except LeaseLost as exc:
            log.debug("heartbeat: %s", exc)
            dropped(a)
        except StoreError as exc:
            unanswered = exc
    if unanswered is not None:
        log.warning("heartbeat could not extend the leases it holds: %s", unanswered)
    return unanswered is None
