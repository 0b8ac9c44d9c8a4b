"""A store whose server is killed mid-run: shared by the store tests of real servers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from idemctl import Acquired, StoreUnavailable
from idemctl.stores.base import Store
from tests.polling import wait_until


def claims_across_a_kill(
    store: Store, kill: Callable[[], None], *, warmup: int, after: int, hang: float, lease: float
) -> None:
    """Claim new keys in a thread, ``kill`` the server once ``warmup`` claims answered, and
    check what a consumer relies on: no call hangs, every answer is right (a new key is
    Acquired as its first attempt, not taken over) or StoreUnavailable, and the ``after``
    calls begun after the kill all fail closed, each within ``hang`` seconds."""
    results: list[tuple[int, float, object]] = []  # (call number, seconds, outcome or error)
    stop, killed = threading.Event(), threading.Event()
    after_kill: list[int] = []

    def loop() -> None:
        i = 0
        while not stop.is_set():
            started_after_kill = killed.is_set()
            started = time.monotonic()
            try:
                outcome: object = store.claim(f"k-{i}", None, lease)
            except Exception as exc:
                outcome = exc
            results.append((i, time.monotonic() - started, outcome))
            if started_after_kill:
                after_kill.append(i)
                if len(after_kill) >= after:
                    return
            i += 1

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    wait_until(lambda: len(results) >= warmup, "the claim loop getting going", hang, interval=0.01)
    kill()
    killed.set()
    worker.join(hang * 6)
    stop.set()
    assert not worker.is_alive(), f"claims hang after the kill: {results[-3:]}"

    unexpected = [r for r in results if not isinstance(r[2], Acquired | StoreUnavailable)]
    assert unexpected == []
    acquired = [r[2] for r in results if isinstance(r[2], Acquired)]
    assert all(a.attempt == 1 and not a.takeover for a in acquired)
    for i, seconds, outcome in results:
        if i in after_kill:
            assert isinstance(outcome, StoreUnavailable), outcome
            assert seconds < hang
    assert len(after_kill) == after
