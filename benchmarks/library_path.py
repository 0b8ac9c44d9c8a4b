"""Benchmark: the library's own path, ``@idempotent`` / ``idemctl.run``, one call at a time.

    .venv/bin/python benchmarks/library_path.py [--keys 2000] [--rounds 5]
        [--only powertools,floor,postgres,idemkit,wake] [--wake-rounds 5] [--hold 1.0]

- ``powertools``: ``@idempotent`` against Powertools' ``@idempotent_function`` over
  ``RedisCachePersistenceLayer`` on the same redis-server, in this process, rounds
  alternating: ``--keys`` fresh keys (first runs), then the same keys again (replays);
  calls a second and the ratio per round, and the median of the ratios.
- ``floor``: ``idemctl.run`` first runs against two raw round trips a call, same run: Redis
  ``SET NX PX`` then ``SET PX``; PostgreSQL ``INSERT ... ON CONFLICT DO NOTHING`` then
  ``UPDATE`` (autocommit), on the same servers.
- ``postgres``: ``idemctl.run`` and ``idemctl.aio.run`` on PostgreSQL, first runs (``--keys``
  new keys) and replays (the same keys again), against that floor on a sync and on an async
  psycopg connection, each round timing the six in turn; the ratios per round and their
  medians.
- ``idemkit``: ``idemctl.aio.run`` against idemkit's ``@idempotent`` (its defaults) on the
  same Redis and PostgreSQL, first runs and replays, the two in turn (alternating who goes
  first); on Redis also the server's µs a call of each (INFO commandstats).
- ``wake``: 2 processes of 10 threads call one key with ``wait=10`` while a holder (this
  process) runs its handler ``--hold`` seconds: the time from the holder's completion to
  each waiter's return, p50/p99/max per store, over ``--wake-rounds`` keys.

Servers are started on free loopback ports (tests/servers.py) and stopped by PID. Ratios
only: the machine's speed cancels out within a run; nothing is asserted on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from idemctl import idempotent, open_store  # noqa: E402
from idemctl.runner import run  # noqa: E402
from tests.servers import MotoServer, PostgresServer, RedisServer, fake_aws_env  # noqa: E402

WAITER = """
import json, sys, threading, time
from idemctl import open_store
from idemctl.runner import run
store = open_store(sys.argv[1])
key, threads = sys.argv[2], int(sys.argv[3])
store.watch()  # subscribed before the holder is told we are ready
out = []
def call():
    r = run(store, key, lambda ctx: {"ran": "waiter"}, wait=10)
    out.append((r.outcome.value, time.time()))
