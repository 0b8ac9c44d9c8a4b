"""A worker for the race test: claims every key, runs a handler that appends to a ledger
file, retries keys that are busy. Kept in its own module so spawned processes import it."""

from __future__ import annotations

import multiprocessing
import os
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from idemctl.errors import StoreUnavailable
from idemctl.model import fingerprint
from idemctl.runner import Context, Outcome
from idemctl.stores.base import Store
from tests.backends import Backend
from tests.contract.api import opened, run
from tests.polling import wait_until


def work(store: Store, keys: list[Any], ledger: str, worker: int, barrier: Any) -> dict[str, Any]:
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

    def one_pass() -> bool:
        """Every pending key run once more; whether none is left busy."""
        nonlocal pending
        busy: list[Any] = []
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
        return not pending

    wait_until(one_pass, f"worker {worker}: every key run to an end", timeout=120, interval=0.005)
    return counts


Work = Callable[[Store, list[Any], str, int, Any], dict[str, Any]]
"""A worker: (store, its items, the ledger file, its number, a barrier to start on) -> counts."""


def process_main(
    work: Work,
    url: str,
    api: str,
    items: list[Any],
    ledger: str,
    worker: int,
    barrier: Any,
    results: Any,
) -> None:
    try:
        store = opened(url, api)
        try:
            results.put((worker, work(store, items, ledger, worker, barrier)))
        finally:
            store.close()
    except Exception as exc:
        results.put((worker, {"error": repr(exc)}))
        raise


def race(backend: Backend, work: Work, inputs: list[list[Any]], ledger: str) -> dict[int, Any]:
    """One worker per input, started at once: in spawned OS processes for stores reachable
    by URL, in threads sharing the store for in-process ones. Each worker's counts, by
    worker; a worker that failed or did not finish fails the test."""
    n = len(inputs)
    results: dict[int, Any] = {}
    if backend.url:
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(n)
        out = ctx.Queue()
        procs = [
            ctx.Process(
                target=process_main,
                args=(work, backend.url, backend.api, inputs[w], ledger, w, barrier, out),
            )
            for w in range(n)
        ]
        for p in procs:
            p.start()
        try:
            for _ in procs:
                worker, counts = out.get(timeout=180)
                results[worker] = counts
        except queue.Empty:
            pytest.fail(f"workers did not finish; exit codes {[p.exitcode for p in procs]}")
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        assert [p.exitcode for p in procs] == [0] * n
    else:
        store = backend.open()
        tbarrier = threading.Barrier(n)

        def thread_main(w: int) -> None:
            results[w] = work(store, inputs[w], ledger, w, tbarrier)

        threads = [threading.Thread(target=thread_main, args=(w,)) for w in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        assert len(results) == n
    assert [c for c in results.values() if "error" in c] == []
    return results
