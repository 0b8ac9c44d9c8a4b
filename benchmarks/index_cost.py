"""What Redis's index (lua/_lib.lua: the in-progress set, the counts by second) costs the hot
path: `idemctl consume` batched, no-op handler, on the same broker, topic and Redis server,
with the index and with the same scripts where count(), uncount() and settle() do nothing,
rounds alternating so the machine's drift falls on both alike.

    .venv/bin/python benchmarks/index_cost.py [--messages 20000] [--rounds 3] [--batch 500]

Prints each round's rate, the median of each, the time per message with over without
(target at most 1.15x), and the Redis server's µs per message (INFO commandstats). Starts
tansu and redis-server on free loopback ports and stops each by its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchError, stdout_console, stop_on_sigterm
from consume_throughput import CONSUMER, produce, sent
from redis_claims import command_stats, own_redis_server, script_commands

TARGET = 1.15
NO_INDEX = """
-- The benchmark's baseline: the index's upkeep does nothing (records still carry n).
local function count() end
local function uncount() end
local function settle() return 0 end
"""


def without_index(store: Any) -> None:
    """Swap ``store``'s scripts for ones whose index upkeep does nothing."""
    from idemctl.resources import read_resource
    from idemctl.stores.redis.scripts import LIB, Script

    runner = store._scripts
    for name in list(runner.scripts):
        source = LIB + NO_INDEX + "\n" + read_resource("lua", f"{name}.lua")
        sha = hashlib.sha1(source.encode()).hexdigest()
        runner.scripts[name] = Script(name, source, sha)
    runner._by_sha = {s.sha: s.name for s in runner.scripts.values()}
    runner.load()


def one_round(
    bootstrap: str, topic: str, n: int, batch: int, base: str, admin: Any, indexed: bool
) -> tuple[float, float]:
    """Messages per second of one consume of the whole topic into a new prefix (after its
    first batch), and the server's µs per message over the same window."""
    from idemctl import open_store
    from idemctl.consume import ConsumeOptions, Consumer, adapt

    inner = script_commands()
    ends: list[tuple[int, float, float]] = []

    def mark(summary: Any) -> None:
        if not ends and summary.finished > 0:
            server = sent(command_stats(admin, "usec"), inner)
            ends.append((summary.finished, time.perf_counter(), server))
        elif len(ends) == 1 and summary.finished >= n:
            now = time.perf_counter()
            ends.append((summary.finished, now, sent(command_stats(admin, "usec"), inner)))

    options = ConsumeOptions(bootstrap, [topic], f"idem-{uuid.uuid4().hex}", batch_size=batch,
                             max_messages=n, kafka_config=CONSUMER)  # fmt: skip
    with open_store(f"{base}?prefix=b{uuid.uuid4().hex[:8]}:") as store:
        store.provision()
        if not indexed:
            without_index(store)
        summary = Consumer(store, adapt(lambda event: None), options, on_progress=mark).run()
    if summary.counts["executed"] != n or len(ends) < 2:
        raise BenchError(f"a round ran {summary.counts} of {n} new messages")
    ((first, t0, s0), (last, t1, s1)) = ends
    return (last - first) / (t1 - t0), (s1 - s0) / (last - first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each, alternating")
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    stop_on_sigterm()
    import redis

    from idemctl.harness.broker import local_broker

    rates: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with contextlib.ExitStack() as servers:
        bootstrap = servers.enter_context(local_broker())
        base = servers.enter_context(own_redis_server())
        admin = servers.enter_context(redis.Redis.from_url(base, decode_responses=True))
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        produce(bootstrap, topic, args.messages)
        one_round(bootstrap, topic, args.messages, args.batch, base, admin, True)  # warm-up
        for _ in range(args.rounds):
            for indexed in (False, True):
                rate = one_round(bootstrap, topic, args.messages, args.batch, base, admin, indexed)
                rates[indexed].append(rate)
    console = stdout_console()
    for indexed in (False, True):
        label = "with the index   " if indexed else "without the index"
        figures = ", ".join(f"{r:,.0f} msg/s ({us:.1f} µs)" for r, us in rates[indexed])
        console.print(f"{label}: {figures}", highlight=False)
    with_rate = statistics.median(r for r, _ in rates[True])
    without_rate = statistics.median(r for r, _ in rates[False])
    with_us = statistics.median(us for _, us in rates[True])
    without_us = statistics.median(us for _, us in rates[False])
    cost = without_rate / with_rate
    verdict = "met" if cost <= TARGET else "NOT met"
    console.print(
        f"time a message, with / without: {cost:.3f}x (medians {with_rate:,.0f} / "
        f"{without_rate:,.0f} msg/s; target <= {TARGET}x: {verdict}); Redis server µs a "
        f"message {with_us:.1f} / {without_us:.1f}",
        highlight=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