ts = [threading.Thread(target=call) for _ in range(threads)]
[t.start() for t in ts]
while len(store.watch().waited) < 1: time.sleep(0.001)
print("ready", flush=True)
[t.join() for t in ts]
print(json.dumps(out), flush=True)
"""


def rate(calls: int, seconds: float) -> float:
    return calls / seconds if seconds > 0 else float("inf")


def timed(fn: Any, keys: list[str]) -> float:
    started = time.perf_counter()
    for key in keys:
        fn(key)
    return rate(len(keys), time.perf_counter() - started)


# powertools ---------------------------------------------------------------------------------


def powertools_fn(url: str, prefix: str) -> Any:
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )
    from redis import Redis

    client = Redis.from_url(url, decode_responses=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        layer = RedisCachePersistenceLayer(client=client)  # type: ignore[arg-type]

    class Context:
        function_name = "bench"
        memory_limit_in_mb = 128
        invoked_function_arn = "arn:aws:lambda:eu-west-1:000000000000:function:bench"
        aws_request_id = "0"

        def get_remaining_time_in_millis(self) -> int:
            return 60_000

    config = IdempotencyConfig(expires_after_seconds=3600)
    config.register_lambda_context(Context())  # type: ignore[arg-type]

    @idempotent_function(  # type: ignore[untyped-decorator]
        data_keyword_argument="order", persistence_store=layer, config=config, key_prefix=prefix
    )
    def charge(order: dict[str, str]) -> dict[str, str]:
        return {"charged": order["id"]}

    return lambda key: charge(order={"id": key})


def section_powertools(redis_url: str, keys: int, rounds: int) -> None:
    print(f"\n== @idempotent vs Powertools @idempotent_function, Redis, {keys} keys a round")
    print("(floor: SET NX then SET, redis-py, the two round trips both make, same rounds)")
    ratios: dict[str, list[float]] = {"first runs": [], "replays": [], "floor/Powertools": []}
    for r in range(rounds):
        tag = uuid.uuid4().hex[:6]
        store = open_store(f"{redis_url}?prefix=lp{tag}:")

        @idempotent(store, key="charge:{order_id}")
        def charge(order_id: str) -> dict[str, str]:
            return {"charged": order_id}

        theirs = powertools_fn(redis_url, f"pt{tag}")
        floor = redis_floor(redis_url)
        names = [f"o-{i}" for i in range(keys)]
        figures: dict[str, tuple[float, float]] = {}
        for phase in ("first runs", "replays"):
            ours = timed(charge, names)
            peer = timed(theirs, names)
            figures[phase] = (ours, peer)
            ratios[phase].append(ours / peer)
        bare = timed(floor, [f"{tag}-{n}" for n in names])
        ratios["floor/Powertools"].append(bare / figures["first runs"][1])
        store.close()
        print(
            f"round {r + 1}: "
            + "; ".join(
                f"{phase} idemctl {o:,.0f}/s, Powertools {p:,.0f}/s = {o / p:.2f}x"
                for phase, (o, p) in figures.items()
            )
            + f"; floor {bare:,.0f}/s = {bare / figures['first runs'][1]:.2f}x Powertools"
        )
    for phase, values in ratios.items():
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"median {phase}: {statistics.median(values):.2f}x ({each})")


# floor ---------------------------------------------------------------------------------------


def redis_floor(url: str) -> Any:
    from redis import Redis

    client = Redis.from_url(url)

    def call(key: str) -> None:
        if not client.set(f"floor:{key}", "in_progress", nx=True, px=60_000):
            raise RuntimeError(key)
        client.set(f"floor:{key}", '{"ok":true}', px=3_600_000)

    return call


FLOOR_INSERT = "INSERT INTO floor_keys (key, v) VALUES (%s, NULL) ON CONFLICT DO NOTHING"
FLOOR_UPDATE = "UPDATE floor_keys SET v = '{\"ok\": true}' WHERE key = %s"


def postgres_floor(url: str) -> Any:
    import psycopg

    conn = psycopg.connect(url.split("?", maxsplit=1)[0], autocommit=True)
    conn.execute("CREATE TABLE IF NOT EXISTS floor_keys (key text PRIMARY KEY, v jsonb)")

    def call(key: str) -> None:
        conn.execute(FLOOR_INSERT, (key,))
        conn.execute(FLOOR_UPDATE, (key,))

    return call


def section_floor(urls: dict[str, str], keys: int, rounds: int) -> None:
    print(f"\n== idemctl.run first runs vs two raw round trips, {keys} keys a round")
    floors = {"redis": redis_floor, "postgres": postgres_floor}
    for name, url in urls.items():
        values = []
        for _ in range(rounds):
            tag = uuid.uuid4().hex[:6]
            store = open_store(url if name == "postgres" else f"{url}?prefix=fl{tag}:")
            store.provision()
            floor = floors[name](url)
            names = [f"{tag}-{i}" for i in range(keys)]
            ours = timed(lambda k, s=store: run(s, k, lambda ctx: {"ok": True}), names)
            theirs = timed(floor, [f"{n}-f" for n in names])
            values.append(ours / theirs)
            store.close()
            print(f"{name}: idemctl {ours:,.0f}/s, floor {theirs:,.0f}/s = {ours / theirs:.2f}x")
        print(f"{name} median: {statistics.median(values):.2f}x")


# postgres ------------------------------------------------------------------------------------


def async_postgres_floor(url: str) -> Any:
    """``postgres_floor`` on psycopg's AsyncConnection: an async function of a key."""
    import psycopg

    conns: list[Any] = []

    async def call(key: str) -> None:
        if not conns:
            conns.append(await psycopg.AsyncConnection.connect(url, autocommit=True))
            await conns[0].execute(
                "CREATE TABLE IF NOT EXISTS floor_keys (key text PRIMARY KEY, v jsonb)"
            )
        await conns[0].execute(FLOOR_INSERT, (key,))
        await conns[0].execute(FLOOR_UPDATE, (key,))

    return call


async def async_timed(fn: Any, keys: list[str]) -> float:
    started = time.perf_counter()
    for key in keys:
        await fn(key)
    return rate(len(keys), time.perf_counter() - started)


