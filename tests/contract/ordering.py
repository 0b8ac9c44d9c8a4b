"""Workers for the sequence guard's tests: each delivers events of entities through
``run(..., order=...)``, writes every handler run to a ledger file (the effect, counted
outside the store) and comes back to busy events later. In a module of its own so spawned
processes import it."""

from __future__ import annotations

import math
import os
import time
from typing import Any

from idemctl.errors import StoreUnavailable
from idemctl.model import Order
from idemctl.runner import Context, Outcome
from idemctl.stores.base import Store
from tests.contract.api import run
from tests.polling import wait_until

STALL = 90
"""Seconds a worker may go without any of its events coming to an end."""

Event = tuple[str, int]
"""(entity, sequence): its key is ``entity#sequence``."""


def deliver(
    store: Store, events: list[Event], ledger: str, worker: int, barrier: Any = None
) -> dict[str, Any]:
    """Run every event once to an end; returns the outcomes by event and their counts."""

    def handler(ctx: Context) -> int:
        assert ctx.order is not None
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.order.entity} {ctx.order.sequence} {worker}\n".encode())
        finally:
            os.close(fd)
        time.sleep(0.001)  # widen the window in which another worker could slip in
        return ctx.order.sequence

    outcomes: dict[str, list[str]] = {}
    pending = list(events)
    if barrier is not None:
        barrier.wait()
    # A stall, not slowness, fails the run: no event came to an end for STALL seconds (a
    # loaded machine makes a whole run slow; a lease left behind frees itself in 30 s).
    deadline = time.monotonic() + STALL
    last: dict[str, str] = {}

    def one_pass() -> bool:
        """Every pending event tried once more; whether none is left to try."""
        nonlocal pending, deadline
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"worker {worker}: {len(pending)} events ended nothing in {STALL} s: {last}"
            )
        again: list[Event] = []
        for entity, sequence in pending:
            key = f"{entity}#{sequence}"
            try:
                result = run(store, key, handler, order=Order(entity, sequence), lease=30)
            except StoreUnavailable as exc:
                last[key] = f"unavailable: {exc}"
                again.append((entity, sequence))
                continue
            if result.outcome is Outcome.BUSY:
                last[key] = f"busy (entity applied {result.last})"
                again.append((entity, sequence))
                continue
            last.pop(key, None)
            deadline = time.monotonic() + STALL
            outcomes.setdefault(key, []).append(result.outcome.value)
        pending = again
        return not pending

    # The stall above fails the run, not a deadline for the whole: a loaded machine is slow.
    wait_until(one_pass, f"worker {worker}: every event ended", timeout=math.inf, interval=0.003)
    return outcomes
