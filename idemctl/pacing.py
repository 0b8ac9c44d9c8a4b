"""Pacing a bulk operation: ``paced`` wraps the ``progress`` callback that ``purge`` and
``unlock_stale`` call after each batch, and waits there until the keys done so far have
taken at least 1/rate s each. Every batch is its own short transaction, script call or
request, and nothing is held while it waits, so the consumers beside it only ever meet
one batch. A batch itself runs at full speed: the rate holds on average over batches
(stores.base.BATCH keys at most each)."""

from __future__ import annotations

import time
from collections.abc import Callable

from idemctl.stores.base import Progress

MAX_RATE = 1_000_000.0


def paced(
    rate: float,
    progress: Progress | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Progress:
    """A progress callback that calls ``progress`` (if any), then waits so that the keys
    reported so far went at ``rate`` a second at most."""
    if not 0 < rate <= MAX_RATE:
        raise ValueError(f"a rate is above 0 and at most {MAX_RATE:,.0f} keys a second")
    started = clock()
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(n)
        wait = started + done / rate - clock()
        if wait > 0:
            sleep(wait)

    return advance