def section_postgres(url: str, keys: int, rounds: int) -> None:
    """The PostgreSQL rows of issue 64's table: ``idemctl.run`` and ``idemctl.aio.run``,
    first runs and replays, against the floor (sync and asyncio psycopg), the four timed in
    turn within each round on the same server, the store's statements warmed first."""
    import asyncio

    from idemctl import aio

    print(f"\n== PostgreSQL: idemctl against two raw statements, {keys} keys a round")
    plain = url.split("?", maxsplit=1)[0]
    store = open_store(url)
    store.provision()
    floor = postgres_floor(plain)
    ratios: dict[str, list[float]] = {}

    def note(name: str, value: float) -> None:
        ratios.setdefault(name, []).append(value)

    async def async_round(astore: Any, afloor: Any, tag: str) -> tuple[float, float, float]:
        names = [f"{tag}-a{i}" for i in range(keys)]

        async def handler(ctx: Any) -> dict[str, bool]:
            return {"ok": True}

        async def call(key: str) -> None:
            await aio.run(astore, key, handler)

        first = await async_timed(call, names)
        again = await async_timed(call, names)
        bare = await async_timed(afloor, [f"{n}-f" for n in names])
        return first, again, bare

    async def main() -> None:
        astore = aio.open_store(url)
        afloor = async_postgres_floor(plain)
        try:
            await async_round(astore, afloor, "warm")  # prepare and keep every plan first
            timed(lambda k: run(store, k, lambda ctx: {"ok": True}), [f"w{i}" for i in range(50)])
            for r in range(rounds):
                tag = uuid.uuid4().hex[:6]
                names = [f"{tag}-{i}" for i in range(keys)]
                ours = timed(lambda k: run(store, k, lambda ctx: {"ok": True}), names)
                again = timed(lambda k: run(store, k, lambda ctx: {"ok": True}), names)
                theirs = timed(floor, [f"{n}-f" for n in names])
                afirst, aagain, abare = await async_round(astore, afloor, tag)
                note("sync first runs / floor", ours / theirs)
                note("sync replays / floor", again / theirs)
                note("asyncio first runs / floor", afirst / abare)
                note("asyncio replays / floor", aagain / abare)
                print(
                    f"round {r + 1}: sync {ours:,.0f}/s first, {again:,.0f}/s replays, floor "
                    f"{theirs:,.0f}/s; asyncio {afirst:,.0f}/s first, {aagain:,.0f}/s "
                    f"replays, floor {abare:,.0f}/s"
                )
        finally:
            await astore.aclose()

    asyncio.run(main())
    store.close()
    for name, values in ratios.items():
        spread = f"{min(values):.2f}-{max(values):.2f}"
        print(f"{name}: median {statistics.median(values):.2f}x ({spread}; target >= 0.6x)")


# idemkit -------------------------------------------------------------------------------------


def server_us(client: Any, keys: int) -> float:
    """Redis's own time (INFO commandstats, every command) since the last CONFIG RESETSTAT,
    per key, and resets it."""
    stats = client.info("commandstats")
    client.config_resetstat()
    return sum(v["usec"] for v in stats.values()) / keys


def section_idemkit(redis_url: str, postgres_url: str, keys: int, rounds: int) -> None:
    """``idemctl.aio.run`` against idemkit 1.0.2's ``@idempotent`` (its defaults, keyed on
    the argument), on the same Redis and PostgreSQL, in the same rounds (the order of the
    two alternating): first runs, then replays; on Redis also the server's µs a first run
    and a replay (INFO commandstats)."""
    import asyncio

    import redis as redis_py

    from idemctl import aio

    try:
        from idemkit import MethodConfig, PostgresBackend, RedisBackend
        from idemkit import idempotent as ik_idempotent
        from idemkit.backends.postgres import init_pg
    except ImportError:
        print("\n== idemkit: not installed (pip install -e '.[bench]'), skipped")
        return
    print(f"\n== idemctl.aio.run against idemkit's @idempotent, {keys} keys a round")
    admin = redis_py.Redis.from_url(redis_url)
    ratios: dict[str, list[float]] = {}
    server: dict[str, list[float]] = {}

    async def main() -> None:
        ours = {
            "redis": aio.open_store(f"{redis_url}?prefix=vsik:"),
            "postgres": aio.open_store(f"{postgres_url}?schema=vsik"),
        }
        for store in ours.values():
            await store.provision()
        await init_pg(postgres_url)
        backends = {
            "redis": RedisBackend.from_url(redis_url),
            "postgres": PostgresBackend.from_url(postgres_url),
        }
        theirs = {}
        for name, backend in backends.items():

            @ik_idempotent(backend=backend, config=MethodConfig(key_fields=["order_id"]))
            async def charge(*, order_id: str) -> dict[str, bool]:
                return {"ok": True}

            theirs[name] = charge

        async def handler(ctx: Any) -> dict[str, bool]:
            return {"ok": True}

        def contenders(name: str) -> dict[str, Any]:
            store = ours[name]
            return {
                "idemctl": lambda k: aio.run(store, k, handler),
                "idemkit": lambda k: theirs[name](order_id=k),
            }

        for name in ours:  # warm-up: connections, scripts, prepared statements
            for fn in contenders(name).values():
                await async_timed(fn, [f"warm-{uuid.uuid4().hex[:6]}-{i}" for i in range(50)])
        try:
            for r in range(rounds):
                tag = uuid.uuid4().hex[:6]
                for name in ours:
                    figures = {}
                    order = list(contenders(name).items())
                    for who, fn in order if r % 2 == 0 else reversed(order):
                        names = [f"{tag}-{who}-{i}" for i in range(keys)]
                        admin.config_resetstat()
                        first = await async_timed(fn, names)
                        us_first = server_us(admin, keys)
                        again = await async_timed(fn, names)
                        us_again = server_us(admin, keys)
                        figures[who] = (first, again)
                        if name == "redis":
                            server.setdefault(f"{who} first run", []).append(us_first)
                            server.setdefault(f"{who} replay", []).append(us_again)
                    (a, b), (c, d) = figures["idemctl"], figures["idemkit"]
                    ratios.setdefault(f"{name} asyncio first runs", []).append(a / c)
                    ratios.setdefault(f"{name} asyncio replays", []).append(b / d)
                    print(
                        f"round {r + 1} {name}: idemctl {a:,.0f}/s first, {b:,.0f}/s replays; "
                        f"idemkit {c:,.0f}/s first, {d:,.0f}/s replays"
                    )
        finally:
            for store in ours.values():
                await store.aclose()
            for backend in backends.values():
                await backend.aclose()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # idemkit's warning that no scope was given
        asyncio.run(main())
    admin.close()
    for name, values in ratios.items():
        spread = f"{min(values):.2f}-{max(values):.2f}"
        print(f"{name}, idemctl / idemkit: median {statistics.median(values):.2f}x ({spread})")
    for name, values in server.items():
        print(f"Redis server µs a call, {name}: median {statistics.median(values):.1f}")


