"""What the async API costs and gives, on one Redis server: keys run to completion a second
(claim, a no-op handler, complete) through

  sync run, one at a time             the baseline
  sync run, 16 threads                what a threaded service gets today
  aio.run, one at a time              the async API's own cost a key
  aio.run, 16 and 64 coroutines       one event loop, awaits overlapped

each on new keys, the best of --reps runs of --keys keys, ratios against the baseline of
the same run. Starts its own redis-server on a free loopback port (stopped by PID), or
uses --redis-url.

    .venv/bin/python benchmarks/aio_run.py [--keys 5000] [--reps 3] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import stdout_console
from redis_claims import own_redis_server

from idemctl import aio, open_store, run


def rate(keys: int, seconds: float) -> float:
    return keys / seconds


def sync_run(url: str, keys: int, threads: int) -> float:
    store = open_store(f"{url}?prefix={uuid.uuid4().hex}:")
    names = [f"k-{i}" for i in range(keys)]
    try:
        started = time.perf_counter()
        if threads == 1:
            for key in names:
                run(store, key, lambda ctx: None, heartbeat=False)
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(
                    pool.map(lambda key: run(store, key, lambda ctx: None, heartbeat=False), names)
                )
        return rate(keys, time.perf_counter() - started)
    finally:
        store.close()


async def _noop(ctx: Any) -> None:
    return None


async def async_run(url: str, keys: int, concurrency: int) -> float:
    async with aio.open_store(f"{url}?prefix={uuid.uuid4().hex}:") as store:
        names = iter([f"k-{i}" for i in range(keys)])

        async def worker() -> None:
            for key in names:
                await aio.run(store, key, _noop, heartbeat=False)

        await aio.run(store, "warm-up", _noop)  # the connection and the scripts
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return rate(keys, time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    contenders: dict[str, Callable[[str], float]] = {
        "sync run, one at a time": lambda url: sync_run(url, args.keys, 1),
        "sync run, 16 threads": lambda url: sync_run(url, args.keys, 16),
        "aio.run, one at a time": lambda url: asyncio.run(async_run(url, args.keys, 1)),
        "aio.run, 16 coroutines": lambda url: asyncio.run(async_run(url, args.keys, 16)),
        "aio.run, 64 coroutines": lambda url: asyncio.run(async_run(url, args.keys, 64)),
    }

    def measure(url: str) -> dict[str, float]:
        best = dict.fromkeys(contenders, 0.0)
        for _ in range(args.reps):  # alternated, so drift hits every contender alike
            for name, contender in contenders.items():
                best[name] = max(best[name], contender(url))
        return best

    if args.redis_url:
        best = measure(args.redis_url)
    else:
        with own_redis_server() as url:
            best = measure(url)
    from rich.table import Table

    baseline = best["sync run, one at a time"]
    table = Table(title=f"keys run to completion a second, one Redis, best of {args.reps}")
    for column in ("contender", "keys/s", "vs sync one at a time"):
        table.add_column(column, justify="left" if column == "contender" else "right")
    for name, value in best.items():
        table.add_row(name, f"{value:,.0f}", f"{value / baseline:.2f}x")
    stdout_console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
