"""A worker for the race test: claims every key, runs a handler that appends to a ledger
file, retries keys that are busy. Kept in its own module so spawned processes import it."""

from __future__ import annotations

import os
import random
import time
from typing import Any

from idemctl.errors import StoreUnavailable
from idemctl.model import fingerprint
from idemctl.runner import Context, Outcome, run
from idemctl.stores import open_store
from idemctl.stores.base import Store


def work(store: Store, keys: list[str], ledger: str, worker: int, barrier: Any) -> dict[str, int]:
    def handler(ctx: Context) -> dict[str, Any]:
        # The side effect, counted outside the store: one line per handler run.
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.key} {worker} {ctx.fencing_token}\n".encode())
        finally:
            os.close(fd)
        time.sleep(0.001)  # widen the window in which another worker could slip in
        return {"worker": worker}

    counts = {"executed": 0, "replayed": 0, "busy": 0, "unavailable": 0, "other": 0}
    pending = random.Random(worker).sample(keys, len(keys))
    barrier.wait()
    deadline = time.monotonic() + 120
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker {worker}: {len(pending)} keys still busy")
        busy = []
        for key in pending:
            try:
                result = run(store, key, handler, fingerprint=fingerprint(key), lease=30)
            except StoreUnavailable:
                # As a consumer does: nothing was decided, so fail closed and come back later
                # (a SQLite writer can wait out its busy timeout on a loaded disk).
                busy.append(key)
                counts["unavailable"] += 1
                continue
            if result.outcome is Outcome.BUSY:
                busy.append(key)
                counts["busy"] += 1
            elif result.outcome in (Outcome.EXECUTED, Outcome.REPLAYED):
                counts[result.outcome.value] += 1
            else:  # a lost lease or worse: the test asserts there are none
                counts["other"] += 1
        pending = busy
        if pending:
            time.sleep(0.005)
    return counts


def process_main(
    url: str, keys: list[str], ledger: str, worker: int, barrier: Any, results: Any
) -> None:
    try:
        store = open_store(url)
        try:
            results.put((worker, work(store, keys, ledger, worker, barrier)))
        finally:
            store.close()
    except Exception as exc:
        results.put((worker, {"error": repr(exc)}))
        raise