# wake ----------------------------------------------------------------------------------------


def one_wake(url: str, hold: float) -> tuple[list[float], list[str]]:
    key = f"wake-{uuid.uuid4().hex[:8]}"
    store = open_store(url)
    started, completed = threading.Event(), []

    def handler(ctx: Any) -> dict[str, str]:
        started.set()
        time.sleep(hold)
        return {"ran": "holder"}

    def hold_it() -> None:
        result = run(store, key, handler)
        completed.append((result.outcome.value, time.time()))

    holder = threading.Thread(target=hold_it)
    holder.start()
    started.wait(30)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", WAITER, url, key, "10"]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)
    ]
    for proc in procs:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("a waiter process did not start")
    holder.join()
    outs = [json.loads(proc.communicate(timeout=60)[0]) for proc in procs]
    store.close()
    done_at = completed[0][1]
    calls = [c for out in outs for c in out]
    return [(at - done_at) * 1000 for _, at in calls], [o for o, _ in calls] + [completed[0][0]]


def section_wake(urls: dict[str, str], rounds: int, hold: float) -> None:
    print(
        f"\n== wake-up: completion to a waiter's return, 20 waiters in 2 processes, {rounds} keys"
    )
    for name, url in urls.items():
        samples: list[float] = []
        outcomes: list[str] = []
        for _ in range(rounds):
            ms, seen = one_wake(url, hold)
            samples += ms
            outcomes += seen
        samples.sort()
        p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
        counts = {o: outcomes.count(o) for o in sorted(set(outcomes))}
        print(
            f"{name}: p50 {statistics.median(samples):.1f} ms, p99 {p99:.1f} ms, "
            f"max {samples[-1]:.1f} ms over {len(samples)} waiters; outcomes {counts}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="powertools,floor,postgres,idemkit,wake")
    parser.add_argument("--wake-rounds", type=int, default=5)
    parser.add_argument("--hold", type=float, default=1.0)
    args = parser.parse_args()
    only = set(args.only.split(","))
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(tmp).start()
        stack.callback(redis.stop)
        redis_url = f"redis://127.0.0.1:{redis.port}/0"
        postgres = PostgresServer(tmp).start()
        stack.callback(postgres.stop)
        postgres_url = postgres.url()
        if "powertools" in only:
            section_powertools(redis_url, args.keys, args.rounds)
        if "floor" in only:
            urls = {"redis": redis_url, "postgres": postgres_url}
            section_floor(urls, args.keys, max(1, args.rounds // 2))
        if "postgres" in only:
            section_postgres(postgres.url(schema="library"), args.keys, args.rounds)
        if "idemkit" in only:
            section_idemkit(redis_url, postgres_url, args.keys, args.rounds)
        if "wake" in only:
            stack.enter_context(fake_aws_env())
            moto = MotoServer(tmp).start()
            stack.callback(moto.stop)
            table = moto.url(f"wake-{uuid.uuid4().hex[:6]}")
            urls = {
                "redis": f"{redis_url}?prefix=wk:",
                "postgres": postgres_url,
                "sqlite": f"sqlite:///{tmp}/wake.db",
                "dynamodb": table,
            }
            for url in urls.values():
                with open_store(url) as store:
                    store.provision()
            section_wake(urls, args.wake_rounds, args.hold)


if __name__ == "__main__":
    main()
